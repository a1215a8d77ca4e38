"""Report-noisy-max as a selection baseline: one draw per candidate, one
argmax, one ε (stream kind nmax; docs/algorithms.md, "Report-noisy-max").

Unlike the SVT selections it is not a sequence of threshold comparisons: the
oracle adds one-sided Exp(2Δ/ε) noise per candidate (each server its own, on
its share) and reveals the position of the largest noisy score.  It touches
data through `Oracle.noisy_max` only, so it runs on the local oracle, the
servers and a plan alike.  Its candidates fit one chunk (`MAX_CHUNK`): the
servers run one tournament per stream, and a selection over more candidates
would need the tournament's intermediate winners kept secret between chunks,
which the servers do not do (docs/algorithms.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from svtagg.analyst.oracle import Oracle
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import MAX_CHUNK, Epsilon, Number, Query


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
) -> NoisyMaxResult:
    """Report-noisy-max over `candidates` (default: every coordinate) at ε."""
    eps = Epsilon.parse(epsilon).value
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    queries = list(candidates) if candidates is not None else [Query(j) for j in range(oracle.d)]
    check_candidates(len(queries))
    alpha = oracle.accuracy(StreamKind.NMAX, eps, len(queries), beta)
    index = oracle.noisy_max(queries, eps)
    return NoisyMaxResult(index, queries[index], alpha, eps)


def check_candidates(k: int) -> None:
    """One tournament holds 1..MAX_CHUNK candidates (ValueError otherwise)."""
    if not 1 <= k <= MAX_CHUNK:
        raise ValueError(
            f"report-noisy-max runs one tournament of 1..{MAX_CHUNK:,} candidates, got {k:,}"
        )
