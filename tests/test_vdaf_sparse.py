"""Sparse one-hot reports (vdaf/sparse.py): honest reports expand to e_α on
the whole domain and verify; hostile ones are refused — an item out of the
domain, two points, a key or a correction changed for one server, a weight
other than one — and the split report (two live leaves with the same seed)
is the negative control: a leaf proof that does not bind the control bit, or
binds it with an XOR tweak, accepts it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from svtagg.vdaf import native, sparse
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.sparse import (
    LEFT,
    NONCE_SIZE,
    RAND_SIZE,
    RIGHT,
    PublicShare,
    SparseError,
    SparseOnehot,
    _blocks,
    _Hash,
    _hash_key,
)

P = FIELD128.modulus
VK = os.urandom(32)


def expand_both(s: SparseOnehot, nonce: bytes, public: bytes, keys: tuple[bytes, bytes]):  # type: ignore[no-untyped-def]
    return [s.expand(i, VK, nonce, public, keys[i]) for i in (0, 1)]


def plain(a, b) -> list[int]:  # type: ignore[no-untyped-def]
    return [
        (x + y) % P for x, y in zip(FIELD128.to_ints(a.out), FIELD128.to_ints(b.out), strict=True)
    ]


@pytest.mark.parametrize("d", [2, 3, 5, 16, 17, 100, 1000])
def test_honest_reports_are_the_unit_vector_and_verify(d: int) -> None:
    s = SparseOnehot(d)
    for alpha in {0, d - 1, d // 2, 1 % d}:
        nonce = os.urandom(NONCE_SIZE)
        public, keys = s.gen(alpha, nonce, os.urandom(RAND_SIZE))
        assert len(public) == s.public_share_bytes()
        a, b = expand_both(s, nonce, public, keys)
        want = [0] * d
        want[alpha] = 1
        assert plain(a, b) == want
        assert s.decide(a.prep_share(), b.prep_share())


def test_sizes_at_ten_thousand() -> None:
    s = SparseOnehot(10_000)
    assert s.bits == 14
    assert s.public_share_bytes() + s.input_share_bytes() == 276


def test_an_item_outside_the_domain_is_refused_by_the_client_and_by_the_servers() -> None:
    s = SparseOnehot(20)  # 5 bits: leaves 20..31 exist but are outside [0, d)
    with pytest.raises(SparseError):
        s.gen(20, os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE))
    big = SparseOnehot(32)  # the same tree shape, a client that lies about d
    nonce = os.urandom(NONCE_SIZE)
    public, keys = big.gen(25, nonce, os.urandom(RAND_SIZE))
    a, b = expand_both(s, nonce, public, keys)
    assert not any(plain(a, b))
    assert not s.decide(a.prep_share(), b.prep_share())


def test_a_key_changed_for_one_server_is_refused() -> None:
    s = SparseOnehot(300)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = s.gen(123, nonce, os.urandom(RAND_SIZE))
    bad = (keys[0], bytes([keys[1][0] ^ 8]) + keys[1][1:])
    a, b = expand_both(s, nonce, public, bad)
    assert not s.decide(a.prep_share(), b.prep_share())


@pytest.mark.parametrize("where", ["seed", "ctrl", "proof", "output"])
def test_a_changed_correction_is_refused(where: str) -> None:
    s = SparseOnehot(300)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = s.gen(77, nonce, os.urandom(RAND_SIZE))
    ps = s.decode_public_share(public)
    level = 4
    if where == "seed":
        seeds = bytearray(ps.seeds)
        seeds[16 * level + 3] ^= 0x10
        ps = PublicShare(bytes(seeds), ps.ctrl, ps.proof, ps.output)
    elif where == "ctrl":
        ctrl = list(ps.ctrl)
        ctrl[level] = (not ctrl[level][0], ctrl[level][1])
        ps = PublicShare(ps.seeds, tuple(ctrl), ps.proof, ps.output)
    elif where == "proof":
        ps = PublicShare(ps.seeds, ps.ctrl, bytes([ps.proof[0] ^ 1]) + ps.proof[1:], ps.output)
    else:  # a weight of 2: the output correction made for 2 instead of 1
        ps = PublicShare(ps.seeds, ps.ctrl, ps.proof, (2 * ps.output) % P)
    a, b = expand_both(s, nonce, s.encode_public_share(ps), keys)
    assert not s.decide(a.prep_share(), b.prep_share())


def test_two_points_are_refused() -> None:
    """A correction made for one item at one level and another item below:
    the same keys, a public share spliced from two honest ones."""
    s = SparseOnehot(256)
    nonce, rand = os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE)
    p1, keys = s.gen(0b1010_0000, nonce, rand)
    p2, _ = s.gen(0b1010_0001, nonce, rand)
    a1, a2 = s.decode_public_share(p1), s.decode_public_share(p2)
    spliced = PublicShare(
        a1.seeds[:-16] + a2.seeds[-16:], a1.ctrl[:-1] + a2.ctrl[-1:], a1.proof, a1.output
    )
    a, b = expand_both(s, nonce, s.encode_public_share(spliced), keys)
    assert not s.decide(a.prep_share(), b.prep_share())


def test_malformed_shares_are_refused() -> None:
    s = SparseOnehot(50)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = s.gen(3, nonce, os.urandom(RAND_SIZE))
    with pytest.raises(SparseError):
        s.expand(0, VK, nonce, public[:-1], keys[0])
    with pytest.raises(SparseError):
        s.expand(0, VK, nonce, public, keys[0][:-1])
    with pytest.raises(SparseError, match="padding"):
        s.decode_public_share(public[:1] + bytes([public[1] | 0xF0]) + public[2:])  # 12 bits used
    with pytest.raises(SparseError, match="modulus"):
        s.decode_public_share(public[:-16] + (P + 1).to_bytes(16, "little"))
    with pytest.raises(SparseError):
        s.decide(b"\0" * 31, b"\0" * 32)


# ------------------------------------------------------------------ the split report


def split_report(s: SparseOnehot, seed_cw_last: bytes = bytes(16)):  # type: ignore[no-untyped-def]
    """Equal keys on both servers, zero seed corrections, one live node per
    level down to a parent whose two leaves are both live: with the same seed
    on both servers, or (`seed_cw_last` ≠ 0) seeds that differ by it on the
    server whose leaf bit is 1.  The output correction makes the two leaves
    add to 1.  Ground until the leaves' bits fall right (a few tries)."""
    n = s.bits
    path = 0b0110 >> max(0, 4 - (n - 1))
    delta = _blocks(seed_cw_last)[0]
    for _ in range(256):
        nonce, k = os.urandom(NONCE_SIZE), os.urandom(16)
        h = _Hash(_hash_key(nonce))
        seed = _blocks(k + k)
        ctrl = np.array([False, True])
        ctrls = []
        for i in range(n - 1):
            bit = (path >> (n - 2 - i)) & 1
            cw = ((bit == 0), (bit == 1))
            kid = h(seed, (LEFT, RIGHT)[bit])
            t = (kid[:, 0] & np.uint64(1)).astype(bool)
            kid[:, 0] &= ~np.uint64(1)
            ctrls.append(cw)
            seed, ctrl = kid, t ^ (ctrl & cw[bit])
        ctrls.append((True, True))
        leaves = []
        for tweak in (LEFT, RIGHT):
            kid = h(seed, tweak)
            t = (kid[:, 0] & np.uint64(1)).astype(bool)
            kid[:, 0] &= ~np.uint64(1)
            kid[ctrl] ^= delta
            leaves.append((kid, t ^ ctrl))
        # the seed correction must land on the server whose leaf bit is 1
        if any(delta) and not all(bool(t[ctrl][0]) for _, t in leaves):
            continue
        signs = [1 if t[0] else -1 for _, t in leaves]  # t₀ − t₁ per leaf
        if signs[0] != signs[1]:
            continue
        conv = [FIELD128.to_ints(sparse._to_field(h(x, sparse.CONVERT))) for x, _ in leaves]
        diff = sum(c[0] - c[1] for c in conv)
        cw_out = (1 - diff) * pow(2 * signs[0], -1, P) % P
        seeds = bytes(16) * (n - 1) + seed_cw_last
        ps = PublicShare(seeds, tuple(ctrls), bytes(16), cw_out)
        return nonce, s.encode_public_share(ps), (k, k), (path << 1, (path << 1) | 1)
    raise AssertionError("no key with the bits needed in 256 tries")


def test_the_split_report_is_refused() -> None:
    s = SparseOnehot(64)
    nonce, public, keys, leaves = split_report(s)
    a, b = expand_both(s, nonce, public, keys)
    got = plain(a, b)
    half = pow(2, -1, P)
    assert [got[x] for x in leaves] == [half, half] and sum(got) % P == 1  # two points
    assert not s.decide(a.prep_share(), b.prep_share())


def test_negative_control_proofs_without_the_control_bit_accept_the_split(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: leaf proofs on the seed alone (as Mastic-04's node
    proofs) let the split report through; the check must not be this one."""

    def seed_only(nonce, seed, ctrl):  # type: ignore[no-untyped-def]
        return _Hash(_hash_key(nonce, 1))(seed, sparse.PROOF)

    monkeypatch.setattr(sparse, "_leaf_proofs", seed_only)
    monkeypatch.setattr(sparse, "_core", None)  # the reference, where the proofs are patched
    s = SparseOnehot(64)
    nonce, public, keys, _ = split_report(s)
    a, b = expand_both(s, nonce, public, keys)
    assert s.decide(a.prep_share(), b.prep_share())  # the broken check accepts


def test_negative_control_an_xor_tweak_for_the_bit_accepts_the_split(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The second control: the bit as an XOR tweak of the seed, H(s ⊕ t·2^127),
    is cancelled by a last seed correction of 2^127 between the two servers."""

    def xor_tweak(nonce, seed, ctrl):  # type: ignore[no-untyped-def]
        x = seed.copy()
        x[:, 1] ^= ctrl.astype(np.uint64) << np.uint64(63)
        return _Hash(_hash_key(nonce, 1))(x, sparse.PROOF)

    monkeypatch.setattr(sparse, "_leaf_proofs", xor_tweak)
    monkeypatch.setattr(sparse, "_core", None)
    s = SparseOnehot(64)
    delta = (1 << 127).to_bytes(16, "little")
    nonce, public, keys, leaves = split_report(s, delta)
    a, b = expand_both(s, nonce, public, keys)
    got = plain(a, b)
    assert all(got[x] for x in leaves) and sum(got) % P == 1  # two points
    assert s.decide(a.prep_share(), b.prep_share())
    monkeypatch.undo()
    a, b = expand_both(s, nonce, public, keys)
    assert not s.decide(a.prep_share(), b.prep_share())


@pytest.mark.skipif(sparse._core is None, reason="the native sparse core is not built here")
@pytest.mark.parametrize("d", [2, 7, 64, 1000])
def test_native_and_numpy_expansions_are_the_same_bytes(d: int) -> None:
    s = SparseOnehot(d)
    reports = []
    for alpha in (0, d - 1, d // 3):
        nonce = os.urandom(NONCE_SIZE)
        reports.append((nonce, *s.gen(alpha, nonce, os.urandom(RAND_SIZE))))
    nonce, public, keys, _ = split_report(SparseOnehot(64)) if d == 64 else (None,) * 4
    if nonce is not None:
        reports.append((nonce, public, keys))
    for nonce, public, keys in reports:
        for i in (0, 1):
            with native.using("native"):
                a = s.expand(i, VK, nonce, public, keys[i])
            with native.using("python"):
                b = s.expand(i, VK, nonce, public, keys[i])
            assert FIELD128.to_ints(a.out) == FIELD128.to_ints(b.out)
            assert a.prep_share() == b.prep_share()


@pytest.mark.skipif(sparse._core is None, reason="the native sparse core is not built here")
@pytest.mark.parametrize("d", [2, 3, 100, 10_000])
def test_native_and_numpy_clients_make_the_same_report(d: int) -> None:
    s = SparseOnehot(d)
    for alpha, weight in ((0, 1), (d - 1, 1), (d // 2, 10**6)):
        nonce, rand = os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE)
        with native.using("native"):
            a = s.gen(alpha, nonce, rand, weight)
        with native.using("python"):
            b = s.gen(alpha, nonce, rand, weight)
        assert a == b


@pytest.mark.skipif(sparse._core is None, reason="the native sparse core is not built here")
def test_a_batch_on_several_threads_sums_as_on_one() -> None:
    """expand_batch on 4 threads: the same prep shares and, after adding the
    threads' wide accumulators (carries across the limbs), the same sum as
    one thread; a report that does not decode gets no share."""
    s = SparseOnehot(5000)  # 2^13 leaves: threads are used from 2^12
    reports = []
    for i in range(64):
        nonce = os.urandom(NONCE_SIZE)
        public, keys = s.gen((77 * i) % 5000, nonce, os.urandom(RAND_SIZE))
        reports.append((nonce, public, keys[1]))
    reports[5] = (reports[5][0], reports[5][1][:-1], reports[5][2])
    one, shares1 = s.expand_batch(1, VK, reports, threads=1)
    four, shares4 = s.expand_batch(1, VK, reports, threads=4)
    assert (
        shares1 == shares4
        and shares1[5] is None
        and all(x for i, x in enumerate(shares1) if i != 5)
    )
    assert FIELD128.to_ints(one.value()) == FIELD128.to_ints(four.value())


@pytest.mark.skipif(sparse._core is None, reason="the native sparse core is not built here")
def test_wide_accumulators_add_with_their_carries() -> None:
    s = SparseOnehot(4)
    a, b = s.accumulator(), s.accumulator()
    assert a.wide is not None and b.wide is not None
    top = np.uint64(2**64 - 1)
    a.wide[:] = [[top, top, 0], [top, 0, 0], [0, top, 1], [5, 6, 7]]
    b.wide[:] = [[1, 0, 0], [1, 0, 0], [0, 1, 0], [top, top, 0]]
    want = []
    for x, y in zip(a.wide.tolist(), b.wide.tolist(), strict=True):
        vx = x[0] + (x[1] << 64) + (x[2] << 128)
        vy = y[0] + (y[1] << 64) + (y[2] << 128)
        want.append((vx + vy) % P)
    a.add(b)
    assert FIELD128.to_ints(a.value()) == want
