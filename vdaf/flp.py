"""The generic fully linear proof of draft-irtf-cfrg-vdaf-07 §7.3 ([BBCGGI19], Thm 4.3).

A validity circuit C (vdaf/circuits.py) maps an encoded measurement to 0 iff
it is valid; its non-affine work is done by gadgets (Mul, PolyEval, ParallelSum).
The prover records the inputs of every gadget call as "wire" values, sets
wire polynomials through them at the P-th roots of unity α^0..α^(P-1) (α^0 a
random seed, α^k the k-th call), and sends the seeds and the gadget
polynomial G(wires(x)).  The verifier reruns C on its share with each gadget
call k answered by G(α^k), and checks at one random point t that G is
consistent with the wire polynomials; everything it computes is linear in
(measurement, proof), so the aggregators do it on shares and add.

Gadgets and circuits are vectorised: a gadget evaluates a batch of calls
(inputs of shape (arity, calls)), and a circuit hands each gadget all its calls
at once, which is what makes the numpy loops long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from svtagg.vdaf import native as _backend
from svtagg.vdaf.field import (
    Field,
    Vec,
    bit_check_at,
    dot_last,
    mul_cols,
    next_power_of_2,
    ntt,
    pair_products,
    poly_eval,
    poly_eval_at_roots,
    powers_rows,
    weighted_rows,
)


class FlpError(ValueError):
    """Malformed FLP input: wrong lengths (draft: ERR_INPUT) or a degenerate query point
    (ERR_ABORT)."""


# -- gadgets (draft §7.3.1) ---------------------------------------------------------


class Gadget(Protocol):
    """A gadget: `eval` maps inputs of shape (arity, ...) to outputs of shape (...)."""

    @property
    def arity(self) -> int: ...

    @property
    def degree(self) -> int: ...

    def eval(self, f: Field, x: Vec) -> Vec: ...


@dataclass(frozen=True)
class Mul:
    """x0 · x1 (degree 2)."""

    arity: int = 2
    degree: int = 2

    def eval(self, f: Field, x: Vec) -> Vec:
        return f.mul(x[0], x[1])


@dataclass(frozen=True)
class PolyEval:
    """p(x0) for a fixed polynomial p (coefficients lowest first; degree = deg p)."""

    coeffs: tuple[int, ...]

    def __post_init__(self) -> None:
        stripped = list(self.coeffs)
        while stripped and stripped[-1] == 0:
            stripped.pop()
        if not stripped:
            raise ValueError("PolyEval needs a nonzero polynomial")
        object.__setattr__(self, "coeffs", tuple(stripped))

    @property
    def arity(self) -> int:
        return 1

    @property
    def degree(self) -> int:
        return len(self.coeffs) - 1

    def eval(self, f: Field, x: Vec) -> Vec:
        acc = f.add(f.zeros_as(x, *x[0].shape), self.coeffs[-1] % f.modulus)
        for c in reversed(self.coeffs[:-1]):
            acc = f.add(f.mul(acc, x[0]), c % f.modulus)
        return acc


def range2() -> PolyEval:
    """The draft-07 gadget Range2, x^2 − x: a bit check, as PolyEval(−x + x^2)."""
    return PolyEval((0, -1, 1))


@dataclass(frozen=True)
class ParallelSum:
    """Σ_i sub(x[i·a : (i+1)·a]) over `count` copies of a sub-gadget of arity a."""

    sub: Gadget
    count: int

    @property
    def arity(self) -> int:
        return self.sub.arity * self.count

    @property
    def degree(self) -> int:
        return self.sub.degree

    def eval(self, f: Field, x: Vec) -> Vec:
        if isinstance(self.sub, Mul):
            return pair_products(f, x, self.count)  # one native pass, no strided copies
        per_copy = x.reshape((self.count, self.sub.arity) + x.shape[1:]).swapaxes(0, 1)
        return f.sum(self.sub.eval(f, per_copy), axis=0)


def gadget_poly(f: Field, g: Gadget, wires: Vec) -> Vec:
    """The gadget polynomial G(w_1(x), ..., w_arity(x)), coefficients lowest first.

    `wires` (arity × P, or arity × reports × P for a batch) are the wire values
    at α^0..α^(P-1).  G has degree ≤ degree·(P−1), so it is found by
    evaluating the wire polynomials at all n = m·P n-th roots of unity (n ≥
    that many + 1), applying the gadget pointwise, and interpolating back.  The
    n-th roots are m cosets ω^s·⟨α⟩ (ω^m = α): the coset s = 0 holds the wire
    values themselves, every other one is a size-P NTT of the wire
    coefficients twisted by ω^(s·j) — for a degree-2 gadget (m = 2) one inverse
    and one forward size-P transform per wire instead of a size-P and a size-2P.
    """
    p_len = wires.shape[-1]
    length = g.degree * (p_len - 1) + 1
    n = next_power_of_2(max(length, p_len))
    m = n // p_len
    if _native_mul_sum(f, g, wires) and p_len >= 2:
        lead = wires.shape[1:-1]
        per_report = np.moveaxis(wires.reshape(g.arity, -1, p_len), 0, -1)
        polys = _mul_gadget_poly(f, g, per_report)  # type: ignore[arg-type]
        return polys.reshape(*lead, polys.shape[-1])
    coeffs = ntt(f, wires, inverse=True)
    evals = f.zeros_as(wires, *wires.shape[:-1], p_len, m)  # root ω^(k·m + s) at [k, s]
    evals[..., 0] = wires
    w_n = f.root(n)
    for s in range(1, m):
        twist = f.as_like(wires, f.powers(pow(w_n, s, f.modulus), p_len, first=0))
        evals[..., s] = ntt(f, mul_cols(f, coeffs, twist))
    out = ntt(f, g.eval(f, evals.reshape(*wires.shape[:-1], n)), inverse=True)
    return out[..., :length]  # type: ignore[no-any-return]


def _native_mul_sum(f: Field, g: Gadget, wires: Vec) -> bool:
    return (
        isinstance(g, ParallelSum)
        and isinstance(g.sub, Mul)
        and wires.dtype != object
        and f.encoded_size == 16
        and wires.size > 0
    )


def _mul_gadget_poly(f: Field, g: ParallelSum, wires: Vec) -> Vec:
    """`gadget_poly` of ParallelSum(Mul) natively, report by report in one call:
    wires (reports, P, arity) → polynomials (reports, 2P − 1)."""
    rows, p_len = wires.shape[0], wires.shape[1]
    alpha, omega = f.root(p_len), f.root(2 * p_len)
    values = [alpha, f.inv(alpha), omega, f.inv(omega), f.inv(p_len), f.inv(2 * p_len)]
    consts = f.from_object(np.array(values, dtype=object))
    out = np.empty((rows, 2 * p_len - 1), dtype=wires.dtype)
    core = _backend.core()
    core.mul_gadget_poly(f.fid, np.ascontiguousarray(wires), g.count, consts, out)
    return out


# -- validity circuits (draft §7.3.2) -----------------------------------------------


class GadgetCall(Protocol):
    """What a circuit calls for a gadget: a batch of inputs (arity × k) → k outputs."""

    def __call__(self, x: Vec) -> Vec: ...


class Valid(Protocol):
    """A validity circuit with its encoding of measurements and results."""

    field: Field
    gadgets: Sequence[Gadget]
    gadget_calls: Sequence[int]
    meas_len: int
    joint_rand_len: int
    output_len: int

    def eval(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> int: ...

    def encode(self, measurement: object) -> Vec: ...

    def truncate(self, meas: Vec) -> Vec: ...

    def decode(self, output: Vec, num_measurements: int) -> object: ...


class _Direct:
    """A gadget evaluated directly (circuit evaluation in the clear)."""

    def __init__(self, f: Field, g: Gadget) -> None:
        self.f, self.g = f, g

    def __call__(self, x: Vec) -> Vec:
        return self.g.eval(self.f, x)


class _Recorder:
    """Records each call's inputs as wire values 1..calls; column 0 holds the seed."""

    def __init__(self, f: Field, g: Gadget, calls: int, seeds: Vec) -> None:
        self.f, self.g = f, g
        self.p = next_power_of_2(1 + calls)
        self.wires = f.zeros_as(seeds, g.arity, self.p)
        self.wires[:, 0] = seeds
        self.k = 0

    def record(self, x: Vec) -> None:
        batch = x.shape[1]
        if self.k + batch >= self.p:
            raise FlpError("a circuit called a gadget more often than it declared")
        self.wires[:, self.k + 1 : self.k + 1 + batch] = x
        self.k += batch


class _ProveCall(_Recorder):
    def __call__(self, x: Vec) -> Vec:
        self.record(x)
        return self.g.eval(self.f, x)


class _QueryCall(_Recorder):
    """Answers call k with G(α^k) from the proof's gadget polynomial."""

    def __init__(self, f: Field, g: Gadget, calls: int, seeds: Vec, poly: Vec) -> None:
        super().__init__(f, g, calls, seeds)
        self.poly = poly
        self.at_roots = poly_eval_at_roots(f, poly, self.p)

    def __call__(self, x: Vec) -> Vec:
        start = self.k + 1
        self.record(x)
        return self.at_roots[start : self.k + 1]  # type: ignore[no-any-return]


class _BatchProveCall:
    """_ProveCall for a batch of reports: inputs (arity, reports, k) recorded into
    wires kept as (reports, P, arity) — the circuits lay their inputs out as
    (reports, k, arity), so recording them is a plain copy — and the gadget
    evaluated on all of them at once."""

    def __init__(self, f: Field, g: Gadget, calls: int, seeds: Vec) -> None:
        self.f, self.g = f, g
        self.p = next_power_of_2(1 + calls)
        self.wires = f.zeros_as(seeds, seeds.shape[0], self.p, g.arity)
        self.wires[:, 0, :] = seeds
        self.k = 0

    def __call__(self, x: Vec) -> Vec:
        batch = x.shape[-1]
        start = self.k + 1
        if start + batch > self.p:
            raise FlpError("a circuit called a gadget more often than it declared")
        self.wires[:, start : start + batch, :] = x.transpose(1, 2, 0)
        self.k += batch
        return self.g.eval(self.f, x)

    def poly(self) -> Vec:
        """The gadget polynomial of each report, (reports, length)."""
        if _native_mul_sum(self.f, self.g, self.wires) and self.p >= 2:
            return _mul_gadget_poly(self.f, self.g, self.wires)  # type: ignore[arg-type]
        return gadget_poly(self.f, self.g, self.wires.transpose(2, 0, 1))


class _BatchQueryCall:
    """_QueryCall for a batch of reports: inputs (arity, reports, k), each report
    answered from its own gadget polynomial.  The inputs are kept as the circuit
    laid them out (no wire matrix): `at_point` needs only their weighted sums."""

    def __init__(self, f: Field, g: Gadget, calls: int, seeds: Vec, polys: Vec) -> None:
        self.f, self.g = f, g
        self.p = next_power_of_2(1 + calls)
        self.seeds = seeds  # (reports, arity): the wires at α^0
        self.k = 0
        self.inputs: list[tuple[int, Vec]] = []
        self.bit_checks: list[tuple[int, Vec, Vec, int, int, int]] = []
        self.polys = polys
        self.at_roots = poly_eval_at_roots(f, polys, self.p)

    def __call__(self, x: Vec) -> Vec:
        batch = x.shape[-1]
        start = self.k + 1
        if start + batch > self.p:
            raise FlpError("a circuit called a gadget more often than it declared")
        self.inputs.append((start, x))
        self.k += batch
        return self.at_roots[:, start : start + batch]  # type: ignore[no-any-return]

    def record_bit_check(self, meas: Vec, r: Vec, s: int, chunk: int, calls: int) -> Vec:
        """The chunked bit check's calls, recorded by their definition (inputs
        (r^(k+1)·m_k, m_k − s), see circuits.py) rather than as inputs, so that
        `at_point` can compute their wire values from the measurement directly."""
        start = self.k + 1
        if start + calls > self.p or self.g.arity != 2 * chunk:
            raise FlpError("a circuit called a gadget more often than it declared")
        self.bit_checks.append((start, meas, r, s, chunk, calls))
        self.k += calls
        return self.at_roots[:, start : start + calls]  # type: ignore[no-any-return]

    def at_point(self, t_powers: Vec) -> Vec:
        """(reports, arity): each wire polynomial at the report's t, Σ_k w(α^k)·λ_k(t)
        with λ(t) = INTT([t^0..t^(P−1)]) (the interpolation matrix is symmetric),
        so one size-P transform per report replaces an inverse NTT of every wire
        row; unrecorded calls (wire value 0) contribute nothing."""
        f, rows = self.f, self.seeds.shape[0]
        lam = ntt(f, np.array(t_powers[:, : self.p], order="C"), inverse=True, in_place=True)
        acc = weighted_rows(f, self.seeds.reshape(rows, 1, -1), lam[:, :1])
        for start, x in self.inputs:
            # x is (arity, reports, k); as (reports, k, arity) it is usually the
            # circuit's own contiguous layout (no copy)
            m = x.transpose(1, 2, 0)
            acc = f.add(acc, weighted_rows(f, m, lam[:, start : start + x.shape[-1]]))
        for start, meas, r, s, chunk, calls in self.bit_checks:
            acc = f.add(acc, bit_check_at(f, meas, r, s, lam[:, start - 1 :], chunk, calls))
        return acc


def eval_circuit(valid: Valid, meas: Vec, joint_rand: Vec, num_shares: int = 1) -> int:
    """C(meas) in the clear: 0 for a valid encoded measurement."""
    _check(valid, meas, joint_rand)
    calls = [_Direct(valid.field, g) for g in valid.gadgets]
    return valid.eval(meas, joint_rand, num_shares, calls)


def _check(valid: Valid, meas: Vec, joint_rand: Vec) -> None:
    if len(meas) != valid.meas_len:
        raise FlpError(f"measurement of length {len(meas)}, the circuit takes {valid.meas_len}")
    if len(joint_rand) != valid.joint_rand_len:
        raise FlpError(f"joint randomness of length {len(joint_rand)}")


# -- the generic FLP (draft §7.3.3) -------------------------------------------------


class FlpGeneric:
    """prove / query / decide for one validity circuit; lengths as in draft §7.3."""

    def __init__(self, valid: Valid) -> None:
        self.valid = valid
        self.field = valid.field
        self.meas_len = valid.meas_len
        self.output_len = valid.output_len
        self.joint_rand_len = valid.joint_rand_len
        self.prove_rand_len = sum(g.arity for g in valid.gadgets)
        self.query_rand_len = len(valid.gadgets)
        self.proof_len = sum(
            g.arity + g.degree * (next_power_of_2(1 + c) - 1) + 1
            for g, c in zip(valid.gadgets, valid.gadget_calls, strict=True)
        )
        self.verifier_len = 1 + sum(g.arity + 1 for g in valid.gadgets)

    def encode(self, measurement: object) -> Vec:
        return self.valid.encode(measurement)

    def truncate(self, meas: Vec) -> Vec:
        return self.valid.truncate(meas)

    def decode(self, output: Vec, num_measurements: int) -> object:
        return self.valid.decode(output, num_measurements)

    def _gadget_calls(self) -> list[tuple[Gadget, int]]:
        return list(zip(self.valid.gadgets, self.valid.gadget_calls, strict=True))

    def prove(self, meas: Vec, prove_rand: Vec, joint_rand: Vec) -> Vec:
        """The proof: per gadget, its wire seeds then its gadget polynomial (Prover)."""
        _check(self.valid, meas, joint_rand)
        if len(prove_rand) != self.prove_rand_len:
            raise FlpError(f"prover randomness of length {len(prove_rand)}")
        f = self.field
        recorders, offset = [], 0
        for g, c in self._gadget_calls():
            recorders.append(_ProveCall(f, g, c, prove_rand[offset : offset + g.arity]))
            offset += g.arity
        self.valid.eval(meas, joint_rand, 1, recorders)
        parts = []
        for r in recorders:
            parts.append(r.wires[:, 0])
            parts.append(gadget_poly(f, r.g, r.wires))
        return np.concatenate(parts)  # type: ignore[no-any-return]

    def query(
        self, meas: Vec, proof: Vec, query_rand: Vec, joint_rand: Vec, num_shares: int
    ) -> Vec:
        """This share's verifier message [C, (wires(t), G(t)) per gadget] (each Aggregator)."""
        _check(self.valid, meas, joint_rand)
        if len(proof) != self.proof_len:
            raise FlpError(f"proof of length {len(proof)}, expected {self.proof_len}")
        if len(query_rand) != self.query_rand_len:
            raise FlpError(f"query randomness of length {len(query_rand)}")
        f = self.field
        calls, offset = [], 0
        for g, c in self._gadget_calls():
            poly_len = g.degree * (next_power_of_2(1 + c) - 1) + 1
            seeds = proof[offset : offset + g.arity]
            poly = proof[offset + g.arity : offset + g.arity + poly_len]
            calls.append(_QueryCall(f, g, c, seeds, poly))
            offset += g.arity + poly_len
        v = self.valid.eval(meas, joint_rand, num_shares, calls)
        verifier = [f.add(f.zeros_as(meas, 1), v)]
        for q, t in zip(calls, query_rand, strict=True):
            # t must not be a P-th root of unity: G(t) would then be an output
            # of the gadget on the measurement, leaked to the verifier.
            t_int = f.to_int(t)
            if pow(t_int, q.p, f.modulus) == 1:
                raise FlpError("degenerate query point (draft: ERR_ABORT)")
            wire_polys = ntt(f, q.wires, inverse=True)
            verifier.append(poly_eval(f, wire_polys, t_int))
            verifier.append(poly_eval(f, q.poly.reshape(1, -1), t_int))
        return np.concatenate(verifier)  # type: ignore[no-any-return]

    def prove_batch(self, meas: Vec, prove_rand: Vec, joint_rand: Vec) -> Vec:
        """`prove` for a batch: row i is prove(meas[i], prove_rand[i], joint_rand[i])
        exactly; the circuit runs once over the matrix and each gadget polynomial
        is one batched NTT pipeline over (arity × reports) wire rows."""
        rows = meas.shape[0]
        shapes = [
            (prove_rand, self.prove_rand_len, "prover randomness"),
            (joint_rand, self.joint_rand_len, "joint randomness"),
            (meas, self.meas_len, "measurement"),
        ]
        for arr, width, what in shapes:
            if arr.shape != (rows, width):
                raise FlpError(f"{what} of shape {arr.shape}, expected ({rows}, {width})")
        eval_batch = getattr(self.valid, "eval_batch", None)
        if eval_batch is None:
            return np.stack(  # type: ignore[no-any-return]
                [self.prove(meas[i], prove_rand[i], joint_rand[i]) for i in range(rows)]
            ).reshape(rows, self.proof_len)
        f = self.field
        recorders, offset = [], 0
        for g, c in self._gadget_calls():
            seeds = prove_rand[:, offset : offset + g.arity]
            recorders.append(_BatchProveCall(f, g, c, seeds))
            offset += g.arity
        eval_batch(meas, joint_rand, 1, recorders)
        parts = []
        for r in recorders:
            parts.append(r.wires[:, 0, :])
            parts.append(r.poly())
        return np.concatenate(parts, axis=1)  # type: ignore[no-any-return]

    def query_batch(
        self, meas: Vec, proof: Vec, query_rand: Vec, joint_rand: Vec, num_shares: int
    ) -> Vec:
        """`query` for a batch of reports, one per row of each argument; row i of the
        result is query(meas[i], proof[i], query_rand[i], joint_rand[i]) exactly.

        The circuit runs once over the whole (reports × length) matrix (its
        `eval_batch`); each wire's value at t comes from its values at the roots
        by one size-P transform of t's powers per report (`_BatchQueryCall.at_point`)
        instead of an inverse NTT of every wire row.  Circuits without
        `eval_batch` are queried report by report.
        """
        rows = meas.shape[0]
        shapes = [
            (proof, self.proof_len, "proof"),
            (query_rand, self.query_rand_len, "query randomness"),
            (joint_rand, self.joint_rand_len, "joint randomness"),
            (meas, self.meas_len, "measurement"),
        ]
        for arr, width, what in shapes:
            if arr.shape != (rows, width):
                raise FlpError(f"{what} of shape {arr.shape}, expected ({rows}, {width})")
        f = self.field
        eval_batch = getattr(self.valid, "eval_batch", None)
        if eval_batch is None:
            return np.stack(  # type: ignore[no-any-return]
                [
                    self.query(meas[i], proof[i], query_rand[i], joint_rand[i], num_shares)
                    for i in range(rows)
                ]
            ).reshape(rows, self.verifier_len)
        calls, offset = [], 0
        for g, c in self._gadget_calls():
            poly_len = g.degree * (next_power_of_2(1 + c) - 1) + 1
            seeds = np.ascontiguousarray(proof[:, offset : offset + g.arity])
            polys = np.ascontiguousarray(proof[:, offset + g.arity : offset + g.arity + poly_len])
            calls.append(_BatchQueryCall(f, g, c, seeds, polys))
            offset += g.arity + poly_len
        v = eval_batch(meas, joint_rand, num_shares, calls)
        verifier = [v.reshape(rows, 1)]
        for j, q in enumerate(calls):
            t_powers = powers_rows(
                f, np.ascontiguousarray(query_rand[:, j]), max(q.polys.shape[1], q.p + 1), first=0
            )
            # t must not be a P-th root of unity (see `query`): draft ERR_ABORT.
            degenerate = _equal_rows(f, t_powers[:, q.p], f.as_like(t_powers, f.vec([1])))
            if degenerate.any():
                raise FlpError(
                    f"degenerate query point for report {int(np.argmax(degenerate))} "
                    "(draft: ERR_ABORT)"
                )
            verifier.append(q.at_point(t_powers))
            poly_len = q.polys.shape[1]
            verifier.append(dot_last(f, q.polys, t_powers[:, :poly_len]).reshape(rows, 1))
        return np.concatenate(verifier, axis=1)  # type: ignore[no-any-return]

    def decide_batch(self, verifiers: Vec) -> npt.NDArray[np.bool_]:
        """`decide` for each row of a (reports × verifier_len) matrix."""
        rows = verifiers.shape[0]
        if verifiers.shape != (rows, self.verifier_len):
            raise FlpError(f"verifiers of shape {verifiers.shape}")
        f = self.field
        ok = _equal_rows(f, verifiers[:, 0], f.zeros_as(verifiers, 1))
        offset = 1
        for g in self.valid.gadgets:
            x = verifiers[:, offset : offset + g.arity].T
            y = verifiers[:, offset + g.arity]
            offset += g.arity + 1
            ok &= _equal_rows(f, g.eval(f, x), y)
        return ok

    def decide(self, verifier: Vec) -> bool:
        """True iff C = 0 and every gadget polynomial matches its wires at t (Collector of
        the verifier shares, i.e. both Aggregators after exchanging them)."""
        if len(verifier) != self.verifier_len:
            raise FlpError(f"verifier of length {len(verifier)}")
        f = self.field
        if f.to_int(verifier[0]) != 0:
            return False
        offset = 1
        for g in self.valid.gadgets:
            x = verifier[offset : offset + g.arity]
            y = verifier[offset + g.arity]
            offset += g.arity + 1
            if f.to_int(g.eval(f, x.reshape(g.arity, 1))[0]) != f.to_int(y):
                return False
        return True


def _equal_rows(f: Field, a: Vec, b: Vec) -> npt.NDArray[np.bool_]:
    """Elementwise equality of two vectors of field elements (b may have length 1)."""
    a, b = np.broadcast_arrays(a, b)
    if a.dtype == object:
        return np.array([int(x) == int(y) for x, y in zip(a, b, strict=True)], dtype=bool)
    size = a.dtype.itemsize
    a_bytes = np.ascontiguousarray(a).view(np.uint8).reshape(-1, size)
    b_bytes = np.ascontiguousarray(b).view(np.uint8).reshape(-1, size)
    return np.all(a_bytes == b_bytes, axis=1)  # type: ignore[no-any-return]
