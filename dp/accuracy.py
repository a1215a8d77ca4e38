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
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import Family, StreamKind, check_epsilon, noise_model
from svtagg.mpc.ring import DEFAULT_FRAC_BITS, sensitivity

#: a ↦ log P(|X| > a) (or log P(X > a)), evaluated on an int64 array of a ≥ 0.
LogTail = Callable[[npt.NDArray[np.int64]], npt.NDArray[Any]]


def _log_tail(family: Family, scale: float, parties: int) -> LogTail:
    """a ↦ log P(|X| > a) (two-sided) or log P(X > a) (one-sided), a >= 0 integer,
    on arrays (−inf for the family "none": no such term)."""
    if family == "none":
        return lambda a: np.full(np.shape(a), -math.inf)
    lam = 1.0 / scale
    one_minus_q = -math.expm1(-lam)
    log_q = -lam

    if family == "laplace" and parties == 1:
        # P(|X| >= b) = 2 q^b / (1 + q) for b >= 1
        const = math.log(2.0) - math.log1p(math.exp(-lam))
        return lambda a: const + (a + 1) * log_q
    if family == "laplace" and parties == 2:
        # P(S = s) = c² q^|s| (|s| + A), c = (1-q)/(1+q), A = (1+q²)/(1-q²)
        q = math.exp(-lam)
        log_c2 = 2.0 * math.log(math.tanh(lam / 2.0))
        big_a = (1.0 + q * q) / (one_minus_q * (1.0 + q))

        def f(a: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
            b = a + 1
            # Σ_{s>=b} q^s (s + A) = q^b [ (b(1-q) + q)/(1-q)² + A/(1-q) ]
            inner = (b * one_minus_q + q) / one_minus_q**2 + big_a / one_minus_q
            return math.log(2.0) + log_c2 + b * log_q + np.log(inner)

        return f
    if family == "geometric" and parties == 1:
        # P(G >= b) = q^b
        return lambda a: (a + 1) * log_q
    if family == "geometric" and parties == 2:
        # P(G1 + G2 >= b) = q^b [ (b+1)(1-q) + q ]
        q = math.exp(-lam)
        return lambda a: (a + 1) * log_q + np.log((a + 2) * one_minus_q + q)
    raise ValueError(f"unsupported family/parties: {family}/{parties}")


def _inverse_tails_reference(
    log_tail: LogTail, log_targets: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """For each target, the least integer a >= 0 with log_tail(a) <= target (the
    tails are non-increasing), for all targets at once: the plain search, for any
    tail (`_inverse_tails` answers most targets faster and falls back to this one).
    Each target's answer depends on that target alone, so the search over a subset
    of the targets gives the same answers for them.

    The answer is bracketed around a guess (a few secant steps on the tail, which
    is close to linear in a: q^a times a slowly varying factor), the bracket widened
    by doubling steps until log_tail(lo) > target >= log_tail(hi), then bisected.
    The bracket, not the guess, decides the result: any guess gives the same a."""
    t = np.asarray(log_targets, dtype=np.float64)
    zero = np.zeros(t.shape, dtype=np.int64)
    done = log_tail(zero) <= t
    guess = _secant_guess(log_tail, t, done)
    # hi: the guess, moved up until its tail is at or below the target
    hi = np.where(done, 0, np.maximum(guess, 1))
    step = np.ones(t.shape, dtype=np.int64)
    while True:
        short = ~done & (log_tail(hi) > t)
        if not short.any():
            break
        hi = np.where(short, hi + step, hi)
        step = np.where(short, step * 2, step)
    # lo: below hi, moved down until its tail is above the target (0's always is)
    lo = np.maximum(hi - 1, 0)
    step = np.ones(t.shape, dtype=np.int64)
    while True:
        low = ~done & (lo > 0) & (log_tail(lo) <= t)
        if not low.any():
            break
        hi = np.where(low, lo, hi)
        lo = np.where(low, np.maximum(lo - step, 0), lo)
        step = np.where(low, step * 2, step)
    while True:
        open_ = ~done & (hi - lo > 1)
        if not open_.any():
            break
        mid = (lo + hi) // 2
        ok = log_tail(mid) <= t
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid, lo)
    return np.where(done, 0, hi)


def _secant_guess(
    log_tail: LogTail, t: npt.NDArray[np.float64], done: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """A starting point for `_inverse_tails_reference` (only a guess; 0 where the target is
    already met).  Every tail here is (a + 1)·log q plus a slowly varying term, so
    one step along the far slope (the secant between 2^30 and 2^31) from a = 0 lands
    near the answer (the slope near 0 would overshoot for wide sums of two draws),
    and Newton steps on local secants close in on it."""
    far = np.asarray([2**30, 2**31], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ends = log_tail(far)
        slope = float(ends[1] - ends[0]) / 2**30
        if not (np.isfinite(slope) and slope < 0):
            return np.zeros(t.shape, dtype=np.int64)
        a = np.maximum((t - log_tail(np.zeros(t.shape, dtype=np.int64))) / slope, 0.0)
        for _ in range(3):  # Newton steps on local secants a few percent wide
            ai = np.clip(np.floor(a), 0, 2.0**60).astype(np.int64)
            h = np.maximum(ai >> 5, 1)
            f0 = log_tail(ai)
            local = (log_tail(ai + h) - f0) / h
            nxt = ai + (t - f0) / np.where(local < 0, local, slope)
            a = np.where(np.isfinite(nxt), np.maximum(nxt, 0.0), a)
    guess = np.clip(np.ceil(a), 0, 2.0**60).astype(np.int64)
    return np.where(done, 0, guess)


#: a ↦ the real a at which a tail crosses each target, approximately (float array).
Guess = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]

#: Noise scales up to which `_inverse_tails` answers from its closed-form guess (its
#: uniqueness argument holds there with a wide margin); beyond, the plain search.
FAST_SCALE_MAX = 2.0**34
#: Targets above this (P > 1 − 2^-20: within ~10^-3 scales of 0) are left to the
#: plain search for sums of two draws, whose tails are nearly flat there.
FAST_TARGET_MAX = -(2.0**-20)
#: Split fractions of β `_best_split` tries (threshold's share f = 1/200 … 199/200).
_SPLIT = np.arange(1, 200) / 200.0
_ONE_MINUS_SPLIT = 1.0 - _SPLIT
_SPLIT.flags.writeable = False
_ONE_MINUS_SPLIT.flags.writeable = False
#: The window `_inverse_tails` checks around its guess g: g − 1, g, g + 1.
_WINDOW = np.asarray([[-1], [0], [1]], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class _Tail:
    """A log-tail (`_log_tail`) and, where `_inverse_tails` may use it, a guess of
    its inverse (None: the plain search only); `target_max`: the largest target
    the guess answers for."""

    fn: LogTail
    guess: Guess | None
    target_max: float


@lru_cache(maxsize=4096)
def _tail(family: Family, scale: float, parties: int) -> _Tail:
    """`_log_tail(family, scale, parties)` with its inverse guess; one object per
    (family, scale, parties), so that `_best_split` sees equal tails as one."""
    fn = _log_tail(family, scale, parties)
    guess = _inverse_guess(family, scale, parties)
    return _Tail(fn, guess, FAST_TARGET_MAX if parties == 2 else math.inf)


def _inverse_guess(family: Family, scale: float, parties: int) -> Guess | None:
    """The real a at which the tail equals each target t, from its closed form (to
    within float rounding, well inside ±1/2 for scale ≤ FAST_SCALE_MAX).

    One draw: the log-tail is linear in a.  Sum of two: with λ = 1/scale,
    m = 1 − q and y the affine function of b = a + 1 in the log (y = 1 + b·m;
    Laplace: y = b·m + q + A·m), b·log q = −(λ/m)·(y − const), so the log-tail is
    r₀ − w + log w in w = (λ/m)·y and t is met at the w ≥ 1 with w − log w = r₀ − t
    (three Newton steps from w = r + log r), a = w·scale − const."""
    if family == "none":
        return lambda t: np.zeros(np.shape(t))
    if not 0 < scale <= FAST_SCALE_MAX or parties not in (1, 2):
        return None
    lam = 1.0 / scale
    if parties == 1:
        const = math.log(2.0) - math.log1p(math.exp(-lam)) if family == "laplace" else 0.0
        return lambda t: (t - const) * -scale - 1.0
    q = math.exp(-lam)
    m = -math.expm1(-lam)
    kn = lam / m  # −log q / (1 − q) ≥ 1
    if family == "geometric":
        r0, offset = kn - math.log(kn), 1.0 / m + 1.0
    else:
        d = q + (1.0 + q * q) / (1.0 + q)  # q + A·m
        log_c2 = 2.0 * math.log(math.tanh(lam / 2.0))
        r0 = math.log(2.0) + log_c2 + kn * d - math.log(kn) - 2.0 * math.log(m)
        offset = d / m + 1.0

    def guess(t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        r = r0 - t
        with np.errstate(invalid="ignore", divide="ignore"):
            w = r + np.log(r)
            r1 = r - 1.0
            for _ in range(3):  # Newton on w − log w − r: w ← w·(log w + r − 1)/(w − 1)
                w = w * (np.log(w) + r1) / (w - 1.0)
        return w * scale - offset

    return guess


def _inverse_tails(tail: _Tail, log_targets: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """`_inverse_tails_reference(tail.fn, log_targets)`, the same answers, faster.

    The guess g (rounded, at least 1) is checked on the tail itself at g − 1, g,
    g + 1: a target met at g − 1 = 0 has answer 0 (the plain search's own test),
    and an a in the window with tail(a − 1) > t ≥ tail(a) is a boundary.  The
    boundary is unique, hence the plain search's answer, wherever the computed tail
    is strictly decreasing around the target's level: always for one draw (the
    computed tail is c + (a + 1)·log q, monotone in a under round-to-nearest), and
    for a sum of two at scale ≤ FAST_SCALE_MAX and t ≤ FAST_TARGET_MAX, where the
    exact tail falls per step by 25× or more the computed one's rounding error at
    the target's level (λ = 1/scale ≥ 2^-34: a fall ≳ 10^-3·λ near the level
    1 − 2^-20, where the geometric sum's value is ≈ 10^-3 and exact to ~10^-16,
    ≳ λ/4 elsewhere, against errors ≲ 10^-12 at |values| ≤ 10^3).  Targets without
    such an answer in the window go to the plain search."""
    t = np.asarray(log_targets, dtype=np.float64)
    if tail.guess is None or t.size == 0:
        return _inverse_tails_reference(tail.fn, t)
    x = tail.guess(t)
    g = np.rint(np.fmax(np.fmin(x, 2.0**60), 1.0)).astype(np.int64)  # NaN: 2^60
    m0, m1, m2 = tail.fn(_WINDOW + g) <= t  # met at g − 1, g, g + 1
    fast = t.max() <= tail.target_max
    if fast and not m0.any() and m2.all():  # the usual case: every boundary at g or g + 1
        return g + 1 - m1
    zero = m0 & (g == 1)
    found = ~m0 & (m1 | m2)  # boundary at g (met at g) or g + 1
    ok = zero | (found & (t <= tail.target_max))
    a = np.where(zero, 0, g + 1 - m1)
    if ok.all():
        return a
    rest = ~ok
    a[rest] = _inverse_tails_reference(tail.fn, t[rest])
    return a


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
    t_gamma = _tail(
        model.threshold_family, float(model.threshold_scale(epsilon, frac_bits)), parties
    )
    t_nu = _tail(model.query_family, float(model.query_scale(epsilon, frac_bits)), parties)
    one_sided = {model.threshold_family, model.query_family} <= {"geometric", "none"}
    return _best_split(t_gamma, t_nu, k, beta, one_sided, model.threshold_family != "none")[0]


def _best_split(
    t_gamma: _Tail,
    t_nu: _Tail,
    k: int,
    beta: float,
    one_sided: bool,
    has_threshold: bool,
) -> tuple[int, int, int]:
    """(α, a₁, a₂) at the split of β that minimises α = a₁ + a₂ + 1
    (max(a₁, a₂) + 1 one-sided)."""
    # Split β: fraction f to the threshold term, (1 - f) to the K query terms
    # (all of it to the queries when there is no threshold term).
    if not has_threshold:  # all of β to the queries (f = 0)
        with np.errstate(divide="ignore"):
            a2 = _inverse_tails(t_nu, np.log(np.ones(1) * beta / k))
        a1 = np.zeros(1, dtype=np.int64)
    else:  # targets log(f·β) for a₁, log((1 − f)·β/k) for a₂, in one array
        n = _SPLIT.size
        targets = np.empty(2 * n)
        np.multiply(_SPLIT, beta, out=targets[:n])
        np.multiply(_ONE_MINUS_SPLIT, beta, out=targets[n:])
        np.divide(targets[n:], k, out=targets[n:])
        with np.errstate(divide="ignore"):
            np.log(targets, out=targets)
        if t_gamma is t_nu:  # one tail (exp3, lap3): one search for both
            both = _inverse_tails(t_nu, targets)
            a1, a2 = both[:n], both[n:]
        else:
            a1 = _inverse_tails(t_gamma, targets[:n])
            a2 = _inverse_tails(t_nu, targets[n:])
    # One-sided noise: N = ν − γ lies in [−γ, ν], so the larger bound suffices.
    total = (np.maximum(a1, a2) if one_sided else a1 + a2) + 1
    i = int(np.argmin(total))  # the first of equal totals, as the loop over f kept
    return int(total[i]), int(a1[i]), int(a2[i])


@lru_cache(maxsize=4096)
def joint_alpha_grid(
    kind: StreamKind, epsilon: Fraction, k: int, beta: float, frac_bits: int
) -> int:
    """α in grid units for a joint-noise stream: γ and each ν are ONE draw each
    of the garbled sampler (`dp.joint`'s exact law at the slightly inflated
    central scales, `dp.jointsvt.joint_stream_noise`), not the sum of two
    servers' draws.

    The split of β is chosen on the one-party Laplace tails at the sampler's
    (inflated) scales, which the exact law follows to the rounding of its
    constants; the bound is then checked on the exact law's tails in grid
    units, dither included (`JointStreamNoise.grid_tail`, `grid_upper` for
    exp3's one-sided draws) and widened 1/16 of a sensitivity at a time until
    P(|γ| > a₁) + k·P(|ν| > a₂) ≤ β (one-sided: P(γ > a₁) + k·P(ν > a₂);
    a tournament, nmax, has no γ: k·P(ν > a₂)) holds there, so it is the
    exact law's (to that step)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    noise = joint_stream_noise(kind, epsilon, frac_bits)
    grid = 1 << noise.shift  # the scales are in sensitivities
    family = "laplace" if noise.signed else "geometric"
    has_threshold = bool(noise.threshold_constants)  # not a tournament (nmax)
    t_nu = _tail(family, float(noise.query_scale) * grid, 1)
    t_gamma = _tail(family, float(noise.threshold_scale) * grid, 1) if has_threshold else t_nu
    _, a1, a2 = _best_split(t_gamma, t_nu, k, beta, not noise.signed, has_threshold)

    # Two-sided draws: |ν − γ| ≤ a₁ + a₂ unless |γ| > a₁ or some |ν| > a₂.
    # One-sided (exp3): every draw is ≥ 0 (its dither too), so ν − γ lies in
    # [−a₁, a₂] unless γ > a₁ or some ν > a₂.
    tail = noise.grid_tail if noise.signed else noise.grid_upper

    def excess(a1: int, a2: int) -> tuple[float, float]:
        return (tail("threshold", a1) if has_threshold else 0.0), k * tail("query", a2)

    # Widen the term that holds more of the mass, 1/16 of a sensitivity at a
    # time: the draws live on the sensitivity lattice, so finer steps would
    # walk 2^F units through a tail that changes little between them.
    step = max(1, (1 << noise.shift) >> 4)
    g, q = excess(a1, a2)
    while g + q > beta:
        a1, a2 = (a1 + step, a2) if g >= q else (a1, a2 + step)
        g, q = excess(a1, a2)
    return (a1 + a2 if noise.signed else max(a1, a2)) + 1


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
