"""The validity circuits of Prio3's instances in draft-irtf-cfrg-vdaf-07 §7.4:
Count (a bit), Sum (an integer in [0, 2^bits)), SumVec (a vector of such
integers) and Histogram (a one-hot vector).

Each circuit is affine in the measurement except for its gadget calls, so on
additive shares every constant is divided among the `num_shares` aggregators
(the `shares_inv` terms) and the shares' outputs add up to C(measurement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.vdaf.field import (
    FIELD64,
    FIELD128,
    Field,
    Vec,
    bit_check_pairs,
    bits_value,
    dot_last,
    powers_rows,
)
from svtagg.vdaf.flp import Gadget, GadgetCall, Mul, ParallelSum, range2


class MeasurementError(ValueError):
    """A measurement outside the circuit's domain (draft: ERR_INPUT at sharding)."""


def _check_int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise MeasurementError(f"{what} must be an integer, got {type(value).__name__}")
    if not low <= int(value) < high:
        raise MeasurementError(f"{what} {value} is outside [{low}, {high})")
    return int(value)


def _bits_le(f: Field, values: Sequence[int], bits: int) -> Vec:
    """Each value as `bits` field elements 0/1, least significant first."""
    arr = np.array([int(v) for v in values], dtype=object)
    shifts = np.arange(bits)
    return f.from_small(((arr[:, None] >> shifts) & 1).reshape(-1).astype(np.int64))


def _int_matrix(measurements: Sequence[object], width: int, high: int) -> npt.NDArray[Any] | None:
    """The measurements as a (count, width) integer matrix when every entry is an
    integer (not a bool) in [0, high), else None: the caller then encodes them
    one by one, which refuses what is wrong with the right message."""
    if not isinstance(measurements, np.ndarray):
        rows: Sequence[Any] = measurements
        try:  # a bool is an int to numpy, not to `_check_int`
            if not all(type(v) is int or isinstance(v, np.integer) for r in rows for v in r):
                return None
        except TypeError:
            return None
    try:
        arr = np.asarray(measurements)
    except (ValueError, TypeError):
        return None
    if arr.ndim != 2 or arr.shape[1] != width or arr.dtype.kind not in "iu" or high > 2**62:
        return None
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= high):
        return None
    return arr.astype(np.int64)


def _bits_matrix(f: Field, values: npt.NDArray[Any], bits: int) -> Vec:
    """Each row's values as `bits` field elements 0/1 each, least significant first
    (`_bits_le` of every row)."""
    shifts = np.arange(bits, dtype=np.int64)
    return f.from_small(((values[:, :, None] >> shifts) & 1).reshape(values.shape[0], -1))


def _encode_each(valid: Any, measurements: Sequence[object]) -> Vec:
    encoded = [valid.encode(m) for m in measurements]
    return np.stack(encoded).reshape(len(encoded), valid.meas_len)


def _from_bits(f: Field, meas: Vec, bits: int) -> Vec:
    """Σ_j 2^j · b_j per group of `bits` elements (draft: truncate)."""
    if bits > 63:
        weights = f.as_like(meas, f.powers(2, bits, first=0))
        return dot_last(f, meas.reshape(-1, 1, bits), weights.reshape(1, bits)).reshape(-1)
    return bits_value(f, meas, bits, bits)


def _chunked_bit_check(
    f: Field, meas: Vec, r: int, num_shares: int, chunk: int, calls: int, gadget: GadgetCall
) -> int:
    """Σ_k r^(k+1) · m_k · (m_k − 1), through ParallelSum(Mul, chunk) (SumVec and Histogram).

    Element k goes into call k // chunk as the pair (r^(k+1)·m_k, m_k − 1/num_shares);
    the measurement is zero-padded to calls·chunk elements, the powers of r still
    advancing over the padding, as the draft does.
    """
    padded = f.zeros_as(meas, calls * chunk)
    padded[: len(meas)] = meas
    shares_inv = f.inv(num_shares)
    r_powers = f.as_like(meas, f.powers(r, calls * chunk, first=1))
    pairs = f.zeros_as(meas, calls, chunk, 2)
    pairs[:, :, 0] = f.mul(padded, r_powers).reshape(calls, chunk)
    pairs[:, :, 1] = f.sub(padded, shares_inv).reshape(calls, chunk)
    out = gadget(pairs.reshape(calls, 2 * chunk).T)
    return f.to_int(f.sum(out))


def _chunked_bit_check_batch(
    f: Field, meas: Vec, r: Vec, num_shares: int, chunk: int, calls: int, gadget: GadgetCall
) -> Vec:
    """`_chunked_bit_check` for a batch: meas (reports × length), r one per report;
    the gadget gets all reports' calls as inputs of shape (2·chunk, reports, calls)."""
    rows = meas.shape[0]
    record = getattr(gadget, "record_bit_check", None)
    if record is not None:  # the verifier: only the wires' values at t are needed
        return f.sum(record(meas, r, f.inv(num_shares), chunk, calls), axis=1)
    pairs = bit_check_pairs(f, meas, r, f.inv(num_shares), calls * chunk)
    out = gadget(pairs.reshape(rows, calls, 2 * chunk).transpose(2, 0, 1))
    return f.sum(out, axis=1)


def _column(f: Field, a: Vec, j: int) -> Vec:
    """Column j of a batch matrix as a contiguous vector."""
    return np.ascontiguousarray(a[:, j])


@dataclass
class Count:
    """A bit: C(m) = m·m − m (draft §7.4.1, Field64)."""

    field: Field = FIELD64
    gadgets: Sequence[Gadget] = (Mul(),)
    gadget_calls: Sequence[int] = (1,)
    meas_len: int = 1
    joint_rand_len: int = 0
    output_len: int = 1

    def eval(self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]) -> int:
        f = self.field
        square = calls[0](meas[[0, 0]].reshape(2, 1))
        return f.to_int(f.sub(square, meas[:1])[0])

    def eval_batch(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> Vec:
        """`eval` for each row of a (reports × meas_len) matrix, as a vector."""
        f = self.field
        x = _column(f, meas, 0)
        square = calls[0](np.stack([x, x]).reshape(2, -1, 1))
        return f.sub(np.ascontiguousarray(square[:, 0]), x)

    def encode(self, measurement: object) -> Vec:
        return self.field.vec([_check_int(measurement, 0, 2, "a Count measurement")])

    def truncate(self, meas: Vec) -> Vec:
        return meas

    def truncate_batch(self, meas: Vec) -> Vec:
        return meas

    def decode(self, output: Vec, num_measurements: int) -> int:
        return self.field.to_int(output[0])


@dataclass
class Sum:
    """An integer in [0, 2^bits) as bits: C = Σ_j r^(j+1)·(b_j² − b_j) (draft §7.4.2)."""

    bits: int
    field: Field = FIELD128
    joint_rand_len: int = 1
    output_len: int = 1
    gadgets: Sequence[Gadget] = dc_field(init=False)
    gadget_calls: Sequence[int] = dc_field(init=False)
    meas_len: int = dc_field(init=False)

    def __post_init__(self) -> None:
        if self.bits <= 0 or 2**self.bits >= self.field.modulus:
            raise ValueError(f"Sum needs 0 < bits and 2^bits < p, got bits = {self.bits}")
        self.gadgets = (range2(),)
        self.gadget_calls = (self.bits,)
        self.meas_len = self.bits

    def eval(self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]) -> int:
        checks = calls[0](meas.reshape(1, -1))
        f = self.field
        r_powers = f.powers(f.to_int(joint_rand[0]), self.bits, first=1)
        return f.dot(checks, f.as_like(checks, r_powers))

    def eval_batch(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> Vec:
        f = self.field
        checks = calls[0](meas.reshape(1, *meas.shape))
        r_powers = powers_rows(f, _column(f, joint_rand, 0), self.bits)
        return f.sum(f.mul(checks, r_powers), axis=1)

    def encode(self, measurement: object) -> Vec:
        value = _check_int(measurement, 0, 2**self.bits, "a Sum measurement")
        return _bits_le(self.field, [value], self.bits)

    def truncate(self, meas: Vec) -> Vec:
        return _from_bits(self.field, meas, self.bits)

    def truncate_batch(self, meas: Vec) -> Vec:
        """`truncate` of each row (each row is whole groups of `bits`)."""
        return _from_bits(self.field, meas.reshape(-1), self.bits).reshape(meas.shape[0], -1)

    def decode(self, output: Vec, num_measurements: int) -> int:
        return self.field.to_int(output[0])


class BitDigits:
    """The output side of a circuit whose measurement is its entries' bits,
    `bits` per entry, least significant first (SumVec, RangeVec): the entries
    come back as Σ 2^i·b_i."""

    field: Field
    bits: int

    def truncate(self, meas: Vec) -> Vec:
        return _from_bits(self.field, meas, self.bits)

    def truncate_batch(self, meas: Vec) -> Vec:
        """`truncate` of each row (each row is whole groups of `bits`)."""
        return _from_bits(self.field, meas.reshape(-1), self.bits).reshape(meas.shape[0], -1)

    def decode(self, output: Vec, num_measurements: int) -> list[int]:
        return self.field.to_ints(output)


@dataclass
class SumVec(BitDigits):
    """`length` integers in [0, 2^bits), all bits checked in chunks (draft §7.4.3)."""

    length: int
    bits: int
    chunk_length: int
    field: Field = FIELD128
    joint_rand_len: int = 1
    gadgets: Sequence[Gadget] = dc_field(init=False)
    gadget_calls: Sequence[int] = dc_field(init=False)
    meas_len: int = dc_field(init=False)
    output_len: int = dc_field(init=False)

    def __post_init__(self) -> None:
        if self.bits <= 0 or 2**self.bits >= self.field.modulus:
            raise ValueError(f"SumVec needs 0 < bits and 2^bits < p, got bits = {self.bits}")
        if self.length <= 0 or self.chunk_length <= 0:
            raise ValueError("SumVec needs a positive length and chunk_length")
        self.meas_len = self.length * self.bits
        self.output_len = self.length
        self.gadgets = (ParallelSum(Mul(), self.chunk_length),)
        self.gadget_calls = (-(-self.meas_len // self.chunk_length),)

    def eval(self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]) -> int:
        return _chunked_bit_check(
            self.field,
            meas,
            self.field.to_int(joint_rand[0]),
            num_shares,
            self.chunk_length,
            self.gadget_calls[0],
            calls[0],
        )

    def eval_batch(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> Vec:
        return _chunked_bit_check_batch(
            self.field,
            meas,
            _column(self.field, joint_rand, 0),
            num_shares,
            self.chunk_length,
            self.gadget_calls[0],
            calls[0],
        )

    def encode(self, measurement: object) -> Vec:
        if not isinstance(measurement, Sequence | np.ndarray) or len(measurement) != self.length:
            raise MeasurementError(f"a SumVec measurement is a sequence of {self.length} integers")
        values = [_check_int(v, 0, 2**self.bits, "a SumVec entry") for v in measurement]
        return _bits_le(self.field, values, self.bits)

    def encode_batch(self, measurements: Sequence[object]) -> Vec:
        """`encode` of each measurement, as the rows of a matrix."""
        values = _int_matrix(measurements, self.length, 2**self.bits)
        if values is None:
            return _encode_each(self, measurements)
        return _bits_matrix(self.field, values, self.bits)


@dataclass
class Histogram:
    """A one-hot vector of `length` buckets: every entry a bit, and they sum to 1
    (draft §7.4.4).  C = r1·(bit checks) + r1²·(Σ m_k − 1)."""

    length: int
    chunk_length: int
    field: Field = FIELD128
    joint_rand_len: int = 2
    gadgets: Sequence[Gadget] = dc_field(init=False)
    gadget_calls: Sequence[int] = dc_field(init=False)
    meas_len: int = dc_field(init=False)
    output_len: int = dc_field(init=False)

    def __post_init__(self) -> None:
        if self.length <= 0 or self.chunk_length <= 0:
            raise ValueError("Histogram needs a positive length and chunk_length")
        self.meas_len = self.output_len = self.length
        self.gadgets = (ParallelSum(Mul(), self.chunk_length),)
        self.gadget_calls = (-(-self.length // self.chunk_length),)

    def eval(self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]) -> int:
        f = self.field
        p = f.modulus
        bit_check = _chunked_bit_check(
            f,
            meas,
            f.to_int(joint_rand[0]),
            num_shares,
            self.chunk_length,
            self.gadget_calls[0],
            calls[0],
        )
        sum_check = (f.to_int(f.sum(meas)) - f.inv(num_shares)) % p
        r1 = f.to_int(joint_rand[1])
        return (r1 * bit_check + r1 * r1 % p * sum_check) % p

    def eval_batch(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> Vec:
        f = self.field
        r0, r1 = _column(f, joint_rand, 0), _column(f, joint_rand, 1)
        bit_check = _chunked_bit_check_batch(
            f, meas, r0, num_shares, self.chunk_length, self.gadget_calls[0], calls[0]
        )
        sum_check = f.sub(f.sum(meas, axis=1), f.inv(num_shares))
        return f.add(f.mul(r1, bit_check), f.mul(f.mul(r1, r1), sum_check))

    def encode(self, measurement: object) -> Vec:
        index = _check_int(measurement, 0, self.length, "a Histogram bucket")
        one_hot = np.zeros(self.length, dtype=np.int64)
        one_hot[index] = 1
        return self.field.from_small(one_hot)

    def encode_batch(self, measurements: Sequence[object]) -> Vec:
        """`encode` of each measurement (a bucket), as the rows of a matrix."""
        column = (
            measurements.reshape(-1, 1)
            if isinstance(measurements, np.ndarray)
            else [[m] for m in measurements]
        )
        buckets = _int_matrix(column, 1, self.length)
        if buckets is None:
            return _encode_each(self, measurements)
        one_hot = np.zeros((len(measurements), self.length), dtype=np.int64)
        one_hot[np.arange(len(measurements)), buckets[:, 0]] = 1
        return self.field.from_small(one_hot)

    def truncate(self, meas: Vec) -> Vec:
        return meas

    def truncate_batch(self, meas: Vec) -> Vec:
        return meas

    def decode(self, output: Vec, num_measurements: int) -> list[int]:
        return self.field.to_ints(output)
