"""Leader and helper as separate processes, driven through the CLI: create,
upload, restart both servers (SIGTERM, graceful), close, run a selection."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np

from svtagg.benchmarks.storeview import store_view
from svtagg.client.upload import Uploader
from svtagg.deploy.cli import main
from svtagg.deploy.launch import LocalDeployment
from svtagg.proto.tls import Identity


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


def _cli_err(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(list(argv))
    return rc, err.getvalue()


def test_processes_end_to_end_with_restart(tmp_path: Path):
    dep = LocalDeployment(tmp_path)
    dep.start()
    try:
        common = ["--certs", str(dep.certs), "--task", "hh"]
        rc, out = _cli(
            "analyst",
            "create-task",
            "--leader",
            dep.address("leader"),
            *common,
            "--d",
            "50",
            "--min-batch",
            "10",
            "--epsilon",
            "3",
        )
        assert rc == 0, out
        values = np.zeros((3000, 50))
        values[:, 7] = 1.0
        values[:1000, 11] = 1.0
        c = Identity.load(dep.certs, "client")
        with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
            assert up.upload("hh", values, batch_size=500).reports == 3000
        for role in ("leader", "helper"):
            assert dep.stop_role(role) == 0  # graceful SIGTERM shutdown
        dep.start()  # same stores, new ports
        leader = ["--leader", dep.address("leader"), *common]
        rc, out = _cli("analyst", "close", *leader)
        assert rc == 0 and "n=3000" in out and "closed" in out, out
        rc, out = _cli(
            "analyst",
            "run",
            *leader,
            "--algorithm",
            "top-k",
            "--k",
            "2",
            "--epsilon",
            "2",
            "--seed",
            "1",
        )
        assert rc == 0, out
        result = json.loads(out)
        assert result["selected"] == [7, 11]
        assert result["exact"]["epsilon_spent"] == "2" and result["queries"] > 0
        # The helper alone restarts: the leader drops its dead sessions and goes on.
        assert dep.stop_role("helper") == 0
        dep.start_role("helper")
        rc, out = _cli(
            "analyst", "run", *leader, "--algorithm", "sum", "--index", "11", "--epsilon", "1/2"
        )
        assert rc == 0, out
        assert abs(json.loads(out)["estimate"] - 1000) < 600  # Cor 6.8 at ε = 1/2: coarse
        rc, out = _cli("analyst", "describe", *leader)
        assert "leader ledger: ε 2.5 of 3 spent" in out, out
        assert "helper ledger: ε 2.5 of 3 spent" in out, out
        rc, out = _cli("analyst", "describe", *leader, "--json")
        described = json.loads(out)
        assert described["budget"]["exact"]["epsilon_spent"] == "5/2"
        assert described["helper_budget"]["exact"]["epsilon_spent"] == "5/2"
        # Requests that cannot finish spend nothing: more ε than is left (1/2),
        # and an index out of range, each end with one line and rc != 0.
        before = [store_view(tmp_path / f"{r}.sqlite", "hh") for r in ("leader", "helper")]
        for bad in (
            ["--algorithm", "sum", "--index", "11", "--epsilon", "1"],
            ["--algorithm", "sum", "--index", "50", "--epsilon", "1/4"],
        ):
            rc, err = _cli_err("analyst", "run", *leader, *bad)
            assert rc != 0 and len(err.strip().splitlines()) == 1, err
        after = [store_view(tmp_path / f"{r}.sqlite", "hh") for r in ("leader", "helper")]
        for b, a in zip(before, after, strict=True):
            assert (a.epsilon_spent, a.delta_spent, a.streams) == (
                b.epsilon_spent,
                b.delta_spent,
                b.streams,
            )
    finally:
        dep.stop()


def test_kill_mid_chunk_fails_the_stream_closed(tmp_path: Path):
    """The helper dies (as with kill -9) right after its durable in_chunk mark: the
    analyst gets an error, never a bit, and after restarts the stream never
    answers again; the ledgers keep the charge."""
    import os

    import pytest

    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.dp.errors import Refusal, StreamClosed
    from svtagg.dp.queries import Query

    dep = LocalDeployment(tmp_path)
    dep.start()
    try:
        rc, out = _cli(
            "analyst",
            "create-task",
            "--leader",
            dep.address("leader"),
            "--certs",
            str(dep.certs),
            "--task",
            "k",
            "--d",
            "4",
            "--min-batch",
            "1",
        )
        assert rc == 0, out
        c = Identity.load(dep.certs, "client")
        with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
            up.upload("k", np.ones((20, 4)))
        _cli(
            "analyst",
            "close",
            "--leader",
            dep.address("leader"),
            "--certs",
            str(dep.certs),
            "--task",
            "k",
        )
        dep.stop_role("helper")
        os.environ["SVTAGG_CRASH_AT"] = "chunk.after_mark"
        try:
            dep.start_role("helper")
        finally:
            del os.environ["SVTAGG_CRASH_AT"]
        with RemoteOracle.from_certs(dep.address("leader"), "k", dep.certs) as o:
            s = o.open_stream(1)
            with pytest.raises(Refusal):
                s.ask([(Query(0), 1000)])
            assert dep.procs["helper"].wait(10) == -9  # SIGKILL
            dep.procs.pop("helper")
            dep.start_role("helper")
            with pytest.raises(StreamClosed):
                s.ask([(Query(0), 1000)])
            assert o.open_stream(1).ask([(Query(0), 1000)]) is None  # others still work
            b = o.budget()
        assert b.epsilon_spent == 2
    finally:
        dep.stop()
