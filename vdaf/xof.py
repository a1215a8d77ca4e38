"""XofShake128, the extendable-output function of draft-irtf-cfrg-vdaf-07 (§6.2.1).

The stream is SHAKE128(len(dst) as one byte || dst || seed || binder).  The
domain-separation tag names the draft version, the algorithm and the usage
(`format_dst`), so no two uses of one seed ever share a stream.  Field
vectors are drawn by rejection sampling (`next_vec`, §6.2): each element is
ENCODED_SIZE little-endian bytes, kept if below p, else skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.vdaf import native as _backend
from svtagg.vdaf.field import DecodeError, Field, Vec, next_power_of_2

#: The draft version this package implements (the first byte of every DST).
VERSION = 7
SEED_SIZE = 16


def format_dst(algo_class: int, algo: int, usage: int) -> bytes:
    """The DST of draft §6.2: version (1 byte), class (1), algorithm (4), usage (2); big-endian."""
    return (
        VERSION.to_bytes(1, "big")
        + algo_class.to_bytes(1, "big")
        + algo.to_bytes(4, "big")
        + usage.to_bytes(2, "big")
    )


class XofShake128:
    """One XOF stream; `next` returns successive bytes of it."""

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        if len(seed) != SEED_SIZE:
            raise ValueError(f"XofShake128 seeds are {SEED_SIZE} bytes, got {len(seed)}")
        if len(dst) > 255:
            raise ValueError("a domain-separation tag is at most 255 bytes")
        self._shake = hashlib.shake_128(bytes([len(dst)]) + dst + seed + binder)
        self._buf = b""
        self._pos = 0

    def next(self, length: int) -> bytes:
        """The next `length` bytes of the stream."""
        end = self._pos + length
        if end > len(self._buf):
            # hashlib's SHAKE has no incremental squeeze: the stream is
            # re-squeezed to a longer prefix (identical on the overlap).
            self._buf = self._shake.digest(max(end, 2 * len(self._buf)))
        out = self._buf[self._pos : end]
        self._pos = end
        return out

    def next_vec(self, f: Field, length: int) -> Vec:
        """`length` field elements by rejection sampling, in stream order (draft §6.2).

        Natively the bytes still come from hashlib's SHAKE128 (~10% of a
        per-report call, over a quarter of a batched preparation: docs/vdaf.md);
        the core decodes them and drops the elements ≥ p."""
        mask = next_power_of_2(f.modulus) - 1
        size = f.encoded_size
        parts: list[Vec] = []
        have = 0
        while have < length:
            want = length - have
            raw = self.next(want * size)
            if f._native():
                # the mask is all ones for both fields: only the comparison with p
                out = f.zeros(want)
                kept = out[: _backend.core().sample(f.fid, raw, out)]
                parts.append(kept)
                have += kept.size
                continue
            if size == 8:
                cand = np.frombuffer(raw, dtype="<u8").astype(object)
            elif size == 16:
                words = np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(object)
                cand = words[:, 0] + (words[:, 1] << 64)
            else:
                cand = np.array(
                    [int.from_bytes(raw[i : i + size], "little") for i in range(0, len(raw), size)],
                    dtype=object,
                )
            cand = cand & mask
            kept = cand[cand < f.modulus]
            parts.append(kept)
            have += kept.size
        if not parts:
            return f.zeros(0)
        return np.concatenate(parts)  # type: ignore[no-any-return]

    @classmethod
    def derive_seed(cls, seed: bytes, dst: bytes, binder: bytes) -> bytes:
        """A fresh SEED_SIZE-byte seed from the stream."""
        return cls(seed, dst, binder).next(SEED_SIZE)

    @classmethod
    def expand_into_vec(cls, f: Field, seed: bytes, dst: bytes, binder: bytes, length: int) -> Vec:
        """`length` field elements from a fresh stream."""
        return cls(seed, dst, binder).next_vec(f, length)


#: One piece of every row's XOF input, (buffer, offset, width, stride): row r's
#: bytes are buffer[offset + r·stride : offset + r·stride + width] (stride 0:
#: the same bytes for every row).  A row's input is its pieces in order.
Piece = tuple[Any, int, int, int]


def shared(data: bytes) -> Piece:
    """The same bytes in every row."""
    return (data, 0, len(data), 0)


def per_row(data: Any, width: int, offset: int = 0, stride: int | None = None) -> Piece:
    """`width` bytes per row of a buffer of rows (`stride` bytes apart, default
    `width`), from `offset`."""
    return (data, offset, width, width if stride is None else stride)


def _row_bytes(piece: Piece, r: int) -> bytes:
    data, offset, width, stride = piece
    if isinstance(data, np.ndarray):
        flat: Any = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        flat = memoryview(data).cast("B")
    start = offset + r * stride
    return bytes(flat[start : start + width])


def shake_rows(pieces: Sequence[Piece], rows: int, length: int) -> npt.NDArray[np.uint8]:
    """(rows, length) bytes: row r is the first `length` bytes of SHAKE128 over
    the concatenation of the pieces' row-r bytes.  Natively one call computes
    every row (several streams per Keccak permutation); the Python reference
    runs hashlib stream by stream."""
    out = np.empty((rows, length), dtype=np.uint8)
    if _backend.active() == "native":
        _backend.core().shake_rows(tuple(pieces), rows, out)
        return out
    for r in range(rows):
        message = b"".join(_row_bytes(p, r) for p in pieces)
        out[r] = np.frombuffer(hashlib.shake_128(message).digest(length), dtype=np.uint8)
    return out


def _header(dst: bytes) -> bytes:
    if len(dst) > 255:
        raise ValueError("a domain-separation tag is at most 255 bytes")
    return bytes([len(dst)]) + dst


def derive_seed_rows(
    seed: Piece, dst: bytes, binder: Sequence[Piece], rows: int
) -> npt.NDArray[np.uint8]:
    """(rows, SEED_SIZE): row r is XofShake128(seed_r, dst, binder_r).next(SEED_SIZE)
    (`derive_seed` of each row), the seed and binder given as pieces."""
    if seed[2] != SEED_SIZE:
        raise ValueError(f"XofShake128 seeds are {SEED_SIZE} bytes")
    return shake_rows([shared(_header(dst)), seed, *binder], rows, SEED_SIZE)


def _all_below_p(f: Field, out: Vec) -> bool:
    """Whether every element just drawn into `out` (native) is below p."""
    return bool(_backend.core().sample(f.fid, out, out) == out.size)


def expand_rows_into(
    f: Field,
    seed: Piece,
    dst: bytes,
    binder: Sequence[Piece],
    rows: int,
    length: int,
    out: Vec | None = None,
) -> Vec:
    """(rows, length): row r is XofShake128(seed_r, dst, binder_r).next_vec(f, length),
    the seed and binder given as pieces; written into `out` (a C-contiguous
    (rows, length) vector of the backend's representation) when given.

    Every row's first length·ENCODED_SIZE stream bytes are drawn together;
    only if some element is ≥ p (probability ~2^-32 per Field64 element, ~2^-62
    per Field128 element) are the rows redone stream by stream, which samples
    past the rejected elements exactly as `next_vec` does."""
    if seed[2] != SEED_SIZE:
        raise ValueError(f"XofShake128 seeds are {SEED_SIZE} bytes")
    pieces = [shared(_header(dst)), seed, *binder]
    size = f.encoded_size
    if next_power_of_2(f.modulus) == 1 << (8 * size):  # no mask: rejection is the only filter
        if f._native():
            drawn = np.empty((rows, length), dtype=f._dtype()) if out is None else out
            _backend.core().shake_rows(tuple(pieces), rows, drawn)
            if _all_below_p(f, drawn):
                return drawn
        else:
            raw = shake_rows(pieces, rows, length * size)
            try:
                decoded = f.decode_vec(raw.tobytes()).reshape(rows, length)
                if out is None:
                    return decoded
                out[...] = decoded
                return out
            except DecodeError:
                pass
    streams = [
        XofShake128(_row_bytes(seed, r), dst, b"".join(_row_bytes(p, r) for p in binder)).next_vec(
            f, length
        )
        for r in range(rows)
    ]
    result = np.stack(streams).reshape(rows, length) if streams else f.zeros(0, length)
    if out is None:
        return result
    out[...] = result
    return out


def expand_rows(
    f: Field, seeds: Sequence[bytes], dst: bytes, binders: Sequence[bytes], length: int
) -> Vec:
    """Row i is XofShake128(seeds[i], dst, binders[i]).next_vec(f, length): a batch's
    expansions, drawn and decoded together (`expand_rows_into`)."""
    if len(seeds) != len(binders):
        raise ValueError("one binder per seed")
    if any(len(s) != SEED_SIZE for s in seeds):
        raise ValueError(f"XofShake128 seeds are {SEED_SIZE} bytes")
    if len(set(map(len, binders))) > 1:  # pieces are one width per row
        out = [
            XofShake128(s, dst, b).next_vec(f, length) for s, b in zip(seeds, binders, strict=True)
        ]
        return np.stack(out).reshape(len(seeds), length)
    rows = len(seeds)
    width = len(binders[0]) if binders else 0
    seed_piece = per_row(b"".join(seeds), SEED_SIZE)
    binder_piece = per_row(b"".join(binders), width)
    return expand_rows_into(f, seed_piece, dst, [binder_piece], rows, length)
