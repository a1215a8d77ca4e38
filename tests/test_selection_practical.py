"""The practical selection variant (`practical_selection`, `plan_practical`) and the
practical top-k: guarantee in the promised fraction of seeded runs (binomial test),
exact planned budget, query bound, witness fallback, data-independent plan."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from test_selection import GRID, certificate_holds, check_binomial, planted_oracle

from svtagg.analyst import applications as apps
from svtagg.analyst.applications import TopKOptions
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import (
    ROUNDING_SLACK,
    Candidates,
    PracticalOptions,
    SearchSpace,
    gbs_budgets,
    geometric_binary_search,
    plan_practical,
    practical_selection,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Number, Query


def dense_top_oracle(n: int, d: int, seed: int) -> LocalOracle:
    """One candidate per score unit below a top at n/2 (the experiments' planted data)."""
    rng = np.random.default_rng(seed)
    scores = np.floor(n // 2 - d * (1.0 - rng.random(d)))
    scores[rng.integers(d)] = n // 2
    return LocalOracle.from_sums(scores.astype(np.int64) * GRID, n, 1000, seed=seed)


def _guarantee_failures(runs: int, n: int, d: int, beta: float, seed0: int) -> int:
    failures = 0
    for seed in range(runs):
        oracle = dense_top_oracle(n, d, seed0 + seed)
        scores = oracle.true_scores()
        plan = plan_practical(oracle, 1, beta, d, n)
        res = practical_selection(oracle, 1, beta, plan=plan)
        # the promise: w.p. ≥ 1 − β the certificate holds and u' − ℓ' ≤ error_bound,
        # so the selection error max_j s_j − s_{j*} ≤ u' − ℓ' ≤ error_bound
        ok = certificate_holds(res, scores) and res.upper - res.lower <= plan.error_bound()
        ok &= scores.max() - scores[res.index] <= plan.error_bound()
        failures += not ok
        # budget: exactly the plan, one stream per coarse round plus one fine stream
        assert res.spend.epsilon == res.planned_epsilon == plan.planned_epsilon == 1
        assert oracle.budget().epsilon_spent == 1
        assert res.spend.streams == plan.coarse_rounds + 1
        assert res.spend.queries <= res.spend.queries_sent <= plan.max_queries()
        assert res.spend.chunks <= plan.coarse_rounds + plan.max_levels
    return failures


def test_practical_guarantee_binomial() -> None:
    runs, n, d, beta = 40, 50_000, 40, 0.1
    f = _guarantee_failures(runs, n, d, beta, 500)
    check_binomial(f, runs, beta, "practical selection (certificate and error bound)")


@pytest.mark.heavy
def test_practical_guarantee_binomial_large() -> None:
    runs, n, d, beta = 60, 100_000, 1000, 0.05
    f = _guarantee_failures(runs, n, d, beta, 900)
    check_binomial(f, runs, beta, "practical selection, d = 1000")


def test_practical_beats_paper_gbs_on_planted_data() -> None:
    # Not a privacy property: a regression check on the point of the variant.  On the
    # experiments' planted data (one candidate per unit near the top) the paper's
    # Alg 8 has mean error ~20 units at d = 200, the practical variant ~4.
    n, d, runs = 50_000, 200, 12
    err_p, err_8 = [], []
    for seed in range(runs):
        o1, o2 = dense_top_oracle(n, d, 700 + seed), dense_top_oracle(n, d, 700 + seed)
        s = o1.true_scores()
        err_p.append(s.max() - s[practical_selection(o1, 1, 0.1).index])
        err_8.append(s.max() - s[geometric_binary_search(o2, 1, 0.1).index])
    assert np.mean(err_p) < np.mean(err_8) / 2, (np.mean(err_p), np.mean(err_8))


def test_plan_is_data_independent_and_consistent() -> None:
    rng = np.random.default_rng(5)
    data = rng.random((300, 25))
    neighbour = data.copy()
    neighbour[3] = rng.random(25)
    plans = [
        plan_practical(LocalOracle(x, 10, seed=1), Fraction(1, 2), 0.05, 25, 300.0)
        for x in (data, neighbour, np.zeros((300, 25)))
    ]
    assert plans[0] == plans[1] == plans[2]
    pl = plans[0]
    assert pl.coarse_epsilon + pl.fine_epsilon == Fraction(1, 2) == pl.planned_epsilon
    assert pl.kind == StreamKind.EXP3  # smallest α of the three kinds here
    assert pl.max_queries() == 25 * (pl.coarse_rounds + pl.max_levels)
    # the levels reach from the coarse upper bound to ℓ_c − α_f on every run
    assert (pl.max_levels - 1) * pl.step >= pl.width_bound + pl.fine_alpha + ROUNDING_SLACK
    assert pl.error_bound() == pl.step + 2 * (pl.fine_alpha + ROUNDING_SLACK)
    # an explicit kind is honoured; bad parameters are refused
    o = LocalOracle(data, 10, seed=1)
    lap24 = PracticalOptions(kind="lap24")
    assert plan_practical(o, 1, 0.05, 25, 300.0, options=lap24).kind == StreamKind.LAP24
    with pytest.raises(ValueError):
        plan_practical(o, 1, 0.05, 25, 300.0, options=PracticalOptions(coarse_fraction=Fraction(1)))
    with pytest.raises(ValueError):
        plan_practical(o, 1, 0.05, 25, 300.0, options=PracticalOptions(step=0))
    with pytest.raises(ValueError):
        gbs_budgets(Fraction(1), 3, Fraction(1))


class _RecordingOracle:
    """Wraps a LocalOracle: records every stream's answers and can silence the
    `mute`-th stream (it then answers NO to everything, as a failed fine stage would)."""

    def __init__(self, inner: LocalOracle, mute: int | None = None) -> None:
        self.inner, self.mute, self.opened = inner, mute, 0
        self.log: list[tuple[int, list[tuple[Query, Number]], int | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def n(self) -> int:
        return self.inner.n

    @property
    def d(self) -> int:
        return self.inner.d

    def open_stream(self, epsilon: Number | str, kind: Any = "lap24", delta: Any = 0) -> Any:
        stream = self.inner.open_stream(epsilon, kind, delta)
        number, outer = self.opened, self
        self.opened += 1

        class _S:
            def ask(self, chunk: Sequence[tuple[Query, Number]]) -> int | None:
                # a muted stream answers NO without asking (as a failed stream would)
                hit = None if number == outer.mute else stream.ask(chunk)
                outer.log.append((number, list(chunk), hit))
                return hit

        return _S()


def test_witness_fallback_is_the_coarse_witness() -> None:
    n, d = 20_000, 30
    base = planted_oracle(n, d, 31)
    plan = plan_practical(base, 1, 0.1, d, n)
    fine = plan.coarse_rounds  # streams 0..T_c−1 are coarse, stream T_c is the fine one
    wrapped = _RecordingOracle(base, mute=fine)
    res = practical_selection(wrapped, 1, 0.1, plan=plan)  # type: ignore[arg-type]
    # the coarse stage is Algorithm 8 at (ε_c, β/2, T_c, kind): the same seeded oracle
    # run through geometric_binary_search draws the same noise, so gives its witness
    coarse = geometric_binary_search(
        planted_oracle(n, d, 31),
        plan.coarse_epsilon,
        plan.beta / 2,
        rounds=plan.coarse_rounds,
        kind=plan.kind,
    )
    assert any(h is not None for s, _, h in wrapped.log if s < fine), "coarse stage saw no YES"
    assert coarse.index != 0  # the fallback is not the default witness
    assert (res.index, res.lower, res.upper) == (coarse.index, coarse.lower, coarse.upper)
    # the fine stream scanned down past ℓ_c − α_f without a YES, within the plan
    assert sum(1 for s, _, _ in wrapped.log if s == fine) <= plan.max_levels
    # when no stream says YES at all, the caller's witness is returned
    # (shifted scores ≤ −n/2 on [0, n]: no stream can sensibly say YES)
    silent = _RecordingOracle(planted_oracle(n, d, 32))
    cands = Candidates.of([Query(j) for j in range(d)], [-float(n)] * d)
    space = SearchSpace(cands, witness=7)
    res2 = practical_selection(silent, 1, 0.1, space=space)  # type: ignore[arg-type]
    assert all(h is None for _, _, h in silent.log)
    assert res2.index == 7


def test_gbs_variant_parameter_delegates() -> None:
    a = practical_selection(planted_oracle(20_000, 20, 41), 1, 0.1)
    b = geometric_binary_search(planted_oracle(20_000, 20, 41), 1, 0.1, variant="practical")
    assert (a.index, a.lower, a.upper, a.spend) == (b.index, b.lower, b.upper, b.spend)
    with pytest.raises(ValueError):
        geometric_binary_search(planted_oracle(1000, 3, 1), 1, 0.1, variant="nope")


def test_practical_subset_interval_offsets() -> None:
    oracle = planted_oracle(10_000, 12, 3)
    scores = oracle.true_scores()
    cands = Candidates.of([Query(j) for j in range(12)], [100.0] * 12)
    space = SearchSpace(cands, subset=[1, 2, 4], interval=(0.0, 10_100.0), witness=2)
    res = practical_selection(oracle, 1, 0.05, space=space)
    assert res.index in (1, 2, 4)
    assert scores[res.index] + 100 >= res.lower - 1e-9
    assert scores[[1, 2, 4]].max() + 100 <= res.upper + 1e-9
    assert res.spend.epsilon == 1


def test_top_k_practical_default_recall_and_budget() -> None:
    rng = np.random.default_rng(2)
    n, d, k = 30_000, 200, 3
    counts = rng.binomial(n, rng.uniform(0, 0.1, d))
    counts[[10, 50, 90]] = [n // 2, n // 3, n // 4]
    oracle = LocalOracle.from_sums(counts * GRID, n, 100, seed=3)
    res = apps.top_k_heavy_hitters(oracle, k, 1, options=TopKOptions(variant="practical"))
    assert set(res.indices) == {10, 50, 90}
    # k rounds of ε/k, fixed in advance: exactly ε, all of it on the ledger
    assert res.spend.epsilon == res.planned_epsilon == 1
    assert oracle.budget().epsilon_spent == 1
    # queries: each round ≤ its plan's bound (|P| shrinks by one per round)
    bound = sum(
        plan_practical(oracle, Fraction(1, k), 1 / d, d - i, n).max_queries() for i in range(k)
    )
    assert res.spend.queries <= bound
    with pytest.raises(ValueError):
        apps.top_k_heavy_hitters(oracle, k, 1, options=TopKOptions(variant="nope"))
