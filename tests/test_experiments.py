"""Experiments: the CLI entry, tiny runs that write JSON and PNG, helpers."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pytest

from svtagg.analyst import experiments as ex


def test_helpers() -> None:
    s = ex.summarize([3.0, 1.0, 2.0])
    assert s["median"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0 and s["reps"] == 3
    assert [ex.log_star(x) for x in (1, 2, 4, 16, 65536, 1e5)] == [0, 1, 2, 3, 4, 5]
    scores = ex.planted_scores(10_000, 50, np.random.default_rng(0))
    assert scores.max() == 5000 and (scores == 5000).sum() == 1  # one planted top
    assert scores.min() >= 5000 - 50  # one candidate per score unit below it
    buf = io.StringIO()
    bar = ex.Progress(2, "t", stream=buf)
    bar.tick()
    bar.tick()
    assert "2/2" in buf.getvalue() and buf.getvalue().endswith("\n")


def test_register_adds_experiment_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="svtagg")
    ex.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["experiment", "queries", "--out", "x", "--reps", "3", "--seed", "9"])
    assert args.handler is ex.run and args.which == "queries" and args.reps == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["experiment", "nonsense"])


def test_quick_run_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(which="all", out=str(tmp_path), reps=1, seed=1, quick=True)
    assert ex.run(args) == 0
    printed = capsys.readouterr().out
    assert "Figure 1" in printed and "exponential mechanism" in printed
    for name in ("figure1", "words", "queries", "applications"):
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data["experiment"] == name
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    fig1 = json.loads((tmp_path / "figure1.json").read_text())
    assert set(fig1["vs_d"]) == set(ex.FIG1_METHODS)
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


def test_em_equivalent_epsilon_inverts_the_exact_em_error() -> None:
    scores = np.array([100, 99, 97, 90, 50, 10])
    for eps in (0.1, 0.5, 2.0):
        err = ex.em_expected_error(scores, eps)
        assert ex.em_equivalent_epsilon([scores], err) == pytest.approx(eps, rel=1e-6)
    assert ex.em_equivalent_epsilon([scores], 0.0) == float("inf")
    uniform = float(np.mean(scores.max() - scores))
    assert ex.em_equivalent_epsilon([scores], uniform + 1) == 0.0  # no better than uniform


def test_word_scores_are_counts_of_real_frequencies() -> None:
    pytest.importorskip("wordfreq")
    f = ex.word_frequencies(101, 300)
    assert f.shape == (200,) and (np.diff(f) <= 0).all() and 0 < f.sum() < 1
    sc = ex.word_scores(100_000, f, np.random.default_rng(0))
    assert sc.shape == (200,) and sc.sum() <= 100_000
    assert abs(sc.sum() - 100_000 * f.sum()) < 5 * np.sqrt(100_000 * f.sum())
    with pytest.raises(ValueError):
        ex.word_frequencies(10, 5)


def test_words_flags() -> None:
    parser = argparse.ArgumentParser(prog="svtagg")
    ex.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["experiment", "words", "--n", "1000,2000", "--epsilon", "0.5", "--window", "11:60"]
    )
    cfg = ex.words_config(args)
    assert cfg.settings == [(1000, 0.5), (2000, 0.5)] and cfg.window == (11, 60)
    assert cfg.parties == (1, 2)
    bad = parser.parse_args(["experiment", "words", "--parties", "3"])
    with pytest.raises(ValueError):
        ex.words_config(bad)
