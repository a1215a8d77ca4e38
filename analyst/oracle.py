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

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol, runtime_checkable

from svtagg.dp.jointsvt import INDEPENDENT, JOINT, joint_allowance, joint_group_delta
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanCharge
from svtagg.dp.queries import Budget, Number, Outcome, Query

#: (candidates sent so far, candidates in all), after each chunk of a report-noisy-max.
TournamentProgress = Callable[[int, int], None]


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
        *,
        chunk_size: int | None = None,
        progress: TournamentProgress | None = None,
    ) -> int:
        """Report-noisy-max (stream kind nmax): charge ε like a stream, then the
        position in `queries` of the largest noisy score (one-sided Exp(2Δ/ε)
        noise per candidate, per party).  One selection per charge, whatever
        the number of chunks of `chunk_size` (default `MAX_CHUNK`) the
        candidates are sent in (`dp.queries.tournament_chunks`); `progress`
        is called after each chunk."""
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

    @property
    def noise(self) -> str:
        return joint_noise_of(self.inner)[0]

    @property
    def epsilon_min(self) -> Fraction:
        return Fraction(getattr(self.inner, "epsilon_min", 0) or 0)

    @property
    def frac_bits(self) -> int:
        return joint_noise_of(self.inner)[1]

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

    @property
    def opens_concurrently(self) -> bool:
        return bool(getattr(self.inner, "opens_concurrently", False))

    def open_streams(
        self, epsilons: Sequence[Number | str], kind: StreamKind | str = StreamKind.LAP24
    ) -> list[Stream]:
        """The inner oracle's `open_streams` (only where `opens_concurrently`), in
        the current group."""
        streams: list[Stream] = self.inner.open_streams(  # type: ignore[attr-defined]
            epsilons, kind, (self.plan_id, self.group)
        )
        self.opened += len(streams)
        return streams

    def noisy_max(
        self,
        queries: Sequence[Query],
        epsilon: Number | str,
        plan: tuple[str, int] | None = None,
        *,
        chunk_size: int | None = None,
        progress: TournamentProgress | None = None,
    ) -> int:
        out = self.inner.noisy_max(
            queries,
            epsilon,
            plan or (self.plan_id, self.group),
            chunk_size=chunk_size,
            progress=progress,
        )
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


#: A plan group's streams as the SDK declares them: (kind, ε) of every stream
#: the group may open, fixed before any data is touched.
GroupStreams = Sequence[tuple[StreamKind | str, Number | str]]


def joint_noise_of(oracle: object) -> tuple[str, int]:
    """(the task's noise option, its frac_bits) as the oracle knows them: an
    oracle that says nothing (the local simulation) is an independent-noise one."""
    noise = getattr(oracle, "noise", INDEPENDENT)
    return (noise if noise in (INDEPENDENT, JOINT) else INDEPENDENT), int(
        getattr(oracle, "frac_bits", 0)
    )


def group_delta(oracle: object, streams: GroupStreams) -> Fraction:
    """The δ a plan group needs for `streams` on this oracle's task: 0 with
    independent noise (the kinds the algorithms open charge no δ there), the sum
    of the streams' joint δ charges with joint noise (`dp.jointsvt.
    joint_group_delta`, the amount each server admits the stream's δ with)."""
    noise, frac_bits = joint_noise_of(oracle)
    if noise != JOINT:
        return Fraction(0)
    try:
        return joint_group_delta(((k, Fraction(str(e))) for k, e in streams), frac_bits)
    except ValueError as exc:
        raise ValueError(f"a plan stream cannot take joint noise: {exc}") from None


def plan_groups(oracle: object, streams: Sequence[GroupStreams]) -> list[tuple[Fraction, Fraction]]:
    """The plan's groups for `streams` (one list per group): each group holds
    exactly the ε of its streams and the δ `group_delta` says they will be charged."""
    return [
        (sum((Fraction(str(e)) for _, e in g), Fraction(0)), group_delta(oracle, g))
        for g in streams
    ]


def adaptive_groups(
    oracle: object, epsilons: Sequence[Number | str]
) -> list[tuple[Fraction, Fraction]]:
    """Plan groups of these ε for a body whose streams are not known in advance:
    δ = 0 on an independent-noise task; on a joint-noise task each group holds
    `dp.jointsvt.joint_allowance` (its most streams, by the task's epsilon_min,
    times the per-stream δ cap), which a basic plan partly returns at its end."""
    noise, _ = joint_noise_of(oracle)
    out = []
    for e in epsilons:
        eps = Fraction(str(e))
        if noise != JOINT:
            out.append((eps, Fraction(0)))
            continue
        eps_min = Fraction(getattr(oracle, "epsilon_min", 0) or 0)
        if eps_min <= 0:
            raise ValueError("a joint-noise task's oracle must know its epsilon_min")
        out.append((eps, joint_allowance(eps, eps_min)))
    return out


def check_plan_delta(
    oracle: object,
    groups: Sequence[tuple[Number | str, Number | str]],
    streams: Sequence[GroupStreams],
) -> None:
    """ValueError (before anything is reserved) if a group declares less ε or δ
    than its declared streams will be charged on this oracle's task."""
    if len(streams) != len(groups):
        raise ValueError(f"{len(groups)} plan groups but streams for {len(streams)}")
    for i, ((eps, dl), need) in enumerate(zip(groups, plan_groups(oracle, streams), strict=True)):
        have = (Fraction(str(eps)), Fraction(str(dl or 0)))
        if have[0] < need[0] or have[1] < need[1]:
            raise ValueError(
                f"plan group {i} declares (ε={have[0]}, δ={have[1]}) but its streams will be "
                f"charged (ε={need[0]}, δ={need[1]}) on this {joint_noise_of(oracle)[0]}-noise "
                "task: the plan under-declares its budget"
            )


@contextmanager
def planned(
    oracle: Oracle,
    groups: Sequence[tuple[Number | str, Number | str]],
    delta_slack: Number | str = 0,
    streams: Sequence[GroupStreams] | None = None,
) -> Iterator[PlannedOracle]:
    """Reserve the plan before any stream opens (refused whole, nothing spent, if
    it does not fit), run the body on a `PlannedOracle`, and end the plan when
    the body returns cleanly (what it did not use comes back, for basic plans).

    `streams` (one list of (kind, ε) per group): the streams the body may open,
    checked against the groups first (`check_plan_delta`): a plan that
    under-declares what they will be charged — on a joint-noise task, the
    joint δ of each stream — is refused before anything is reserved.

    After an error the plan is left as it is (a crash never refunds), with one
    exception: a ValueError (an invalid argument, refused before any charge or
    noise draw) before the plan's first stream opened.  Then nothing under the
    plan has touched the data, and ending it returns the whole reservation, so a
    run that cannot start costs nothing."""
    if streams is not None:
        check_plan_delta(oracle, groups, streams)
    plan_id, charge = oracle.reserve_plan(groups, delta_slack)
    view = PlannedOracle(oracle, plan_id, charge)
    try:
        yield view
    except ValueError:
        if view.opened == 0:
            oracle.end_plan(plan_id)
        raise
    oracle.end_plan(plan_id)
