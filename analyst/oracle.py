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
from enum import StrEnum
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from svtagg.analyst.kinds import StreamKind, as_fraction, ctt_gap
from svtagg.mpc.ring import encode_scalar, sensitivity

Number = Fraction | int | float

#: Largest chunk a stream accepts in one call.
MAX_CHUNK = 100_000


class OracleError(Exception):
    """Base class for refusals by an oracle (budget, closed stream, bad input)."""


class BudgetExhausted(OracleError):
    """Opening the stream would exceed the dataset's (ε, δ) budget."""


class StreamClosed(OracleError):
    """The stream already answered YES / Close (or failed) and answers no more."""


@dataclass(frozen=True)
class Query:
    """A public query on the aggregate: coordinate `index` of S, or its complement.

    The complement is n − S_index, the sum of 1 − v_index: a score with per-user
    value in [0, 1] (the σ = −1 scores of sparse mean and MWEM).
    """

    index: int
    complement: bool = False


class Outcome(StrEnum):
    """Answer of one CompareToThresholds query."""

    HIGH = "high"
    LOW = "low"
    CLOSE = "close"


@dataclass
class Budget:
    """Remaining and total privacy budget of a dataset."""

    epsilon_total: Fraction
    delta_total: Fraction
    epsilon_spent: Fraction = Fraction(0)
    delta_spent: Fraction = Fraction(0)

    @property
    def epsilon_left(self) -> Fraction:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_left(self) -> Fraction:
        return self.delta_total - self.delta_spent


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

    def accuracy(
        self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float
    ) -> float:
        """α in score units: P(some of k answers is off by ≥ α) ≤ β."""
        ...

    def budget(self) -> Budget: ...

    def stats(self) -> OracleStats: ...


# -- chunk checks shared by every implementation --------------------------------------


def check_chunk_size(k: int) -> None:
    """A chunk holds 1..MAX_CHUNK queries."""
    if k < 1:
        raise ValueError("a chunk needs at least one query")
    if k > MAX_CHUNK:
        raise ValueError(f"a chunk holds at most {MAX_CHUNK} queries, got {k}")


def check_ctt_gaps(
    chunk: Sequence[tuple[Query, Number, Number]],
    epsilon: Fraction,
    delta: Fraction,
    parties: int,
) -> None:
    """Every (τL, τH) of a CompareToThresholds chunk must be at least the gap apart."""
    gap = ctt_gap(epsilon, delta, parties)
    need = Fraction(str(gap))
    for _, lo, hi in chunk:
        if as_fraction(hi, "tau_high") - as_fraction(lo, "tau_low") < need:
            raise ValueError(
                f"CompareToThresholds requires τH − τL ≥ {gap:.6g}; got τL={lo}, τH={hi}"
            )


def encode_thresholds(
    taus: Sequence[Number], frac_bits: int, bound: int | None = None
) -> npt.NDArray[np.int64]:
    """Thresholds (score units) onto the grid, exactly; refused beyond ±bound grid units.

    Whole numbers take a fast path; anything else goes through its exact rational.
    """
    unit = sensitivity(frac_bits)
    if taus and all(isinstance(t, (int, np.integer)) for t in taus):
        grid = [int(t) * unit for t in taus]
    else:
        grid = [encode_scalar(as_fraction(t, "threshold"), frac_bits) for t in taus]
    if bound is not None and any(abs(g) > bound for g in grid):
        raise ValueError(f"|threshold| must be at most {bound / unit:g} score units")
    return np.asarray(grid, dtype=np.int64)
