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
    for name in ("figure1", "queries", "applications"):
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data["experiment"] == name
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    fig1 = json.loads((tmp_path / "figure1.json").read_text())
    assert set(fig1["vs_d"]) == {"alg8", "practical", "alg9", "alg9_tuned", "gaussian", "em"}
    for row in fig1["vs_d"]["practical"]:
        em = fig1["vs_d"]["em"][fig1["vs_d"]["practical"].index(row)]
        if em["mean"] > 0:
            assert row["mean_ratio_to_em"] == pytest.approx(row["mean"] / em["mean"])
        else:
            assert row["mean_ratio_to_em"] == float("inf")
    assert "ratio of mean error" in printed
    assert "1/n²" in fig1["matching"]
    q = json.loads((tmp_path / "queries.json").read_text())
    for row, b in zip(q["rows"]["alg8"], q["bounds"], strict=True):
        assert row["max"] <= b["alg8_bound_d_T"]  # Theorem 6.6: ≤ |P|·T
    for row, b in zip(q["rows"]["alg9"], q["bounds"], strict=True):
        assert row["max"] <= b["alg9_plan_max"]
    for row, b in zip(q["rows"]["practical"], q["bounds"], strict=True):
        assert row["max"] <= b["practical_plan_max"]
    apps_ = json.loads((tmp_path / "applications.json").read_text())
    assert {"svt", "svt_practical", "laplace", "gaussian"} == set(apps_["top_k"])
    assert all(0 <= r["median"] <= 1 for r in apps_["top_k"]["svt_practical"])
