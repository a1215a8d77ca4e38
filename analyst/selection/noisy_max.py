"""Report-noisy-max as a selection baseline: one draw per candidate, one
argmax, one ε (stream kind nmax; docs/algorithms.md, "Report-noisy-max").

Unlike the SVT selections it is not a sequence of threshold comparisons: the
oracle adds one-sided Exp(2Δ/ε) noise per candidate (each server its own, on
its share) and reveals the position of the largest noisy score.  It touches
data through `Oracle.noisy_max` only, so it runs on the local oracle, the
servers and a plan alike.  More candidates than one chunk (`MAX_CHUNK`) go to
the servers in several chunks of one tournament, whose winner so far is
carried secret-shared between them, so one ε still pays for the one index
released (docs/algorithms.md); at most `MAX_TOURNAMENT` candidates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from svtagg.analyst.oracle import Oracle, TournamentProgress
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import MAX_TOURNAMENT, Epsilon, Number, Query


@dataclass(frozen=True)
class NoisyMaxResult:
    """The chosen candidate (its position and query) and the accuracy the noise
    allows: w.p. ≥ 1 − β its score is above the largest score minus `alpha`."""

    index: int
    query: Query
    alpha: float
    epsilon: Fraction


def noisy_max_selection(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float = 0.05,
    candidates: Sequence[Query] | None = None,
    *,
    chunk_size: int | None = None,
    progress: TournamentProgress | None = None,
) -> NoisyMaxResult:
    """Report-noisy-max over `candidates` (default: every coordinate) at ε, in
    chunks of `chunk_size` (default `MAX_CHUNK`); `progress` after each chunk."""
    eps = Epsilon.parse(epsilon).value
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    queries = list(candidates) if candidates is not None else [Query(j) for j in range(oracle.d)]
    check_candidates(len(queries))
    alpha = oracle.accuracy(StreamKind.NMAX, eps, len(queries), beta)
    index = oracle.noisy_max(queries, eps, chunk_size=chunk_size, progress=progress)
    return NoisyMaxResult(index, queries[index], alpha, eps)


def check_candidates(k: int) -> None:
    """One tournament holds 1..MAX_TOURNAMENT candidates (ValueError otherwise)."""
    if not 1 <= k <= MAX_TOURNAMENT:
        raise ValueError(
            f"report-noisy-max runs one tournament of 1..{MAX_TOURNAMENT:,} candidates, got {k:,}"
        )
