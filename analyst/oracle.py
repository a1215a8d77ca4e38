"""The oracle interface every selection algorithm is written against.

An oracle holds (shares of) the per-coordinate sums S = Σ_i v_i of n users'
embeddings v_i ∈ [0,1]^d and answers SVT streams on them.  Algorithms see only
the stream outputs: the index of the first YES in a chunk, or None.  Two
implementations exist: `LocalOracle` (central, plaintext, the reference) and
`RemoteOracle` (the two servers).

Conventions shared by all implementations:
- Scores and thresholds are in *score units* (sums of [0,1] values); the
  oracle encodes thresholds exactly onto the grid of 2^F units per user.
- A query is YES when noisy score ≥ noisy threshold (the rule of Algorithm 3
  and of the note; ties have positive probability with discrete noise, and ≥
  is used everywhere).
- Opening a stream charges its (ε, δ) to the budget before any noise is drawn;
  a YES (or Close) closes the stream; a closed stream refuses further queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol, runtime_checkable

from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Budget, Number, Outcome, Query


@dataclass
class OracleStats:
    """What an oracle served: every stream opened and every query answered."""

    streams: int = 0
    queries: int = 0
    chunks: int = 0
    epsilon_spent: Fraction = Fraction(0)
    delta_spent: Fraction = Fraction(0)
    by_kind: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class Stream(Protocol):
    """One open SVT stream."""

    kind: StreamKind
    epsilon: Fraction
    delta: Fraction

    @property
    def closed(self) -> bool: ...

    @property
    def queries_answered(self) -> int: ...

    def ask(self, chunk: Sequence[tuple[Query, Number]]) -> int | None:
        """Batch SVT over (query, τ) pairs: index in `chunk` of the first YES, or None.

        A YES closes the stream.  Raises StreamClosed on a closed stream, and
        ValueError for an empty or oversized chunk or a CompareToThresholds stream.
        """
        ...

    def compare(self, chunk: Sequence[tuple[Query, Number, Number]]) -> list[Outcome]:
        """CompareToThresholds over (query, τL, τH): outcomes up to and including
        the first CLOSE (which closes the stream).  Requires τH − τL ≥ gap."""
        ...

    def alpha(self, k: int, beta: float) -> float:
        """Accuracy of this stream for k queries with failure probability β."""
        ...


@runtime_checkable
class Oracle(Protocol):
    """What every selection algorithm may use; nothing here exposes data."""

    @property
    def n(self) -> int:
        """Public number of users."""
        ...

    @property
    def d(self) -> int:
        """Number of coordinates of the aggregate."""
        ...

    @property
    def parties(self) -> int:
        """1 for central noise, 2 for the two-server noise model."""
        ...

    def open_stream(
        self,
        epsilon: Number | str,
        kind: StreamKind | str = StreamKind.LAP24,
        delta: Number | str = 0,
    ) -> Stream: ...

    def accuracy(self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float) -> float:
        """α in score units: P(some of k answers is off by ≥ α) ≤ β."""
        ...

    def budget(self) -> Budget: ...

    def stats(self) -> OracleStats: ...
