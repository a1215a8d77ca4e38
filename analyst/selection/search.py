"""The two searches every selection algorithm is built from: Algorithm 8's rounds
of halving [ℓ, u] (one stream per round, geometric budgets), and the threshold
levels of a descending scan on one stream (dense steps, then doubling ones)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from svtagg.analyst.selection.records import Region
from svtagg.analyst.selection.session import Session

#: Ratio γ of consecutive round budgets in Algorithm 8 (the paper's 3/4).
GBS_RATIO = Fraction(3, 4)

#: Levels a later rank of `scan_top_k` scans at the fine step before its steps grow.
SCAN_RANK_DENSE = 4
#: A later rank's step grows (doubling) up to this fraction of the level's height
#: above the interval's lower end, never below the fine step: on skewed data the
#: next score may be far below, and consecutive ranks differ by a fraction of it.
SCAN_RANK_RELATIVE = Fraction(1, 16)


# --------------------------------------------------------------------------- Algorithm 8


def gbs_budgets(epsilon: Fraction, rounds: int, ratio: Fraction = GBS_RATIO) -> list[Fraction]:
    """ε_t = (ε/Z)·γ^(T−t), t = 1..T, with Z = (1 − γ^T)/(1 − γ): they sum to ε exactly."""
    g = Fraction(ratio)
    if not 0 < g < 1:
        raise ValueError(f"ratio must be in (0, 1), got {ratio}")
    z = (1 - g**rounds) / (1 - g)
    return [epsilon / z * g ** (rounds - t) for t in range(1, rounds + 1)]


@dataclass(frozen=True)
class GbsSchedule:
    """Algorithm 8's T, ε and β, and the ratio γ of consecutive round budgets."""

    rounds: int
    epsilon: Fraction
    beta: float
    ratio: Fraction = GBS_RATIO


def gbs(session: Session, region: Region, schedule: GbsSchedule) -> tuple[int, float, float]:
    """Algorithm 8 on the region's positions P, interval [ℓ, u] and witness j0;
    returns (j*, ℓ', u').

    Round t opens one stream of budget ε_t (`gbs_budgets`) and asks all of P at the
    midpoint, with α_t = accuracy(ε_t, |P|, β/T).  j* moves only when a YES raises ℓ
    (m − α_t > ℓ): it is the YES with the best certified lower bound so far.  (We
    also measured "the YES at the highest threshold" as a witness rule: at d = 10³
    its mean error was 15–25× worse, because the highest thresholds are asked by
    the first, noisiest rounds.)
    """
    subset = region.positions
    best = region.witness
    lo, hi = float(region.lower), float(region.upper)
    rounds = schedule.rounds
    for eps_t in gbs_budgets(schedule.epsilon, rounds, schedule.ratio):
        alpha_t = session.alpha(eps_t, len(subset), schedule.beta / rounds)
        m = (lo + hi) / 2
        stream = session.open(eps_t)
        hit = session.ask(stream, region.cands, subset, m)
        if hit is None:
            hi = min(hi, m + alpha_t)
        elif m - alpha_t > lo:
            lo = m - alpha_t
            best = subset[hit]
    return best, lo, hi


# --------------------------------------------------------------------------- descending scans


def dense_levels(top: float, floor_level: float, step: int, count: int) -> list[float]:
    """⌊top⌋, ⌊top⌋ − step, … : at most `count` levels, the last the first one at
    or below `floor_level`."""
    levels = []
    m = float(math.floor(top))
    for _ in range(count):
        levels.append(m)
        if m <= floor_level:
            break
        m -= step
    return levels


def extend_doubling(
    levels: list[float], step: int, cap: int, tau_limit: int, base: float | None = None
) -> None:
    """Append at most `cap` levels below the last of `levels`, each step double the
    one before (starting at 2·step), stopping at −`tau_limit`.  With `base`, a step
    taken from a level m above `base` is at most max(step, `SCAN_RANK_RELATIVE`·(m −
    base))."""
    gap = 2 * step
    for _ in range(max(cap, 0)):
        last = levels[-1]
        g = gap
        if base is not None and last > base:
            g = min(gap, max(step, math.floor(float(SCAN_RANK_RELATIVE) * (last - base))))
        m = max(last - g, -float(tau_limit))
        if m >= last:
            break
        levels.append(m)
        gap = 2 * g


def rank_schedule_length(width: float, step: int, limit: int) -> int:
    """Levels of a later rank's schedule in the worst case: from the top of the
    interval (height `width` above its lower end) down to −`limit` (`extend_doubling`
    with `base`), plus the `SCAN_RANK_DENSE` fine levels."""
    m, gap, count = float(width), 2 * step, SCAN_RANK_DENSE
    m -= (SCAN_RANK_DENSE - 1) * step
    while m > -limit:
        g = gap
        if m > 0:
            g = min(gap, max(step, math.floor(float(SCAN_RANK_RELATIVE) * m)))
        m -= g
        count += 1
        gap = 2 * g
    return count + 1


def level_certificate(
    levels: list[float], i: int, alpha: float, bound: float
) -> tuple[float, float]:
    """[lower, upper] after a descending scan's first YES at `levels[i]`: the pick is
    ≥ levels[i] − α, and every score is ≤ levels[i − 1] + α (the NO just before)
    or, at the first level, ≤ `bound`."""
    return levels[i] - alpha, bound if i == 0 else min(bound, levels[i - 1] + alpha)
