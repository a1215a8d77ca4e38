"""Ahead-of-time joint noise: the rules both stores apply to a stream's pool of
jointly drawn noise shares (servers/exchange/joint.py says how the pool is filled and
consumed, docs/privacy.md why no share is ever used twice).

A stream's pool, on each server, is a pair of counters and the batches held:

- `next`: the first sequence number no batch has reserved yet.  A batch
  reserves [lo, lo + count) before its garbled sampler runs (lo ≥ next, then
  next = lo + count), so every sequence number is generated at most once.
- `used`: every sample below it is consumed or discarded.  A chunk takes
  [lo, lo + count) only if lo ≥ used, deletes every held sample below
  lo + count and sets used = lo + count, in one committed transaction before
  its comparison runs, so every sequence number is used at most once.
- the batches: this server's shares, keyed by their first sequence number.

Pure functions only: the stores call them inside their transactions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from svtagg.dp.errors import FailedPrecondition, InvalidArgument
from svtagg.mpc.ring import U64

#: One held batch: (first sequence number, this server's shares).
Batch = tuple[int, U64]

#: Sequence numbers stay below this (the stores keep them as signed 64-bit).
MAX_SEQ = 1 << 62

#: Most samples one batch exchange generates (≈ 1,600 AND gates each for lap24:
#: ≈ 0.5 GB of garbled tables at this size, streamed in lane batches).
MAX_BATCH = 10_000


@dataclass(frozen=True)
class JointPool:
    """A stream's pool on one server: its counters, whether its γ share came
    from a batch, and the runs of samples held, as (first, count), ascending."""

    next: int = 0
    used: int = 0
    gamma_ready: bool = False
    runs: tuple[tuple[int, int], ...] = ()

    @property
    def held(self) -> int:
        return sum(n for _, n in self.runs)

    def first_run(self) -> tuple[int, int]:
        """(first, count) of the contiguous samples from the lowest held one:
        what a chunk can take in one range ((used, 0) when none is held)."""
        if not self.runs:
            return self.used, 0
        first, count = self.runs[0]
        for lo, n in self.runs[1:]:
            if lo != first + count:
                break
            count += n
        return first, count


def runs_of(sizes: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The held runs, ascending, adjacent batches merged, from each batch's
    (first number, samples)."""
    out: list[tuple[int, int]] = []
    for lo, n in sorted(sizes):
        if out and out[-1][0] + out[-1][1] == lo:
            out[-1] = (out[-1][0], out[-1][1] + n)
        elif n:
            out.append((lo, n))
    return tuple(out)


def reserve(pool: JointPool, count: int, lo: int | None) -> int:
    """The first sequence number of a new batch of `count` samples: `lo` as the
    other server named it (the helper), refused if any of its numbers was
    reserved before; or (None: the leader) this server's next."""
    if not 1 <= count <= MAX_BATCH:
        raise InvalidArgument(f"a noise batch holds 1 to {MAX_BATCH} samples, not {count}")
    first = max(pool.next, pool.used) if lo is None else lo
    if first + count > MAX_SEQ:
        raise FailedPrecondition(f"a stream's pool numbers its samples below {MAX_SEQ}")
    if lo is None:
        return first
    if lo < max(pool.next, pool.used):
        raise FailedPrecondition(
            f"noise samples from {lo} were reserved before (next is {pool.next}): "
            "a batch is generated once"
        )
    return lo


def take(batches: Sequence[Batch], used: int, lo: int, count: int) -> tuple[U64, list[Batch]]:
    """Samples [lo, lo + count) out of the held `batches` (at least every one
    that starts below lo + count), and what to keep of them: only samples from
    lo + count on (everything below is consumed or discarded).  Refused if any
    of them was consumed or discarded (lo < used) or is not held here."""
    if count < 0 or lo < 0 or lo + count > MAX_SEQ:
        raise InvalidArgument(f"noise samples [{lo}, {lo + count}) out of [0, {MAX_SEQ})")
    if lo < used:
        raise FailedPrecondition(
            f"noise samples from {lo} are already consumed (this server's next unused is {used})"
        )
    end = lo + count
    parts: list[U64] = []
    keep: list[Batch] = []
    for first, shares in sorted(batches, key=lambda b: b[0]):
        last = first + len(shares)
        a, b = max(first, lo), min(last, end)
        if a < b:
            parts.append(shares[a - first : b - first])
        if last > end:
            start = max(first, end)
            keep.append((start, shares[start - first :]))
    taken = np.concatenate(parts).astype(np.uint64) if parts else np.zeros(0, dtype=np.uint64)
    if len(taken) != count:
        raise FailedPrecondition(
            f"noise samples [{lo}, {end}) are not all held here ({len(taken)} of {count})"
        )
    return taken, keep


def encode(shares: U64) -> bytes:
    return np.asarray(shares, dtype="<u8").tobytes()


def decode(blob: bytes) -> U64:
    return np.frombuffer(bytes(blob), dtype="<u8").astype(np.uint64)
