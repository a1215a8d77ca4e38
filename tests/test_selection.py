"""Selection algorithms (Alg 6–9, Cor 6.8) against the local oracle.

Statistical tests run each algorithm on seeded planted data and count runs in
which the theorem's guarantee fails; the guarantee promises failure probability
≤ β per run, so the count is Binomial(R, ≤ β) and we reject only when
P(Bin(R, β) ≥ count) < FALSE_FAIL, the false-failure probability of the test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import (
    ROUNDING_SLACK,
    Candidates,
    SearchSpace,
    SelectionResult,
    binary_search,
    binary_search_rounds,
    default_rounds,
    gbs_budgets,
    geometric_binary_search,
    linear_scan,
    plan_for,
    plan_sampling_and_filtering,
    sampling_and_filtering,
    sum_estimation,
)
from svtagg.analyst.selection.session import DESCEND_CHUNK
from svtagg.dp.queries import Query
from svtagg.mpc.ring import sensitivity

FALSE_FAIL = 1e-3
GRID = sensitivity(16)


def planted_oracle(n: int, d: int, seed: int, top: float = 0.5, spread: float = 0.4) -> LocalOracle:
    """Scores: candidate d//3 has mean `top`, the others uniform in [0, spread)."""
    rng = np.random.default_rng(seed)
    means = rng.uniform(0.0, spread, d)
    means[d // 3] = top
    sums = np.rint(rng.binomial(n, means) * GRID).astype(np.int64)
    return LocalOracle.from_sums(sums, n, epsilon_total=1000, seed=seed)


def check_binomial(failures: int, runs: int, beta: float, what: str) -> None:
    # P(Bin(runs, beta) >= failures)
    p = binom.sf(failures - 1, runs, beta) if failures > 0 else 1.0
    assert p >= FALSE_FAIL, (
        f"{what}: {failures}/{runs} runs broke the guarantee (promised failure ≤ {beta}); "
        f"P(this many | guarantee holds) = {p:.2e} < {FALSE_FAIL} (the test's false-failure "
        f"probability)"
    )


def certificate_holds(res: SelectionResult, scores: np.ndarray) -> bool:
    """Theorem 6.6's event: s_{j*} ≥ ℓ' and every score ≤ u'."""
    return bool(scores[res.index] >= res.lower - 1e-9 and scores.max() <= res.upper + 1e-9)


def gbs_width_bound(width: float, rounds: int, last_alpha: float) -> float:
    """u' − ℓ' ≤ W/2^T + 3·α_T: each round halves the width and adds α_t, and
    α_{t−1} ≈ (4/3)α_t, so the added terms sum to ≤ 3α_T (α widened by the threshold
    rounding slack; 1% for the grid rounding of α)."""
    return width / 2**rounds + 3.0 * (last_alpha + ROUNDING_SLACK) * 1.01 + 1e-6


# --------------------------------------------------------------------------- Alg 8


def test_gbs_budgets_sum_exactly() -> None:
    for t in (1, 2, 17, 64):
        parts = gbs_budgets(Fraction(7, 10), t)
        assert sum(parts) == Fraction(7, 10)
        assert all(b * Fraction(3, 4) == a for a, b in zip(parts, parts[1:], strict=False))


def test_geometric_binary_search_guarantee() -> None:
    runs, beta, eps = 30, 0.1, Fraction(1)
    n, d = 50_000, 40
    failures = 0
    for seed in range(runs):
        oracle = planted_oracle(n, d, seed)
        scores = oracle.true_scores()
        res = geometric_binary_search(oracle, eps, beta)
        rounds = default_rounds(n)
        paper = n / 2**rounds + (384 / float(eps)) * math.log(2 * d * rounds / beta)
        width_ok = res.upper - res.lower <= gbs_width_bound(n, rounds, res.spend.alphas[-1])
        assert gbs_width_bound(n, rounds, res.spend.alphas[-1]) <= paper
        if not (certificate_holds(res, scores) and width_ok):
            failures += 1
        # Theorem 6.6: ≤ |P|·T queries; exactly ε spent, one stream per round.
        assert res.spend.queries <= d * rounds
        assert res.spend.streams == rounds
        assert res.spend.epsilon == res.planned_epsilon == eps
        assert oracle.budget().epsilon_spent == eps
        assert len(res.spend.alphas) == rounds
    check_binomial(failures, runs, beta, "Algorithm 8")


def test_gbs_subset_witness_and_offsets() -> None:
    oracle = planted_oracle(10_000, 12, 3)
    scores = oracle.true_scores()
    cands = Candidates.of([Query(j) for j in range(12)], [100.0] * 12)
    space = SearchSpace(cands, subset=[1, 2, 4], interval=(0.0, 10_100.0), witness=2)
    res = geometric_binary_search(oracle, 1, 0.05, space=space)
    assert res.index in (1, 2, 4)
    assert scores[res.index] + 100 >= res.lower - 1e-9
    assert scores[[1, 2, 4]].max() + 100 <= res.upper + 1e-9


# --------------------------------------------------------------------------- Cor 6.8


def test_sum_estimation_interval() -> None:
    runs, beta = 30, 0.1
    n = 20_000
    failures = 0
    for seed in range(runs):
        oracle = planted_oracle(n, 3, 100 + seed)
        truth = oracle.true_scores()[1]
        est = sum_estimation(oracle, Query(1), 1, beta)
        rounds = default_rounds(n)
        paper = 1 + (384 / 1.0) * math.log(2 * rounds / beta)
        ok = est.lower - 1e-9 <= truth <= est.upper + 1e-9
        ok &= est.upper - est.lower <= min(paper, gbs_width_bound(n, rounds, est.spend.alphas[-1]))
        failures += not ok
        assert est.spend.queries <= rounds
        assert est.spend.epsilon == est.planned_epsilon == 1
    check_binomial(failures, runs, beta, "Corollary 6.8")


def test_sum_estimation_complement() -> None:
    oracle = planted_oracle(20_000, 3, 7)
    truth = 20_000 - oracle.true_scores()[0]
    est = sum_estimation(oracle, Query(0, complement=True), 2, 0.01)
    assert est.lower - 1e-9 <= truth <= est.upper + 1e-9


# --------------------------------------------------------------------------- Alg 6


def test_binary_search_guarantee() -> None:
    runs, beta = 25, 0.1
    n, d = 50_000, 30
    failures = 0
    rounds = binary_search_rounds(n)
    for seed in range(runs):
        oracle = planted_oracle(n, d, 200 + seed)
        scores = oracle.true_scores()
        res = binary_search(oracle, 1, beta)
        alpha = res.spend.alphas[0]
        # Alg 6's analysis: the returned index is within u − ℓ ≤ 3α (or 2α when it was
        # the only one above m) of the maximum.
        failures += scores.max() - scores[res.index] > 3 * (alpha + ROUNDING_SLACK)
        assert res.spend.queries <= d * rounds
        assert res.spend.streams <= 2 * rounds
        assert res.spend.epsilon == res.spend.streams * Fraction(1, 2 * rounds)
        assert res.spend.epsilon <= res.planned_epsilon == 1
        assert oracle.budget().epsilon_spent == res.spend.epsilon
    check_binomial(failures, runs, beta, "Algorithm 6")


# --------------------------------------------------------------------------- Alg 7


def test_linear_scan_guarantee() -> None:
    runs, beta = 20, 0.1
    n, d = 300, 6
    failures = 0
    for seed in range(runs):
        oracle = planted_oracle(n, d, 300 + seed)
        scores = oracle.true_scores()
        res = linear_scan(oracle, 2, beta)
        alpha = res.spend.alphas[0]
        # YES at level m: s_j ≥ m − α; all NO at m + 1: every score ≤ m + 1 + α.
        failures += scores.max() - scores[res.index] > 2 * (alpha + ROUNDING_SLACK) + 1
        assert res.spend.queries <= d * (n + 1)
        assert res.spend.streams == 1
        assert res.spend.epsilon == res.planned_epsilon == 2
        # chunks of whole levels over all d candidates, at most one chunk past the YES
        per = DESCEND_CHUNK // d
        assert res.spend.queries_sent % d == 0
        assert res.spend.chunks == -(-res.spend.queries_sent // (per * d))
        assert res.spend.queries_sent - res.spend.queries < per * d
    check_binomial(failures, runs, beta, "Algorithm 7")


# --------------------------------------------------------------------------- Alg 9


def test_plan_identical_for_neighbouring_datasets() -> None:
    rng = np.random.default_rng(5)
    data = rng.random((400, 30))
    neighbour = data.copy()
    neighbour[17] = rng.random(30)  # replace one user's record
    plans = []
    for x in (data, neighbour, np.zeros((400, 30))):
        oracle = LocalOracle(x, 10, seed=1)
        for variant in ("paper", "tuned"):
            plans.append(plan_for(oracle, Fraction(1, 2), 1 / 60, variant=variant))
    assert plans[0] == plans[2] == plans[4]
    assert plans[1] == plans[3] == plans[5]


def test_plan_phases_and_budget() -> None:
    def acc(e: Fraction, k: int, b: float) -> float:
        return 8 / float(e) * math.log(k / b)

    # As written, phases only run for n/α ≥ 2^64.
    small = plan_sampling_and_filtering(10**6, 100, 1, 1e-3, acc)
    assert small.phases == () and small.final_rounds == 64
    assert small.planned_epsilon == Fraction(1, 2)
    huge = plan_sampling_and_filtering(10**30, 100, 1, 1e-3, acc)
    assert len(huge.phases) >= 1
    for ph in huge.phases:
        assert ph.t >= 64 and ph.epsilon == Fraction(1, ph.t**3)
        assert ph.max_filter_streams == ph.t**2  # the t² reading of lines 11–12
    assert huge.planned_epsilon <= 1
    tuned = plan_sampling_and_filtering(10**6, 100, 1, 1e-3, acc, variant="tuned")
    assert tuned.phases == () and tuned.planned_epsilon == 1 == tuned.final_epsilon
    assert tuned.final_rounds == math.ceil(math.log2(10**6 / tuned.alpha)) + 2
    big = plan_sampling_and_filtering(10**12, 100, 1, 1e-3, acc, variant="tuned")
    t1 = math.ceil(math.log2(10**12 / big.alpha))  # line 4 with x = n/α
    t2 = math.ceil(math.log2(64 * t1**3))  # line 14: x = 64·t³
    assert 64 * t2**3 < 2**20 <= 64 * t1**3
    assert [p.t for p in big.phases] == [t1, t2]
    assert big.planned_epsilon == 1 and 0 < big.final_epsilon < 1
    with pytest.raises(ValueError):
        plan_sampling_and_filtering(10**6, 100, 2, 1e-3, acc)  # ε > 1
    with pytest.raises(ValueError):
        plan_sampling_and_filtering(10**6, 100, 1, 0.1, acc)  # β > 1/d


@pytest.mark.parametrize("variant", ["paper", "tuned"])
def test_sampling_and_filtering_accounting(variant: str) -> None:
    n, d, beta = 200_000, 50, 1 / 100
    oracle = planted_oracle(n, d, 11)
    plan = plan_for(oracle, 1, beta, variant=variant)
    res = sampling_and_filtering(oracle, 1, beta, variant=variant, rng=3)
    assert res.planned_epsilon == plan.planned_epsilon
    assert res.spend.epsilon <= plan.planned_epsilon
    assert oracle.budget().epsilon_spent == res.spend.epsilon
    assert res.spend.queries <= plan.max_queries()
    assert not plan.phases  # at practical n both variants are the final search alone
    assert res.spend.epsilon == plan.planned_epsilon  # no data-dependent streams
    assert certificate_holds(res, oracle.true_scores())


def test_sampling_and_filtering_phases_run() -> None:
    # n = 10^9 (exact grid sums, no data matrix) puts n/α above the tuned cut-off,
    # so the phases (lines 4–14, the t² filtering) run against a real oracle.
    n, d, beta = 10**9, 60, 1 / 120
    oracle = planted_oracle(n, d, 12)
    plan = plan_for(oracle, 1, beta, variant="tuned")
    assert len(plan.phases) >= 1
    res = sampling_and_filtering(oracle, 1, beta, variant="tuned", rng=4)
    ph = plan.phases[0]
    assert res.spend.epsilon <= plan.planned_epsilon == 1
    assert oracle.budget().epsilon_spent == res.spend.epsilon
    # every stream is ε' of some phase or one of the final search's ε_t
    assert res.spend.streams <= sum(p.max_filter_streams + 2 * p.t for p in plan.phases) + (
        plan.final_rounds
    )
    assert res.spend.queries <= plan.max_queries()
    assert ph.t**2 == ph.max_filter_streams
    assert certificate_holds(res, oracle.true_scores())


def _alg9_failures(variant: str, runs: int, n: int, d: int) -> int:
    beta = 1 / (2 * d)
    failures = 0
    for seed in range(runs):
        oracle = planted_oracle(n, d, 400 + seed)
        scores = oracle.true_scores()
        res = sampling_and_filtering(oracle, 1, beta, variant=variant, rng=seed)
        plan = plan_for(oracle, 1, beta, variant=variant)
        bound = gbs_width_bound(n, plan.final_rounds, res.spend.alphas[-1])
        ok = certificate_holds(res, scores) and res.upper - res.lower <= bound
        failures += not ok
        assert res.spend.queries <= plan.max_queries()
    return failures


@pytest.mark.parametrize("variant", ["paper", "tuned"])
def test_sampling_and_filtering_guarantee(variant: str) -> None:
    runs, d = 30, 40
    f = _alg9_failures(variant, runs, 100_000, d)
    check_binomial(f, runs, 1 / (2 * d), f"Algorithm 9 ({variant})")


def test_default_candidates_and_errors() -> None:
    oracle = planted_oracle(1000, 5, 1)
    with pytest.raises(ValueError):
        geometric_binary_search(oracle, 1, 1.5)
    with pytest.raises(ValueError):
        geometric_binary_search(oracle, 0, 0.1)
    with pytest.raises(ValueError):
        geometric_binary_search(oracle, 1, 0.1, space=SearchSpace(Candidates.of([])))


def test_two_server_noise_model_uses_its_own_alpha() -> None:
    # With two servers each term is the sum of two draws; α must come from that model.
    n, d = 50_000, 20
    one = planted_oracle(n, d, 21)
    sums = np.rint(one.true_scores() * GRID).astype(np.int64)
    two = LocalOracle.from_sums(sums, n, 100, parties=2, seed=21)
    r1 = geometric_binary_search(one, 1, 0.1)
    r2 = geometric_binary_search(two, 1, 0.1)
    assert r2.spend.alphas[-1] > r1.spend.alphas[-1]
    last = gbs_budgets(Fraction(1), 16)[-1]
    assert r2.spend.alphas[-1] == two.accuracy("lap24", last, d, 0.1 / 16)
    assert certificate_holds(r2, two.true_scores())
