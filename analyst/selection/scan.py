"""The scan selection (`scan_selection`) and its top-k (`scan_top_k`): a short
localisation (a geometric binary search, then an optional middle scan at a
coarse step) and one deciding descending-scan stream per rank.  Not in the
paper; built from its pieces.  `ScanPlan` describes the stages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from svtagg.analyst.oracle import Oracle
from svtagg.analyst.selection.plans import ScanOptions, ScanPlan, plan_misfit, plan_scan
from svtagg.analyst.selection.records import Region, ScanTopK, SearchSpace, SelectionResult
from svtagg.analyst.selection.search import (
    SCAN_RANK_DENSE,
    dense_levels,
    extend_doubling,
    level_certificate,
)
from svtagg.analyst.selection.session import ROUNDING_SLACK, Session
from svtagg.dp.queries import Epsilon, Number

#: (ranks chosen so far, k, queries answered so far), after each rank.
RankProgress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class _Localised:
    """What the localisation released: its witness (None when no stream said YES)
    and the interval [lower, upper] the deciding scan starts from."""

    witness: int | None
    lower: float
    upper: float


def _scan_plan(
    oracle: Oracle,
    region: Region,
    k: int,
    epsilon: Epsilon | Number | str,
    beta: float,
    options: ScanOptions | None,
    plan: ScanPlan | None,
) -> ScanPlan:
    """The plan (given, or `plan_scan`'s for k ranks over the region); refuses a
    plan made for another candidate count, interval or k."""
    size = len(region.positions)
    pl = (
        plan
        if plan is not None
        else plan_scan(oracle, epsilon, beta, size, region.width, k=k, options=options)
    )
    if plan_misfit(pl, size, region.width) or pl.streams != k:
        raise ValueError("plan was made for another candidate count, interval or k")
    return pl


def _scan_coarse(session: Session, region: Region, plan: ScanPlan) -> _Localised:
    """The coarse stage on [ℓ, u].

    Witness: the YES with the best certified lower bound (Algorithm 8's rule); when
    no YES raised ℓ, the most recent YES; None when no stream said YES.  All three
    depend only on released outputs.
    """
    positions = region.positions
    lo, hi = float(region.lower), float(region.upper)
    best: int | None = None
    last: int | None = None
    for e_t, a_up, a_lo in zip(plan.coarse_budgets, plan.coarse_up, plan.coarse_lo, strict=True):
        session.spend.alphas.append(a_lo)
        m = (lo + hi) / 2
        hit = session.ask(session.open(e_t), region.cands, positions, m)
        if hit is None:
            hi = min(hi, m + a_up + ROUNDING_SLACK)
            continue
        last = positions[hit]
        if m - a_lo - ROUNDING_SLACK > lo:
            lo = m - a_lo - ROUNDING_SLACK
            best = positions[hit]
    return _Localised(best if best is not None else last, lo, hi)


def _mid_stage(session: Session, region: Region, coarse: _Localised, plan: ScanPlan) -> _Localised:
    """The middle stream: descend from u_c at `mid_step` (then doubling) until a YES
    at level m_i; returns its candidate (or the coarse witness) and
    [max(ℓ_c, m_i − mid_lo), min(u_c, m_{i−1} + mid_up)].  For one-sided noise the
    NO at m_{i−1} bounds every score by m_{i−1} + γ, so `mid_up` bounds γ alone."""
    lo_c, hi_c = coarse.lower, coarse.upper
    floor_level = lo_c - plan.mid_lo - ROUNDING_SLACK
    levels = dense_levels(hi_c, floor_level, plan.mid_step, plan.mid_dense)
    extend_doubling(levels, plan.mid_step, plan.mid_tail, session.tau_limit)
    session.spend.alphas.append(plan.mid_lo)
    found = session.descend(region.cands, region.positions, levels, plan.mid_epsilon)
    if found is None:
        return coarse
    hit, i = found
    lower = max(lo_c, levels[i] - plan.mid_lo - ROUNDING_SLACK)
    upper = hi_c if i == 0 else min(hi_c, levels[i - 1] + plan.mid_up + ROUNDING_SLACK)
    return _Localised(region.positions[hit], lower, max(upper, lower))


def _scan_localise(session: Session, region: Region, plan: ScanPlan) -> _Localised:
    """The coarse stage, then the middle stage if the plan has one; the witness is
    the middle stage's YES if it had one.

    Every stream of these stages and the first rank's is opened whatever the
    answers, so they are opened ahead, together (`Session.open_ahead`)."""
    mid = [plan.mid_epsilon] if plan.mid_epsilon else []
    session.open_ahead([*plan.coarse_budgets, *mid, plan.fine_epsilon])
    found = _scan_coarse(session, region, plan)
    return _mid_stage(session, region, found, plan) if plan.mid_epsilon else found


def _scan_levels(
    top: float,
    floor_level: float,
    plan: ScanPlan,
    tau_limit: int,
    base: float | None = None,
) -> list[float]:
    """The thresholds one fine stream may ask, in order: from `top` down by the step
    to `floor_level` (at most `dense_levels` levels), then doubling steps to −4n.
    With `base` (later ranks of `scan_top_k`), at most `SCAN_RANK_DENSE` levels at
    the step, then each doubled step is capped at max(step, `SCAN_RANK_RELATIVE`·(m
    − base)) while the level m is above `base`, for at most `plan.rank_levels`
    levels in all."""
    count = plan.dense_levels if base is None else min(SCAN_RANK_DENSE, plan.dense_levels)
    levels = dense_levels(top, floor_level, plan.step, count)
    cap = plan.tail_levels if base is None else plan.rank_levels - len(levels)
    extend_doubling(levels, plan.step, cap, tau_limit, base)
    return levels


def _scan_ranks(
    session: Session,
    region: Region,
    localised: _Localised,
    plan: ScanPlan,
    progress: RankProgress | None = None,
) -> tuple[list[int], list[float], list[float]]:
    """The fine streams of up to `plan.streams` ranks (see `scan_top_k`): the picks
    (positions in the candidate list) in rank order and their certificates' lower
    and upper ends.  A stream that never says YES ends the ranking early."""
    k = plan.streams
    groups = region.cands.groups
    lo_c, hi_c = localised.lower, localised.upper
    a_f = plan.fine_alpha + ROUNDING_SLACK
    start = hi_c
    chosen: list[int] = []
    lowers: list[float] = []
    uppers: list[float] = []
    remaining = list(region.positions)
    for rank in range(k):
        session.spend.alphas.append(plan.fine_alpha)
        base = None if rank == 0 else region.lower
        levels = _scan_levels(start, lo_c - a_f, plan, session.tau_limit, base)
        found = session.descend(region.cands, remaining, levels, plan.fine_epsilon)
        if found is None:
            break
        hit, i = found
        chosen.append(remaining[hit])
        low, up = level_certificate(levels, i, a_f, hi_c if rank == 0 else uppers[-1])
        lowers.append(low)
        uppers.append(up)
        if groups is None:
            remaining = remaining[:hit] + remaining[hit + 1 :]
        else:
            label = groups[remaining[hit]]
            remaining = [p for p in remaining if groups[p] != label]
            if not remaining:
                break
        start = levels[i - 1] if i > 0 else levels[0]
        if progress is not None:
            progress(len(chosen), k, session.spend.queries)
    return chosen, lowers, uppers


def scan_selection(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    space: SearchSpace | None = None,
    options: ScanOptions | None = None,
    plan: ScanPlan | None = None,
) -> SelectionResult:
    """Scan selection: a short localisation, then one deciding descending-scan stream.

    The localisation only places the deciding scan's start, so it gets a small share
    of ε (`ScanOptions`): a geometric binary search (`coarse_fraction`, default 1/8)
    and a middle descending scan at a coarse step (`mid_fraction`, default 1/16; 0
    skips it).  The trade-off is the analyst's: larger shares send fewer
    comparisons and leave the deciding stream less budget (docs/algorithms.md §6
    has both ends measured).  The deciding scan continues below the localised
    interval with doubling steps, so it ends at a YES even when the localisation
    failed; only if no stream ever says YES (every threshold down to −4n answered
    NO, probability below e^(−4n·ε_f/c)) is an earlier stage's YES — or, with none,
    the space's witness (default the first candidate) — returned.  Privacy: basic
    composition of T_c + 2 (or + 1) streams whose budgets sum to ε exactly, all
    fixed by the plan before data (thresholds adapt, which AboveThreshold allows).
    W.p. ≥ 1 − β the chosen score is within `plan.error_bound()` of the max.
    """
    region = (space or SearchSpace()).resolve(oracle)
    pl = _scan_plan(oracle, region, 1, epsilon, beta, options, plan)
    session = Session(oracle, pl.kind)
    localised = _scan_localise(session, region, pl)
    chosen, lowers, uppers = _scan_ranks(session, region, localised, pl)
    cands = region.cands
    if not chosen:
        j = localised.witness if localised.witness is not None else region.witness
        return SelectionResult(
            j, cands.queries[j], localised.lower, localised.upper, session.spend, pl.planned_epsilon
        )
    j = chosen[0]
    return SelectionResult(
        j, cands.queries[j], lowers[0], uppers[0], session.spend, pl.planned_epsilon
    )


def scan_top_k(
    oracle: Oracle,
    k: int,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    space: SearchSpace | None = None,
    options: ScanOptions | None = None,
    plan: ScanPlan | None = None,
    progress: RankProgress | None = None,
) -> ScanTopK:
    """Top-k by one coarse localisation and a descending scan that continues.

    Rank 1 is `scan_selection`.  Rank r + 1 opens its own stream (budget ε_f, every
    rank's YES paid as its own stream) over the candidates not yet chosen and
    starts at the last level rank r answered NO at, not from the top: that level
    was NO for every remaining candidate, so nothing is skipped w.p. ≥ 1 − β.  A
    later rank scans `SCAN_RANK_DENSE` levels at the fine step, then doubles its
    step (the next score may be far below on skewed data); its certificate
    [lower, upper] is as wide as the step it answered YES at, plus 2·α_f.
    Budget: ε_c + k·ε_f = ε, basic composition, all fixed by the plan.  A stream
    that never says YES (see `scan_selection`) ends the ranking early.  Candidates
    with `groups` (one public label each): a pick removes every candidate of its
    group (sparse mean's two signs of a coordinate).  The space's witness is not
    used.
    """
    region = (space or SearchSpace()).resolve(oracle)
    pl = _scan_plan(oracle, region, k, epsilon, beta, options, plan)
    session = Session(oracle, pl.kind)
    localised = _scan_localise(session, region, pl)
    chosen, lowers, uppers = _scan_ranks(session, region, localised, pl, progress)
    return ScanTopK(chosen, lowers, uppers, session.spend, pl.planned_epsilon)


def scan_plan(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    k: int = 1,
    space: SearchSpace | None = None,
    options: ScanOptions | None = None,
) -> ScanPlan:
    """The plan `scan_selection` (k = 1) or `scan_top_k` would make on this
    space, made before any budget is reserved: its `stream_budgets` are what a
    budget plan's group must hold (on a joint-noise task, their joint δ too)."""
    region = (space or SearchSpace()).resolve(oracle)
    return _scan_plan(oracle, region, k, epsilon, beta, options, None)
