"""Comparison baselines: central exponential mechanism, the Gaussian aggregation
oracle of §4 with zCDP accounting, naive Laplace counts, and central MWEM.

These are *simulation baselines*, not deployed mechanisms: they read the plaintext
data (they are central or aggregation mechanisms, with trusted noise) and draw
noise with numpy's `Generator` (floating point, not an exact sampler).  That is
fine for measuring utility in experiments and wrong for protecting real data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from svtagg.analyst.applications import Array, MarginalWorkload, mwem_loop
from svtagg.dp.accounting import ZCDPAccountant, gaussian_sigma, rho_for_dp

Rng = np.random.Generator


def _rng(rng: Rng | int | None) -> Rng:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


# --------------------------------------------------------------------------- central


def exponential_mechanism(
    scores: npt.ArrayLike, epsilon: float, sensitivity: float = 1.0, rng: Rng | int | None = None
) -> int:
    """Central exponential mechanism: P(j) ∝ exp(ε·s_j/(2Δ)).  Sampled as the argmax of
    ε·s_j/(2Δ) + Gumbel noise, which has exactly that distribution."""
    s = np.asarray(scores, dtype=np.float64)
    g = _rng(rng).gumbel(size=s.shape)
    return int(np.argmax(float(epsilon) * s / (2.0 * sensitivity) + g))


def report_noisy_max(
    scores: npt.ArrayLike, epsilon: float, sensitivity: float = 1.0, rng: Rng | int | None = None
) -> int:
    """Report-noisy-max with Lap(2Δ/ε) noise (ε-DP for scores that may move either way)."""
    s = np.asarray(scores, dtype=np.float64)
    return int(np.argmax(s + _rng(rng).laplace(0.0, 2.0 * sensitivity / float(epsilon), s.shape)))


def em_select(data: npt.ArrayLike, epsilon: float, rng: Rng | int | None = None) -> int:
    """Selection on column sums of an n × d matrix in [0,1] with the exponential mechanism."""
    return exponential_mechanism(np.asarray(data, dtype=np.float64).sum(axis=0), epsilon, 1.0, rng)


# --------------------------------------------------------------------------- aggregation


@dataclass
class GaussianAggregation:
    """The aggregation oracle G of §4: Σ_i ϕ(x_i) + N(0, σ² I), with compositional zCDP.

    `sums` are the exact column sums of ϕ(x_i) and `l2_sensitivity` the largest
    ‖ϕ(x) − ϕ(x')‖₂ under replacement: 2 for ϕ into the unit ball (the paper's
    2/σ²-zCDP per answer), √d for vectors in [0,1]^d.
    """

    sums: Array
    l2_sensitivity: float
    accountant: ZCDPAccountant

    def release(self, rho: float, rng: Rng | int | None = None) -> Array:
        """One ρ-zCDP answer: all sums with N(0, σ²), σ = Δ/√(2ρ)."""
        self.accountant.charge(rho)
        sigma = gaussian_sigma(rho, self.l2_sensitivity)
        return self.sums + _rng(rng).normal(0.0, sigma, self.sums.shape)


def gaussian_for_dp(
    sums: npt.ArrayLike, epsilon: float, delta: float
) -> tuple[GaussianAggregation, float]:
    """A [0,1]^d aggregation oracle whose whole zCDP budget converts to (ε, δ)."""
    arr = np.asarray(sums, dtype=np.float64)
    rho = rho_for_dp(epsilon, delta)
    return GaussianAggregation(arr, math.sqrt(arr.size), ZCDPAccountant(rho)), rho


def gaussian_selection(
    sums: npt.ArrayLike, epsilon: float, delta: float, rng: Rng | int | None = None
) -> int:
    """Aggregation baseline for selection: release all d noisy sums once at the ρ that
    converts to (ε, δ), take the argmax.  Error ≍ √(d·log(1/δ))/ε (Theorem 4.4)."""
    agg, rho = gaussian_for_dp(sums, epsilon, delta)
    return int(np.argmax(agg.release(rho, rng)))


def gaussian_top_k(
    sums: npt.ArrayLike, k: int, epsilon: float, delta: float, rng: Rng | int | None = None
) -> list[int]:
    """Aggregation baseline for top-k: one (ε, δ) release, the k largest noisy sums."""
    agg, rho = gaussian_for_dp(sums, epsilon, delta)
    noisy = agg.release(rho, rng)
    return [int(j) for j in np.argsort(-noisy, kind="stable")[:k]]


def gaussian_sparse_mean(
    sums: npt.ArrayLike,
    n: int,
    k: int,
    clip: float,
    epsilon: float,
    delta: float,
    rng: Rng | int | None = None,
) -> Array:
    """Aggregation baseline for sparse mean: one (ε, δ) release of the sums of
    `sparse_mean_embedding`, keep the k coordinates with the largest |ĝ − n/2|,
    μ̂_j = B(2ĝ_j − n)/n there and 0 elsewhere."""
    agg, rho = gaussian_for_dp(sums, epsilon, delta)
    noisy = agg.release(rho, rng)
    est = clip * (2 * noisy - n) / n
    out = np.zeros_like(est)
    top = np.argsort(-np.abs(est), kind="stable")[:k]
    out[top] = est[top]
    return out


def laplace_selection(
    sums: npt.ArrayLike, epsilon: float, l1_sensitivity: float, rng: Rng | int | None = None
) -> int:
    """Naive selection: Lap(Δ₁/ε) on all d sums, the argmax.  For records in [0,1]^d
    (every record may touch every candidate) a replacement moves the sums by ≤ d
    in ℓ1, so Δ₁ = d and the error grows like d·log d/ε."""
    s = np.asarray(sums, dtype=np.float64)
    return int(np.argmax(s + _rng(rng).laplace(0.0, l1_sensitivity / float(epsilon), s.shape)))


def laplace_top_k(
    counts: npt.ArrayLike, k: int, epsilon: float, sparsity: int, rng: Rng | int | None = None
) -> list[int]:
    """Naive heavy hitters: Lap(2r/ε) on all d counts (a replaced r-sparse record moves
    the count vector by ≤ 2r in ℓ1), top k of the noisy counts.  Error Θ(r log d/ε)."""
    c = np.asarray(counts, dtype=np.float64)
    noisy = c + _rng(rng).laplace(0.0, 2.0 * sparsity / float(epsilon), c.shape)
    return [int(j) for j in np.argsort(-noisy, kind="stable")[:k]]


def central_mwem(
    truth_hist: Array,
    workload: MarginalWorkload,
    epsilon: float,
    rounds: int,
    rng: Rng | int | None = None,
    sensitivity: float = 1.0,
) -> Array:
    """Central MWEM (Hardt–Ligett–McSherry): each round the exponential mechanism with
    ε/(2T) on |q(B) − q(A)| and a Laplace measurement Lap(Δ·2T/ε).  Δ = 1 for the
    two-way marginal queries (q ∈ {0,1}); the paper's Lap(4T/ε) is Δ = 2 for q ∈ [−1,1]."""
    gen = _rng(rng)
    n = float(truth_hist.sum())
    truth = workload.answers(truth_hist)
    step = float(epsilon) / (2 * rounds)

    def select(qa: Array, _t: int) -> int:
        return exponential_mechanism(np.abs(truth - qa), step, sensitivity, gen)

    def measure(q: int, _t: int) -> float:
        return float(truth[q] + gen.laplace(0.0, sensitivity / step))

    synth, _ = mwem_loop(int(round(n)), workload, rounds, select, measure)
    return synth


# --------------------------------------------------------------------------- shuffle model


def shuffle_epsilon(local_epsilon: float, n: int, delta: float) -> float:
    """Central ε of n shuffled ε₀-DP local reports: Feldman, McMillan, Talwar,
    "Hiding among the clones" (FOCS 2021), Theorem 3.1:
    ε = ln(1 + (e^ε₀ − 1)/(e^ε₀ + 1)·(8√(e^ε₀·ln(4/δ))/√n + 8e^ε₀/n)),
    valid for ε₀ ≤ ln(n/(16 ln(2/δ))); outside that range this returns inf."""
    e0 = float(local_epsilon)
    if e0 <= 0 or n < 1 or not 0 < delta < 1:
        raise ValueError("need ε₀ > 0, n ≥ 1 and δ in (0, 1)")
    limit = math.log(n / (16 * math.log(2 / delta))) if n > 16 * math.log(2 / delta) else 0.0
    if e0 > limit:
        return math.inf
    x = math.exp(e0)
    return math.log1p((x - 1) / (x + 1) * (8 * math.sqrt(x * math.log(4 / delta) / n) + 8 * x / n))


def shuffle_local_epsilon(epsilon: float, n: int, delta: float) -> float:
    """The largest ε₀ whose shuffled central guarantee (`shuffle_epsilon`) is ≤ (ε, δ);
    0 when no ε₀ qualifies (n too small for the bound)."""
    lo, hi = 0.0, 50.0
    if shuffle_epsilon(1e-9, n, delta) > epsilon:
        return 0.0
    for _ in range(100):  # shuffle_epsilon increases in ε₀ on its valid range
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if shuffle_epsilon(mid, n, delta) <= epsilon else (lo, mid)
    return lo


def shuffled_rr_select(
    counts: npt.ArrayLike, n: int, epsilon: float, delta: float, rng: Rng | int | None = None
) -> int:
    """Shuffle-model selection for one-item-per-user data: every user applies K-ary
    randomized response (K = d + 1: the d candidates and "anything else") at the ε₀
    of `shuffle_local_epsilon(ε, n, δ)`, the shuffler hides who sent what, and the
    analyst takes the argmax of the report counts over the candidates (debiasing is
    monotone, so it does not change the argmax).  (ε, δ)-DP centrally by the
    amplification bound above; simulated exactly per category (binomial keeps,
    multinomial spreads over the other K − 1 values)."""
    gen = _rng(rng)
    c = np.asarray(counts, dtype=np.int64)
    d = c.size
    cells = np.append(c, n - int(c.sum()))  # the last cell: users holding another item
    k = d + 1
    e0 = shuffle_local_epsilon(epsilon, n, delta)
    keep = math.exp(e0) / (math.exp(e0) + k - 1)
    reports = np.zeros(k, dtype=np.int64)
    for v, m in enumerate(cells.tolist()):
        kept = int(gen.binomial(m, keep)) if m else 0
        reports[v] += kept
        moved = m - kept
        if moved:
            spread = gen.multinomial(moved, np.full(k - 1, 1.0 / (k - 1)))
            reports[:v] += spread[:v]
            reports[v + 1 :] += spread[v:]
    top = reports[:d]
    best = np.flatnonzero(top == top.max())
    return int(gen.choice(best))
