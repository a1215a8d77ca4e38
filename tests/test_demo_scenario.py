"""The model-selection demo scenario: its data, its Laplace baseline, and the point
it makes (SVT selection beats both aggregation baselines when r = d)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from svtagg.analyst import baselines
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import scan_selection
from svtagg.deploy import jobs
from svtagg.deploy.algorithms import RunFlags, run_algorithm
from svtagg.deploy.workloads import laplace_argmax, model_selection
from svtagg.dp.errors import BudgetExhausted


def test_model_selection_data_touches_every_candidate() -> None:
    v = model_selection(500, 40, seed=3)
    assert v.shape == (500, 40) and v.min() >= 0.0 and v.max() <= 1.0
    assert (v > 0).mean() > 0.9  # a record touches (almost) every candidate: r = d
    assert np.array_equal(v, model_selection(500, 40, seed=3))  # seeded


def test_laplace_argmax_scale() -> None:
    sums = np.zeros(5000)
    sums[7] = 1e6
    assert laplace_argmax(sums, 1.0, 10.0, seed=1) == 7  # a gap of 10⁶ ≫ 10/ε
    picks = {laplace_argmax(np.zeros(50), 1.0, 10.0, seed=s) for s in range(40)}
    assert len(picks) > 10  # ties broken by the noise, not by position


def test_svt_beats_aggregation_baselines_when_records_are_dense() -> None:
    # Not a privacy property: the scenario's point, with a wide margin.  At n = 3000,
    # d = 200, ε = 1: the Gaussian baseline's noise σ ≈ √d·√(2 ln(1.25n²))/ε ≈ 80
    # and Laplace's scale d/ε = 200 dwarf the score gaps; SVT's error is O(log d/ε).
    n, d, eps = 3000, 200, 1.0
    err: dict[str, list[float]] = {"svt": [], "gauss": [], "laplace": []}
    for seed in range(4):
        v = model_selection(n, d, seed)
        truth = v.sum(axis=0)
        best = truth.max()
        j = scan_selection(LocalOracle(v, 10, parties=2, seed=seed), eps, 0.05).index
        err["svt"].append(best - truth[j])
        err["gauss"].append(best - truth[baselines.gaussian_selection(truth, eps, 1 / n**2, seed)])
        err["laplace"].append(best - truth[laplace_argmax(truth, eps, float(d), seed)])
    means = {k: float(np.mean(x)) for k, x in err.items()}
    assert means["svt"] * 3 < means["gauss"] < means["laplace"], means


def test_demo_parser_defaults_to_model_selection() -> None:
    parser = argparse.ArgumentParser(prog="svtagg")
    jobs.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo"])
    assert args.scenario == "model-selection"
    assert parser.parse_args(["demo", "--scenario", "heavy-hitters"]).scenario == "heavy-hitters"
    assert "scan" in jobs.ALGORITHMS


def test_run_algorithm_scan_with_shares_on_a_local_oracle() -> None:
    from svtagg.analyst.selection import ScanOptions, plan_scan

    v = model_selection(2000, 30, seed=5)
    truth = v.sum(axis=0)
    oracle = LocalOracle(v, 10, parties=2, seed=5)
    out = run_algorithm(oracle, RunFlags("scan", "1", shares="1/2,0"))
    cheap = ScanOptions(coarse_fraction="1/2", mid_fraction=0)
    plan = plan_scan(oracle, 1, 0.05, 30, 2000.0, options=cheap)
    assert oracle.stats().streams == plan.coarse_rounds + 1  # the shares were used
    assert truth.max() - truth[out["selected"]] <= plan.error_bound()  # seeded run
    top = run_algorithm(oracle, RunFlags("top-k", "1", k=3, shares="1/4,1/8"))
    assert len(top["selected"]) == 3
    with pytest.raises(ValueError):
        run_algorithm(oracle, RunFlags("gbs", "1", shares="1/2,0"))


def test_selection_table_rows() -> None:
    truth = np.array([10.0, 40.0, 25.5])
    lines = jobs.selection_table(
        truth,
        [
            ("through the servers", 2, 1_234_567, 0.84),
            ("simulated", 1, None, None),
        ],
    )
    assert lines[0].split()[-2:] == ["servers", "s"]
    served, simulated = lines[1].split(), lines[2].split()
    assert served[-5:] == ["2", "25.5", "14.5", "1.23", "0.8"]  # error = 40 − 25.5
    assert simulated[-5:] == ["1", "40.0", "0.0", "—", "—"]


def test_demo_noisy_max_row_runs_on_a_local_oracle() -> None:
    # The demo's second run through the servers, on the local two-party oracle:
    # noisy-max on the model-selection data picks a near-best candidate and is
    # charged ε, so a task of 2ε holds the scan and the noisy-max runs.
    v = model_selection(2000, 30, seed=2)
    truth = v.sum(axis=0)
    oracle = LocalOracle(v, 2, parties=2, seed=2)
    scan = run_algorithm(oracle, RunFlags("scan", "1"))
    nm = run_algorithm(oracle, RunFlags("noisy-max", "1"))
    assert nm["algorithm"] == "noisy-max" and 0 <= nm["selected"] < 30
    assert truth.max() - truth[nm["selected"]] <= nm["alpha"]  # seeded run, w.p. ≥ 1 − β
    assert truth.max() - truth[scan["selected"]] >= 0
    with pytest.raises(BudgetExhausted):  # the budget is spent
        run_algorithm(oracle, RunFlags("noisy-max", "1"))


def test_demo_local_scan_rows_include_joint_noise() -> None:
    """The demo's local rows: the scan at its three settings on the two-party
    oracle and on a simulated joint-noise task, each a candidate index."""
    v = model_selection(2000, 30, seed=4)
    rows = jobs._local_scan_rows(v, "2", 4)
    assert [r[0] for r in rows] == [label for label, _, _ in jobs.LOCAL_SCANS]
    assert any("joint noise" in label for label, _, _ in jobs.LOCAL_SCANS)
    truth = v.sum(axis=0)
    for _, j, sent, seconds in rows:
        assert 0 <= j < 30 and sent is None and seconds is None
        assert truth.max() - truth[j] < 0.1 * truth.max()  # near the best at ε = 2


def test_the_strings_demo_finds_the_heavy_words_and_refuses_forged_reports(capsys) -> None:  # type: ignore[no-untyped-def]
    """`svtagg demo --scenario strings`: the generated text's top words come
    back as strings from a leader and a helper process, the forged reports (a
    count of 10^6 each) are refused by the first level's check at ingest, and
    the whole ε is spent over the levels, on the leader's ledger."""
    from svtagg.deploy.cli import main

    code = main(
        ["demo", "--scenario", "strings", "--users", "3000", "--k", "2", "--epsilon", "8",
         "--malicious", "2"]
    )  # fmt: skip
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert code == 0
    assert "2/2 of the true top-2" in out
    # Through the two server processes: the forged reports are refused at
    # ingest (the first level's check), the walk's own checks refuse none.
    assert "refused {'invalid_proof': 2}" in err
    assert "n = 3,000" in err
    assert "refused by the walk's checks: 0" in out
    assert "ε spent 8 over 8 levels (the leader's ledger: 8 of 8)" in out


def test_the_word_corpus_is_seeded_and_short() -> None:
    from svtagg.deploy.workloads import word_corpus

    words = word_corpus(2000, 300, 1.1, seed=5)
    assert words == word_corpus(2000, 300, 1.1, seed=5)
    assert len(set(words)) > 100 and all(1 <= len(w.encode()) <= 8 for w in words)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epsilon", "abc"], "positive number"),
        (["--epsilon", "-1"], "must be positive"),
        (["--users", "0"], "at least 1"),
        (["--k", "0"], "at least 1"),
    ],
)
def test_the_strings_demo_refuses_bad_flags_by_name(capsys, flags, message) -> None:  # type: ignore[no-untyped-def]
    from svtagg.deploy.cli import main

    assert main(["demo", "--scenario", "strings", *flags]) == 2
    assert message in capsys.readouterr().err
