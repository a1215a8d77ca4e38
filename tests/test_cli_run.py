"""`svtagg analyst run` through the real command line and servers: a run that
cannot finish spends nothing (both ledgers, exact), and the output of one that
does reports its own spend, with numbers as numbers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_cli_errors import svtagg

from svtagg.deploy.launch import LocalDeployment

USAGE = 2


@dataclass
class Env:
    dep: LocalDeployment
    root: Path

    def analyst(self, command: str, *argv: str, task: str = "t") -> list[str]:
        leader = self.dep.address("leader")
        return ["analyst", command, "--leader", leader, "--certs", str(self.dep.certs),
                "--task", task, *argv]  # fmt: skip

    def ledgers(self, task: str = "t") -> tuple[Fraction, Fraction]:
        """The exact ε spent on the leader and on the helper (not the rounded display)."""
        r = svtagg(*self.analyst("budget", "--json", task=task))
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        return (
            Fraction(data["leader"]["exact"]["epsilon_spent"]),
            Fraction(data["helper"]["exact"]["epsilon_spent"]),
        )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("run")
    with LocalDeployment(root / "dep") as dep:
        e = Env(dep, root)
        r = svtagg(*e.analyst("create-task", "--d", "6", "--min-batch", "1"))
        assert r.returncode == 0, r.stderr
        rows = (np.random.default_rng(7).random((120, 6)) < np.linspace(0.1, 0.9, 6)).astype(int)
        data = root / "rows.csv"
        np.savetxt(data, rows, fmt="%d", delimiter=",")
        r = svtagg("client", "upload", "--leader", dep.address("leader"), "--helper",
                   dep.address("helper"), "--certs", str(dep.certs), "--task", "t",
                   "--input", str(data), "--quiet", "--no-require-validation")  # fmt: skip
        assert r.returncode == 0, r.stderr
        r = svtagg(*e.analyst("close"))
        assert r.returncode == 0, r.stderr
        yield e


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, f"expected one stderr line: {r.stderr}"
    return lines[0]


# (name, extra arguments, exit code, text the one line must hold, text it must not)
BAD_RUNS = [
    ("unknown kind", ["--k", "2", "--kind", "bogus"], USAGE, "--kind", "ctt"),
    ("ctt on an AboveThreshold algorithm", ["--k", "2", "--kind", "ctt"], USAGE, "--kind", None),
    ("auto on an algorithm without it", ["--algorithm", "gbs", "--kind", "auto"], USAGE,
     "lap24, lap3, exp3", "auto"),
    ("ε below the task's minimum", ["--k", "2", "--epsilon", "1e-10"], USAGE, "epsilon_min",
     None),
    # The total is above the minimum, the scan's first stream (ε/8) below it:
    # only the servers can tell, and the run must still cost nothing.
    ("a stream below the task's minimum", ["--algorithm", "scan", "--epsilon", "1e-9"], 1,
     "epsilon_min", None),
    ("sum without --index", ["--algorithm", "sum"], USAGE, "--index", None),
    ("--index on another algorithm", ["--algorithm", "scan", "--index", "2"], USAGE, "--index",
     None),
    ("β out of range", ["--algorithm", "scan", "--beta", "1.5"], USAGE, "beta", None),
    ("--kind on noisy-max", ["--algorithm", "noisy-max", "--kind", "lap24"], USAGE, "--kind",
     None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "extra", "rc", "says", "never"), BAD_RUNS, ids=[b[0] for b in BAD_RUNS]
)
def test_a_run_that_cannot_finish_spends_nothing(
    env: Env, name: str, extra: list[str], rc: int, says: str, never: str | None
):
    before = env.ledgers()
    r = svtagg(*env.analyst("run", *extra))
    line = _one_line(r)
    assert r.returncode == rc, f"{name}: rc {r.returncode}; {line}"
    assert says.lower() in line.lower(), f"{name}: {says!r} not in {line!r}"
    if never is not None:
        # The message lists only what this run accepts.
        assert never not in line.split(";")[-1], f"{name}: {never!r} offered in {line!r}"
    assert env.ledgers() == before, f"{name}: ε was spent ({before} -> {env.ledgers()})"


def test_the_leader_refuses_an_unusable_plan_without_charge(env: Env):
    """A plan one of whose groups is below the task's smallest stream ε could
    open no stream there: the leader refuses it before reserving anything."""
    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.dp.errors import InvalidArgument

    before = env.ledgers()
    with RemoteOracle.from_certs(env.dep.address("leader"), "t", env.dep.certs) as oracle:
        with pytest.raises(InvalidArgument, match="epsilon_min"):
            oracle.reserve_plan([("1/2", 0), ("1/10000000000", 0)])
    assert env.ledgers() == before


def test_run_reports_its_own_spend_as_numbers(env: Env):
    first = svtagg(*env.analyst("run", "--algorithm", "scan", "--epsilon", "1/2", "--seed", "1"))
    assert first.returncode == 0, first.stderr
    before = env.ledgers()
    r = svtagg(*env.analyst("run", "--algorithm", "scan", "--epsilon", "1/4", "--seed", "2"))
    assert r.returncode == 0, r.stderr
    after = env.ledgers()
    out = json.loads(r.stdout)
    spent = after[0] - before[0]
    assert spent > 0
    # This run's spend, not the task's running total (which the earlier run raised).
    assert Fraction(out["exact"]["epsilon_spent"]) == spent
    assert out["epsilon_spent"] == pytest.approx(float(spent))
    assert Fraction(out["exact"]["task_epsilon_spent"]) == after[0]
    for key in ("epsilon", "epsilon_spent", "delta_spent", "task_epsilon_spent",
                "task_epsilon_left", "task_delta_spent", "task_delta_left"):  # fmt: skip
        assert isinstance(out[key], float), f"{key}: {out[key]!r} is not a number"


def test_noisy_max_runs_through_the_servers(env: Env):
    """The baseline through the command line and the remote oracle: the largest
    count (coordinate 5, 108 of 120 users, 20 above the next) is chosen at
    ε = 4 (noise scale 1/2 per server), and each run costs exactly its ε on both
    ledgers."""
    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.dp.queries import Query

    before = env.ledgers()
    r = svtagg(*env.analyst("run", "--algorithm", "noisy-max", "--epsilon", "4"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["algorithm"] == "noisy-max" and out["selected"] == 5 and out["alpha"] > 0
    assert env.ledgers() == (before[0] + 4, before[1] + 4)
    with RemoteOracle.from_certs(env.dep.address("leader"), "t", env.dep.certs) as oracle:
        assert oracle.noisy_max([Query(0), Query(5), Query(5, complement=True)], "3/2") == 1
        # n − S_0 = 106 against S_3 = 69 (the counts of this seed).
        assert oracle.noisy_max([Query(0, complement=True), Query(3)], "3/2") == 0
        stats = oracle.stats()
        assert stats.streams == 2 and stats.by_kind == {"nmax": 2} and stats.queries == 5
        assert stats.peer_bytes > 0
        with pytest.raises(ValueError, match="out of range"):
            oracle.noisy_max([Query(6)], 1)
        with pytest.raises(ValueError, match="noisy_max"):
            oracle.open_stream(1, "nmax")
    assert env.ledgers() == (before[0] + 7, before[1] + 7)
