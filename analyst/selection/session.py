"""One algorithm run's access to the oracle: it opens streams, asks chunks at
thresholds rounded to whole score units, and records what the run spent."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from svtagg.analyst.oracle import Oracle, Stream
from svtagg.analyst.selection.records import Candidates, Spend
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import MAX_CHUNK

#: A descending scan (`Session.descend`) puts as many whole levels in one chunk
#: as fit in this many comparisons (at least one level per chunk).
DESCEND_CHUNK = 16_384

#: Thresholds are sent as whole score units (see `Session._tau`), which moves
#: each by at most 1/2; the interval bookkeeping widens every α by that much.
ROUNDING_SLACK = 0.5


class Session:
    """Opens streams and asks chunks on behalf of one algorithm run, recording spend."""

    def __init__(
        self,
        oracle: Oracle,
        kind: StreamKind | str,
        spend: Spend | None = None,
        descend_chunk: int = DESCEND_CHUNK,
    ):
        if descend_chunk < 1:
            raise ValueError(f"descend_chunk must be at least 1, got {descend_chunk}")
        self.oracle = oracle
        self.descend_chunk = descend_chunk
        self._ahead: deque[tuple[Fraction, Stream]] = deque()
        self.kind = StreamKind.parse(kind)
        self.spend = spend if spend is not None else Spend()
        # Thresholds beyond what a server accepts carry no information (see `_tau`).
        self.tau_limit = 4 * oracle.n - 1

    def open(self, epsilon: Fraction) -> Stream:
        """A stream of budget ε: the next one opened ahead (`open_ahead`), or a new one."""
        if self._ahead:
            planned = self._ahead[0][0]
            if planned != epsilon:
                raise ValueError(f"the next stream opened ahead has ε = {planned}, not {epsilon}")
            return self._ahead.popleft()[1]
        stream = self.oracle.open_stream(epsilon, self.kind)
        self.spend.streams += 1
        self.spend.epsilon += epsilon
        return stream

    def open_ahead(self, epsilons: Sequence[Fraction]) -> None:
        """Open now, all at once, the streams the run will certainly open next, in
        this order (`open` hands them out).  Only an oracle that opens several streams
        concurrently (`opens_concurrently`: the servers) does anything: k opens
        then cost about one round trip's wait instead of k.  Each is charged when
        opened here, as it would have been a little later; a run that fails in
        between leaves them charged and unused."""
        if not epsilons or not getattr(self.oracle, "opens_concurrently", False):
            return
        streams = self.oracle.open_streams(list(epsilons), self.kind)  # type: ignore[attr-defined]
        for eps, stream in zip(epsilons, streams, strict=True):
            self._ahead.append((eps, stream))
            self.spend.streams += 1
            self.spend.epsilon += eps

    def alpha(self, epsilon: Fraction, k: int, beta: float) -> float:
        """α from the oracle (recorded as is) plus the threshold rounding slack."""
        a = float(self.oracle.accuracy(self.kind, epsilon, k, beta))
        self.spend.alphas.append(a)
        return a + ROUNDING_SLACK

    def _taus(
        self, cands: Candidates, positions: Sequence[int], levels: Sequence[float]
    ) -> list[int]:
        """The thresholds actually sent for `positions` at each of `levels` in turn
        (level-major): m − offset rounded to a whole score unit, within ±4n.

        Whole units take the oracle's exact integer path (no per-threshold rational
        encoding, which dominated run time); the ±1/2 this moves a threshold is
        covered by `ROUNDING_SLACK`, added to every α the bookkeeping uses.
        Servers refuse |τ| > 4n; such a threshold already lies far outside every
        score, so clamping only matters when the noise is of the order of 4n, i.e.
        when the stream is useless anyway.  Both are data-independent.
        """
        offsets = np.asarray(cands.offsets, dtype=np.float64)[np.asarray(positions, dtype=np.intp)]
        m = np.asarray(levels, dtype=np.float64)[:, None]
        taus = np.clip(np.floor(m - offsets[None, :] + 0.5), -self.tau_limit, self.tau_limit)
        out: list[int] = taus.astype(np.int64).ravel().tolist()
        return out

    def ask(
        self, stream: Stream, cands: Candidates, positions: Sequence[int], m: float
    ) -> int | None:
        """Batch SVT of candidates `positions` at threshold m (score units) on `stream`.

        Returns the position in `positions` of the first YES, or None.  Chunks longer
        than MAX_CHUNK are split: consecutive chunks on one stream are the same
        online AboveThreshold mechanism.
        """
        return self._ask_levels(stream, cands, positions, [m])

    def _ask_levels(
        self, stream: Stream, cands: Candidates, positions: Sequence[int], levels: Sequence[float]
    ) -> int | None:
        """Batch SVT of all of `positions` at each of `levels` in turn: the index of
        the first YES in that order (level-major), or None."""
        queries = [cands.queries[p] for p in positions] * len(levels)
        pairs = list(zip(queries, self._taus(cands, positions, levels), strict=True))
        for start in range(0, len(pairs), MAX_CHUNK):
            chunk = pairs[start : start + MAX_CHUNK]
            hit = stream.ask(chunk)
            self.spend.chunks += 1
            self.spend.queries_sent += len(chunk)
            self.spend.queries += len(chunk) if hit is None else hit + 1
            if hit is not None:
                return start + hit
        return None

    def descend(
        self,
        cands: Candidates,
        positions: Sequence[int],
        levels: Sequence[float],
        epsilon: Fraction,
    ) -> tuple[int, int] | None:
        """One stream of budget ε asking all of `positions` at each of `levels` in
        turn: (position in `positions`, level index) of its YES, or None if it never
        said YES.

        Whole levels go to the stream together, as many as fit in `descend_chunk`
        comparisons: the stream sees the same queries in the same order as level
        by level (the next level is asked only after all-NO answers, which is what
        a chunk's first-YES index already tells), so the released output has the
        same distribution; a chunk's comparisons after its first YES are computed
        and not released.  Fewer, larger chunks cost fewer round trips and more
        comparisons (at most one chunk's worth more per stream).
        """
        stream = self.open(epsilon)
        size = len(positions)
        if size == 0:
            return None
        per = max(1, self.descend_chunk // size)
        for first in range(0, len(levels), per):
            hit = self._ask_levels(stream, cands, positions, levels[first : first + per])
            if hit is not None:
                return hit % size, first + hit // size
        return None


def check_beta(beta: float) -> float:
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return float(beta)


def default_rounds(width: float) -> int:
    """T = max(1, ⌈log2 W⌉), the paper's default number of rounds for an interval W."""
    return max(1, math.ceil(math.log2(width))) if width > 1 else 1
