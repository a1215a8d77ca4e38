"""RangeVec and MultiHot (vdaf/ranged.py), the project's own Prio3 circuits.

They have no official test vectors, so they are held to completeness and
soundness directly: honest measurements (random, and the extremes) are accepted
and aggregate to the right sums on both backends, through the per-report and
the batched paths, byte for byte the same; encodings outside the language,
proved honestly by the FLP (so the proof is well formed and only the circuit
can object), are rejected by `prep_shares_to_prep`, as are a tampered proof
share and a prover lying about its gadget outputs; `encode` refuses
out-of-range measurements."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest

from svtagg.vdaf import native
from svtagg.vdaf.circuits import MeasurementError
from svtagg.vdaf.field import Vec
from svtagg.vdaf.flp import FlpGeneric, eval_circuit
from svtagg.vdaf.prio3 import (
    ALGORITHM_ID_MULTIHOT,
    ALGORITHM_ID_RANGE_VEC,
    NONCE_SIZE,
    InputShare,
    PrepShare,
    Prio3,
    VerifyError,
    prio3_multihot,
    prio3_range_vec,
    run_prio3,
)
from svtagg.vdaf.ranged import MultiHot, RangeVec, sqrt_chunk
from tests.test_vdaf_flp import LyingProver

#: Every test here runs on the native field core and on the Python reference.
pytestmark = pytest.mark.usefixtures("vdaf_backend")

RNG = random.Random(5301)


def range_values(length: int, frac_bits: int, count: int) -> list[list[int]]:
    """`count` honest RangeVec measurements: the extremes 0 and 2^F, all zero, all
    2^F, then random values (with 2^F − 1 and 1 among them)."""
    top = 2**frac_bits
    out = [
        [0] * length,
        [top] * length,
        [(0, top, top - 1, 1)[i % 4] for i in range(length)],
    ]
    while len(out) < count:
        out.append([RNG.choice([0, top, RNG.randrange(top + 1)]) for _ in range(length)])
    return out[:count]


def multihot_values(length: int, max_weight: int, count: int) -> list[list[int]]:
    """`count` honest MultiHot measurements: all zero, weight exactly max_weight
    (at both ends of the vector), then random weights up to max_weight."""
    out = [
        [0] * length,
        [1] * max_weight + [0] * (length - max_weight),
        [0] * (length - max_weight) + [1] * max_weight,
    ]
    while len(out) < count:
        ones = RNG.sample(range(length), RNG.randrange(max_weight + 1))
        out.append([int(j in ones) for j in range(length)])
    return out[:count]


#: name → (instance, honest measurements); 2 and 3 aggregators, default and
#: explicit chunk lengths, F at both ends of its range, max_weight with and
#: without an offset (offset = 2^w − 1 − max_weight).
CASES: dict[str, tuple[Prio3, list[list[int]]]] = {
    "rangevec": (prio3_range_vec(7, 4), range_values(7, 4, 6)),
    "rangevec-F1-3shares": (prio3_range_vec(5, 1, 3, shares=3), range_values(5, 1, 5)),
    "rangevec-F32": (prio3_range_vec(3, 32, 5), range_values(3, 32, 4)),
    "multihot": (prio3_multihot(12, 4), multihot_values(12, 4, 6)),
    "multihot-full-weight": (prio3_multihot(9, 9, 4), multihot_values(9, 9, 5)),
    "multihot-w1-3shares": (prio3_multihot(6, 1, shares=3), multihot_values(6, 1, 5)),
    "multihot-no-offset": (prio3_multihot(8, 3, 2), multihot_values(8, 3, 5)),
}


def column_sums(measurements: list[list[int]]) -> list[int]:
    return [sum(col) for col in zip(*measurements, strict=True)]


def nonces(count: int) -> list[bytes]:
    return [os.urandom(NONCE_SIZE) for _ in range(count)]


def prepare(
    vdaf: Prio3, key: bytes, nonce: bytes, public: Any, inputs: list[InputShare]
) -> tuple[list[Any], list[PrepShare]]:
    states, shares = [], []
    for j in range(vdaf.shares):
        st, ps = vdaf.prep_init(key, j, nonce, public, inputs[j])
        states.append(st)
        shares.append(ps)
    return states, shares


def seeds_for(vdaf: Prio3) -> list[bytes]:
    return [os.urandom(16) for _ in range(vdaf.rand_size // 16)]


# -- the instances ---------------------------------------------------------------------


def test_algorithm_ids_are_private_use_and_distinct() -> None:
    ids = {prio3_range_vec(2, 3).algorithm_id, prio3_multihot(4, 2).algorithm_id}
    assert ids == {ALGORITHM_ID_RANGE_VEC, ALGORITHM_ID_MULTIHOT} == {0xFFFF5301, 0xFFFF5302}
    assert all(0xFFFF0000 <= i <= 0xFFFFFFFF for i in ids)


def test_lengths_and_default_chunks() -> None:
    rv = RangeVec(100, 16)
    assert rv.meas_len == 100 * 17 and rv.output_len == 100
    assert rv.chunk_length == sqrt_chunk(100 * 18) == 42
    assert rv.gadget_calls == (-(-1700 // 42) + -(-100 // 42),)
    mh = MultiHot(1000, 10)
    assert (mh.weight_bits, mh.offset) == (4, 5)
    assert mh.meas_len == 1004 and mh.output_len == 1000
    assert mh.chunk_length == sqrt_chunk(1004) == 32
    assert MultiHot(8, 7).offset == 0 and MultiHot(8, 8).offset == 7
    assert RangeVec(4, 2, 3).chunk_length == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: RangeVec(0, 4),
        lambda: RangeVec(3, 0),
        lambda: RangeVec(3, 33),
        lambda: RangeVec(3, 4, 0),
        lambda: MultiHot(0, 1),
        lambda: MultiHot(5, 0),
        lambda: MultiHot(5, 6),
        lambda: MultiHot(5, 2, -1),
    ],
    ids=[
        "length 0",
        "F 0",
        "F 33",
        "chunk 0",
        "multihot length 0",
        "max_weight 0",
        "max_weight > length",
        "chunk -1",
    ],
)
def test_constructors_refuse_bad_parameters(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


def test_encodings() -> None:
    rv = RangeVec(3, 3)
    assert rv.field.to_ints(rv.encode([8, 5, 0])) == [0, 0, 0, 1] + [1, 0, 1, 0] + [0] * 4
    assert rv.field.to_ints(rv.encode(np.array([8, 5, 0]))) == rv.field.to_ints(
        rv.encode([8, 5, 0])
    )
    mh = MultiHot(6, 4)  # w = 3, offset = 3: weight 2 is encoded as 5
    assert mh.field.to_ints(mh.encode([0, 1, 0, 0, 1, 0])) == [0, 1, 0, 0, 1, 0, 1, 0, 1]
    assert mh.field.to_ints(mh.encode([0] * 6)) == [0] * 6 + [1, 1, 0]
    assert mh.field.to_ints(mh.encode([1, 1, 1, 1, 0, 0]))[6:] == [1, 1, 1]


@pytest.mark.parametrize(
    "vdaf, bad",
    [
        (prio3_range_vec(3, 4), [0, 17, 1]),  # 2^F + 1
        (prio3_range_vec(3, 4), [0, -1, 1]),
        (prio3_range_vec(3, 4), [0, 1]),
        (prio3_range_vec(3, 4), [0, 1.5, 1]),
        (prio3_range_vec(3, 4), [0, True, 1]),
        (prio3_range_vec(3, 4), 16),
        (prio3_range_vec(3, 4), "abc"),
        (prio3_range_vec(2, 32), [2**32 + 1, 0]),
        (prio3_multihot(5, 2), [1, 1, 1, 0, 0]),  # weight max_weight + 1
        (prio3_multihot(5, 2), [2, 0, 0, 0, 0]),
        (prio3_multihot(5, 2), [-1, 1, 0, 0, 0]),
        (prio3_multihot(5, 2), [1, 0, 0, 0]),
        (prio3_multihot(5, 2), 3),
    ],
)
def test_encode_refuses_out_of_range_measurements(vdaf: Prio3, bad: object) -> None:
    with pytest.raises(MeasurementError):
        vdaf.shard(bad, bytes(NONCE_SIZE))


# -- completeness ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_honest_measurements_are_accepted_and_summed(name: str) -> None:
    vdaf, measurements = CASES[name]
    result = run_prio3(vdaf, os.urandom(16), measurements, nonces(len(measurements)))
    assert result == column_sums(measurements)


@pytest.mark.parametrize("name", list(CASES))
def test_circuit_is_zero_on_every_honest_encoding(name: str) -> None:
    vdaf, measurements = CASES[name]
    valid, f = vdaf.flp.valid, vdaf.field
    for m in measurements:
        jr = f.vec([RNG.randrange(f.modulus) for _ in range(valid.joint_rand_len)])
        meas = valid.encode(m)
        assert eval_circuit(valid, meas, jr) == 0
        assert f.to_ints(valid.truncate(meas)) == m


@pytest.mark.parametrize("name", list(CASES))
def test_batched_paths_equal_the_single_report_functions(name: str) -> None:
    """shard_batch = shard and prep_init_batch = prep_init byte for byte, the same
    prep messages through prep_shares_to_prep_batch, and the right aggregate."""
    vdaf, measurements = CASES[name]
    rows = len(measurements)
    ns, rands, key = nonces(rows), [os.urandom(vdaf.rand_size) for _ in range(rows)], os.urandom(16)
    batch = vdaf.shard_batch(measurements, ns, rands)
    single = [vdaf.shard(m, n, r) for m, n, r in zip(measurements, ns, rands, strict=True)]
    for (pub, ins), (want_pub, want_ins) in zip(batch, single, strict=True):
        assert vdaf.encode_public_share(pub) == vdaf.encode_public_share(want_pub)
        assert [vdaf.encode_input_share(s) for s in ins] == [
            vdaf.encode_input_share(s) for s in want_ins
        ]
    batched = [
        vdaf.prep_init_batch(key, j, ns, [p for p, _ in batch], [ins[j] for _, ins in batch])
        for j in range(vdaf.shares)
    ]
    f = vdaf.field
    for i, (n, (pub, ins)) in enumerate(zip(ns, single, strict=True)):
        states, shares = prepare(vdaf, key, n, pub, ins)
        for j in range(vdaf.shares):
            b_state, b_share = batched[j][i]
            assert vdaf.encode_prep_share(b_share) == vdaf.encode_prep_share(shares[j])
            assert f.encode_vec(b_state.out_share) == f.encode_vec(states[j].out_share)
            assert b_state.corrected_joint_rand_seed == states[j].corrected_joint_rand_seed
    msgs = vdaf.prep_shares_to_prep_batch(
        [[batched[j][i][1] for j in range(vdaf.shares)] for i in range(rows)]
    )
    assert not any(isinstance(m, VerifyError) for m in msgs)
    for i in range(rows):
        shares = [batched[j][i][1] for j in range(vdaf.shares)]
        assert msgs[i] == vdaf.prep_shares_to_prep(shares)
    outs = [
        [vdaf.prep_next(batched[j][i][0], msgs[i]) for i in range(rows)]  # type: ignore[arg-type]
        for j in range(vdaf.shares)
    ]
    assert vdaf.unshard([vdaf.aggregate(o) for o in outs], rows) == column_sums(measurements)


@pytest.mark.parametrize("name", ["rangevec", "multihot-w1-3shares", "multihot-full-weight"])
def test_both_backends_give_the_same_bytes(vdaf_backend: str, name: str) -> None:
    """One report sharded with the same randomness and prepared from the same bytes
    under the native core and the reference, per report and batched: every message
    equal."""
    if vdaf_backend != "native":
        pytest.skip("compares the native core with the reference once")
    vdaf, measurements = CASES[name]
    m = measurements[-1]
    nonce, rand, key = os.urandom(NONCE_SIZE), os.urandom(vdaf.rand_size), os.urandom(16)

    def run() -> list[bytes]:
        public, inputs = vdaf.shard(m, nonce, rand)
        [(b_public, b_inputs)] = vdaf.shard_batch([m], [nonce], [rand])
        out = [vdaf.encode_public_share(public), vdaf.encode_public_share(b_public)]
        out += [vdaf.encode_input_share(s) for s in [*inputs, *b_inputs]]
        decoded = [vdaf.decode_input_share(j, out[2 + j]) for j in range(vdaf.shares)]
        states, shares = prepare(vdaf, key, nonce, public, decoded)
        out += [vdaf.encode_prep_share(ps) for ps in shares]
        for j in range(vdaf.shares):
            [(_, ps)] = vdaf.prep_init_batch(key, j, [nonce], [public], [decoded[j]])
            out.append(vdaf.encode_prep_share(ps))
        msg = vdaf.prep_shares_to_prep(shares)
        out.append(vdaf.encode_prep_msg(msg))
        out += [vdaf.encode_agg_share(vdaf.prep_next(st, msg)) for st in states]
        return out

    with native.using("python"):
        ref = run()
    with native.using("native"):
        nat = run()
    assert ref == nat


# -- soundness -------------------------------------------------------------------------


def range_entry(bits: list[int], length: int, frac_bits: int, at: int = 1) -> list[int]:
    """A RangeVec encoding (as integers) with entry `at` replaced by `bits`, the
    other entries honest values."""
    honest = [(3 * e) % (2**frac_bits + 1) for e in range(length)]
    out: list[int] = []
    for e, v in enumerate(honest):
        out += bits if e == at else [(v >> i) & 1 for i in range(frac_bits + 1)]
    return out


def multihot_encoding(entries: list[int], weight_digits: list[int]) -> list[int]:
    return entries + weight_digits


F = 4  # RangeVec(4, F = 4): entries of 5 bits, values in [0, 16]
MW = 3  # MultiHot(7, max_weight = 3): w = 2, offset = 0
MW5 = 5  # MultiHot(7, max_weight = 5): w = 3, offset = 2

#: (name, circuit, encoded measurement as integers): each is outside the circuit's
#: language, and each gets past one of the two checks.
INVALID: list[tuple[str, Any, list[int]]] = [
    # all bits, but 2^F + 1: only the range product catches it
    ("rangevec 2^F+1", RangeVec(4, F), range_entry([1, 0, 0, 0, 1], 4, F)),
    ("rangevec 2^(F+1)-1", RangeVec(4, F), range_entry([1] * 5, 4, F)),
    ("rangevec top+high bit", RangeVec(4, F, 3), range_entry([0, 0, 0, 1, 1], 4, F, at=3)),
    # a non-bit digit: the value 2 is in range, only the bit check catches it
    ("rangevec digit 2", RangeVec(4, F), range_entry([2, 0, 0, 0, 0], 4, F)),
    ("rangevec digit -1", RangeVec(4, F), range_entry([0, 0, 0, -1, 0], 4, F, at=0)),
    # top bit set and a low part L = 2 − 2 = 0: the range product is 0, the digits
    # are not bits
    ("rangevec L=0 non-bits", RangeVec(4, F), range_entry([2, -1, 0, 0, 1], 4, F)),
    ("multihot entry 2", MultiHot(7, MW), multihot_encoding([2, 0, 0, 0, 0, 0, 0], [0, 1])),
    # weight max_weight + 1, weight bits at their maximum 2^w − 1 (= max_weight here)
    ("multihot weight+1", MultiHot(7, MW), multihot_encoding([1, 1, 1, 1, 0, 0, 0], [1, 1])),
    (
        "multihot weight+1 offset",
        MultiHot(7, MW5),
        multihot_encoding([1, 1, 1, 1, 1, 1, 0], [1, 1, 1]),
    ),
    # weight max_weight + 1 with the equation satisfied by a digit of 2: 2 + 2 + 4 = 8
    (
        "multihot weight+1 digit 2",
        MultiHot(7, MW5),
        multihot_encoding([1, 1, 1, 1, 1, 1, 0], [2, 1, 1]),
    ),
    # an allowed weight, wrongly encoded (weight 2 + offset 2 = 4, claims 5 or 3)
    (
        "multihot wrong weight high",
        MultiHot(7, MW5),
        multihot_encoding([0, 1, 0, 1, 0, 0, 0], [1, 0, 1]),
    ),
    (
        "multihot wrong weight low",
        MultiHot(7, MW5),
        multihot_encoding([0, 1, 0, 1, 0, 0, 0], [1, 1, 0]),
    ),
    # weight 1 = claimed 1, but from the "entries" 2 and −1
    ("multihot 2 + (-1)", MultiHot(7, MW), multihot_encoding([2, -1, 0, 0, 0, 0, 0], [1, 0])),
]


def _prio3_of(valid: Any) -> Prio3:
    if isinstance(valid, RangeVec):
        return prio3_range_vec(valid.length, valid.frac_bits, valid.chunk_length)
    return prio3_multihot(valid.length, valid.max_weight, valid.chunk_length)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c[0])
def test_invalid_encoding_makes_the_circuit_nonzero(case: tuple[str, Any, list[int]]) -> None:
    _, valid, ints = case
    f = valid.field
    assert len(ints) == valid.meas_len
    jr = f.vec([RNG.randrange(f.modulus) for _ in range(valid.joint_rand_len)])
    assert eval_circuit(valid, f.vec(ints), jr) != 0


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c[0])
def test_honestly_proved_invalid_encoding_is_rejected(case: tuple[str, Any, list[int]]) -> None:
    """A client that skips the encoding checks: the crafted vector is sharded and
    proved by the real prover (shard_encoded), so the proof is a correct proof of a
    nonzero circuit output; the aggregators reject it, one report at a time and
    inside a batch of honest reports."""
    _, valid, ints = case
    vdaf = _prio3_of(valid)
    f, key = vdaf.field, os.urandom(16)
    nonce = os.urandom(NONCE_SIZE)
    public, inputs = vdaf.shard_encoded(f.vec(ints), nonce, seeds_for(vdaf))
    _, shares = prepare(vdaf, key, nonce, public, inputs)
    with pytest.raises(VerifyError):
        vdaf.prep_shares_to_prep(shares)

    honest = vdaf.flp.valid.encode(
        [0] * valid.length if isinstance(valid, MultiHot) else [2**valid.frac_bits] * valid.length
    )
    ns = nonces(3)
    reports = [vdaf.shard_encoded(honest, ns[0], seeds_for(vdaf))]
    reports.append(vdaf.shard_encoded(f.vec(ints), ns[1], seeds_for(vdaf)))
    reports.append(vdaf.shard_encoded(honest, ns[2], seeds_for(vdaf)))
    batched = [
        vdaf.prep_init_batch(key, j, ns, [p for p, _ in reports], [ins[j] for _, ins in reports])
        for j in range(vdaf.shares)
    ]
    msgs = vdaf.prep_shares_to_prep_batch(
        [[batched[j][i][1] for j in range(vdaf.shares)] for i in range(3)]
    )
    assert [isinstance(m, VerifyError) for m in msgs] == [False, True, False]


def _bump(f: Any, v: Vec, index: int) -> Vec:
    delta = f.zeros_as(v, len(v))
    delta[index : index + 1] = f.as_like(v, f.vec([1]))
    return f.add(v, delta)


@pytest.mark.parametrize("name", ["rangevec", "multihot"])
@pytest.mark.parametrize("where", ["seed", "first coefficient", "last coefficient"])
def test_tampered_proof_share_is_rejected(name: str, where: str) -> None:
    vdaf, measurements = CASES[name]
    key, nonce = os.urandom(16), os.urandom(NONCE_SIZE)
    public, inputs = vdaf.shard(measurements[1], nonce)
    _, shares = prepare(vdaf, key, nonce, public, inputs)
    assert vdaf.prep_shares_to_prep(shares) is not None  # control: accepted
    gadget = vdaf.flp.valid.gadgets[0]
    index = {"seed": 0, "first coefficient": gadget.arity, "last coefficient": -1}[where]
    leader = inputs[0]
    assert leader.proof is not None
    proof = _bump(vdaf.field, leader.proof, index % vdaf.flp.proof_len)
    tampered = InputShare(meas=leader.meas, proof=proof, blind=leader.blind)
    _, shares = prepare(vdaf, key, nonce, public, [tampered, *inputs[1:]])
    with pytest.raises(VerifyError):
        vdaf.prep_shares_to_prep(shares)


@pytest.mark.parametrize(
    "valid, ints",
    [
        (RangeVec(3, 2, 2), [1, 0, 1] + [0, 0, 1] + [1, 1, 1]),  # 5 and 7 > 4
        # weight 1 (+ offset 1 = 2, encoded [0, 1]) from the "entries" 2 and −1: the
        # weight equation holds, only the bit products are nonzero
        (MultiHot(5, 2, 2), [2, -1, 0, 0, 0] + [0, 1]),
    ],
    ids=["RangeVec", "MultiHot"],
)
def test_lying_gadget_polynomial_is_rejected(valid: Any, ints: list[int]) -> None:
    """A prover whose gadget polynomial claims every product is 0 makes the circuit
    output 0 for an invalid measurement; the check at the random point catches it."""
    liar = LyingProver(valid)
    f = valid.field
    meas = f.vec(ints)
    jr = f.vec([RNG.randrange(f.modulus) for _ in range(valid.joint_rand_len)])
    proof = liar.prove(
        meas, f.vec([RNG.randrange(f.modulus) for _ in range(liar.prove_rand_len)]), jr
    )
    qr = f.vec([RNG.randrange(f.modulus) for _ in range(liar.query_rand_len)])
    verifier = liar.query(meas, proof, qr, jr, 1)
    assert eval_circuit(valid, meas, jr) != 0
    assert f.to_int(verifier[0]) == 0  # the lie makes the circuit output 0 ...
    assert not liar.decide(verifier)  # ... but the gadget check at t fails


def test_offset_weight_check_is_split_between_the_shares() -> None:
    """The constant offset enters each of s shares as offset/s: with 3 additive
    shares of an honest encoding, the shares' circuit outputs add up to 0."""
    valid = MultiHot(7, MW5)
    f = valid.field
    meas = valid.encode([1, 0, 1, 1, 0, 1, 0])
    jr = f.vec([RNG.randrange(f.modulus) for _ in range(2)])
    parts = [f.vec([RNG.randrange(f.modulus) for _ in range(valid.meas_len)]) for _ in range(2)]
    parts.append(f.sub(meas, f.add(parts[0], parts[1])))
    flp = FlpGeneric(valid)
    proof = flp.prove(
        meas, f.vec([RNG.randrange(f.modulus) for _ in range(flp.prove_rand_len)]), jr
    )
    proof_parts = [
        f.vec([RNG.randrange(f.modulus) for _ in range(flp.proof_len)]) for _ in range(2)
    ]
    proof_parts.append(f.sub(proof, f.add(proof_parts[0], proof_parts[1])))
    qr = f.vec([RNG.randrange(f.modulus) for _ in range(flp.query_rand_len)])
    verifier = f.zeros(flp.verifier_len)
    for m, pi in zip(parts, proof_parts, strict=True):
        verifier = f.add(verifier, flp.query(m, pi, qr, jr, 3))
    assert f.to_int(verifier[0]) == 0
    assert flp.decide(verifier)
