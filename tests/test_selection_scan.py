"""The scan selection (`scan_selection`, `scan_top_k`, `plan_scan`): guarantees in
the promised fraction of seeded runs (binomial tests, false-failure probability in
the message), exact planned budget, query bound, a plan identical on neighbouring
datasets, and no arbitrary witness when the coarse stage certifies nothing."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from test_selection import GRID, certificate_holds, check_binomial, planted_oracle
from test_selection_practical import _RecordingOracle, dense_top_oracle

from svtagg.analyst import applications as apps
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import (
    Candidates,
    ScanOptions,
    SearchSpace,
    plan_scan,
    scan_selection,
    scan_top_k,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Query


def _scan_failures(runs: int, n: int, d: int, beta: float, seed0: int, parties: int) -> int:
    failures = 0
    for seed in range(runs):
        base = dense_top_oracle(n, d, seed0 + seed)
        oracle = LocalOracle.from_sums(
            base.true_scores().astype(np.int64) * GRID, n, 1000, seed=seed0 + seed, parties=parties
        )
        scores = oracle.true_scores()
        plan = plan_scan(oracle, 1, beta, d, n)
        res = scan_selection(oracle, 1, beta, plan=plan)
        # the promise: w.p. ≥ 1 − β the certificate holds and the error ≤ error_bound
        ok = certificate_holds(res, scores)
        ok &= scores.max() - scores[res.index] <= plan.error_bound()
        failures += not ok
        assert res.spend.epsilon == res.planned_epsilon == plan.planned_epsilon == 1
        assert oracle.budget().epsilon_spent == 1
        assert res.spend.streams == plan.stages + 1
        assert res.spend.queries <= res.spend.queries_sent <= plan.max_queries()
    return failures


@pytest.mark.parametrize("parties", [1, 2])
def test_scan_guarantee_binomial(parties: int) -> None:
    runs, n, d, beta = 40, 50_000, 40, 0.1
    f = _scan_failures(runs, n, d, beta, 1300 + 100 * parties, parties)
    check_binomial(f, runs, beta, f"scan selection, {parties} part(y/ies)")


def test_scan_top_k_guarantee_binomial() -> None:
    # The promise per run: w.p. ≥ 1 − β every rank's certificate holds (pick ≥ lower,
    # every candidate not chosen before it ≤ upper), rank 1's error ≤ error_bound,
    # and the budget is exactly the plan's.
    runs, n, d, k, beta = 30, 30_000, 60, 4, 0.1
    failures = 0
    for seed in range(runs):
        oracle = dense_top_oracle(n, d, 2000 + seed)
        scores = oracle.true_scores()
        plan = plan_scan(oracle, 1, beta, d, n, k=k)
        res = scan_top_k(oracle, k, 1, beta, plan=plan)
        assert res.spend.epsilon == res.planned_epsilon == plan.planned_epsilon == 1
        assert res.spend.queries_sent <= plan.max_queries()
        assert len(set(res.indices)) == len(res.indices)
        left = list(range(d))
        ok = len(res.indices) == k
        ok &= scores.max() - scores[res.indices[0]] <= plan.error_bound()
        for j, lo, up in zip(res.indices, res.lowers, res.uppers, strict=True):
            ok &= bool(scores[j] >= lo - 1e-9 and scores[left].max() <= up + 1e-9)
            left.remove(j)
        failures += not ok
    check_binomial(failures, runs, beta, "scan top-k (every rank's certificate)")


def test_scan_plan_identical_on_neighbouring_datasets() -> None:
    rng = np.random.default_rng(5)
    data = rng.random((300, 25))
    neighbour = data.copy()
    neighbour[3] = rng.random(25)  # replace one user
    for k in (1, 3):
        plans = [
            plan_scan(LocalOracle(x, 10, seed=1, parties=p), Fraction(1, 2), 0.05, 25, 300.0, k=k)
            for x in (data, neighbour, np.zeros((300, 25)))
            for p in (2,)
        ]
        assert plans[0] == plans[1] == plans[2]
        pl = plans[0]
        total = pl.coarse_epsilon + pl.mid_epsilon + k * pl.fine_epsilon
        assert total == Fraction(1, 2) == pl.planned_epsilon
        assert (pl.coarse_epsilon, pl.mid_epsilon) == (Fraction(1, 16), Fraction(1, 32))
        assert pl.kind == StreamKind.EXP3
    o = LocalOracle(data, 10, seed=1)
    eighth = ScanOptions(coarse_fraction="1/8")
    assert plan_scan(o, 1, 0.05, 25, 300.0, options=eighth).coarse_epsilon == Fraction(1, 8)
    lap24 = ScanOptions(kind="lap24")
    assert plan_scan(o, 1, 0.05, 25, 300.0, options=lap24).kind == StreamKind.LAP24
    bads = [{"coarse_fraction": "1"}, {"step": 0}, {"rounds": 0}]
    bads += [{"coarse_fraction": "1/2", "mid_fraction": "1/2"}, {"mid_fraction": "-1/8"}]
    for bad in bads:
        with pytest.raises(ValueError):
            plan_scan(o, 1, 0.05, 25, 300.0, options=ScanOptions(**bad))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        plan_scan(o, 1, 0.05, 25, 300.0, k=26)


def test_scan_never_returns_an_arbitrary_candidate() -> None:
    # Shifted scores s − n lie below the whole coarse interval [0, n]: no coarse stream
    # certifies anything.  Algorithm 8 would return its default witness (candidate 0);
    # the scan continues below the interval and still picks by a YES of its stream.
    n, d = 20_000, 30
    oracle = _RecordingOracle(planted_oracle(n, d, 32))
    cands = Candidates.of([Query(j) for j in range(d)], [-float(n)] * d)
    res = scan_selection(oracle, 1, 0.1, space=SearchSpace(cands))  # type: ignore[arg-type]
    last_stream, chunk, hit = oracle.log[-1]
    assert hit is not None and chunk[hit][0].index == res.index  # the fine stream's YES
    rounds = plan_scan(oracle.inner, 1, 0.1, d, n).coarse_rounds
    assert all(h is None for s, _, h in oracle.log if s < rounds)  # the search: all NO
    assert res.lower <= oracle.inner.true_scores()[res.index] - n
    # a fine stream silenced (answers NO throughout): the coarse stage's witness,
    # a function of released outputs only, and a stream's YES
    plan = plan_scan(planted_oracle(n, d, 31), 1, 0.1, d, n)
    wrapped = _RecordingOracle(planted_oracle(n, d, 31), mute=plan.stages)
    res2 = scan_selection(wrapped, 1, 0.1, plan=plan)  # type: ignore[arg-type]
    earlier_yes = [c[h][0].index for s, c, h in wrapped.log if s < plan.stages and h is not None]
    assert earlier_yes and res2.index == earlier_yes[-1]  # the middle stream's YES


def test_top_k_default_is_scan_and_uses_the_whole_budget() -> None:
    rng = np.random.default_rng(2)
    n, d, k = 30_000, 200, 3
    counts = rng.binomial(n, rng.uniform(0, 0.1, d))
    counts[[10, 50, 90]] = [n // 2, n // 3, n // 4]
    oracle = LocalOracle.from_sums(counts * GRID, n, 100, seed=3)
    res = apps.top_k_heavy_hitters(oracle, k, 1)
    assert set(res.indices) == {10, 50, 90}
    assert res.spend.epsilon == res.planned_epsilon == 1 == oracle.budget().epsilon_spent
    # one coarse stage for all ranks: far fewer comparisons than k restarts
    plan = plan_scan(oracle, 1, min(1 / d, 0.1), d, n, k=k)
    assert res.spend.streams == plan.stages + k
    assert res.spend.queries_sent <= plan.max_queries()


def test_applications_accept_the_scan_and_paper_variants() -> None:
    n, d = 20_000, 12
    fp = apps.fp_selection(planted_oracle(n, d, 4), 2, 1.0, 1, 0.1, minimize=False)
    assert fp.index == d // 3
    fp8 = apps.fp_selection(
        planted_oracle(n, d, 4), 2, 1.0, 1, 0.1, minimize=False, variant="paper"
    )
    assert fp8.selection.spend.streams != fp.selection.spend.streams
    with pytest.raises(ValueError):
        apps.fp_selection(planted_oracle(n, d, 4), 2, 1.0, 1, 0.1, variant="tuned")


def test_scan_top_k_groups_remove_the_whole_group() -> None:
    # sparse mean's use: both signs of a coordinate are candidates; a pick removes both
    n, d = 20_000, 30
    oracle = planted_oracle(n, d, 12)
    queries = [Query(j, c) for j in range(d) for c in (False, True)]
    groups = [j for j in range(d) for _ in (False, True)]
    signs = SearchSpace(Candidates.of(queries, groups=groups))
    res = scan_top_k(oracle, 5, 1, 0.1, space=signs)
    picked = [queries[p].index for p in res.indices]
    assert len(picked) == 5 and len(set(picked)) == 5
    assert res.spend.epsilon == res.planned_epsilon == 1
    with pytest.raises(ValueError):
        scan_top_k(oracle, 2, 1, 0.1, space=SearchSpace(Candidates.of(queries, groups=[0])))


def test_sparse_mean_scan_default_budget_and_support() -> None:
    rng = np.random.default_rng(8)
    n, d, k = 20_000, 40, 2
    clip = apps.sparse_mean_clip(n, d, 0.1)
    mu = np.zeros(d)
    mu[[5, 17]] = [0.9, -0.9]
    x = rng.normal(mu, 1.0, (n, d))
    oracle = LocalOracle(apps.sparse_mean_embedding(x, clip), 100, seed=9)
    res = apps.sparse_mean(oracle, k, 1, 0.1, clip)
    assert sorted(res.support) == [5, 17]
    assert res.spend.epsilon == res.planned_epsilon == 1 == oracle.budget().epsilon_spent
    assert np.sign(res.mean[5]) == 1 and np.sign(res.mean[17]) == -1
