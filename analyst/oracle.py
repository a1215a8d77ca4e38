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

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol, runtime_checkable

from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanCharge
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
        plan: tuple[str, int] | None = None,
    ) -> Stream:
        """Charge the budget (or group `plan[1]` of the reserved plan `plan[0]`)
        and open a stream."""
        ...

    def noisy_max(
        self,
        queries: Sequence[Query],
        epsilon: Number | str,
        plan: tuple[str, int] | None = None,
    ) -> int:
        """Report-noisy-max (stream kind nmax): charge ε like a stream, then the
        position in `queries` of the largest noisy score (one-sided Exp(2Δ/ε)
        noise per candidate, per party).  One selection per charge."""
        ...

    def reserve_plan(
        self, groups: Sequence[tuple[Number | str, Number | str]], delta_slack: Number | str = 0
    ) -> tuple[str, PlanCharge]:
        """Reserve a budget plan (`svtagg.dp.plans`): its id and its charge."""
        ...

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        """End a plan cleanly: what it did not use comes back (basic plans)."""
        ...

    def accuracy(self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float) -> float:
        """α in score units: P(some of k answers is off by ≥ α) ≤ β."""
        ...

    def budget(self) -> Budget: ...

    def stats(self) -> OracleStats: ...


class PlannedOracle:
    """An oracle whose streams are counted against one reserved plan: every
    `open_stream` goes to the current `group`.  Algorithms run on it unchanged."""

    def __init__(self, inner: Oracle, plan_id: str, charge: PlanCharge) -> None:
        self.inner = inner
        self.plan_id = plan_id
        self.charge = charge
        self.group = 0
        #: Streams opened under the plan so far.
        self.opened = 0

    @property
    def n(self) -> int:
        return self.inner.n

    @property
    def d(self) -> int:
        return self.inner.d

    @property
    def parties(self) -> int:
        return self.inner.parties

    def open_stream(
        self,
        epsilon: Number | str,
        kind: StreamKind | str = StreamKind.LAP24,
        delta: Number | str = 0,
        plan: tuple[str, int] | None = None,
    ) -> Stream:
        stream = self.inner.open_stream(epsilon, kind, delta, plan or (self.plan_id, self.group))
        self.opened += 1
        return stream

    def noisy_max(
        self,
        queries: Sequence[Query],
        epsilon: Number | str,
        plan: tuple[str, int] | None = None,
    ) -> int:
        out = self.inner.noisy_max(queries, epsilon, plan or (self.plan_id, self.group))
        self.opened += 1
        return out

    def reserve_plan(
        self, groups: Sequence[tuple[Number | str, Number | str]], delta_slack: Number | str = 0
    ) -> tuple[str, PlanCharge]:
        raise ValueError("plans do not nest")

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        return self.inner.end_plan(plan_id)

    def accuracy(self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float) -> float:
        return self.inner.accuracy(kind, epsilon, k, beta)

    def budget(self) -> Budget:
        return self.inner.budget()

    def stats(self) -> OracleStats:
        return self.inner.stats()


@contextmanager
def planned(
    oracle: Oracle,
    groups: Sequence[tuple[Number | str, Number | str]],
    delta_slack: Number | str = 0,
) -> Iterator[PlannedOracle]:
    """Reserve the plan before any stream opens (refused whole, nothing spent, if
    it does not fit), run the body on a `PlannedOracle`, and end the plan when
    the body returns cleanly (what it did not use comes back, for basic plans).

    After an error the plan is left as it is (a crash never refunds), with one
    exception: a ValueError (an invalid argument, refused before any charge or
    noise draw) before the plan's first stream opened.  Then nothing under the
    plan has touched the data, and ending it returns the whole reservation, so a
    run that cannot start costs nothing."""
    plan_id, charge = oracle.reserve_plan(groups, delta_slack)
    view = PlannedOracle(oracle, plan_id, charge)
    try:
        yield view
    except ValueError:
        if view.opened == 0:
            oracle.end_plan(plan_id)
        raise
    oracle.end_plan(plan_id)
