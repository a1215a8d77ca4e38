"""`svtagg analyst run` for every application: each runs through the oracle
interface (here the local reference oracle) and spends exactly the ε asked."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from svtagg.analyst import applications
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.deploy.algorithms import ALGORITHMS, RunFlags, run_algorithm


def _spent(oracle: LocalOracle) -> Fraction:
    return oracle.budget().epsilon_spent


def test_fp_selection_job_picks_the_smallest_loss() -> None:
    rng = np.random.default_rng(0)
    n, d = 40_000, 6
    residuals = rng.uniform(-1, 1, size=(n, d)) * np.linspace(0.1, 1.0, d)
    data = applications.fp_loss_embedding(residuals, 1.0, 2.0)
    oracle = LocalOracle(data, 2, seed=1)
    out = run_algorithm(oracle, RunFlags("fp", "2", beta=0.05, p=2.0, bound=1.0))
    # column 0's loss is ≈ 130 score units, column 1's ≈ 1,050: the gap exceeds
    # the reported bound, so a wrong pick has probability ≤ β = 0.05
    assert 0 < out["fp_error_bound"] < 900
    assert out["selected"] == 0
    assert _spent(oracle) == 2


def test_sparse_mean_job_finds_the_support() -> None:
    rng = np.random.default_rng(1)
    n, d = 20_000, 20
    mu = np.zeros(d)
    mu[[3, 11]] = 1.0
    x = rng.normal(mu, 1.0, size=(n, d))
    clip = applications.sparse_mean_clip(n, d, 0.05)
    oracle = LocalOracle(applications.sparse_mean_embedding(x, clip), 4, seed=2)
    # ε/(2k) = 1: Algorithm 9 needs ε ≤ 1 per round
    out = run_algorithm(oracle, RunFlags("sparse-mean", "4", beta=0.05, k=2, seed=3, clip=clip))
    assert sorted(out["support"]) == [3, 11]
    assert all(abs(v - 1.0) < 0.5 for v in out["mean"].values())
    assert _spent(oracle) == 4


def test_mwem_job_runs_and_spends_its_budget() -> None:
    rng = np.random.default_rng(2)
    a = 4
    x = (rng.random((5000, a)) < 0.6).astype(np.int8)
    data = applications.marginals_embedding(x)
    oracle = LocalOracle(data, 4, seed=4)
    out = run_algorithm(oracle, RunFlags("mwem", "4", beta=0.1, attributes=a, rounds=2))
    assert out["rounds"] == 2 and len(out["chosen_queries"]) == 2
    assert abs(sum(out["synthetic_histogram"]) - 5000) < 1e-6
    assert _spent(oracle) == 4


def test_mwem_job_needs_the_attribute_count() -> None:
    oracle = LocalOracle(np.zeros((10, 6)), 4, seed=5)
    with pytest.raises(ValueError, match="attributes"):
        run_algorithm(oracle, RunFlags("mwem", "4"))
    assert _spent(oracle) == 0
    assert {"fp", "sparse-mean", "mwem"} <= set(ALGORITHMS)
