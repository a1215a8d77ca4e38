"""What the selection algorithms take and return: the candidates and where to
search among them, the record of what a run spent, and the results.  Shared by
every module of the package and by the applications; no algorithm lives here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from svtagg.analyst.oracle import Oracle
from svtagg.dp.queries import Query


class Variant(StrEnum):
    """Which version of an algorithm runs: as the paper writes it, with the tuned
    constants of Algorithm 9, the practical selection (`practical_selection`), or
    the scan selection (`scan_selection`, `scan_top_k`)."""

    PAPER = "paper"
    TUNED = "tuned"
    PRACTICAL = "practical"
    SCAN = "scan"


def variant_of(value: Variant | str, *allowed: Variant) -> Variant:
    """`value` as a Variant, refused unless it is one of `allowed`."""
    if value not in allowed:
        names = " or ".join(repr(a.value) for a in allowed)
        raise ValueError(f"variant must be {names}, got {value!r}")
    return Variant(value)


@dataclass
class Spend:
    """What an algorithm spent: streams opened, queries answered, budget, α's used.

    `queries` counts answered queries (a chunk answers up to and including its
    first YES, as in batch SVT); `queries_sent` counts every (query, τ) pair sent.
    """

    streams: int = 0
    queries: int = 0
    queries_sent: int = 0
    chunks: int = 0
    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    alphas: list[float] = field(default_factory=list)

    def add(self, other: Spend) -> None:
        self.streams += other.streams
        self.queries += other.queries
        self.queries_sent += other.queries_sent
        self.chunks += other.chunks
        self.epsilon += other.epsilon
        self.delta += other.delta
        self.alphas.extend(other.alphas)


@dataclass(frozen=True)
class Candidates:
    """Candidate scores q_j(S) + w_j: queries with public offsets (default 0).

    `groups` (optional) gives every candidate a public label: `scan_top_k` removes
    a pick's whole group from the later ranks (sparse mean's two signs of one
    coordinate); the one-winner selections do not use it.
    """

    queries: tuple[Query, ...]
    offsets: tuple[float, ...]
    groups: tuple[int, ...] | None = None

    @classmethod
    def coordinates(cls, d: int) -> Candidates:
        """The d coordinates of the aggregate, no offsets: the plain selection problem."""
        return cls(tuple(Query(j) for j in range(d)), (0.0,) * d)

    @classmethod
    def of(
        cls,
        queries: Sequence[Query],
        offsets: Sequence[float] | None = None,
        groups: Sequence[int] | None = None,
    ) -> Candidates:
        offs = tuple(float(w) for w in offsets) if offsets is not None else (0.0,) * len(queries)
        if len(offs) != len(queries):
            raise ValueError("one offset per query is required")
        if groups is not None and len(groups) != len(queries):
            raise ValueError("one group label per candidate is required")
        return cls(tuple(queries), offs, tuple(groups) if groups is not None else None)

    def __len__(self) -> int:
        return len(self.queries)


@dataclass(frozen=True)
class SearchSpace:
    """Where a search runs: Algorithm 8's P, [ℓ, u] and j0.

    Defaults: the d coordinates of the aggregate as candidates, all of them
    searched, [0, n], and the first searched position as the witness j0 (the
    answer when no stream ever says YES).  The caller vouches for the interval:
    Algorithm 8 requires max_{j∈P} s_j ≤ u and s_{j0} ≥ ℓ.
    """

    candidates: Candidates | None = None
    subset: Sequence[int] | None = None
    interval: tuple[float, float] | None = None
    witness: int | None = None

    def resolve(self, oracle: Oracle) -> Region:
        """The space with every default filled in from the oracle's public d and n."""
        cands = self.candidates if self.candidates is not None else Candidates.coordinates(oracle.d)
        positions = list(self.subset) if self.subset is not None else list(range(len(cands)))
        if not positions:
            raise ValueError("need at least one candidate")
        lo, hi = self.interval if self.interval is not None else (0.0, float(oracle.n))
        witness = self.witness if self.witness is not None else positions[0]
        return Region(cands, positions, lo, hi, witness)


@dataclass(frozen=True)
class Region:
    """A resolved `SearchSpace`: the candidates, the positions searched (indices
    into the candidates), the interval [lower, upper] and the witness."""

    cands: Candidates
    positions: Sequence[int]
    lower: float
    upper: float
    witness: int

    @property
    def width(self) -> float:
        return self.upper - self.lower


@dataclass(frozen=True)
class SelectionResult:
    """Chosen candidate (position in the candidate list and its query) and the record.

    `lower`/`upper` is the interval the algorithm certifies: w.p. ≥ 1 − β the chosen
    score is ≥ lower and every candidate's score is ≤ upper (Algorithm 8 and 9);
    Algorithms 6 and 7 report their final search interval.
    """

    index: int
    query: Query
    lower: float
    upper: float
    spend: Spend
    planned_epsilon: Fraction


@dataclass(frozen=True)
class SumEstimate:
    """Corollary 6.8: an interval [lower, upper] containing the sum w.p. ≥ 1 − β."""

    estimate: float
    lower: float
    upper: float
    spend: Spend
    planned_epsilon: Fraction


@dataclass(frozen=True)
class ScanTopK:
    """`scan_top_k`'s picks in rank order (positions in the candidate list) and record.

    Per rank r, w.p. ≥ 1 − β for all ranks together: the pick's score is ≥ lowers[r]
    and every candidate not chosen before rank r scores ≤ uppers[r]."""

    indices: list[int]
    lowers: list[float]
    uppers: list[float]
    spend: Spend
    planned_epsilon: Fraction
