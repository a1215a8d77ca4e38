"""The SVT comparison circuits, written once against `garble.Backend`.

Inputs: the garbler's ring values a (known to it in the clear) and wires for the
evaluator's values b, as 64 bit-planes × n lanes.  Under the overflow bound
|a + b| < 2^63 (as signed int64), "YES" means a + b ≥ 0, the complement of the
sign bit of the 64-bit sum.

Sizes per comparison: the carry chain needs 63 AND gates (one garbler-half gate
for bit 0, 62 full half-gates), i.e. 125 ciphertexts = 2000 bytes; the garbler's
inputs cost nothing (they are folded into labels by free XOR with a constant).
The chunk circuits add a Brent–Kung prefix-OR (< 2 ANDs per lane) and, for
CompareToThresholds, 2 more ANDs per query.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from svtagg.mpc.garble import Backend, Bits, Wires
from svtagg.mpc.ring import RING_BITS

#: Lanes per pass of the carry chain: small enough that a layer's buffers
#: (4 × 16 bytes per lane on the garbler) stay in L2, large enough that
#: numpy's per-call overhead is amortized.
LANE_BATCH = 4096


class CttCode(enum.IntEnum):
    """Outcome of one CompareToThresholds query; the value is also its byte in
    the evaluator's result message."""

    HIGH = 0
    LOW = 1
    CLOSE = 2


HIGH, LOW, CLOSE = CttCode.HIGH, CttCode.LOW, CttCode.CLOSE


def bit_planes(z: npt.NDArray[np.uint64]) -> Bits:
    """(64, n) uint8 array: row i holds bit i of every element of z."""
    le = np.ascontiguousarray(z, dtype="<u8").view(np.uint8).reshape(-1, 8)
    return np.ascontiguousarray(np.unpackbits(le, axis=1, bitorder="little").T)


WireSource = Callable[[int, int], Wires]
"""(lo, hi) → the evaluator-input wires of lanes lo..hi−1, as 64 × (hi − lo).
Called once per lane batch, in order, so labels can be produced just in time."""


def planes(b: Wires) -> WireSource:
    """A WireSource over a whole (64, n, …) array of wires or bits."""
    return lambda lo, hi: b[:, lo:hi]


def lane_batches(n: int) -> list[tuple[int, int]]:
    """The lane batches of an n-lane circuit; the OT extension uses the same split."""
    return [(lo, min(lo + LANE_BATCH, n)) for lo in range(0, n, LANE_BATCH)]


def sign_yes(be: Backend, a_bits: Bits | None, b: WireSource, n: int) -> Wires:
    """YES_k = [a_k + b_k ≥ 0 as int64], for every lane k < n.

    a_bits: (64, n) garbler bits (None on the evaluator); b: the 64 × n wires of
    the evaluator's bits. Carry chain with the majority trick, one AND per bit:
    c_{i+1} = c_i ⊕ ((a_i ⊕ c_i) ∧ (b_i ⊕ c_i)), c_0 = 0; sign = a63 ⊕ b63 ⊕ c63.
    Lanes are independent, so they are processed in cache-sized batches.
    """
    parts = []
    for lo, hi in lane_batches(n):
        a = None if a_bits is None else a_bits[:, lo:hi]
        parts.append(_sign_yes_batch(be, a, b(lo, hi)))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _sign_yes_batch(be: Backend, a_bits: Bits | None, b: Wires) -> Wires:
    def a(i: int) -> Bits | None:
        return None if a_bits is None else a_bits[i]

    c = be.and_const(a(0), b[0])  # c_1 = a_0 ∧ b_0 (c_0 = 0)
    for i in range(1, RING_BITS - 1):
        x = be.xor_const(c, a(i))
        y = be.xor(b[i], c)
        c = be.xor(c, be.and_(x, y))
    sign = be.xor_const(be.xor(b[RING_BITS - 1], c), a(RING_BITS - 1))
    return be.not_(sign)


def prefix_or(be: Backend, x: Wires) -> Wires:
    """Inclusive prefix OR p_k = x_0 ∨ … ∨ x_k, Brent–Kung: < 2n ORs in
    2·log2(n) layers, each layer one vectorized gate call over all its gates."""
    p = x.copy()
    n = p.shape[0]
    d = 1
    while 2 * d <= n:  # up-sweep: p[i] covers (i − 2d, i] for i ≡ −1 mod 2d
        idx = np.arange(2 * d - 1, n, 2 * d)
        p[idx] = be.or_(p[idx], p[idx - d])
        d *= 2
    d //= 2
    while d >= 1:  # down-sweep: complete the prefixes in between
        idx = np.arange(3 * d - 1, n, 2 * d)
        if idx.size:
            p[idx] = be.or_(p[idx], p[idx - d])
        d //= 2
    return p


def _first_one(be: Backend, p: Wires) -> Wires:
    """One-hot of the first 1 of a prefix-OR p: f_k = p_k ⊕ p_{k−1} (free)."""
    f = p.copy()
    f[1:] = be.xor(p[1:], p[:-1])
    return f


def first_yes_circuit(be: Backend, a_bits: Bits | None, b: WireSource, n: int) -> Wires:
    """Chunk circuit of AboveThreshold over n lanes: outputs the one-hot of the
    first YES (all zeros if none). Lanes after the first YES output 0 whatever
    their inputs."""
    return _first_one(be, prefix_or(be, sign_yes(be, a_bits, b, n)))


def ctt_circuit(be: Backend, a_bits: Bits | None, b: WireSource, n: int) -> tuple[Wires, Wires]:
    """CompareToThresholds chunk circuit over n queries.

    Lanes 0..n−1 of the inputs carry z_high, lanes n..2n−1 carry z_low.
    high_j, low_j = YES of each; close_j = ¬high_j ∧ ¬low_j.
    Outputs (m, f): f = one-hot of the first CLOSE; m_j = high_j ∧ ¬(a CLOSE
    before j). Before the first CLOSE, m_j tells HIGH from LOW; from the first
    CLOSE on, m_j = 0 and after it f_j = 0, so later queries reveal nothing.
    """
    yes = sign_yes(be, a_bits, b, 2 * n)
    high, low = yes[:n], yes[n:]
    close = be.and_(be.not_(high), be.not_(low))
    p = prefix_or(be, close)
    m = high.copy()
    if n > 1:
        m[1:] = be.and_(high[1:], be.not_(p[:-1]))
    return m, _first_one(be, p)


def first_yes_index(f: Bits) -> int | None:
    """Decode the one-hot output of `first_yes_circuit`."""
    hits = np.flatnonzero(f)
    return int(hits[0]) if hits.size else None


def ctt_outcomes(m: Bits, f: Bits) -> list[int]:
    """Decode (m, f) of `ctt_circuit`: HIGH or LOW per query, up to and including
    the first CLOSE."""
    hits = np.flatnonzero(f)
    stop = int(hits[0]) if hits.size else m.shape[0]
    out: list[int] = [HIGH if v else LOW for v in m[:stop].tolist()]
    if hits.size:
        out.append(CLOSE)
    return out


def plain_first_yes(z_l: npt.NDArray[np.uint64], z_h: npt.NDArray[np.uint64]) -> int | None:
    """Plaintext reference: first j with signed(z_l[j] + z_h[j]) ≥ 0."""
    hits = np.flatnonzero((z_l + z_h).view(np.int64) >= 0)
    return int(hits[0]) if hits.size else None


def plain_compare_to_thresholds(
    z_high: npt.NDArray[np.uint64], z_low: npt.NDArray[np.uint64]
) -> list[int]:
    """Plaintext reference for CompareToThresholds on reconstructed values."""
    out: list[int] = []
    for hi, lo in zip(z_high.view(np.int64).tolist(), z_low.view(np.int64).tolist(), strict=True):
        out.append(HIGH if hi >= 0 else LOW if lo >= 0 else CLOSE)
        if out[-1] == CLOSE:
            break
    return out
