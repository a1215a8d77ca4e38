"""One algorithm run's access to the oracle: it opens streams, asks chunks at
thresholds rounded to whole score units, and records what the run spent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from svtagg.analyst.oracle import Oracle, Stream
from svtagg.analyst.selection.records import Candidates, Spend
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import MAX_CHUNK

#: Thresholds are sent as whole score units (see `Session._tau`), which moves
#: each by at most 1/2; the interval bookkeeping widens every α by that much.
ROUNDING_SLACK = 0.5


class Session:
    """Opens streams and asks chunks on behalf of one algorithm run, recording spend."""

    def __init__(self, oracle: Oracle, kind: StreamKind | str, spend: Spend | None = None):
        self.oracle = oracle
        self.kind = StreamKind.parse(kind)
        self.spend = spend if spend is not None else Spend()
        # Thresholds beyond what a server accepts carry no information (see `_tau`).
        self.tau_limit = 4 * oracle.n - 1

    def open(self, epsilon: Fraction) -> Stream:
        stream = self.oracle.open_stream(epsilon, self.kind)
        self.spend.streams += 1
        self.spend.epsilon += epsilon
        return stream

    def alpha(self, epsilon: Fraction, k: int, beta: float) -> float:
        """α from the oracle (recorded as is) plus the threshold rounding slack."""
        a = float(self.oracle.accuracy(self.kind, epsilon, k, beta))
        self.spend.alphas.append(a)
        return a + ROUNDING_SLACK

    def _tau(self, tau: float) -> int:
        """The threshold actually sent: τ rounded to a whole score unit, within ±4n.

        Whole units take the oracle's exact integer path (no per-threshold rational
        encoding, which dominated run time); the ±1/2 this moves a threshold is
        covered by `ROUNDING_SLACK`, added to every α the bookkeeping uses.
        Servers refuse |τ| > 4n; such a threshold already lies far outside every
        score, so clamping only matters when the noise is of the order of 4n, i.e.
        when the stream is useless anyway.  Both are data-independent.
        """
        return min(max(math.floor(tau + 0.5), -self.tau_limit), self.tau_limit)

    def ask(
        self, stream: Stream, cands: Candidates, positions: Sequence[int], m: float
    ) -> int | None:
        """Batch SVT of candidates `positions` at threshold m (score units) on `stream`.

        Returns the position in `positions` of the first YES, or None.  Chunks longer
        than MAX_CHUNK are split: consecutive chunks on one stream are the same
        online AboveThreshold mechanism.
        """
        for start in range(0, len(positions), MAX_CHUNK):
            part = positions[start : start + MAX_CHUNK]
            chunk = [(cands.queries[p], self._tau(m - cands.offsets[p])) for p in part]
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
        said YES."""
        stream = self.open(epsilon)
        for i, m in enumerate(levels):
            hit = self.ask(stream, cands, positions, m)
            if hit is not None:
                return hit, i
        return None


def check_beta(beta: float) -> float:
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return float(beta)


def default_rounds(width: float) -> int:
    """T = max(1, ⌈log2 W⌉), the paper's default number of rounds for an interval W."""
    return max(1, math.ceil(math.log2(width))) if width > 1 else 1
