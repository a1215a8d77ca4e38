"""A small privacy accountant: basic and advanced composition, and zCDP.

Used to plan the (ε, δ) variants (MWEM, Theorem 7.8) and to match the Gaussian
aggregation baseline (§4) to a target (ε, δ).  Basic composition is exact
(Fractions); the advanced-composition and zCDP conversions are real-valued
bounds, and the inverses are rounded *down* so that the forward bound never
exceeds its target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from svtagg.dp.kinds import as_fraction
from svtagg.dp.queries import Epsilon, Number

Pair = tuple[Fraction, Fraction]


def basic_composition(
    charges: Iterable[tuple[Fraction | int | float | str, Fraction | int | float | str]],
) -> Pair:
    """Σ ε_i, Σ δ_i, exactly."""
    eps, delta = Fraction(0), Fraction(0)
    for e, d in charges:
        eps += as_fraction(e, "epsilon")
        delta += as_fraction(d, "delta")
    return eps, delta


def advanced_composition(
    epsilon0: float, delta0: float, k: int, delta_prime: float
) -> tuple[float, float]:
    """k-fold composition of (ε0, δ0)-DP mechanisms (Dwork–Rothblum–Vadhan):

    (√(2k ln(1/δ')) ε0 + k ε0 (e^ε0 − 1),  k δ0 + δ').
    """
    if k < 1 or not 0 < delta_prime < 1:
        raise ValueError("need k >= 1 and 0 < delta' < 1")
    e0 = float(epsilon0)
    eps = math.sqrt(2 * k * math.log(1 / delta_prime)) * e0 + k * e0 * math.expm1(e0)
    return eps, k * float(delta0) + delta_prime


def advanced_composition_step(
    epsilon: Epsilon | Number | str, delta: float, k: int, *, max_denominator: int = 10**9
) -> Fraction:
    """Largest per-step ε0 (a Fraction, rounded down) whose k-fold advanced
    composition with δ' = δ is ≤ ε; also never below ε/k, exactly (basic
    composition is always available, so the better of the two is returned)."""
    eps = Epsilon.parse(epsilon)
    target = float(eps.value)
    lo, hi = 0.0, target
    for _ in range(200):
        mid = (lo + hi) / 2
        if advanced_composition(mid, 0.0, k, float(delta))[0] <= target:
            lo = mid
        else:
            hi = mid
    adv = _fraction_below(lo, max_denominator)
    basic = eps.split(k).value
    return max(adv, basic)


def _fraction_below(x: float, max_denominator: int) -> Fraction:
    f = Fraction(x).limit_denominator(max_denominator)
    while f > Fraction(x):
        f -= Fraction(1, max_denominator)
    return max(f, Fraction(0))


def zcdp_to_dp(rho: float, delta: float) -> float:
    """ρ-zCDP ⇒ (ρ + 2√(ρ ln(1/δ)), δ)-DP (Bun–Steinke 2016, Prop. 1.3)."""
    if rho < 0 or not 0 < delta < 1:
        raise ValueError("need rho >= 0 and 0 < delta < 1")
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def rho_for_dp(epsilon: float, delta: float) -> float:
    """The ρ whose conversion `zcdp_to_dp(ρ, δ)` is exactly ε: (√(L+ε) − √L)², L = ln(1/δ)."""
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError("need epsilon > 0 and 0 < delta < 1")
    lg = math.log(1 / delta)
    return (math.sqrt(lg + epsilon) - math.sqrt(lg)) ** 2


def gaussian_rho(sigma: float, l2_sensitivity: float) -> float:
    """A Gaussian release with noise N(0, σ²) per coordinate is Δ²/(2σ²)-zCDP."""
    return l2_sensitivity**2 / (2 * sigma**2)


def gaussian_sigma(rho: float, l2_sensitivity: float) -> float:
    """σ = Δ/√(2ρ): the noise that makes a Δ-sensitive release ρ-zCDP."""
    if rho <= 0:
        raise ValueError("rho must be > 0")
    return l2_sensitivity / math.sqrt(2 * rho)


class ZCDPAccountant:
    """Compositional zCDP: Σ ρ_i ≤ ρ_total, converted to (ε, δ) on demand."""

    def __init__(self, rho_total: float):
        self.rho_total = float(rho_total)
        self.rho_spent = 0.0

    def charge(self, rho: float) -> None:
        # A tiny relative slack absorbs float rounding of exact splits of ρ_total.
        if self.rho_spent + rho > self.rho_total * (1 + 1e-12):
            raise ValueError(f"zCDP budget exhausted: {self.rho_spent} + {rho} > {self.rho_total}")
        self.rho_spent += rho

    def epsilon(self, delta: float) -> float:
        return zcdp_to_dp(self.rho_spent, delta)
