"""Two validity circuits of this project's own, beyond draft-irtf-cfrg-vdaf-07's
§7.4 set: RangeVec (a vector of values in [0, 2^F], the project's fixed-point
encoding of [0, 1]) and MultiHot (a 0/1 vector with at most `max_weight` ones).

Both are written for the draft's generic FLP (vdaf/flp.py) in the style of
SumVec and Histogram (vdaf/circuits.py): every non-affine check is a product
of two affine functions of the encoded measurement, all products go through
one ParallelSum(Mul, chunk_length) gadget, and a random linear combination
with powers of joint-randomness elements folds the checks into one circuit
output.  A nonzero check leaves a nonzero polynomial in the joint randomness
of degree at most (number of Mul products + 1), so an invalid measurement
evaluates to 0 with probability at most that degree over p (Schwartz–Zippel);
the FLP's consistency check catches a prover that lies about gadget outputs.

Constants in an affine gadget input or in a linear check are multiplied by
1/num_shares (`shares_inv`), as in circuits.py, so that the aggregators'
outputs on their additive shares add up to the circuit's value.

The Prio3 instances (`prio3_range_vec`, `prio3_multihot` in vdaf/prio3.py)
use private-use algorithm IDs; there are no official test vectors for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.vdaf.circuits import (
    BitDigits,
    MeasurementError,
    _bits_le,
    _bits_matrix,
    _check_int,
    _chunked_bit_check,
    _chunked_bit_check_batch,
    _column,
    _encode_each,
    _from_bits,
    _int_matrix,
)
from svtagg.vdaf.field import FIELD128, Field, Vec, bits_value, powers_rows
from svtagg.vdaf.flp import Gadget, GadgetCall, Mul, ParallelSum

#: The largest number of fractional bits RangeVec takes (values up to 2^32).
MAX_FRAC_BITS = 32


def sqrt_chunk(products: int) -> int:
    """The default ParallelSum chunk length for a circuit of `products` Mul
    products: ⌊√products⌉, which balances the gadget's arity (wire seeds, and
    the verifier message) against its number of calls (the gadget polynomial).

    It is a rule of thumb, not the optimum: the proof grows with the next power
    of two above calls + 1, so a somewhat larger chunk can give a shorter proof
    (RangeVec(100, 16): chunk 42, 44 calls, 211 proof elements; chunk 59, 31
    calls, 181).  Pass chunk_length to choose it, e.g. by trial as
    benchmarks/bench_vdaf.py does."""
    if products <= 0:
        raise ValueError("a circuit needs at least one product")
    return max(1, round(math.sqrt(products)))


def _bit_columns(values: npt.NDArray[Any], bits: int) -> npt.NDArray[Any]:
    """A column of integers as `bits` columns of their bits, least significant first."""
    return (values >> np.arange(bits, dtype=np.int64)) & 1  # type: ignore[no-any-return]


def _calls(count: int, chunk: int) -> int:
    return -(-count // chunk)


def _measurement_list(measurement: object, length: int, what: str) -> list[object]:
    """The entries of a vector measurement, refusing anything but a sequence of
    `length` (a str or bytes is a sequence, not a vector)."""
    if not isinstance(measurement, Sequence | np.ndarray) or isinstance(measurement, str | bytes):
        raise MeasurementError(f"a {what} measurement is a sequence of {length} integers")
    if len(measurement) != length:
        raise MeasurementError(f"a {what} measurement has {length} entries, got {len(measurement)}")
    return list(measurement)


class RangeVec(BitDigits):
    """`length` integers, each in [0, 2^F] inclusive (F = `frac_bits`, 1 ≤ F ≤ 32):
    a vector of values in [0, 1] with 2^F units each.

    Encoding: every entry as F + 1 bits, least significant first, entry after
    entry (SumVec's layout with bits = F + 1), so meas_len = length·(F + 1).
    F + 1 bits hold [0, 2^(F+1)); the circuit cuts that down to [0, 2^F]:

    - every element is a bit, b·(b − 1) = 0 (length·(F + 1) products);
    - for every entry, b_F · L = 0 with L = Σ_{i<F} 2^i·b_i its low part: if the
      top bit is set the low bits are all 0, so the value is at most 2^F
      (`length` products; both factors are linear, no constant term).

    C = Σ_k r0^(k+1)·m_k·(m_k − 1) + Σ_e r1^(e+1)·b_(e,F)·L_e, with two
    joint-randomness elements: the two sums have no common monomial and no
    constant term, so C is the zero polynomial only if every product is 0.

    The gadget is one ParallelSum(Mul, chunk_length): the bit checks fill
    ⌈length·(F+1)/chunk⌉ calls (as SumVec's), then the range products
    ⌈length/chunk⌉ more, each part zero-padded to whole calls.  The default
    chunk_length is ⌊√(length·(F + 2))⌉, the square root of the number of
    products (`sqrt_chunk`).  Output: the `length` values Σ_i 2^i·b_i;
    decoded, the list of their sums over the batch.
    """

    field: Field = FIELD128
    joint_rand_len = 2

    def __init__(self, length: int, frac_bits: int, chunk_length: int | None = None) -> None:
        if length <= 0:
            raise ValueError(f"RangeVec needs a positive length, got {length}")
        if not 1 <= frac_bits <= MAX_FRAC_BITS:
            raise ValueError(f"RangeVec needs 1 <= frac_bits <= {MAX_FRAC_BITS}, got {frac_bits}")
        self.length = length
        self.frac_bits = frac_bits
        self.bits = frac_bits + 1
        self.meas_len = length * self.bits
        self.output_len = length
        self.products = length * (frac_bits + 2)
        chunk = sqrt_chunk(self.products) if chunk_length is None else chunk_length
        if chunk <= 0:
            raise ValueError(f"RangeVec needs a positive chunk_length, got {chunk}")
        self.chunk_length = chunk
        self.bit_calls = _calls(self.meas_len, chunk)
        self.range_calls = _calls(length, chunk)
        self.gadgets: Sequence[Gadget] = (ParallelSum(Mul(), chunk),)
        self.gadget_calls: Sequence[int] = (self.bit_calls + self.range_calls,)

    def __repr__(self) -> str:
        return (
            f"RangeVec(length={self.length}, frac_bits={self.frac_bits}, "
            f"chunk_length={self.chunk_length})"
        )

    def _split(self, meas: Vec) -> tuple[Vec, Vec]:
        """(top bits, low parts) of every entry: b_(e,F) and L_e, shaped like
        the entries (a vector for one report, a matrix for a batch)."""
        f, lead = self.field, meas.shape[:-1]
        groups = meas.reshape(*lead, self.length, self.bits)
        top = np.ascontiguousarray(groups[..., self.frac_bits])
        low = bits_value(f, meas, self.bits, self.frac_bits).reshape(*lead, self.length)
        return top, low

    def _range_inputs(self, scaled_top: Vec, low: Vec) -> Vec:
        """The range products' gadget inputs, (2·chunk, [reports,] range_calls):
        entry e is the pair (r1^(e+1)·b_(e,F), L_e) in call e // chunk, the
        pairs zero-padded to whole calls."""
        f, lead = self.field, scaled_top.shape[:-1]
        chunk, calls = self.chunk_length, self.range_calls
        pairs = f.zeros_as(scaled_top, *lead, calls * chunk, 2)
        pairs[..., : self.length, 0] = scaled_top
        pairs[..., : self.length, 1] = low
        grouped = pairs.reshape(*lead, calls, 2 * chunk)
        return np.moveaxis(grouped, -1, 0)  # type: ignore[no-any-return]

    def eval(self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]) -> int:
        f = self.field
        bit_check = _chunked_bit_check(
            f,
            meas,
            f.to_int(joint_rand[0]),
            num_shares,
            self.chunk_length,
            self.bit_calls,
            calls[0],
        )
        top, low = self._split(meas)
        r1_powers = f.as_like(meas, f.powers(f.to_int(joint_rand[1]), self.length, first=1))
        out = calls[0](self._range_inputs(f.mul(top, r1_powers), low))
        return (bit_check + f.to_int(f.sum(out))) % f.modulus

    def eval_batch(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> Vec:
        """`eval` for each row of a (reports × meas_len) matrix, as a vector."""
        f = self.field
        bit_check = _chunked_bit_check_batch(
            f,
            meas,
            _column(f, joint_rand, 0),
            num_shares,
            self.chunk_length,
            self.bit_calls,
            calls[0],
        )
        top, low = self._split(meas)
        r1_powers = powers_rows(f, _column(f, joint_rand, 1), self.length)
        out = calls[0](self._range_inputs(f.mul(top, r1_powers), low))
        return f.add(bit_check, f.sum(out, axis=1))

    def encode(self, measurement: object) -> Vec:
        entries = _measurement_list(measurement, self.length, "RangeVec")
        bound = 2**self.frac_bits
        values = [_check_int(v, 0, bound + 1, "a RangeVec entry") for v in entries]
        return _bits_le(self.field, values, self.bits)

    def encode_batch(self, measurements: Sequence[object]) -> Vec:
        """`encode` of each measurement, as the rows of a matrix."""
        values = _int_matrix(measurements, self.length, 2**self.frac_bits + 1)
        if values is None:
            return _encode_each(self, measurements)
        return _bits_matrix(self.field, values, self.bits)


class MultiHot:
    """A 0/1 vector of `length` entries with at most `max_weight` ones
    (1 ≤ max_weight ≤ length).

    Encoding: the `length` bits, then the weight in offset form: with
    w = max_weight.bit_length() and offset = 2^w − 1 − max_weight, the w bits
    of weight + offset, least significant first; meas_len = length + w.  A
    w-bit number is at most 2^w − 1, so weight + offset fits exactly when
    weight ≤ max_weight.

    The circuit checks that every element (entries and weight bits) is a bit,
    Σ_k r0^(k+1)·m_k·(m_k − 1) through ParallelSum(Mul, chunk_length) as
    Histogram does, and the linear weight equation
    W = Σ_j m_j + offset − Σ_i 2^i·v_i = 0 (the constant offset enters each
    share as offset/num_shares).  C = r1·(bit check) + r1²·W: a nonzero W or a
    non-bit leaves a nonzero polynomial in (r0, r1).  Since every element is a
    bit and length + 2^w < p, W = 0 in the field means the weight equals the
    encoded number minus offset in the integers.

    The default chunk_length is ⌊√(length + w)⌉, the square root of the number
    of Mul products (`sqrt_chunk`).  Output: the `length` entries; decoded, the
    per-entry counts over the batch.
    """

    field: Field = FIELD128
    joint_rand_len = 2

    def __init__(self, length: int, max_weight: int, chunk_length: int | None = None) -> None:
        if length <= 0:
            raise ValueError(f"MultiHot needs a positive length, got {length}")
        if not 1 <= max_weight <= length:
            raise ValueError(f"MultiHot needs 1 <= max_weight <= length, got {max_weight}")
        self.length = length
        self.max_weight = max_weight
        self.weight_bits = max_weight.bit_length()
        self.offset = 2**self.weight_bits - 1 - max_weight
        self.meas_len = length + self.weight_bits
        self.output_len = length
        chunk = sqrt_chunk(self.meas_len) if chunk_length is None else chunk_length
        if chunk <= 0:
            raise ValueError(f"MultiHot needs a positive chunk_length, got {chunk}")
        self.chunk_length = chunk
        self.gadgets: Sequence[Gadget] = (ParallelSum(Mul(), chunk),)
        self.gadget_calls: Sequence[int] = (_calls(self.meas_len, chunk),)

    def __repr__(self) -> str:
        return (
            f"MultiHot(length={self.length}, max_weight={self.max_weight}, "
            f"chunk_length={self.chunk_length})"
        )

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
        weight = f.to_int(f.sum(meas[: self.length]))
        claimed = f.to_int(_from_bits(f, meas[self.length :], self.weight_bits)[0])
        weight_check = (weight + self.offset * f.inv(num_shares) - claimed) % p
        r1 = f.to_int(joint_rand[1])
        return (r1 * bit_check + r1 * r1 % p * weight_check) % p

    def eval_batch(
        self, meas: Vec, joint_rand: Vec, num_shares: int, calls: Sequence[GadgetCall]
    ) -> Vec:
        """`eval` for each row of a (reports × meas_len) matrix, as a vector."""
        f = self.field
        r0, r1 = _column(f, joint_rand, 0), _column(f, joint_rand, 1)
        bit_check = _chunked_bit_check_batch(
            f, meas, r0, num_shares, self.chunk_length, self.gadget_calls[0], calls[0]
        )
        weight = f.sum(meas[:, : self.length], axis=1)
        weight_bits = np.ascontiguousarray(meas[:, self.length :]).reshape(-1)
        claimed = _from_bits(f, weight_bits, self.weight_bits)
        weight_check = f.sub(f.add(weight, self.offset * f.inv(num_shares)), claimed)
        return f.add(f.mul(r1, bit_check), f.mul(f.mul(r1, r1), weight_check))

    def encode(self, measurement: object) -> Vec:
        entries = _measurement_list(measurement, self.length, "MultiHot")
        bits = [_check_int(v, 0, 2, "a MultiHot entry") for v in entries]
        weight = sum(bits)
        if weight > self.max_weight:
            raise MeasurementError(
                f"a MultiHot measurement has {weight} ones, at most {self.max_weight} allowed"
            )
        f = self.field
        encoded_weight = _bits_le(f, [weight + self.offset], self.weight_bits)
        return np.concatenate([f.from_small(np.array(bits, dtype=np.int64)), encoded_weight])

    def encode_batch(self, measurements: Sequence[object]) -> Vec:
        """`encode` of each measurement, as the rows of a matrix."""
        bits = _int_matrix(measurements, self.length, 2)
        if bits is None or (bits.size and int(bits.sum(axis=1).max()) > self.max_weight):
            return _encode_each(self, measurements)
        weights = bits.sum(axis=1, keepdims=True) + self.offset
        return self.field.from_small(
            np.concatenate([bits, _bit_columns(weights, self.weight_bits)], axis=1)
        )

    def truncate(self, meas: Vec) -> Vec:
        return meas[: self.length]

    def truncate_batch(self, meas: Vec) -> Vec:
        """`truncate` of each row."""
        return np.ascontiguousarray(meas[:, : self.length])

    def decode(self, output: Vec, num_measurements: int) -> list[int]:
        return self.field.to_ints(output)
