"""The practical selection: Algorithm 8 at a share of ε to localise the maximum,
then one descending-scan stream (Algorithm 7 restricted to the localised
interval) to decide.  Not in the paper; built from its pieces."""

from __future__ import annotations

from svtagg.analyst.oracle import Oracle
from svtagg.analyst.selection.plans import (
    PracticalOptions,
    PracticalPlan,
    plan_misfit,
    plan_practical,
)
from svtagg.analyst.selection.records import SearchSpace, SelectionResult
from svtagg.analyst.selection.search import GbsSchedule, dense_levels, gbs, level_certificate
from svtagg.analyst.selection.session import Session
from svtagg.dp.queries import Epsilon, Number


def practical_selection(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    space: SearchSpace | None = None,
    options: PracticalOptions | None = None,
    plan: PracticalPlan | None = None,
) -> SelectionResult:
    """Practical selection: coarse Algorithm 8, then a fine descending scan on one stream.

    See `PracticalPlan` for the stages; `options` (default `PracticalOptions()`)
    are the analyst's choices the plan is made from, unless `plan` is given.
    Witness rule: the fine stream's first YES; if it never answers YES (only when
    the coarse certificate failed or the noise was extreme), the coarse stage's
    witness — the YES with the best certified lower bound, Algorithm 8's rule —
    and if no stream ever said YES, the given witness.
    Privacy: basic composition of T_c + 1 streams whose budgets sum to ε exactly,
    all fixed by the plan before data is touched (thresholds are adaptive, which
    AboveThreshold allows).  Queries ≤ `plan.max_queries()`.  W.p. ≥ 1 − β: the
    chosen score is ≥ ℓ' and every score ≤ u', and u' − ℓ' ≤ `plan.error_bound()`.
    """
    region = (space or SearchSpace()).resolve(oracle)
    size = len(region.positions)
    pl = (
        plan
        if plan is not None
        else plan_practical(oracle, epsilon, beta, size, region.width, options=options)
    )
    if plan_misfit(pl, size, region.width):
        raise ValueError("plan was made for another candidate count or interval")
    session = Session(oracle, pl.kind)
    coarse = GbsSchedule(pl.coarse_rounds, pl.coarse_epsilon, pl.beta / 2, pl.ratio)
    best, lo_c, hi_c = gbs(session, region, coarse)
    a_f = session.alpha(pl.fine_epsilon, pl.size * pl.max_levels, pl.beta / 2)
    levels = dense_levels(hi_c, lo_c - a_f, pl.step, pl.max_levels)
    cands, positions = region.cands, region.positions
    found = session.descend(cands, positions, levels, pl.fine_epsilon)
    if found is not None:
        hit, i = found
        j = positions[hit]
        lower, upper = level_certificate(levels, i, a_f, hi_c)
        return SelectionResult(j, cands.queries[j], lower, upper, session.spend, pl.planned_epsilon)
    # No YES down to ℓ_c − α_f contradicts the coarse certificate (max ≥ ℓ_c), so one
    # of the two stages failed; report the coarse stage's witness and certificate.
    return SelectionResult(best, cands.queries[best], lo_c, hi_c, session.spend, pl.planned_epsilon)
