"""Simulation baselines: exponential mechanism, Gaussian aggregation, Laplace counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from svtagg.analyst import applications as apps
from svtagg.analyst import baselines
from svtagg.dp.accounting import rho_for_dp

FALSE_FAIL = 1e-3


def test_exponential_mechanism_distribution() -> None:
    scores = np.array([0.0, 1.0, 2.0, 4.0])
    eps, draws = 1.0, 20_000
    rng = np.random.default_rng(0)
    counts = np.bincount(
        [baselines.exponential_mechanism(scores, eps, 1.0, rng) for _ in range(draws)], minlength=4
    )
    p = np.exp(eps * scores / 2)
    p /= p.sum()
    stat = chisquare(counts, draws * p)
    assert stat.pvalue > FALSE_FAIL, f"EM frequencies off the exact pmf (p={stat.pvalue:.2e})"


def test_gaussian_release_noise_scale() -> None:
    d, eps, delta = 400, 1.0, 1e-6
    agg, rho = baselines.gaussian_for_dp(np.zeros(d), eps, delta)
    assert rho == pytest.approx(rho_for_dp(eps, delta))
    noisy = agg.release(rho, np.random.default_rng(1))
    sigma = math.sqrt(d) / math.sqrt(2 * rho)
    # sample sd of 400 normals is within 15% of σ except with probability < 1e-3
    assert abs(noisy.std() / sigma - 1) < 0.15
    with pytest.raises(ValueError):
        agg.release(rho, 1)  # budget already used


def test_selection_baselines_find_clear_winner() -> None:
    scores = np.full(50, 1000.0)
    scores[7] = 5000.0
    assert baselines.gaussian_selection(scores, 1.0, 1e-6, 0) == 7
    assert baselines.em_select(np.tile(scores / 5000, (1, 1)) * 5000, 1.0, 0) == 7
    assert baselines.report_noisy_max(scores, 1.0, 1.0, 0) == 7
    assert set(baselines.gaussian_top_k(scores, 1, 1.0, 1e-6, 0)) == {7}
    assert baselines.laplace_top_k(scores, 1, 1.0, 3, 0) == [7]


def test_central_mwem_beats_uniform() -> None:
    wl = apps.MarginalWorkload.build(4)
    rng = np.random.default_rng(2)
    x = (rng.random((20_000, 4)) < [0.9, 0.8, 0.2, 0.1]).astype(int)
    hist = wl.histogram(x)
    synth = baselines.central_mwem(hist, wl, 1.0, 8, 3)
    uniform = np.full(16, 20_000 / 16)
    assert synth.sum() == pytest.approx(20_000)
    # MWEM with the averaged output converges slowly; 8 rounds must still cut the error.
    assert apps.max_query_error(wl, hist, synth) < 0.7 * apps.max_query_error(wl, hist, uniform)


def test_shuffle_amplification_bound_and_selection() -> None:
    from svtagg.analyst import baselines as bl

    n, delta = 10**5, 1e-10
    # the bound grows with ε₀ and the inverse hits the target
    vals = [bl.shuffle_epsilon(e0, n, delta) for e0 in (0.5, 1.0, 2.0, 4.0)]
    assert vals == sorted(vals) and vals[0] < 0.5
    e0 = bl.shuffle_local_epsilon(1.0, n, delta)
    assert bl.shuffle_epsilon(e0, n, delta) == pytest.approx(1.0, abs=1e-6)
    assert bl.shuffle_epsilon(20.0, n, delta) == float("inf")  # outside the theorem's range
    assert bl.shuffle_local_epsilon(1.0, 10, delta) == 0.0  # too few users for the bound
    # a candidate held by a third of the users is found; a flat histogram is a coin toss
    counts = np.zeros(200, dtype=np.int64)
    counts[17] = n // 3
    assert bl.shuffled_rr_select(counts, n, 1.0, delta, rng=1) == 17
    picks = {
        bl.shuffled_rr_select(np.zeros(200, dtype=np.int64), n, 1.0, delta, rng=s)
        for s in range(20)
    }
    assert len(picks) > 5
