"""Experiments (`svtagg.experiments`): the CLI entry, tiny runs that write JSON and
PNG, helpers, and a clear refusal without matplotlib."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from svtagg.experiments.cli import register, run, words_config
from svtagg.experiments.common import (
    Progress,
    em_equivalent_epsilon,
    em_expected_error,
    planted_scores,
    summarize,
)
from svtagg.experiments.figure1 import FIG1_METHODS
from svtagg.experiments.queries import log_star
from svtagg.experiments.words import word_frequencies, word_scores


def test_helpers() -> None:
    s = summarize([3.0, 1.0, 2.0])
    assert s["median"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0 and s["reps"] == 3
    assert [log_star(x) for x in (1, 2, 4, 16, 65536, 1e5)] == [0, 1, 2, 3, 4, 5]
    scores = planted_scores(10_000, 50, np.random.default_rng(0))
    assert scores.max() == 5000 and (scores == 5000).sum() == 1  # one planted top
    assert scores.min() >= 5000 - 50  # one candidate per score unit below it
    buf = io.StringIO()
    bar = Progress(2, "t", stream=buf)
    bar.tick()
    bar.tick()
    assert "2/2" in buf.getvalue() and buf.getvalue().endswith("\n")


def test_register_adds_experiment_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="svtagg")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["experiment", "queries", "--out", "x", "--reps", "3", "--seed", "9"])
    assert args.handler is run and args.which == "queries" and args.reps == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["experiment", "nonsense"])


def test_quick_run_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(which="all", out=str(tmp_path), reps=1, seed=1, quick=True)
    assert run(args) == 0
    printed = capsys.readouterr().out
    assert "Figure 1" in printed and "exponential mechanism" in printed
    for name in ("figure1", "words", "queries", "applications"):
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data["experiment"] == name
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    fig1 = json.loads((tmp_path / "figure1.json").read_text())
    assert set(fig1["vs_d"]) == set(FIG1_METHODS)
    assert {"scan", "scan_2p", "practical_2p", "alg8_2p"} <= set(fig1["vs_d"])
    assert len(fig1["vs_n"]["em"]) == 3  # the quick run's right panel has several n
    for row in fig1["vs_d"]["practical"]:
        # the ratio is to EM's exact expected error on the same data; never inf
        if row["em_mean"] > 0:
            assert row["mean_ratio_to_em"] == pytest.approx(row["mean"] / row["em_mean"])
        else:
            assert row["mean_ratio_to_em"] is None
    assert "inf" not in fig1["table"]
    assert "ε-equivalence" in printed
    words = json.loads((tmp_path / "words.json").read_text())
    assert {r.get("parties") for r in words["rows"]} == {None, 1, 2}
    for r in words["rows"]:
        if r["method"] not in ("em", "shuffle"):
            assert r["sent_per_candidate"]["mean"] > 0
            eq = r["epsilon_equivalence"]
            assert eq is None or eq > 0
    assert "scan selection" in printed
    assert "1/n²" in fig1["matching"]
    q = json.loads((tmp_path / "queries.json").read_text())
    for row, b in zip(q["rows"]["alg8"], q["bounds"], strict=True):
        assert row["max"] <= b["alg8_bound_d_T"]  # Theorem 6.6: ≤ |P|·T
    for row, b in zip(q["rows"]["alg9"], q["bounds"], strict=True):
        assert row["max"] <= b["alg9_plan_max"]
    for row, b in zip(q["rows"]["practical"], q["bounds"], strict=True):
        assert row["max"] <= b["practical_plan_max"]
    for row, b in zip(q["rows"]["scan"], q["bounds"], strict=True):
        assert row["sent"]["max"] <= b["scan_plan_max"]
    apps_ = json.loads((tmp_path / "applications.json").read_text())
    assert {"svt", "svt_practical", "laplace", "gaussian", "svt_scan"} == set(apps_["top_k"])
    assert {"svt", "svt_alg9", "gaussian"} == set(apps_["sparse_mean"])
    assert {"svt", "svt_adv", "central", "svt_alg8"} == set(apps_["mwem"])
    assert all(0 <= r["median"] <= 1 for r in apps_["top_k"]["svt_practical"])


def test_run_without_matplotlib_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    args = argparse.Namespace(which="queries", out=str(tmp_path), reps=1, seed=1, quick=True)
    assert run(args) == 3  # the command line's exit code for the local environment
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'svtagg[experiments]'" in err[0], err
    assert not any(tmp_path.iterdir())  # refused before anything ran


def test_em_equivalent_epsilon_inverts_the_exact_em_error() -> None:
    scores = np.array([100, 99, 97, 90, 50, 10])
    for eps in (0.1, 0.5, 2.0):
        err = em_expected_error(scores, eps)
        assert em_equivalent_epsilon([scores], err) == pytest.approx(eps, rel=1e-6)
    assert em_equivalent_epsilon([scores], 0.0) == float("inf")
    uniform = float(np.mean(scores.max() - scores))
    assert em_equivalent_epsilon([scores], uniform + 1) == 0.0  # no better than uniform


def test_word_scores_are_counts_of_real_frequencies() -> None:
    pytest.importorskip("wordfreq")
    f = word_frequencies(101, 300)
    assert f.shape == (200,) and (np.diff(f) <= 0).all() and 0 < f.sum() < 1
    sc = word_scores(100_000, f, np.random.default_rng(0))
    assert sc.shape == (200,) and sc.sum() <= 100_000
    assert abs(sc.sum() - 100_000 * f.sum()) < 5 * np.sqrt(100_000 * f.sum())
    with pytest.raises(ValueError):
        word_frequencies(10, 5)


def test_words_flags() -> None:
    parser = argparse.ArgumentParser(prog="svtagg")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["experiment", "words", "--n", "1000,2000", "--epsilon", "0.5", "--window", "11:60"]
    )
    cfg = words_config(args)
    assert cfg.settings == [(1000, 0.5), (2000, 0.5)] and cfg.window == (11, 60)
    assert cfg.parties == (1, 2)
    joint = parser.parse_args(["experiment", "words", "--parties", "1,joint"])
    assert words_config(joint).parties == (1, "joint")
    bad = parser.parse_args(["experiment", "words", "--parties", "3"])
    with pytest.raises(ValueError):
        words_config(bad)


def test_words_with_joint_noise(tmp_path: Path) -> None:
    """The words experiment's joint-noise rows: one draw of the garbled sampler's
    law per term (a joint-noise task), labelled as such on the figure."""
    from svtagg.experiments.words import WordsConfig, plot_label, words

    cfg = WordsConfig(settings=[(5000, 1.0)], window=(101, 160), parties=(1, "joint"))
    res = words(tmp_path, reps=2, seed=1, cfg=cfg)
    joint = [r for r in res["rows"] if r.get("parties") == "joint"]
    assert {r["method"] for r in joint} == {
        "scan",
        "scan_cheap",
        "scan_accurate",
        "practical",
        "alg8",
        "noisy_max",  # one joint draw per candidate
    }
    assert any(r["method"] == "noisy_max" and r["parties"] == 1 for r in res["rows"])
    assert all(len(r["errors"]) == 2 and r["sent_per_candidate"]["mean"] > 0 for r in joint)
    assert plot_label(joint[0]).endswith("joint noise")


def test_noisy_max_experiment(tmp_path: Path) -> None:
    """The noisy-max comparison at a tiny size: one row per method, noisy-max
    sends one tournament where the scan sends many comparisons, its error
    falls as ε grows, and the budget that matches the scan's error is read off
    the curve by log-linear interpolation."""
    from svtagg.experiments.noisy_max import noisy_max_budget, noisy_max_vs_scan, table

    res = noisy_max_vs_scan(n=2000, d=60, runs=4, epsilon=1.0, seed=1)
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"scan", "nmax2", "nmax1"}
    assert rows["nmax2"]["comparisons_per_candidate"] == 1
    assert rows["scan"]["comparisons_per_candidate"] > 10
    assert all(e >= 0 for r in rows.values() for e in r["errors"])
    curve = res["noisy_max_curve"]
    assert curve[0][1] > curve[-1][1]  # ε/16 is far noisier than ε
    assert "report-noisy-max, two servers" in table(res)
    assert noisy_max_budget([(1.0, 8.0), (2.0, 2.0)], 4.0) == pytest.approx(np.sqrt(2))
    assert noisy_max_budget([(1.0, 8.0), (2.0, 2.0)], 1.0) is None
