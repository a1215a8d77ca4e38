"""The prefix crawl's incremental verifiable DPF (vdaf/crawl.py): honest
reports walked level by level give every kept prefix's exact count and pass
every level's check; hostile ones are refused at the level where they break —
a weight other than one, the split report, a changed correction, different
public shares to the two servers — and a seed-only leaf proof (Mastic-04's)
lets the split report through, the negative control."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

from svtagg.vdaf import crawl, sparse
from svtagg.vdaf.crawl import (
    CHECK_VALUE_SIZE,
    CrawlReports,
    Level,
    PrefixDpf,
    check_hashed,
    check_level,
    check_values,
    level_counts,
    step_level,
)
from svtagg.vdaf.sparse import NONCE_SIZE, RAND_SIZE, P, SparseError

VK = os.urandom(32)


def make(dpf: PrefixDpf, alpha: int, weight: int = 1):  # type: ignore[no-untyped-def]
    nonce = os.urandom(NONCE_SIZE)
    public, keys = dpf.gen(alpha, nonce, os.urandom(RAND_SIZE), weight)
    return nonce, public, keys


def walk(dpf: PrefixDpf, reports, threshold: int, publics=None, reference=False):  # type: ignore[no-untyped-def]
    """Crawl every level on two `CrawlReports` (one bit per level): keep the
    candidates whose reconstructed count is at least `threshold` (the test's
    plaintext stand-in for the level's answers).  Returns per level the
    candidate counts and the reports refused there.  `reference`: the numpy
    path even where the native core is (the controls break the reference)."""

    def view(i: int) -> list[tuple[bytes, bytes, bytes]]:
        return [
            (n, publics[j][i] if publics else pub, keys[i])
            for j, (n, pub, keys) in enumerate(reports)
        ]

    servers = [CrawlReports(dpf.bits, i, VK, view(i), reference) for i in (0, 1)]
    out = []
    for level in range(1, dpf.bits + 1):
        invalid = step_level(servers[0], servers[1], 1)
        candidates = servers[0].candidates
        counts = dict(zip(candidates, level_counts(*servers), strict=True))
        out.append((counts, np.flatnonzero(invalid).tolist()))
        if level < dpf.bits:
            kept = [x for x in candidates if counts[x] >= threshold]
            for s in servers:
                s.keep(kept)
    return out


@pytest.mark.parametrize("reference", [False, True], ids=["native-if-built", "reference"])
def test_an_honest_crawl_counts_every_kept_prefix_exactly(reference: bool) -> None:
    dpf = PrefixDpf(12)
    gen = np.random.default_rng(3)
    popular = [0b101100111000, 0b101100111001, 0b000011110000, 0b111111111111]
    alphas = [popular[i] for i in gen.choice(4, 40, p=[0.4, 0.3, 0.2, 0.1])]
    alphas += [int(x) for x in gen.integers(0, 1 << 12, 10)]
    reports = [make(dpf, a) for a in alphas]
    levels = walk(dpf, reports, threshold=3, reference=reference)
    for level, (counts, refused) in enumerate(levels, 1):
        assert refused == []
        truth = Counter(a >> (12 - level) for a in alphas)
        assert counts == {x: truth.get(x, 0) for x in counts}
    last = {x for x, c in levels[-1][0].items() if c >= 3}
    assert last == {a for a, c in Counter(alphas).items() if c >= 3}


def test_a_weight_other_than_one_is_refused_at_the_first_level() -> None:
    dpf = PrefixDpf(6)
    levels = walk(dpf, [make(dpf, 9), make(dpf, 9, weight=2), make(dpf, 9, weight=0)], 1)
    assert levels[0][1] == [1, 2]


@pytest.mark.parametrize("part", ["seed", "ctrl", "proof", "output"])
def test_a_changed_correction_is_refused_at_its_level(part: str) -> None:
    dpf = PrefixDpf(8)
    nonce, public, keys = make(dpf, 0b10110011)
    levels = dpf.decode(public)
    lv = levels[4]
    bad = {
        "seed": Level(bytes([lv.seed[0] ^ 0x20]) + lv.seed[1:], lv.ctrl, lv.proof, lv.output),
        "ctrl": Level(lv.seed, (not lv.ctrl[0], lv.ctrl[1]), lv.proof, lv.output),
        "proof": Level(lv.seed, lv.ctrl, bytes([lv.proof[0] ^ 1]) + lv.proof[1:], lv.output),
        "output": Level(lv.seed, lv.ctrl, lv.proof, (lv.output + 1) % P),
    }[part]
    tampered = dpf.encode([*levels[:4], bad, *levels[5:]])
    honest = make(dpf, 0b10110011)
    result = walk(dpf, [honest, (nonce, tampered, keys)], threshold=1)
    refused_at = [level for level, (_, refused) in enumerate(result, 1) if refused]
    assert refused_at == [5]  # the level whose correction changed


def _publics_differing_at_level_6(dpf: PrefixDpf):  # type: ignore[no-untyped-def]
    """A report's key pair with two public shares that differ only in level 6's
    output correction (its own + 1 and + 2): nothing the first five levels
    evaluate differs, so only the public share's binding into each level's
    digest key can tell before level 6; at level 6 whichever server's node is
    live applies a wrong correction, so the weight check fails there."""
    nonce, public, keys = make(dpf, 0b110011)
    levels = dpf.decode(public)
    lv = levels[5]

    def variant(add: int) -> bytes:
        return dpf.encode([*levels[:5], Level(lv.seed, lv.ctrl, lv.proof, (lv.output + add) % P)])

    return nonce, keys, variant(1), variant(2)


def test_different_public_shares_to_the_two_servers_are_refused_at_once() -> None:
    dpf = PrefixDpf(6)
    nonce, keys, one, two = _publics_differing_at_level_6(dpf)
    result = walk(dpf, [(nonce, one, keys)], 1, publics=[(one, two)])
    assert result[0][1] == [0]  # at level 1, where the two views first meet


def test_unbound_public_shares_let_wrong_counts_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with a digest key that leaves the public share out,
    the two servers evaluate different reports unnoticed for five levels, and
    at level 6 a report whose dead sibling node is held alike (both bits 1)
    passes with counts 2 and −1 — the sum is still one unit, and still one
    node is live.  A report does so with probability ≈ 1/4 (43 of 200
    measured), so over 64 reports (both engines, alternately) none does with
    probability (3/4)^64 ≈ 10^−8 (over 20, as this test once had, 0.3 %: it
    failed a CI run)."""
    real = crawl.base_key

    def unbound(verify_key, nonce, phash):  # type: ignore[no-untyped-def]
        return real(verify_key, nonce, b"")

    monkeypatch.setattr(crawl, "base_key", unbound)
    dpf = PrefixDpf(6)
    passed_wrong = 0
    for i in range(64):
        nonce, keys, one, two = _publics_differing_at_level_6(dpf)
        result = walk(dpf, [(nonce, one, keys)], 1, publics=[(one, two)], reference=i % 2 == 0)
        refused_at = [level for level, (_, refused) in enumerate(result, 1) if refused]
        assert refused_at in ([], [6])
        if not refused_at:
            assert result[-1][0] == {0b110010: P - 1, 0b110011: 2}
            passed_wrong += 1
    assert passed_wrong > 0


def split(dpf: PrefixDpf):  # type: ignore[no-untyped-def]
    """The split report, cut at the last level: equal keys and zero seed
    corrections, so both servers hold the same seeds everywhere; one live node
    per level (the left child), then both children of the last live node live,
    each worth ½.  Each level's proof correction is what the proof function in
    use (`crawl._leaf_proofs`, patched by the control) makes the left child
    agree on.  Ground until the two last children's signs agree."""
    from svtagg.vdaf.sparse import LEFT, RIGHT, _blocks, _Hash, _hash_key

    n = dpf.bits
    for _ in range(256):
        nonce, k = os.urandom(NONCE_SIZE), os.urandom(16)
        h = _Hash(_hash_key(nonce, 0, crawl.DST))
        seed, ctrl = _blocks(k + k), np.array([False, True])
        levels = []
        for level in range(1, n + 1):
            raw = [h(seed, LEFT), h(seed, RIGHT)]
            bits = [(x[:, 0] & np.uint64(1)).astype(bool) for x in raw]
            for x in raw:
                x[:, 0] &= ~np.uint64(1)
            # a child whose control correction is 1 flips on the server whose
            # parent bit is 1: with equal raw bits, the two servers then differ
            child_t = [b ^ ctrl for b in bits]
            proofs = crawl._leaf_proofs(nonce, raw[0], child_t[0], crawl.DST)
            cs = (proofs[0] ^ proofs[1]).astype("<u8").tobytes()
            signs = [1 if t[0] else -1 for t in child_t]  # t₀ − t₁ per child
            if level < n:
                levels.append(Level(bytes(16), (True, False), cs, signs[0] % P))
                seed, ctrl = raw[0], child_t[0]
            elif signs[0] == signs[1]:
                levels.append(Level(bytes(16), (True, True), cs, signs[0] * pow(2, -1, P) % P))
                return nonce, dpf.encode(levels), (k, k)
    raise AssertionError("no key with agreeing signs")


def test_the_split_report_is_refused_where_it_splits() -> None:
    dpf = PrefixDpf(5)
    result = walk(dpf, [split(dpf)], threshold=0)
    assert [level for level, (_, refused) in enumerate(result, 1) if refused] == [5]


def test_negative_control_seed_only_proofs_let_the_split_report_through(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With leaf proofs on the seed alone (Mastic-04's node proofs) the split
    report passes every level and puts ½ on two strings: the control bit in
    the proof's key is what stops it."""

    def seed_only(nonce, seed, ctrl, dst=sparse.DST):  # type: ignore[no-untyped-def]
        return sparse._Hash(sparse._hash_key(nonce, 1, dst))(seed, sparse.PROOF)

    monkeypatch.setattr(crawl, "_leaf_proofs", seed_only)
    dpf = PrefixDpf(5)
    result = walk(dpf, [split(dpf)], threshold=0, reference=True)
    assert all(not refused for _, refused in result)
    half = pow(2, -1, P)
    assert sorted(result[-1][0].values())[-2:] == [half, half]


def test_inputs_are_checked() -> None:
    dpf = PrefixDpf(5)
    with pytest.raises(SparseError):
        dpf.gen(32, os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE))
    nonce, public, keys = make(dpf, 3)
    with pytest.raises(SparseError):
        dpf.decode(public[:-1])
    with pytest.raises(SparseError):
        PrefixDpf(257)
    root = dpf.root(0, keys[0])
    ev = dpf.expand(0, VK, nonce, public, root)
    with pytest.raises(SparseError):
        dpf.decide(ev.prep_share[:-1], ev.prep_share)
    assert dpf.public_share_bytes() == 2 + 5 * 48


def test_keep_refuses_a_prefix_that_was_no_candidate_or_one_kept_twice() -> None:
    dpf = PrefixDpf(4)
    nonce, public, keys = make(dpf, 0b1010)
    ev = dpf.expand(0, VK, nonce, public, dpf.root(0, keys[0]))
    assert ev.candidates == [0, 1]
    with pytest.raises(SparseError, match="not a candidate"):
        dpf.keep(ev, [2], 1)
    with pytest.raises(SparseError, match="distinct"):
        dpf.keep(ev, [1, 1], 1)
    assert dpf.keep(ev, [1], 1).prefixes == [1]


native_only = pytest.mark.skipif(not crawl._native(), reason="the native core is not built")


@native_only
@pytest.mark.parametrize("bits", [1, 7, 13, 64, 256])
def test_the_native_core_makes_the_references_bytes(bits: int) -> None:
    """Key generation, a walk's step (`expand_into`: several kept nodes, both
    servers, one to five binary levels at once; a negated one takes it out
    again) and `descend`: the same bytes as the numpy reference's `gen`,
    `expand` and `keep` in turn."""
    from svtagg.vdaf import native
    from svtagg.vdaf.field import FIELD128
    from svtagg.vdaf.sparse import Accumulator

    dpf = PrefixDpf(bits)
    gen = np.random.default_rng(bits)
    for _ in range(3):
        nonce, rand = os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE)
        alpha = int.from_bytes(os.urandom(32), "big") % (1 << bits)
        public, keys = dpf.gen(alpha, nonce, rand)
        with native.using("python"):
            assert dpf.gen(alpha, nonce, rand) == (public, keys)
        for agg in (0, 1):
            nodes = dpf.root(agg, keys[agg])
            while nodes.level < bits:
                steps = int(gen.integers(1, min(5, bits - nodes.level) + 1))
                ref, ref_preps = dpf.expand_steps(agg, VK, nonce, public, nodes, steps)
                acc = Accumulator(len(ref.candidates), wide=True)
                view = dpf.view(nonce, public)
                preps = dpf.expand_into(acc, agg, VK, view, nodes, steps)
                assert preps == ref_preps
                assert FIELD128.to_ints(acc.value()) == ref.shares
                dpf.expand_into(acc, agg, VK, view, nodes, steps, negate=True)
                assert FIELD128.to_ints(acc.value()) == [0] * len(ref.candidates)
                # keep a few (α's prefix among them), as a walk would
                mine = alpha >> (bits - nodes.level - steps)
                others = [int(x) for x in gen.choice(ref.candidates, 3)]
                kept = list(dict.fromkeys([mine, *others]))
                want = dpf.keep(ref, kept, nodes.level + steps)
                got = dpf.descend(agg, view, nodes, steps, kept)
                assert (got.level, got.prefixes, got.total) == (
                    want.level,
                    want.prefixes,
                    want.total,
                )
                assert (got.seeds == want.seeds).all() and (got.ctrl == want.ctrl).all()
                nodes = got


def test_an_output_correction_past_the_modulus_is_refused_when_decoded() -> None:
    """A public share with an output correction ≥ p does not decode: both
    engines' walks refuse the report before its first level (it is never
    live, so no level counts it)."""
    dpf = PrefixDpf(8)
    nonce, public, keys = make(dpf, 77)
    raw = bytearray(public)
    head = len(raw) - 48 * 8
    raw[head + 48 * 2 + 32 : head + 48 * 2 + 48] = (P + 3).to_bytes(16, "little")
    with pytest.raises(SparseError):
        dpf.view(nonce, bytes(raw))
    for reference in (False, True):
        result = walk(dpf, [make(dpf, 77), (nonce, bytes(raw), keys)], 1, reference=reference)
        assert [sum(counts.values()) for counts, _ in result] == [1] * 8


@native_only
def test_a_step_on_several_threads_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The native walk cut over threads (each its own accumulator, added at
    the end) gives the prep shares, count shares and kept nodes of one
    thread, a refused report's take-out included."""
    dpf = PrefixDpf(16)
    gen = np.random.default_rng(4)
    reports = [make(dpf, int(a)) for a in gen.choice([7, 300, 4242, 65000], 90)]
    reports.append(make(dpf, 7, weight=2))

    def run(threads: int) -> list[object]:
        monkeypatch.setattr(crawl, "WALK_THREADS", threads)
        monkeypatch.setattr(crawl, "_PER_THREAD", 8)
        servers = [CrawlReports(16, i, VK, [(n, p, k[i]) for n, p, k in reports]) for i in (0, 1)]
        out: list[object] = []
        for _ in range(2):
            was = servers[0].live & servers[1].live
            shares = [s.extend(8) for s in servers]
            ok = check_level(shares[0], shares[1], was)
            for s in servers:
                s.drop(was & ~ok)
            counts = [s.count_shares() for s in servers]
            out += [shares[0].tobytes(), shares[1].tobytes(), counts, ok.tolist()]
            if servers[0].depth < 16:
                a, b = counts
                heavy = [
                    x
                    for x, u, v in zip(servers[0].candidates, a, b, strict=True)
                    if (u + v) % P >= 2
                ]
                for s in servers:
                    s.keep(heavy)
        return out

    assert run(1) == run(4)


def test_count_shares_become_ring_shares_without_an_exchange() -> None:
    """A level's Field128 count shares, converted by each server alone
    (`ring_shares`), add up mod 2^64 to the exact counts; the control without
    server 0's −1 (the integer wrap past p ≡ 1 mod 2^64) is off by one on
    every candidate."""
    from svtagg.vdaf.crawl import ring_shares

    dpf = PrefixDpf(8)
    tops = [int(a) for a in np.random.default_rng(9).integers(0, 4, 60)]
    reports = [make(dpf, t << 6) for t in tops]  # the top two bits: 0..3
    servers = [CrawlReports(8, i, VK, [(n, p, k[i]) for n, p, k in reports]) for i in (0, 1)]
    shares = [s.extend(2) for s in servers]
    assert check_level(shares[0], shares[1], servers[0].live).all()
    a, b = (s.count_shares() for s in servers)
    want = [tops.count(x) for x in range(4)]
    assert (ring_shares(a, 0) + ring_shares(b, 1)).tolist() == want
    unshifted = np.array([x & (2**64 - 1) for x in a], dtype=np.uint64) + ring_shares(b, 1)
    assert unshifted.tolist() == [w + 1 for w in want]


@pytest.mark.parametrize("reference", [False, True], ids=["native-if-built", "reference"])
def test_a_resumed_walk_makes_the_walks_bytes(reference: bool) -> None:
    """A server that lost its walk rebuilds it from its record (servers/crawl.py):
    `resume` at a level's candidates (24 bits, past one 16-bit hop), with the
    reports its checks refused left out, then keep and extend, gives the
    prep shares and count shares the walk that never stopped gives."""
    dpf = PrefixDpf(32)
    gen = np.random.default_rng(8)
    alphas = [int(x) for x in gen.choice([0xABCDEF01, 0xABCDEE02, 0x12345678], 30)]
    reports = [make(dpf, a) for a in alphas] + [make(dpf, 0xABCDEF01, weight=3)]
    view = [(n, p, k[0]) for n, p, k in reports]
    helper = [(n, p, k[1]) for n, p, k in reports]
    steady = CrawlReports(32, 0, VK, view, reference)
    other = CrawlReports(32, 1, VK, helper, reference)
    kept = [0]
    for steps in (8, 8, 8):  # three levels: 24 bits
        if steady.depth:
            for s in (steady, other):
                s.keep(kept)
        invalid = steady.live & ~check_level(steady.extend(steps), other.extend(steps), steady.live)
        for s in (steady, other):
            s.drop(invalid)
        counts = level_counts(steady, other)
        kept = [c for c, n in zip(steady.candidates, counts, strict=True) if n >= 5]
    refused = ~steady.live
    assert refused.sum() == 1  # the weight-3 report, at the first level
    resumed = CrawlReports(32, 0, VK, view, reference)
    resumed.resume(steady.candidates, 24, refused)
    for s in (steady, resumed):
        s.keep(kept)
    assert np.array_equal(steady.extend(8), resumed.extend(8))
    assert steady.count_shares() == resumed.count_shares()
    assert np.array_equal(steady.live, resumed.live)
    with pytest.raises(SparseError, match="resumes"):
        steady.resume(steady.candidates, 32, refused)


def test_hashed_check_values_decide_as_the_prep_shares_do() -> None:
    """The servers exchange a 16-byte hash per report and step
    (`check_values`) instead of 32 bytes per binary level: it decides exactly
    as `check_level` on the prep shares, for honest reports, a weight of two,
    a key changed for one server and a correction changed at the third bit;
    the control, values that hash the weight without negating it on server 1,
    refuses the honest reports too."""
    dpf = PrefixDpf(16)
    reports = [make(dpf, a) for a in (0x6869, 0x6869, 0x6F6B)]
    reports.append(make(dpf, 0x6F6B, weight=2))
    n, p, k = make(dpf, 0x6F6B)
    reports.append((n, p, (k[0], bytes([k[1][0] ^ 1]) + k[1][1:])))
    n, p, k = make(dpf, 0x6869)
    levels = dpf.decode(p)
    lv = levels[2]
    levels[2] = Level(lv.seed, lv.ctrl, lv.proof, (lv.output + 1) % P)
    reports.append((n, dpf.encode(levels), k))
    sides = [CrawlReports(16, i, VK, [(n, p, k[i]) for n, p, k in reports]) for i in (0, 1)]
    live = sides[0].live
    prep = [s.extend(4) for s in sides]
    plain = check_level(prep[0], prep[1], live)
    values = [check_values(prep[i], i, live) for i in (0, 1)]
    assert values[0].shape == (6, CHECK_VALUE_SIZE)
    assert list(check_hashed(values[0], values[1], live)) == list(plain)
    assert list(plain) == [True, True, True, False, False, False]
    unnegated = check_values(prep[1], 0, live)
    assert not check_hashed(values[0], unnegated, live).any()


def test_check_values_reduce_and_negate_weights_exactly() -> None:
    """`check_values`' weights on 64-bit words: reduced below p and negated
    mod p as Python integers do, at the edges (0, 1, p − 1, 2^64, 2^128 − 1)
    and at random."""
    from svtagg.vdaf.crawl import _canonical

    gen = np.random.default_rng(2)
    vals = [0, 1, P - 1, P - 2, 2**64 - 1, 2**64, 2**127, P, P + 5, 2**128 - 1]
    vals += [int.from_bytes(gen.bytes(16), "little") % P for _ in range(500)]
    words = np.array([[v & (2**64 - 1), v >> 64] for v in vals], dtype=np.uint64)
    for negate in (False, True):
        out = _canonical(words, negate)
        got = [int(a) | (int(b) << 64) for a, b in out]
        assert got == [(P - v % P) % P if negate else v % P for v in vals]
