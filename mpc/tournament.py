"""Chunked report-noisy-max: one tournament over a stream's candidates, run
chunk by chunk, each chunk's winner carried to the next XOR-shared between the
garbler and the evaluator, so that only the final index is ever revealed
(docs/mpc.md, "Chunked tournaments"; docs/privacy.md for why that costs one ε).

Written, like `circuits.py`, once against `garble.Backend`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from svtagg.mpc.circuits import (
    LANE_BATCH,
    Rows,
    WireSource,
    _add_const,
    _signed_ge,
    _tournament,
    check_width,
    lane_batches,
    ring_from_bits,
)
from svtagg.mpc.garble import Backend, Bits, Wires
from svtagg.mpc.ring import RING_BITS

#: Index bits a chunked tournament carries and reveals: a stream's candidates,
#: over all its chunks, number fewer than 2^32 (the servers refuse more).
CARRY_INDEX_BITS = 32


@dataclass(frozen=True)
class TournamentChunk:
    """Where a chunk sits in its stream's tournament, as both parties know it:
    the absolute index of its first candidate, whether a winner is carried in
    (every chunk but the first) and whether it is the last (which reveals)."""

    offset: int = 0
    carry_in: bool = False
    final: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.offset < 1 << CARRY_INDEX_BITS:
            raise ValueError(f"a tournament holds fewer than 2^{CARRY_INDEX_BITS} candidates")
        if self.carry_in != (self.offset > 0):
            raise ValueError("a winner is carried into every chunk but the first")


def carry_lanes(width: int) -> int:
    """Lanes of w bits that hold a carried winner: its value in lane 0, then its
    index in w-bit pieces (lane 1 + p holds index bits [p·w, (p + 1)·w))."""
    return 1 + -(-CARRY_INDEX_BITS // check_width(width))


def carry_bits(width: int) -> int:
    """Output wires of a non-final chunk: the winner's w value bits, then its index bits."""
    return width + CARRY_INDEX_BITS


def carry_words(bits: Bits, width: int) -> npt.NDArray[np.uint64]:
    """A carried winner's `carry_bits(w)` bits (value bits, then index bits,
    each least significant first) → its `carry_lanes(w)` ring lanes.  XOR of
    two carries' bits is XOR of their lanes, so masks and masked carries
    convert alike."""
    if bits.shape != (carry_bits(width),):
        raise ValueError("malformed carry")
    rows = np.zeros((carry_lanes(width), RING_BITS), dtype=np.uint8)
    rows[0, :width] = bits[:width]
    idx = bits[width:]
    for p in range(carry_lanes(width) - 1):
        piece = idx[p * width : (p + 1) * width]
        rows[1 + p, : piece.size] = piece
    return ring_from_bits(list(rows.T))


def carry_value_index(words: npt.NDArray[np.uint64], width: int) -> tuple[int, int]:
    """The (signed w-bit value, index) that unmasked carry lanes hold."""
    if words.shape != (carry_lanes(width),):
        raise ValueError("malformed carry")
    half = 1 << (width - 1)
    raw = int(words[0]) & ((1 << width) - 1)
    index = 0
    for p in range(carry_lanes(width) - 1):
        index |= (int(words[1 + p]) & ((1 << width) - 1)) << (p * width)
    return (raw + half) % (1 << width) - half, index & ((1 << CARRY_INDEX_BITS) - 1)


def _chunk_winner(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, first: int, width: int
) -> tuple[Wires, Rows, int, Rows]:
    """The largest a_j + b_j over lanes first..n−1 (the chunk's candidates; the
    lanes before them hold the carry): (its value, (w, 1); its index as rows;
    the lane that index 0 stands for; the wire rows of lanes 0..first−1).  As
    `argmax_circuit`, batch by batch, but every batch winner keeps its value.
    One batch: the index counts from lane `first`.  Several: a batch's index
    rows count from its own first lane, so batch 0's (which count from
    `first`) get `first` added (11 ANDs) before the batch winners meet, and the
    index is the lane's."""
    batches = lane_batches(n)
    full = (LANE_BATCH - 1).bit_length()
    done = getattr(be, "batch_done", None)
    carried: Rows = []
    vals: list[Wires] = []
    rows: list[Rows] = []
    for lo, hi in batches:
        bw = b(lo, hi)
        start = max(lo, first)  # ≤ hi − 1: batch 0 holds every carry lane and ≥ 1 candidate
        if lo < first:  # copied: a source may reuse its buffer for the next batch
            carried = [bw[i, : first - lo].copy() for i in range(width)]

        def share(i: int, s: int = start, hi: int = hi) -> Bits | None:
            return None if a_bits is None else a_bits[i, s:hi]

        x = [bw[i, start - lo :] for i in range(width)]
        v, idx = _tournament(be, np.stack(_add_const(be, x, share)), [], True)
        if len(batches) > 1:
            zero = be.xor(v[0], v[0])
            idx = idx + [zero] * (full - len(idx))
            if start > lo:  # the count from the batch's lane 0 (< 2^12: no carry out)
                idx = _add_const(be, idx, functools.partial(_const_bit, start - lo, a_bits=a_bits))
        vals.append(v)
        rows.append(idx)
        if done is not None:
            done()
    if len(batches) == 1:
        return vals[0], rows[0], first, carried
    cat = [np.concatenate([r[i] for r in rows]) for i in range(full)]
    v, idx = _tournament(be, np.concatenate(vals, axis=1), cat, True)
    return v, idx, 0, carried


def chunk_input(
    z: npt.NDArray[np.uint64], carry: npt.NDArray[np.uint64] | None, width: int
) -> npt.NDArray[np.uint64]:
    """A chunk's input vector on either side: the carry's lanes (this party's
    share), then its share of the candidates."""
    if z.shape[0] < 1:
        raise ValueError("a chunk of a chunked report-noisy-max needs candidates")
    if carry is None:
        return z
    if carry.shape != (carry_lanes(width),):
        raise ValueError(f"a carried winner is {carry_lanes(width)} lanes at width {width}")
    return np.concatenate([carry, z])


def _const_bit(value: int, i: int, a_bits: Bits | None) -> Bits | None:
    """Bit i of a constant only the garbler feeds (None on the evaluator), one lane."""
    return None if a_bits is None else np.full(1, (value >> i) & 1, dtype=np.uint8)


def noisy_max_chunk_circuit(
    be: Backend,
    a_bits: Bits | None,
    b: WireSource,
    n: int,
    width: int,
    where: TournamentChunk,
    out_mask: Bits | None = None,
) -> tuple[Wires, ...]:
    """One chunk of a chunked report-noisy-max tournament.

    Lanes: with `where.carry_in`, the first E = `carry_lanes(w)` lanes hold the
    carried winner XOR-shared (the garbler's a_bits are its masks, the
    evaluator's its masked bits: XOR, free); the other k = n − E lanes (all n
    without a carry) are the chunk's candidates, additive shares as in
    `argmax_circuit`, whose absolute indices are offset, …, offset + k − 1
    (`where.offset` is public; the garbler adds it).  The chunk's winner (the
    tournament with values kept) then meets the carried one, which wins ties:
    its index is smaller than every candidate of this chunk, and its noisy
    value is the one drawn when it was a candidate, never redrawn.

    A final chunk (`where.final`) outputs the winner's `CARRY_INDEX_BITS` index bits (bit i
    in bundle i); any other outputs its value and index bits XORed with the
    garbler's fresh `out_mask` (`carry_bits(w)` bits, None on the evaluator),
    so the evaluator decodes only uniformly random bits and the garbler, which
    is sent nothing, learns nothing: the winner stays secret-shared.  ANDs: as
    `argmax_circuit` plus w per batch winner (values kept), then w to compare
    and w + 32 to mux against the carry (32 without its value in the final) and
    31 to add the offset: ≈ 3w per candidate plus < 2w + 100 per chunk.
    """
    w = check_width(width)
    offset, carry_in, final = where.offset, where.carry_in, where.final
    first = carry_lanes(w) if carry_in else 0
    if not 1 <= n - first:
        raise ValueError("a chunk needs at least one candidate")
    if (
        a_bits is not None
        and not final
        and (out_mask is None or out_mask.shape != (carry_bits(w),))
    ):
        raise ValueError("the garbler masks a carried winner with carry_bits(w) bits")
    v, idx, base, carried = _chunk_winner(be, a_bits, b, n, first, w)
    zero = be.xor(v[0], v[0])
    lane = idx + [zero] * (CARRY_INDEX_BITS - len(idx))
    # The absolute index: its lane − first + offset (< 2^32 by the servers' bound).
    shift = (offset + base - first) % (1 << CARRY_INDEX_BITS)
    index = _add_const(be, lane, lambda i: _const_bit(shift, i, a_bits))
    value = list(v)
    if carry_in:

        def mask(i: int, lane_no: int) -> Bits | None:
            return None if a_bits is None else a_bits[i, lane_no : lane_no + 1]

        c_val = [be.xor_const(carried[i][0:1], mask(i, 0)) for i in range(w)]
        c_idx = []
        for j in range(CARRY_INDEX_BITS):
            p, q = divmod(j, w)
            c_idx.append(be.xor_const(carried[q][1 + p : 2 + p], mask(q, 1 + p)))
        # The chunk's winner takes over only if strictly greater (ties stay with the carry).
        gt = be.not_(_signed_ge(be, np.stack(c_val), v))
        lo = c_idx + ([] if final else c_val)
        hi = index + ([] if final else value)
        diff = be.and_(
            np.concatenate([be.xor(x, y) for x, y in zip(lo, hi, strict=True)]),
            np.concatenate([gt] * len(lo)),
        )
        picked = [be.xor(x, diff[j : j + 1]) for j, x in enumerate(lo)]
        index = picked[:CARRY_INDEX_BITS]
        value = picked[CARRY_INDEX_BITS:]
    if final:
        return tuple(index)
    bits = value + index
    masked = [
        be.xor_const(x, None if out_mask is None else out_mask[i : i + 1])
        for i, x in enumerate(bits)
    ]
    return (np.concatenate(masked),)


def noisy_max_chunk_and_gates(k: int, width: int, where: TournamentChunk) -> int:
    """The AND gates of `noisy_max_chunk_circuit` over k candidates, from its
    public shape (for the cost tables and to check the circuit)."""
    carry_in, final = where.carry_in, where.final

    def rounds(n: int, levels: int) -> int:
        ands = 0
        while n > 1:
            m = n // 2
            ands += m * (2 * width + levels)
            n, levels = n - m, levels + 1
        return ands

    w = width
    first = carry_lanes(w) if carry_in else 0
    n = k + first
    full = (LANE_BATCH - 1).bit_length()
    total = (w - 1) * k
    batches = lane_batches(n)
    for lo, hi in batches:
        total += rounds(hi - max(lo, first), 0)
    if len(batches) > 1:
        if first:
            total += full - 1  # batch 0's count shifted by `first`
        total += rounds(len(batches), full)
    total += CARRY_INDEX_BITS - 1  # the offset
    if carry_in:
        total += w + CARRY_INDEX_BITS + (0 if final else w)
    return total


def plain_noisy_max_chunk(
    z_l: npt.NDArray[np.uint64],
    z_h: npt.NDArray[np.uint64],
    offset: int,
    carried: tuple[int, int] | None,
    width: int = RING_BITS,
) -> tuple[int, int]:
    """Plaintext reference of one chunk: (signed w-bit value, absolute index) of
    the winner so far — the carried (value, index), unless a candidate of this
    chunk (index offset + j) is strictly greater; among the chunk's candidates
    the first largest."""
    s = (np.asarray(z_l, dtype=np.uint64) + np.asarray(z_h, dtype=np.uint64)).astype(object)
    half = 1 << (width - 1)
    signed = [((int(v) + half) % (1 << width)) - half for v in s]
    j = max(range(len(signed)), key=lambda i: (signed[i], -i))
    if carried is not None and carried[0] >= signed[j]:
        return carried
    return signed[j], offset + j
