"""The accounting of an AboveThreshold stream whose noise is drawn jointly
(task option noise = joint; docs/privacy.md, "Jointly generated noise").

With joint noise the threshold noise ρ (γ) and each query's noise ν are single
draws of the garbled sampler (`svtagg.mpc.jointnoise`), whose exact law is
`dp.joint.pmf`, not the ideal discrete Laplace.  The change-of-variables proof
of AboveThreshold (Lyu, Su, Li 2017, Theorem 2) uses the noise only through
two pointwise ratios: on neighbouring data (every score moves by at most Δ),
the output "NO for i < j, YES at j" maps to itself under ρ ↦ ρ + Δ and
ν_j ↦ ν_j + 2Δ (the other ν_i unchanged).  So, with R_ρ the largest
P(ρ = x)/P(ρ = x + Δ) or its reciprocal over the support, R_ν the same for ν
and the shift 2Δ, and the pairs whose shifted point leaves the finite support
charged to δ:

    P_D[E] ≤ R_ρ·R_ν·P_D'[E] + P(ρ + Δ ∉ supp) + P(ν + 2Δ ∉ supp),

i.e. (ln R_ρ + ln R_ν, δ_ρ + δ_ν)-DP, both directions (the law is symmetric
about −½, so the shift −d has the reciprocal ratios and the same tail).
`dp.joint.shift_ratio` gives R exactly, `dp.joint.tail_mass` the tails.

The servers charge the stream's ε unchanged: the sampler is built for scales
t·(1 + 2^−m) — the kind's central scales, inflated by the least of a fixed
ladder of factors — such that R_ρ·R_ν ≤ e^ε holds, checked in integers against
a rigorous lower bound of e^ε (`dp.noise._exp_bounds`).  δ is charged, rounded
up to a power of two (`delta_charge`).  The kinds: lap24 and lap3 (two-sided
Laplace noise for both terms).  exp3 (one-sided noise) and ctt (two
thresholds from one γ, with its own gap argument) are refused.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from svtagg.dp.joint import sampler_constants, shift_ratio, tail_mass
from svtagg.dp.kinds import StreamKind, noise_model
from svtagg.dp.noise import _exp_bounds
from svtagg.mpc.ring import sensitivity

#: A task's noise option.
INDEPENDENT = "independent"
JOINT = "joint"
NOISE_OPTIONS = (INDEPENDENT, JOINT)
#: The stream kinds a joint-noise task opens.
JOINT_KINDS = (StreamKind.LAP24, StreamKind.LAP3)
#: b, the width of the sampler's constants (1727 ANDs per sample at t = 2^20).
SAMPLER_BITS = 64
#: The scale inflations tried, 1 + 2^−m for m in this order: the first whose
#: exact loss fits ε is used.
INFLATION_EXPONENTS = (40, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1)
#: Binary digits of e^ε for the rigorous comparison.
_EXP_PRECISION = 192
#: The most δ one joint-noise stream may be charged: a (kind, ε) whose sampler
#: needs more is refused.  Every stream the two kinds open at F ≤ 16 and
#: ε ∈ [1/64, 16] is charged 2^−69 or less, so the cap refuses nothing a task
#: uses; it gives a plan that cannot list its streams in advance a rigorous
#: allowance (`joint_allowance`).
JOINT_DELTA_CAP = Fraction(1, 1 << 64)


def check_joint_kind(kind: StreamKind | str) -> StreamKind:
    """The kind, if a joint-noise task opens it; else ValueError saying why."""
    k = StreamKind.parse(kind)
    if k not in JOINT_KINDS:
        raise ValueError(
            f"a task with joint noise opens lap24 and lap3 streams only, not {k.value}: "
            "exp3's one-sided noise and ctt's two thresholds are not covered by the "
            "joint sampler's accounting (docs/privacy.md)"
        )
    return k


@dataclass(frozen=True)
class JointStreamNoise:
    """The two samplers of a joint-noise stream and what the stream costs."""

    bits: int
    threshold_constants: tuple[int, ...]
    query_constants: tuple[int, ...]
    #: The scales the constants round, in grid units: the kind's, times `inflation`.
    threshold_scale: Fraction
    query_scale: Fraction
    inflation: Fraction
    #: R_ρ·R_ν exactly: e^(the stream's ε-loss), ≤ e^ε.
    ratio: Fraction
    #: δ_ρ + δ_ν exactly, and the power of two ≥ it that the ledger is charged.
    delta: Fraction
    delta_charge: Fraction

    @property
    def max_magnitude(self) -> int:
        """|γ| + |ν| ≤ this (each sample lies in [−2^K, 2^K))."""
        return (1 << len(self.threshold_constants)) + (1 << len(self.query_constants))


def _power_of_two_above(x: Fraction) -> Fraction:
    """The least 2^e ≥ x (x > 0)."""
    e = x.numerator.bit_length() - x.denominator.bit_length() + 1  # 2^e > x
    while Fraction(2) ** (e - 1) >= x:
        e -= 1
    return Fraction(2) ** e


def _within(ratio: Fraction, epsilon: Fraction) -> bool:
    """ratio ≤ e^ε, decided in integers from a rigorous lower bound of e^ε."""
    lo, _ = _exp_bounds(epsilon, _EXP_PRECISION)
    return ratio.numerator << _EXP_PRECISION <= lo * ratio.denominator


@functools.lru_cache(maxsize=256)
def joint_stream_noise(
    kind: StreamKind, epsilon: Fraction, frac_bits: int, bits: int = SAMPLER_BITS
) -> JointStreamNoise:
    """The samplers and charge of a joint-noise stream of this kind and ε.
    ValueError for a kind that cannot take joint noise, or (no inflation of the
    ladder fits) a precision too low for this ε."""
    model = noise_model(check_joint_kind(kind))
    delta_unit = sensitivity(frac_bits)
    t_rho = model.threshold_scale(epsilon, frac_bits)
    t_nu = model.query_scale(epsilon, frac_bits)
    for m in INFLATION_EXPONENTS:
        inflation = 1 + Fraction(1, 1 << m)
        c_rho = sampler_constants(t_rho * inflation, bits)
        c_nu = sampler_constants(t_nu * inflation, bits)
        if (1 << len(c_rho)) < delta_unit or (1 << len(c_nu)) < 2 * delta_unit:
            raise ValueError(f"epsilon={epsilon} is too large for the joint sampler")
        ratio = shift_ratio(c_rho, bits, delta_unit) * shift_ratio(c_nu, bits, 2 * delta_unit)
        if _within(ratio, epsilon):
            delta = (
                tail_mass(c_rho, bits, (1 << len(c_rho)) - delta_unit)
                + tail_mass(c_nu, bits, (1 << len(c_nu)) - 2 * delta_unit)
            ) / 2
            if delta > JOINT_DELTA_CAP:
                raise ValueError(
                    f"the joint sampler's δ at epsilon={epsilon} exceeds the cap 2^-64"
                )
            return JointStreamNoise(
                bits,
                c_rho,
                c_nu,
                t_rho * inflation,
                t_nu * inflation,
                inflation,
                ratio,
                delta,
                _power_of_two_above(delta),
            )
    raise ValueError(f"the joint sampler at {bits} bits cannot fit epsilon={epsilon}")


def joint_group_delta(
    streams: Iterable[tuple[StreamKind | str, Fraction]], frac_bits: int
) -> Fraction:
    """The δ a plan group must hold on a joint-noise task for `streams` (kind, ε)
    to open in it: the sum of their charged δ (each rounded up to its power of
    two, as the servers charge it; basic composition inside the group, as
    `dp.plans.PlanBook.admit` counts it).  Exact; ValueError for a kind or ε the
    joint sampler does not cover."""
    total = Fraction(0)
    for kind, eps in streams:
        total += joint_stream_noise(StreamKind.parse(kind), Fraction(eps), frac_bits).delta_charge
    return total


def joint_allowance(epsilon: Fraction, epsilon_min: Fraction) -> Fraction:
    """The δ a plan group of ε must hold on a joint-noise task when the streams
    it will open are not known in advance (an adaptive algorithm): every stream
    takes at least the task's epsilon_min, so at most ⌊ε / epsilon_min⌋ of them
    open, and each is charged at most `JOINT_DELTA_CAP`.  An upper bound; a basic
    plan returns what its streams did not use when it ends."""
    if epsilon_min <= 0:
        raise ValueError("epsilon_min must be > 0")
    return (Fraction(epsilon) // Fraction(epsilon_min)) * JOINT_DELTA_CAP
