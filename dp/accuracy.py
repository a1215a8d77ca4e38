"""Accuracy α of an SVT stream from the exact tails of the noise it uses.

For a query with true score s and threshold τ the stream compares
s − τ + N_j ≥ 0 with N_j = ν_j − γ (grid units; with two servers ν and γ are each
the sum of two independent draws).  If |γ| ≤ a₁ and |ν_j| ≤ a₂ for all j, then
every answer is correct whenever |s − τ| ≥ a₁ + a₂ + 1 grid unit: YES whenever
s ≥ τ + α, NO whenever s ≤ τ − α.  Union bound:
    P(|γ| > a₁) + K · P(|ν| > a₂) ≤ β,
and we take the split of β between the two terms that minimises a₁ + a₂.  For
the one-sided kind only the upper tails matter (ν, γ ≥ 0) and N_j ∈ [−γ, ν_j],
so max(a₁, a₂) + 1 suffices.  Report-noisy-max (no γ, one-sided ν ≥ 0 on each
of K candidates): if every ν_j < α then the selected j* has
s_j* ≥ s_max + ν_max − ν_j* > s_max − α, so α is the least a + 1 with
K · P(ν > a) ≤ β.  The tails are the
exact ones of the discrete laws (single draw or sum of two), evaluated in floating
point; this function is not on the privacy path, only on the accuracy one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

from svtagg.dp.kinds import Family, StreamKind, check_epsilon, noise_model
from svtagg.mpc.ring import DEFAULT_FRAC_BITS, sensitivity


def _log_tail(family: Family, scale: float, parties: int) -> Callable[[int], float]:
    """a ↦ log P(|X| > a) (two-sided) or log P(X > a) (one-sided), a >= 0 integer
    (−inf for the family "none": no such term)."""
    if family == "none":
        return lambda a: -math.inf
    lam = 1.0 / scale
    one_minus_q = -math.expm1(-lam)
    log_q = -lam

    if family == "laplace" and parties == 1:
        # P(|X| >= b) = 2 q^b / (1 + q) for b >= 1
        def f(a: int) -> float:
            b = a + 1
            return math.log(2.0) + b * log_q - math.log1p(math.exp(-lam))

        return f
    if family == "laplace" and parties == 2:
        # P(S = s) = c² q^|s| (|s| + A), c = (1-q)/(1+q), A = (1+q²)/(1-q²)
        q = math.exp(-lam)
        log_c2 = 2.0 * math.log(math.tanh(lam / 2.0))
        big_a = (1.0 + q * q) / (one_minus_q * (1.0 + q))

        def f(a: int) -> float:
            b = a + 1
            # Σ_{s>=b} q^s (s + A) = q^b [ (b(1-q) + q)/(1-q)² + A/(1-q) ]
            inner = (b * one_minus_q + q) / one_minus_q**2 + big_a / one_minus_q
            return math.log(2.0) + log_c2 + b * log_q + math.log(inner)

        return f
    if family == "geometric" and parties == 1:
        # P(G >= b) = q^b
        return lambda a: (a + 1) * log_q
    if family == "geometric" and parties == 2:
        # P(G1 + G2 >= b) = q^b [ (b+1)(1-q) + q ]
        q = math.exp(-lam)
        return lambda a: (a + 1) * log_q + math.log((a + 2) * one_minus_q + q)
    raise ValueError(f"unsupported family/parties: {family}/{parties}")


def _inverse_tail(log_tail: Callable[[int], float], log_target: float) -> int:
    """Least integer a >= 0 with log_tail(a) <= log_target."""
    if log_tail(0) <= log_target:
        return 0
    hi = 1
    while log_tail(hi) > log_target:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if log_tail(mid) <= log_target:
            hi = mid
        else:
            lo = mid
    return hi


@lru_cache(maxsize=65536)
def alpha_grid(
    kind: StreamKind, epsilon: Fraction, k: int, beta: float, parties: int, frac_bits: int
) -> int:
    """α in grid units (see the module docstring)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if parties not in (1, 2):
        raise ValueError(f"parties must be 1 or 2, got {parties}")
    model = noise_model(kind)
    t_gamma = _log_tail(
        model.threshold_family, float(model.threshold_scale(epsilon, frac_bits)), parties
    )
    t_nu = _log_tail(model.query_family, float(model.query_scale(epsilon, frac_bits)), parties)
    one_sided = {model.threshold_family, model.query_family} <= {"geometric", "none"}
    best: int | None = None
    # Split β: fraction f to the threshold term, (1 - f) to the K query terms
    # (all of it to the queries when there is no threshold term).
    splits = [0.0] if model.threshold_family == "none" else [i / 200.0 for i in range(1, 200)]
    for f in splits:
        a1 = _inverse_tail(t_gamma, math.log(f * beta)) if f else 0
        a2 = _inverse_tail(t_nu, math.log((1.0 - f) * beta / k))
        # One-sided noise: N = ν − γ lies in [−γ, ν], so the larger bound suffices.
        total = (max(a1, a2) if one_sided else a1 + a2) + 1
        if best is None or total < best:
            best = total
    assert best is not None
    return best


def alpha(
    kind: StreamKind | str,
    epsilon: Fraction | float | str,
    k: int,
    beta: float,
    parties: int = 1,
    frac_bits: int = DEFAULT_FRAC_BITS,
) -> float:
    """α in score units: P(some of the k answers is off by ≥ α) ≤ β."""
    eps = check_epsilon(epsilon)
    grid = alpha_grid(StreamKind.parse(kind), eps, int(k), float(beta), parties, frac_bits)
    return grid / sensitivity(frac_bits)
