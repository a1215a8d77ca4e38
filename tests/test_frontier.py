"""The frontier experiment (`svtagg experiment frontier`): the engine's constants,
the table's columns at a tiny size, and its command line."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

import pytest

from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.experiments.cli import frontier_config, register
from svtagg.experiments.frontier import (
    EngineCosts,
    FrontierConfig,
    comparison_width,
    engine_costs,
    frontier,
)
from svtagg.mpc.circuits import argmax_and_gates
from svtagg.mpc.jointnoise import SamplerShape, and_gates_per_sample

#: Made-up constants, so the cost columns can be checked against them exactly.
COSTS = EngineCosts(40, 64, 41.0, 2000.0, 1e-5, 120.0, 4500.0, 6e-5, 1600.0, 76000.0, 2e-4)


@pytest.mark.parametrize("n_max", [1000, 10**5, 10**7])
@pytest.mark.parametrize("epsilon", [Fraction(1), Fraction(1, 1000)])
def test_width_is_the_servers(n_max: int, epsilon: Fraction) -> None:
    from svtagg.dp.kinds import stream_width as _comparison_width

    for kind in (StreamKind.LAP24, StreamKind.NMAX):
        assert comparison_width(n_max, kind, epsilon) == _comparison_width(n_max, 16, kind, epsilon)


def test_engine_costs_on_a_small_instance() -> None:
    c = engine_costs(10_000, 1.0, k=64)
    assert c.width == 34 and c.instance == 64  # the least w for n_max = 10^4 at ε = 1
    assert c.and_per_candidate * 64 == argmax_and_gates(64, 34)
    assert 30 < c.and_per_query < c.width + 5  # w − 1 ANDs per comparison, plus the chunk logic
    assert c.bytes_per_query > 16 * c.and_per_query  # two 128-bit ciphertexts per AND
    assert c.bytes_per_candidate > 2 * c.bytes_per_query
    assert c.seconds_per_query > 0 and c.seconds_per_candidate > 0
    # one joint ν: the sampler's digit comparisons and the 47-bit re-share (no
    # chunk logic), ≥ 32 B of tables each
    noise = joint_stream_noise(StreamKind.LAP24, Fraction(1), 16)
    shape = SamplerShape(noise.query_constants, noise.query_widths, noise.shift)
    assert c.and_per_sample == and_gates_per_sample(shape)
    assert c.bytes_per_sample > 32 * c.and_per_sample and c.seconds_per_sample > 0


def test_frontier_rows_at_a_tiny_size(tmp_path: Path) -> None:
    cfg = FrontierConfig(n=2000, d=60, epsilon=1.0, runs=3, seed=4)
    res = frontier(tmp_path, cfg, COSTS)
    rows = {r["method"]: r for r in res["rows"]}
    assert list(rows) == [
        "scan_cheap",
        "scan",
        "scan_accurate",
        "scan_joint",
        "scan_central",
        "noisy_max",
        "gaussian",
        "laplace",
        "em",
    ]
    for r in rows.values():
        assert len(r["errors"]) == 3 and min(r["errors"]) >= 0 and r["mean"] >= 0
        assert r["median"] >= 0
        eq = r["epsilon_equivalence"]
        assert eq is None or eq > 0
    em = rows["em"]
    assert em["mean"] == pytest.approx(res["em_mean"])  # its exact expectation
    assert em["epsilon_equivalence"] == pytest.approx(1.0, rel=1e-6)
    for key in ("scan_cheap", "scan", "scan_accurate"):
        r = rows[key]
        cmp = r["comparisons_per_candidate"]
        assert cmp > 1
        assert r["and_per_candidate"] == pytest.approx(cmp * 41.0)
        assert r["bytes_per_candidate"] == pytest.approx(cmp * 2000.0)
        assert r["bytes_total"] == pytest.approx(cmp * 2000.0 * 60)
        assert r["engine_seconds"] == pytest.approx(cmp * 1e-5 * 60)
    # the accurate end sends more comparisons than the cheap end
    assert (
        rows["scan_accurate"]["comparisons_per_candidate"]
        > rows["scan_cheap"]["comparisons_per_candidate"]
    )
    nm = rows["noisy_max"]
    assert nm["comparisons_per_candidate"] is None  # one tournament
    assert (nm["and_per_candidate"], nm["bytes_per_candidate"]) == (120.0, 4500.0)
    assert nm["bytes_total"] == 4500.0 * 60
    joint = rows["scan_joint"]  # the online comparisons plus one sampled ν each
    cmp = joint["comparisons_per_candidate"]
    assert cmp > 1
    assert joint["and_per_candidate"] == pytest.approx(cmp * (41.0 + 1600.0))
    assert joint["bytes_per_candidate"] == pytest.approx(cmp * (2000.0 + 76000.0))
    assert rows["scan_central"]["comparisons_per_candidate"] > 1
    for key in ("gaussian", "laplace", "em", "scan_central"):
        assert "bytes_per_candidate" not in rows[key]
    lines = res["table"].splitlines()
    assert sum(line.startswith("| ") for line in lines) == 1 + 9
    assert "1 tournament" in res["table"]
    saved = json.loads((tmp_path / "frontier.json").read_text())
    assert saved["engine"]["bytes_per_query"] == 2000.0
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_frontier_flags() -> None:
    parser = argparse.ArgumentParser(prog="svtagg")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["experiment", "frontier", "--n", "5000", "--d", "50", "--reps", "7"])
    cfg = frontier_config(args)
    assert (cfg.n, cfg.d, cfg.runs, cfg.epsilon) == (5000, 50, 7, 1.0)
    quick = frontier_config(parser.parse_args(["experiment", "frontier", "--quick"]))
    assert (quick.n, quick.d, quick.runs) == (2000, 100, 4)
    assert frontier_config(parser.parse_args(["experiment", "frontier"])).runs == 100
    with pytest.raises(ValueError, match="one --epsilon"):
        frontier_config(parser.parse_args(["experiment", "frontier", "--epsilon", "1,2"]))
    with pytest.raises(ValueError):
        frontier_config(parser.parse_args(["experiment", "frontier", "--d", "1"]))
