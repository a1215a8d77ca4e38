"""The generic FLP of svtagg.vdaf: gadget polynomials agree with the gadgets, a
multi-gadget circuit with dependent calls proves and verifies, and the proof
system's soundness where it matters — out-of-range measurements, a cheating
prover, a proof bound to another nonce and a wrong joint-randomness part are
all rejected."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from svtagg.vdaf.circuits import Count, Histogram, MeasurementError, Sum, SumVec
from svtagg.vdaf.field import FIELD64, FIELD128, Field, Vec, next_power_of_2, ntt, poly_eval
from svtagg.vdaf.flp import (
    FlpError,
    FlpGeneric,
    Gadget,
    GadgetCall,
    Mul,
    ParallelSum,
    PolyEval,
    eval_circuit,
    gadget_poly,
    range2,
)
from svtagg.vdaf.prio3 import (
    NONCE_SIZE,
    PrepShare,
    Prio3,
    VerifyError,
    prio3_count,
    prio3_histogram,
    prio3_sum,
    prio3_sum_vec,
    run_prio3,
)

RNG = random.Random(2024)


#: Every test here runs on the native field core and on the Python reference.
pytestmark = pytest.mark.usefixtures("vdaf_backend")


def rand_vec(f: Field, n: int) -> Vec:
    return f.vec([RNG.randrange(f.modulus) for _ in range(n)])


@pytest.mark.parametrize(
    "g",
    [Mul(), range2(), PolyEval((0, -23, 1, 3)), ParallelSum(Mul(), 5), ParallelSum(range2(), 3)],
    ids=["Mul", "Range2", "PolyEval", "ParallelSum(Mul)", "ParallelSum(Range2)"],
)
@pytest.mark.parametrize("p", [1, 2, 8])
def test_gadget_polynomial_agrees_with_the_gadget(g: Gadget, p: int) -> None:
    """G(w(t)) = gadget(w_1(t), ..., w_a(t)) at a random t, for wires at P roots."""
    f = FIELD128
    wires = rand_vec(f, g.arity * p).reshape(g.arity, p)
    poly = gadget_poly(f, g, wires)
    assert len(poly) == g.degree * (p - 1) + 1
    t = RNG.randrange(f.modulus)
    at_t = poly_eval(f, ntt(f, wires, inverse=True), t)
    assert f.to_int(poly_eval(f, poly, t)) == f.to_int(g.eval(f, at_t.reshape(g.arity, 1))[0])


def test_polyeval_strips_and_refuses_zero() -> None:
    assert PolyEval((1, 2, 0, 0)).degree == 1
    with pytest.raises(ValueError):
        PolyEval((0, 0))


@dataclass
class TwoGadgets:
    """A circuit whose later gadget calls take earlier outputs (two batches to one
    gadget): x² by the first gadget, then x·x² and x²·x³ by the second; C = x^5 − x,
    so it accepts 0 and the 4th roots of unity (1 among them) and refuses 2 or 3."""

    field: Field = FIELD64
    gadgets: Sequence[Gadget] = (Mul(), Mul())
    gadget_calls: Sequence[int] = (1, 2)
    meas_len: int = 1
    joint_rand_len: int = 0
    output_len: int = 1

    def eval(self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]) -> int:
        f = self.field
        x = meas[:1]
        sq = calls[0](np.stack([x, x]))
        cube = calls[1](np.stack([x, sq]))
        fifth = calls[1](np.stack([sq, cube]))
        return f.to_int(f.sub(fifth, x)[0])

    def encode(self, measurement: object) -> Vec:
        return self.field.vec([measurement])

    def truncate(self, meas: Vec) -> Vec:
        return meas

    def decode(self, output: Vec, num_measurements: int) -> object:
        return self.field.to_int(output[0])


def run_flp(flp: FlpGeneric, meas: Vec, num_shares: int = 2) -> bool:
    """Prove, share meas and proof additively, query each share, decide."""
    f = flp.field
    joint_rand = rand_vec(f, flp.joint_rand_len)
    proof = flp.prove(meas, rand_vec(f, flp.prove_rand_len), joint_rand)
    query_rand = rand_vec(f, flp.query_rand_len)
    meas_shares = [rand_vec(f, len(meas)) for _ in range(num_shares - 1)]
    proof_shares = [rand_vec(f, len(proof)) for _ in range(num_shares - 1)]
    meas_shares.append(f.sub(meas, f.sum(np.stack(meas_shares), axis=0)))
    proof_shares.append(f.sub(proof, f.sum(np.stack(proof_shares), axis=0)))
    verifier = f.zeros(flp.verifier_len)
    for m, pi in zip(meas_shares, proof_shares, strict=True):
        verifier = f.add(verifier, flp.query(m, pi, query_rand, joint_rand, num_shares))
    return flp.decide(verifier)


def test_multi_gadget_circuit_with_dependent_calls() -> None:
    flp = FlpGeneric(TwoGadgets())
    assert run_flp(flp, FIELD64.vec([1]))
    assert run_flp(flp, FIELD64.vec([0]), num_shares=3)
    assert not run_flp(flp, FIELD64.vec([2]))


def invalid_cases() -> list[tuple[str, Any, list[int]]]:
    """Encoded measurements outside each circuit's language (as integers: the
    vectors are made under the backend of the test)."""
    return [
        ("count=2", Count(), [2]),
        ("sum bit=2", Sum(8), [1, 2, 0, 0, 0, 0, 0, 0]),
        ("sum bit=-1", Sum(8), [0, -1, 0, 0, 0, 0, 0, 0]),
        ("sumvec 2^bits", SumVec(4, 3, 2), [0] * 9 + [2, 0, 0]),
        ("histogram two-hot", Histogram(5, 2), [1, 0, 0, 1, 0]),
        ("histogram empty", Histogram(5, 2), [0] * 5),
        ("histogram 2+(-1)", Histogram(5, 2), [2, -1, 0, 0, 0]),
    ]


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda c: c[0])
def test_out_of_range_measurement_is_rejected(case: tuple[str, Any, list[int]]) -> None:
    _, valid, ints = case
    meas = valid.field.vec(ints)
    flp = FlpGeneric(valid)
    joint_rand = rand_vec(valid.field, valid.joint_rand_len)
    assert eval_circuit(valid, meas, joint_rand) != 0
    assert not run_flp(flp, meas)


class LyingProver(FlpGeneric):
    """A broken prover: it proves an invalid measurement with gadget polynomials that
    claim every gadget call returned 0, so the circuit itself comes out 0 at the
    verifier; only the consistency check at the random point t can catch it."""

    def prove(self, meas: Vec, prove_rand: Vec, joint_rand: Vec) -> Vec:
        honest = super().prove(meas, prove_rand, joint_rand)
        f, parts, offset = self.field, [], 0
        for g, c in zip(self.valid.gadgets, self.valid.gadget_calls, strict=True):
            p = next_power_of_2(1 + c)
            poly_len = g.degree * (p - 1) + 1
            parts.append(honest[offset : offset + g.arity])
            values = f.zeros(p)  # G(α^0) free, G(α^k) = 0 for every call k
            values[:1] = f.vec([RNG.randrange(f.modulus)])
            lie = f.zeros(poly_len)
            lie[:p] = ntt(f, values, inverse=True)
            parts.append(lie)
            offset += g.arity + poly_len
        return np.concatenate(parts)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "valid, meas",
    [
        (Sum(4), [2, 0, 0, 5]),
        (SumVec(3, 2, 2), [3, 0, 1, 1, 0, 0]),
        (Histogram(5, 2), [2, -1, 0, 0, 0]),  # sums to 1, not one-hot
    ],
    ids=["Sum", "SumVec", "Histogram"],
)
def test_lying_gadget_polynomial_is_rejected(valid: Any, meas: list[int]) -> None:
    liar = LyingProver(valid)
    f = valid.field
    meas = f.vec(meas)
    joint_rand = rand_vec(f, valid.joint_rand_len)
    proof = liar.prove(meas, rand_vec(f, liar.prove_rand_len), joint_rand)
    verifier = liar.query(meas, proof, rand_vec(f, liar.query_rand_len), joint_rand, 1)
    assert f.to_int(verifier[0]) == 0  # the lie makes the circuit output 0 ...
    assert not liar.decide(verifier)  # ... but the gadget check at t fails


def test_degenerate_query_point_aborts() -> None:
    flp = FlpGeneric(Sum(3))  # 3 calls: P = 4, so t = 1 (= α^0) is degenerate
    f = flp.field
    meas = flp.encode(5)
    jr = rand_vec(f, 1)
    proof = flp.prove(meas, rand_vec(f, flp.prove_rand_len), jr)
    with pytest.raises(FlpError):
        flp.query(meas, proof, f.vec([f.root(4)]), jr, 1)
    with pytest.raises(FlpError):
        flp.decide(f.zeros(flp.verifier_len + 1))


# -- Prio3 end to end and its binding checks -----------------------------------------

INSTANCES: dict[str, tuple[Prio3, list[Any], Any]] = {
    "count": (prio3_count(), [0, 1, 1, 0, 1], 3),
    "sum": (prio3_sum(8), [0, 147, 1, 0, 11, 0], 159),
    "sumvec": (prio3_sum_vec(3, 4, 2, shares=3), [[1, 2, 15], [0, 0, 1]], [1, 2, 16]),
    "histogram": (prio3_histogram(7, 3), [0, 6, 6, 2], [1, 0, 1, 0, 0, 0, 2]),
}


@pytest.mark.parametrize("name", list(INSTANCES))
def test_run_prio3_end_to_end(name: str) -> None:
    vdaf, measurements, want = INSTANCES[name]
    nonces = [os.urandom(NONCE_SIZE) for _ in measurements]
    assert run_prio3(vdaf, os.urandom(16), measurements, nonces) == want


@pytest.mark.parametrize(
    "vdaf, bad",
    [
        (prio3_count(), 2),
        (prio3_sum(4), 16),
        (prio3_sum(4), -1),
        (prio3_sum_vec(2, 4, 2), [1, 16]),
        (prio3_sum_vec(2, 4, 2), [1]),
        (prio3_histogram(4, 2), 4),
        (prio3_count(), True),
    ],
)
def test_encode_refuses_out_of_domain_measurements(vdaf: Prio3, bad: object) -> None:
    with pytest.raises(MeasurementError):
        vdaf.shard(bad, bytes(NONCE_SIZE))


def prepare(
    vdaf: Prio3, verify_key: bytes, nonce: bytes, public: Any, inputs: Any
) -> tuple[list[Any], list[PrepShare]]:
    states, shares = [], []
    for j in range(vdaf.shares):
        st, ps = vdaf.prep_init(verify_key, j, nonce, public, inputs[j])
        states.append(st)
        shares.append(ps)
    return states, shares


def finish(vdaf: Prio3, states: list[Any], shares: list[PrepShare]) -> list[Vec]:
    msg = vdaf.prep_shares_to_prep(shares)
    return [vdaf.prep_next(st, msg) for st in states]


JOINT_RAND = {
    "sum": (prio3_sum(8), 200),
    "sumvec": (prio3_sum_vec(3, 4, 2), [1, 2, 15]),
    "histogram": (prio3_histogram(7, 3), 5),
}


@pytest.mark.parametrize("name", list(JOINT_RAND))
def test_broken_client_out_of_range_report_is_rejected(name: str) -> None:
    """A client that skips encoding checks and shards an invalid vector is refused
    by the aggregators' decision."""
    vdaf, _ = JOINT_RAND[name]
    bad = vdaf.field.zeros(vdaf.flp.meas_len)
    bad[:1] = vdaf.field.vec([2])  # a "bit" of 2 (and, for the histogram, a weight of 2)
    seeds = [os.urandom(16) for _ in range(vdaf.rand_size // 16)]
    nonce, key = os.urandom(NONCE_SIZE), os.urandom(16)
    public, inputs = vdaf.shard_encoded(bad, nonce, seeds)
    states, shares = prepare(vdaf, key, nonce, public, inputs)
    with pytest.raises(VerifyError):
        finish(vdaf, states, shares)


@pytest.mark.parametrize("name", list(JOINT_RAND))
def test_proof_bound_to_another_nonce_fails(name: str) -> None:
    vdaf, m = JOINT_RAND[name]
    key, nonce, other = os.urandom(16), os.urandom(NONCE_SIZE), os.urandom(NONCE_SIZE)
    public, inputs = vdaf.shard(m, nonce)
    assert finish(vdaf, *prepare(vdaf, key, nonce, public, inputs))  # control: accepted
    with pytest.raises(VerifyError):
        finish(vdaf, *prepare(vdaf, key, other, public, inputs))


@pytest.mark.parametrize("name", list(JOINT_RAND))
@pytest.mark.parametrize("who", [0, 1])
def test_wrong_joint_randomness_part_fails(name: str, who: int) -> None:
    vdaf, m = JOINT_RAND[name]
    key, nonce = os.urandom(16), os.urandom(NONCE_SIZE)
    public, inputs = vdaf.shard(m, nonce)
    assert public is not None
    forged = list(public)
    forged[who] = bytes(b ^ 1 for b in forged[who])  # one flipped bit in a public part
    with pytest.raises(VerifyError):
        finish(vdaf, *prepare(vdaf, key, nonce, forged, inputs))
    # An aggregator sending a wrong part in its prep share is caught as well.
    states, shares = prepare(vdaf, key, nonce, public, inputs)
    part = shares[who].joint_rand_part
    assert part is not None
    shares[who] = PrepShare(shares[who].verifier, bytes(16 - len(part)) + part[::-1])
    with pytest.raises(VerifyError):
        finish(vdaf, states, shares)


def test_count_without_joint_randomness_binds_query_to_the_verify_key() -> None:
    """Count has no joint randomness; a tampered helper share is still caught."""
    vdaf = prio3_count()
    key, nonce = os.urandom(16), os.urandom(NONCE_SIZE)
    public, inputs = vdaf.shard(1, nonce)
    states, shares = prepare(vdaf, key, nonce, public, inputs)
    f = vdaf.field
    assert f.to_ints(f.sum(np.stack(finish(vdaf, states, shares)), axis=0)) == [1]  # control
    leader = inputs[0]
    assert leader.meas is not None
    shifted = type(leader)(meas=f.add(leader.meas, f.vec([1])), proof=leader.proof)
    states, shares = prepare(vdaf, key, nonce, public, [shifted, inputs[1]])  # now encodes 2
    with pytest.raises(VerifyError):
        finish(vdaf, states, shares)
