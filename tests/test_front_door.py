"""The front door holds the CLI's rules, tried from the user's side: the
Python front door (`svtagg.connect`) and the `svtagg` command line against
real leader and helper processes started with the flags the docs give (the
default server requires validated reports).  Each case failed on the code
before the fix; its docstring says how."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ProcessDeployment, running

import svtagg
from svtagg.deploy.cli import main
from svtagg.dp.errors import AlreadyExists, BudgetExhausted, FailedPrecondition, Refusal

D = 12


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessDeployment]:
    with running(tmp_path_factory.mktemp("front")) as d:
        yield d


def _connect(pd: ProcessDeployment) -> Any:
    return svtagg.connect(pd.address("leader"), certs=pd.certs, helper=pd.address("helper"))


def _users(n: int, seed: int = 3) -> list[list[int]]:
    """Category ids, one or two per user, skewed to the low ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        first = int(min(D - 1, rng.geometric(0.3) - 1))
        out.append([first] if rng.random() < 0.7 else sorted({first, int(rng.integers(D))}))
    return out


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _analyst(pd: ProcessDeployment, command: str, *rest: str) -> list[str]:
    return ["analyst", command, "--leader", pd.address("leader"), "--certs", str(pd.certs), *rest]


def _closed_task(pd: ProcessDeployment, task_id: str, epsilon: str, users: int = 300) -> None:
    with _connect(pd) as conn:
        conn.create_task(task_id, d=D, epsilon=epsilon, min_batch=1, embedding="heavy_hitters")
        conn.upload(task_id, _users(users), embedding="heavy_hitters", fmt="categories")
        conn.task(task_id).close_collection()


# ---------------------------------------------------------------- budget
def test_a_top_k_the_budget_cannot_hold_is_refused_before_anything_is_spent(
    pd: ProcessDeployment,
) -> None:
    """Before: top_k(k=3, epsilon=5) with ε = 2 left ran 16 streams, spent
    1.979 of 2 and raised with no answer; the CLI refused the same request."""
    _closed_task(pd, "fd-budget", "2")
    with _connect(pd) as conn:
        task = conn.task("fd-budget")
        with pytest.raises(BudgetExhausted):
            task.top_k(k=3, epsilon=5)
        assert task.budget().exact["epsilon_spent"] == 0
        helper = task.state().helper_budget  # the refusal spent nothing there either
        assert helper is not None and helper.exact["epsilon_spent"] == 0
        top = task.top_k(k=3, epsilon=1, seed=1)
        assert len(top) == 3 and len(set(top)) == 3
        # The whole ε was reserved as one plan, and what the streams did not
        # use came back: never more than asked.
        spent = task.budget().exact["epsilon_spent"]
        assert 0 < spent <= 1
        assert task.plans() == []


def test_top_k_reports_counts_with_intervals_charged_in_the_same_plan(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a top-k answer was ids only."""
    _closed_task(pd, "fd-counts", "4", users=400)
    rc, out, err = _cli(
        capsys,
        *_analyst(pd, "run", "--task", "fd-counts", "--algorithm", "top-k", "--k", "2",
                  "--epsilon", "1", "--counts", "1", "--seed", "2"),
    )  # fmt: skip
    assert rc == 0, err
    result = json.loads(out)
    assert result["exact"]["epsilon"] == "2" and result["counts_epsilon"] == "1"
    assert [c["index"] for c in result["counts"]] == result["selected"]
    for c in result["counts"]:
        assert c["lower"] <= c["estimate"] <= c["upper"] and c["epsilon"] == "1/2"
    assert Fraction(result["exact"]["epsilon_spent"]) <= 2


def test_noisy_max_refuses_k_before_anything_is_reserved(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `noisy-max --k 10` returned one index and ignored --k."""
    _closed_task(pd, "fd-nmax", "2")
    rc, _, err = _cli(
        capsys,
        *_analyst(pd, "run", "--task", "fd-nmax", "--algorithm", "noisy-max", "--k", "10"),
    )
    assert rc == 2 and "noisy-max selects one index" in err, err
    with _connect(pd) as conn:
        assert conn.task("fd-nmax").budget().exact["epsilon_spent"] == 0


def test_a_run_whose_helper_dies_says_what_stays_reserved_and_the_plan_can_be_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: exit 4, the task's spend up by the run's ε, and nothing said
    that ε was spent or how to end the reservation."""
    pd = ProcessDeployment(tmp_path).start()
    try:
        _closed_task(pd, "fd-dies", "4")
        pd.arm("helper", "chunk.after_mark")  # the helper dies at the run's first chunk
        rc, out, err = _cli(
            capsys, *_analyst(pd, "run", "--task", "fd-dies", "--algorithm", "top-k",
                              "--k", "3", "--epsilon", "2"),
        )  # fmt: skip
        assert rc == 4, err
        report = json.loads(out)
        plan = report["plan_id"]
        assert report["plan_state"] == "active" and report["epsilon_reserved"] == "2"
        assert f"end-plan --plan {plan}" in err and "counts as spent" in err
        pd.await_kill("helper")
        pd.restart("helper")
        rc, out, err = _cli(capsys, *_analyst(pd, "plans", "--task", "fd-dies", "--json"))
        assert rc == 0 and [p["plan_id"] for p in json.loads(out)["plans"]] == [plan], err
        rc, out, err = _cli(capsys, *_analyst(pd, "end-plan", "--plan", plan, "--json"))
        assert rc == 0, err
        ended = json.loads(out)
        returned = Fraction(ended["refunded_epsilon"])
        assert ended["state"] == "ended" and 0 < returned < 2
        with _connect(pd) as conn:
            task = conn.task("fd-dies")
            assert task.budget().exact["epsilon_spent"] == 2 - returned
            assert task.plans() == []
            # both ledgers agree
            state = task.state()
            assert state.helper_budget is not None
            assert state.helper_budget.exact["epsilon_spent"] == 2 - returned
    finally:
        pd.stop()


# ---------------------------------------------------------------- dead ends
def test_a_close_below_min_batch_is_refused_saying_what_is_missing(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the close succeeded and the task could never be queried."""
    with _connect(pd) as conn:
        conn.create_task("fd-small", d=D, epsilon=1, min_batch=100, embedding="heavy_hitters")
        conn.upload("fd-small", _users(10), embedding="heavy_hitters", fmt="categories")
        with pytest.raises(FailedPrecondition, match="upload 90 more before closing"):
            conn.task("fd-small").close_collection()
    rc, _, err = _cli(capsys, *_analyst(pd, "close", "--task", "fd-small"))
    assert rc == 1 and "90 more" in err, err
    with _connect(pd) as conn:
        assert conn.task("fd-small").state().collecting


def test_the_python_upload_counts_once(pd: ProcessDeployment) -> None:
    """Before: conn.upload(...) run twice counted every user twice (200 → 400)."""
    users = _users(50, seed=9)
    with _connect(pd) as conn:
        conn.create_task("fd-twice", d=D, epsilon=1, min_batch=1, embedding="heavy_hitters")
        conn.upload("fd-twice", users, embedding="heavy_hitters", fmt="categories")
        with pytest.raises(AlreadyExists, match="already uploaded"):
            conn.upload("fd-twice", users, embedding="heavy_hitters", fmt="categories")
        assert conn.task("fd-twice").state().n == 50
        # other rows are other users; journal=False is the documented opt-out
        conn.upload("fd-twice", users[:5], embedding="heavy_hitters", fmt="categories")
        conn.upload(
            "fd-twice", users[:5], embedding="heavy_hitters", fmt="categories", journal=False
        )
        assert conn.task("fd-twice").state().n == 60


def test_create_task_without_validity_takes_the_default_server(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: create-task without --validity was refused by a default server."""
    rc, out, err = _cli(
        capsys, *_analyst(pd, "create-task", "--task", "fd-default", "--d", "8",
                          "--embedding", "heavy_hitters", "--json"),
    )  # fmt: skip
    assert rc == 0, err
    assert "--validity multihot" in err
    rc, out, err = _cli(
        capsys, *_analyst(pd, "create-task", "--task", "fd-default-v", "--d", "8", "--json")
    )
    assert rc == 0 and "--validity range" in err, err


# ---------------------------------------------------------------- what a user sees
def test_front_door_errors_are_refusals_and_a_wrong_port_is_explained(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a duplicate task id raised a raw grpc._InactiveRpcError; a wrong
    port printed gRPC's 'failed to connect to all addresses'."""
    with _connect(pd) as conn:
        conn.create_task("fd-dup", d=4, epsilon=1)
        with pytest.raises(AlreadyExists):
            conn.create_task("fd-dup", d=4, epsilon=1)
        with pytest.raises(Refusal):
            conn.task("fd-dup").top_k(k=2, epsilon=1)  # still collecting
    host = pd.address("leader").rsplit(":", 1)[0]
    rc, _, err = _cli(capsys, "analyst", "list", "--leader", f"{host}:1", "--certs", str(pd.certs))
    assert rc == 4 and "nothing answers at" in err and "failed to connect" not in err, err


def test_a_run_shows_progress_when_asked(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `analyst run` printed nothing while it ran."""
    _closed_task(pd, "fd-progress", "2")
    rc, out, err = _cli(
        capsys, *_analyst(pd, "run", "--task", "fd-progress", "--k", "2", "--progress")
    )
    assert rc == 0, err
    assert re.search(r"done: +\d+ streams, \d+ queries", err), err
    assert json.loads(out)["selected"]


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SVTAGG_CONFIG", "")
    for var in ("SVTAGG_LEADER", "SVTAGG_HELPER", "SVTAGG_CERTS"):
        monkeypatch.delenv(var, raising=False)
    assert os.environ.get("SVTAGG_STATE_DIR")
