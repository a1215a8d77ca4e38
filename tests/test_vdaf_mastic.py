"""Mastic (vdaf/mastic.py) against every published vector of
draft-mouris-cfrg-mastic-04 (tests/vectors/mastic/04), then the hostile
reports a server must refuse: a weight out of range, two points, a key
tampered for one aggregator, a counter that is not one, and a prover without
the proof's correction as the negative control of the weight check."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from svtagg.vdaf.field import FIELD64, FIELD128
from svtagg.vdaf.flp13 import Count, Flp, FlpError, Histogram, MultihotCountVec, Sum, SumVec
from svtagg.vdaf.mastic import (
    NONCE_SIZE,
    VERIFY_KEY_SIZE,
    AggParam,
    Mastic,
    MasticError,
    mastic_count,
    mastic_histogram,
    mastic_multihot,
    mastic_sum,
    mastic_sum_vec,
)

VECTORS = Path(__file__).parent / "vectors" / "mastic" / "04"
FILES = sorted(p.name for p in VECTORS.glob("*.json"))


def instance(name: str, v: dict) -> Mastic:  # type: ignore[type-arg]
    bits = v["vidpf_bits"]
    kind = name.split("_")[0]
    if kind == "MasticCount":
        return mastic_count(bits)
    if kind == "MasticSum":
        return mastic_sum(bits, v["max_measurement"])
    if kind == "MasticSumVec":
        return mastic_sum_vec(bits, v["length"], v["bits"], v["chunk_length"])
    if kind == "MasticHistogram":
        return mastic_histogram(bits, v["length"], v["chunk_length"])
    if kind == "MasticMultihotCountVec":
        return mastic_multihot(bits, v["length"], v["max_weight"], v["chunk_length"])
    raise AssertionError(name)


def decode_agg_param(m: Mastic, data: bytes) -> AggParam:
    level = int.from_bytes(data[:2], "big")
    count = int.from_bytes(data[2:6], "big")
    size = (level + 1 + 7) // 8
    prefixes = []
    for i in range(count):
        raw = data[6 + size * i : 6 + size * (i + 1)]
        prefixes.append(tuple(bool(raw[j // 8] >> (7 - j % 8) & 1) for j in range(level + 1)))
    weight_check = bool(data[6 + size * count])
    agg = AggParam(level, tuple(prefixes), weight_check)
    assert agg.encode() == data
    return agg


def test_all_nine_vectors_are_present() -> None:
    assert len(FILES) == 9


@pytest.mark.parametrize("name", FILES)
def test_the_drafts_vector(name: str) -> None:
    v = json.loads((VECTORS / name).read_text())
    m = instance(name, v)
    ctx, verify_key = bytes.fromhex(v["ctx"]), bytes.fromhex(v["verify_key"])
    agg = decode_agg_param(m, bytes.fromhex(v["agg_param"]))
    out_shares: list[list[list[int]]] = [[], []]
    for prep in v["prep"]:
        alpha, weight = prep["measurement"]
        nonce, rand = bytes.fromhex(prep["nonce"]), bytes.fromhex(prep["rand"])
        words, shares = m.shard(ctx, alpha, weight, nonce, rand)
        assert m.encode_public_share(words).hex() == prep["public_share"]
        assert m.decode_public_share(bytes.fromhex(prep["public_share"])) == words
        assert [m.encode_input_share(s).hex() for s in shares] == prep["input_shares"]
        states, prep_shares = zip(
            *(m.prep_init(verify_key, ctx, i, agg, nonce, words, shares[i]) for i in (0, 1)),
            strict=True,
        )
        assert [m.encode_prep_share(s).hex() for s in prep_shares] == prep["prep_shares"][0]
        msg = m.prep_shares_to_prep(ctx, agg, prep_shares)
        assert (msg or b"").hex() == prep["prep_messages"][0]
        for i in (0, 1):
            out = m.prep_next(states[i], msg)
            size = m.field.encoded_size
            assert [x.to_bytes(size, "little").hex() for x in out] == prep["out_shares"][i]
            out_shares[i].append(out)
    agg_shares = [m.aggregate(agg, out_shares[i]) for i in (0, 1)]
    assert [m.encode_agg_share(s).hex() for s in agg_shares] == v["agg_shares"]
    assert m.unshard(agg, agg_shares) == v["agg_result"]


# ------------------------------------------------------------------ hostile reports

CTX = b"svtagg mastic test"
KEY = os.urandom(VERIFY_KEY_SIZE)


def run(m: Mastic, agg: AggParam, words, shares, nonce):  # type: ignore[no-untyped-def]
    pairs = [m.prep_init(KEY, CTX, i, agg, nonce, words, shares[i]) for i in (0, 1)]
    msg = m.prep_shares_to_prep(CTX, agg, [s for _, s in pairs])
    return [m.prep_next(st, msg) for st, _ in pairs]


def fresh(m: Mastic, alpha, weight):  # type: ignore[no-untyped-def]
    nonce = os.urandom(NONCE_SIZE)
    words, shares = m.shard(CTX, alpha, weight, nonce, os.urandom(m.rand_size))
    return words, shares, nonce


def first_level(bits: int) -> AggParam:
    return AggParam(0, ((False,), (True,)), True)


@pytest.mark.parametrize(
    "make,weight",
    [
        (lambda: mastic_count(4), 1),
        (lambda: mastic_sum(4, 5), 5),
        (lambda: mastic_histogram(4, 5, 2), 3),
        (lambda: mastic_multihot(4, 6, 3, 2), [1, 0, 1, 0, 0, 1]),
    ],
)
def test_honest_reports_add_up_at_every_level(make, weight) -> None:  # type: ignore[no-untyped-def]
    m = make()
    alphas = [(True, False, True, True), (True, False, False, False), (False,) * 4]
    reports = [fresh(m, a, weight) for a in alphas]
    for level in range(4):
        prefixes = tuple(sorted({a[: level + 1] for a in alphas}))
        agg = AggParam(level, prefixes, level == 0)
        outs = [run(m, agg, *r) for r in reports]
        result = m.unshard(agg, [m.aggregate(agg, [o[i] for o in outs]) for i in (0, 1)])
        for x, got in zip(prefixes, result, strict=True):
            n = sum(a[: level + 1] == x for a in alphas)
            enc = m.circuit.truncate(m.circuit.encode(weight))
            assert got == m.circuit.decode([e * n for e in enc], n)


def test_a_weight_out_of_range_is_refused() -> None:
    """A count of 2 slipped past the encoder: the FLP refuses it."""
    m = mastic_count(3)
    words, shares, nonce = fresh(m, (True, True, False), 1)
    # rebuild the report with β = (1, 2): the encoder would refuse 2
    m.circuit.encode = lambda w: [2]  # type: ignore[method-assign]
    words, shares, nonce = fresh(m, (True, True, False), 1)
    with pytest.raises(MasticError, match="FLP verification failed"):
        run(m, first_level(3), words, shares, nonce)


def test_a_sum_over_its_maximum_is_refused() -> None:
    m = mastic_sum(3, 5)
    bad = Sum(FIELD64, 7)  # encodes 7 with the offset of max 7 (zero)
    m.circuit.encode = lambda w: bad.encode(7)[:3] + m.circuit._bits(7, 3)  # type: ignore[method-assign]
    words, shares, nonce = fresh(m, (False, True, True), 0)
    with pytest.raises(MasticError, match="FLP"):
        run(m, first_level(3), words, shares, nonce)


@pytest.mark.parametrize("part", ["seed", "payload", "ctrl", "proof"])
def test_a_tampered_correction_word_is_refused(part: str) -> None:
    m = mastic_count(4)
    words, shares, nonce = fresh(m, (True, False, True, False), 1)
    w = words[1]
    bad = {
        "seed": replace(w, seed=bytes([w.seed[0] ^ 4]) + w.seed[1:]),
        "payload": replace(w, payload=((w.payload[0] + 1) % FIELD64.modulus, *w.payload[1:])),
        "ctrl": replace(w, ctrl=(not w.ctrl[0], w.ctrl[1])),
        "proof": replace(w, proof=bytes([w.proof[0] ^ 1]) + w.proof[1:]),
    }[part]
    words = [*words[:1], bad, *words[2:]]
    with pytest.raises(MasticError, match="VIDPF verification failed"):
        # level 1 walks the tampered word for both children of the first level
        run(
            m,
            AggParam(1, ((True, False), (True, True), (False, False)), False),
            words,
            shares,
            nonce,
        )


def test_a_key_changed_for_one_aggregator_is_refused() -> None:
    m = mastic_count(4)
    words, shares, nonce = fresh(m, (True, False, True, False), 1)
    helper = replace(shares[1], key=bytes([shares[1].key[0] ^ 2]) + shares[1].key[1:])
    with pytest.raises(MasticError, match="VIDPF verification failed"):
        run(m, first_level(4), words, (shares[0], helper), nonce)


def test_two_points_are_refused() -> None:
    """A last correction word whose control bits keep both children live: the
    payload shares then put weight on two leaves (checked below, so the report
    really is two-hot), and no node-proof correction can make both agree."""
    m = mastic_count(4)
    alpha = (True, False, True, False)
    words, shares, nonce = fresh(m, alpha, 1)
    w = words[3]
    two = [*words[:3], replace(w, ctrl=(w.ctrl[0], not w.ctrl[1]))]  # lose = the right child
    leaves = ((True, False, True, False), (True, False, True, True))
    p = FIELD64.modulus
    outs = [m.vidpf.eval_prefixes(i, two, shares[i].key, leaves, CTX, nonce)[0] for i in (0, 1)]
    sums = [(a[0] + b[0]) % p for a, b in zip(outs[0], outs[1], strict=True)]
    assert all(sums), "the tampered tree should carry weight on both leaves"
    with pytest.raises(MasticError, match="VIDPF verification failed"):
        run(m, AggParam(3, leaves, False), two, shares, nonce)
    assert run(m, AggParam(3, leaves, False), words, shares, nonce)


def test_a_counter_other_than_one_is_refused() -> None:
    """β = (2, 1): a weight of one counted twice; the counter check refuses it."""
    m = mastic_count(3)
    gen = m.vidpf.gen
    m.vidpf.gen = lambda a, beta, *r: gen(a, [2, *beta[1:]], *r)  # type: ignore[method-assign]
    words, shares, nonce = fresh(m, (False, False, True), 1)
    with pytest.raises(MasticError, match="VIDPF verification failed"):
        run(m, AggParam(2, ((False, False, True),), False), words, shares, nonce)


def test_the_negative_control_a_prover_that_lies_is_caught() -> None:
    """A proof whose gadget polynomial is off by one at one coefficient: the
    verifier must reject it (if it did not, the weight check would be blind)."""
    for circuit, meas in [
        (Count(FIELD64), [1]),
        (Histogram(FIELD128, 5, 2), [0, 0, 1, 0, 0]),
        (SumVec(FIELD128, 3, 2, 2), [1, 0, 1, 1, 0, 0]),
        (
            MultihotCountVec(FIELD128, 4, 2, 2),
            MultihotCountVec(FIELD128, 4, 2, 2).encode([1, 0, 1, 0]),
        ),
    ]:
        flp, p = Flp(circuit), circuit.field.modulus
        jr = [int.from_bytes(os.urandom(8), "little") % p for _ in range(circuit.joint_rand_len)]
        pr = [int.from_bytes(os.urandom(8), "little") % p for _ in range(circuit.prove_rand_len)]
        qr = [int.from_bytes(os.urandom(8), "little") % p for _ in range(circuit.query_rand_len)]
        proof = flp.prove(meas, pr, jr)
        assert flp.decide(flp.query(meas, proof, qr, jr, 1))
        lie = list(proof)
        lie[-1] = (lie[-1] + 1) % p
        assert not flp.decide(flp.query(meas, lie, qr, jr, 1))
        # an invalid measurement with an honestly computed proof is refused
        bad = [(x + 3) % p for x in meas]
        assert not flp.decide(flp.query(bad, flp.prove(bad, pr, jr), qr, jr, 1))


def test_a_test_point_on_the_roots_is_refused() -> None:
    c = Count(FIELD64)
    flp = Flp(c)
    proof = flp.prove([1], [5, 7], [])
    with pytest.raises(FlpError, match="root of unity"):
        flp.query([1], proof, [1], [], 1)


def test_malformed_public_shares_are_refused() -> None:
    m = mastic_count(3)
    words, _, _ = fresh(m, (True, False, True), 1)
    data = m.encode_public_share(words)
    with pytest.raises(MasticError, match="bytes"):
        m.decode_public_share(data[:-1])
    with pytest.raises(MasticError, match="padding"):
        m.decode_public_share(bytes([data[0] | 0x80]) + data[1:])


def test_the_drafts_checks_accept_a_split_report() -> None:
    """A finding about draft 04, kept as a test of the draft's behaviour: the
    same key to both aggregators, zero seed corrections, control corrections
    that keep one child live per level and both at the last, and output
    corrections of 1 then ½ pass the onehot, counter and payload checks (and
    the FLP): weight ½ on two sibling leaves, which the aggregate decodes as
    (p + 1)/2.  Node proofs on the seed alone cannot see the control bits;
    vdaf/sparse.py and vdaf/crawl.py key their proofs by the bit
    (tests/test_vdaf_sparse.py, tests/test_vdaf_crawl.py refuse the same
    construction)."""
    from svtagg.vdaf.vidpf import CorrectionWord

    m = mastic_count(3)
    p = m.field.modulus
    for _ in range(64):
        nonce, k = os.urandom(NONCE_SIZE), os.urandom(16)
        seed, t, signs, ctrls = k, [False, True], [], []
        for level in range(3):
            raw = m.vidpf.extend(seed, CTX, nonce)
            cw = (True, True) if level == 2 else (True, False)
            # the live child's bit on each aggregator: raw, flipped where the parent bit is 1
            child_t = [[raw[1][d] ^ (t[b] and cw[d]) for b in (0, 1)] for d in (0, 1)]
            ctrls.append(cw)
            signs.append([1 if ct[0] and not ct[1] else -1 for ct in child_t])
            seed, t = m.vidpf.convert(raw[0][0], CTX, nonce)[0], child_t[0]
        if signs[2][0] == signs[2][1]:
            break
    else:
        raise AssertionError("no key with agreeing signs")
    half = pow(2, -1, p)
    outs = [signs[0][0] % p, signs[1][0] % p, signs[2][0] * half % p]
    words = [CorrectionWord(bytes(16), ctrls[i], (outs[i], outs[i]), bytes(32)) for i in range(3)]
    _, honest = m.shard(CTX, (True, False, True), 1, nonce, os.urandom(m.rand_size))
    shares = (replace(honest[0], key=k), replace(honest[1], key=k))
    leaves = ((False, False, False), (False, False, True))
    results = []
    for agg in (AggParam(0, ((False,), (True,)), True), AggParam(2, leaves, False)):
        outs_ = run(m, agg, words, shares, nonce)  # no MasticError: the draft accepts it
        results.append(m.unshard(agg, [m.aggregate(agg, [o]) for o in outs_]))
    # One unit on the left prefix at the first level; split in halves at the last.
    assert results == [[1, 0], [half, half]]
