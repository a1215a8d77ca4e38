"""Applications (§7): embeddings, F_p selection, top-k, sparse mean, MWEM."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from svtagg.analyst import applications as apps
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.mpc.ring import encode, sensitivity

GRID = sensitivity(16)


def oracle_of(values: np.ndarray, seed: int) -> LocalOracle:
    return LocalOracle(values, epsilon_total=100, seed=seed)


def test_embeddings_registry_and_ranges() -> None:
    rng = np.random.default_rng(0)
    assert set(apps.EMBEDDINGS) == {"heavy_hitters", "sparse_mean", "marginals", "fp_loss"}
    hh = apps.EMBEDDINGS["heavy_hitters"]([[0, 3], [1], []], 5)
    assert hh.tolist() == [[1, 0, 0, 1, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    sm = apps.EMBEDDINGS["sparse_mean"](rng.normal(0, 5, (100, 4)), 3.0)
    assert sm.min() >= 0 and sm.max() <= 1
    # the σ = −1 score is the complement of the σ = +1 score
    x = np.array([[-1.0, 0.5]])
    assert np.allclose(1 - apps.sparse_mean_embedding(x, 2.0), (2.0 - x) / 4.0)
    mg = apps.EMBEDDINGS["marginals"](np.array([[1, 1, 0], [1, 0, 1]]))
    # pairs (0,1), (0,2), (1,2); value (1 + q(x))/2
    assert mg.tolist() == [[1.0, 0.5, 0.5], [0.5, 1.0, 0.5]]
    fp = apps.EMBEDDINGS["fp_loss"](np.array([[-2.0, 0.5, 9.0]]), 4.0, 2)
    assert fp.tolist() == [[0.25, 0.015625, 1.0]]


def test_fp_selection_picks_smallest_loss() -> None:
    rng = np.random.default_rng(1)
    n, d = 20_000, 8
    scale = np.full(d, 2.0)
    scale[5] = 0.2  # candidate 5 has the smallest residuals
    res = rng.normal(0, 1, (n, d)) * scale
    emb = apps.fp_loss_embedding(res, bound=6.0, p=2)
    sel = apps.fp_selection(oracle_of(emb, 2), 2, 6.0, 1, 0.05)
    assert sel.index == 5
    assert sel.lp_error_bound == pytest.approx(6.0 * sel.fp_error_bound**0.5)
    assert sel.selection.query.complement


def test_top_k_heavy_hitters_recall_and_budget() -> None:
    rng = np.random.default_rng(2)
    n, d, k = 30_000, 200, 3
    counts = rng.binomial(n, rng.uniform(0, 0.1, d))
    counts[[10, 50, 90]] = [n // 2, n // 3, n // 4]
    oracle = LocalOracle.from_sums(counts * GRID, n, 100, seed=3)
    res = apps.top_k_heavy_hitters(oracle, k, 1, options=apps.TopKOptions(rng=4))
    assert set(res.indices) == {10, 50, 90}
    assert len(set(res.indices)) == k  # chosen categories are removed
    assert res.spend.epsilon <= res.planned_epsilon <= 1
    assert oracle.budget().epsilon_spent == res.spend.epsilon


def test_sparse_mean_support_and_budget() -> None:
    rng = np.random.default_rng(3)
    n, d, k = 40_000, 30, 2
    mu = np.zeros(d)
    mu[[4, 20]] = [1.0, -1.0]
    clip = apps.sparse_mean_clip(n, d, 0.1)
    emb = apps.sparse_mean_embedding(rng.normal(mu, 1, (n, d)), clip)
    oracle = oracle_of(emb, 5)
    res = apps.sparse_mean(oracle, k, 1, 0.1, clip, variant="paper", rng=6)
    assert sorted(res.support) == [4, 20]
    assert np.linalg.norm(res.mean - mu) < 0.5
    assert res.planned_epsilon <= 1  # Alg 9 as written plans ε/2 of each ε/(2k) share
    assert oracle.budget().epsilon_spent == res.spend.epsilon


def test_mwem_svt_pure_and_advanced() -> None:
    rng = np.random.default_rng(4)
    a, n, t = 4, 200_000, 4
    wl = apps.MarginalWorkload.build(a)
    x = (rng.random((n, a)) < [0.9, 0.8, 0.2, 0.1]).astype(int)
    hist = wl.histogram(x)
    per_elem = encode(apps.marginals_embedding(wl.domain), 16).astype(np.int64)
    sums = (hist.astype(np.int64)[:, None] * per_elem).sum(axis=0)
    assert np.array_equal(sums, encode(apps.marginals_embedding(x), 16).astype(np.int64).sum(0))
    uniform = apps.max_query_error(wl, hist, np.full(2**a, n / 2**a))
    for delta in (0.0, 1e-6):
        oracle = LocalOracle.from_sums(sums, n, 100, seed=7)
        res = apps.mwem_svt(oracle, wl, 1, 0.1, rounds=t, delta=delta)
        assert res.synthetic.sum() == pytest.approx(n)
        assert apps.max_query_error(wl, hist, res.synthetic) < 0.9 * uniform
        assert res.spend.epsilon == res.planned_epsilon == 2 * t * res.step_epsilon
        assert oracle.budget().epsilon_spent == res.spend.epsilon
        if delta == 0:
            assert res.planned_epsilon == 1
        else:
            assert res.step_epsilon >= Fraction(1, 2 * t)
    assert apps.mwem_rounds(10**6, 1.0, 256, 28, 0.1) >= 1
