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

import numpy as np
import numpy.typing as npt

from svtagg.dp.jointsvt import joint_stream_noise
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
    return _best_split(t_gamma, t_nu, k, beta, one_sided, model.threshold_family != "none")


def _best_split(
    t_gamma: Callable[[int], float],
    t_nu: Callable[[int], float],
    k: int,
    beta: float,
    one_sided: bool,
    has_threshold: bool,
) -> int:
    """min over the splits of β of a₁ + a₂ + 1 (max(a₁, a₂) + 1 one-sided)."""
    best: int | None = None
    # Split β: fraction f to the threshold term, (1 - f) to the K query terms
    # (all of it to the queries when there is no threshold term).
    splits = [i / 200.0 for i in range(1, 200)] if has_threshold else [0.0]
    for f in splits:
        a1 = _inverse_tail(t_gamma, math.log(f * beta)) if f else 0
        a2 = _inverse_tail(t_nu, math.log((1.0 - f) * beta / k))
        # One-sided noise: N = ν − γ lies in [−γ, ν], so the larger bound suffices.
        total = (max(a1, a2) if one_sided else a1 + a2) + 1
        if best is None or total < best:
            best = total
    assert best is not None
    return best


def _joint_abs_tails(
    constants: tuple[int, ...], bits: int, a: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """P(|X| > a) for one draw of the joint sampler, for every a of an array
    (`dp.joint.abs_tail`, vectorised: the digit walk of `tail_mass` in floats)."""

    def tail(m: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        total = np.zeros(m.shape)
        prefix = np.ones(m.shape)
        for i in reversed(range(len(constants))):
            p = constants[i] / float(1 << bits)
            bit = ((m >> i) & 1).astype(bool)
            total += np.where(bit, 0.0, prefix * p)
            prefix *= np.where(bit, p, 1.0 - p)
        out = total + prefix
        return np.where(m <= 0, 1.0, np.where(m >= 1 << len(constants), 0.0, out))

    return 0.5 * (tail(a + 1) + tail(a))


def _joint_inverse_tails(
    constants: tuple[int, ...], bits: int, targets: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """For each target, the least integer a ≥ 0 with P(|X| > a) ≤ target: one
    bisection over [0, 2^K] for all targets at once (the tail is non-increasing
    and 0 at 2^K)."""
    lo = np.full(targets.shape, -1, dtype=np.int64)  # fails (P(|X| > −1) = 1)
    hi = np.full(targets.shape, 1 << len(constants), dtype=np.int64)  # holds
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        ok = _joint_abs_tails(constants, bits, mid) <= targets
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


@lru_cache(maxsize=4096)
def joint_alpha_grid(
    kind: StreamKind, epsilon: Fraction, k: int, beta: float, frac_bits: int
) -> int:
    """α in grid units for a joint-noise stream: γ and each ν are ONE draw each
    of the garbled sampler (`dp.joint`'s exact law at the slightly inflated
    central scales, `dp.jointsvt.joint_stream_noise`), not the sum of two
    servers' draws; the same split of β as `alpha_grid`."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    noise = joint_stream_noise(kind, epsilon, frac_bits)
    f = np.arange(1, 200) / 200.0
    a1 = _joint_inverse_tails(noise.threshold_constants, noise.bits, f * beta)
    a2 = _joint_inverse_tails(noise.query_constants, noise.bits, (1.0 - f) * beta / k)
    return int(np.min(a1 + a2)) + 1


def joint_alpha(
    kind: StreamKind | str,
    epsilon: Fraction | float | str,
    k: int,
    beta: float,
    frac_bits: int = DEFAULT_FRAC_BITS,
) -> float:
    """`alpha` for a stream of a joint-noise task, in score units."""
    eps = check_epsilon(epsilon)
    grid = joint_alpha_grid(StreamKind.parse(kind), eps, int(k), float(beta), frac_bits)
    return grid / sensitivity(frac_bits)


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
