"""Operating a deployment: the leader's health follows the helper, a close with
the helper down closes nothing, describe names the missing ledger, and the
leader's log records task creation, close and spending with task ids."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import grpc

from svtagg.deploy.launch import LocalDeployment
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto.tls import Identity, tls_target


def svtagg(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "svtagg.deploy.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def leader_health(dep: LocalDeployment) -> int:
    ident = Identity.load(dep.certs, "analyst")
    creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
    with grpc.secure_channel(dep.address("leader"), creds, options=tls_target("leader")) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status)


def wait_for(pred: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_helper_outage_seen_by_health_close_and_describe(tmp_path: Path):
    with LocalDeployment(tmp_path / "dep") as dep:
        base = ["--leader", dep.address("leader"), "--certs", str(dep.certs), "--task", "t"]
        r = svtagg(
            "analyst", "create-task", *base, "--d", "4", "--min-batch", "1", "--validity", "none"
        )
        assert r.returncode == 0, r.stderr
        rows = tmp_path / "one.csv"
        rows.write_text("0,1,0,1\n")
        r = svtagg("client", "upload", "--leader", dep.address("leader"), "--helper",
                   dep.address("helper"), "--certs", str(dep.certs), "--task", "t",
                   "--input", str(rows), "--no-require-validation", "--quiet")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert leader_health(dep) == SERVING

        dep.stop_role("helper")
        assert wait_for(lambda: leader_health(dep) == NOT_SERVING), "health ignored the helper"

        start = time.monotonic()
        r = svtagg("analyst", "close", *base)
        assert r.returncode == 4, r.stderr
        assert "helper" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert time.monotonic() - start < 15, "the close waited on the helper too long"

        r = svtagg("analyst", "describe", *base, "--json")
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["state"] == "collecting", "the leader closed its side without the helper"
        assert info["helper_budget"] is None
        text = svtagg("analyst", "describe", *base).stdout
        assert "helper ledger: not available" in text

        dep.start_role("helper")  # waits for SERVING on the helper
        assert wait_for(lambda: leader_health(dep) == SERVING), "health did not recover"
        r = svtagg("analyst", "close", *base, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "closed"

    log = (tmp_path / "dep" / "leader.log").read_text()
    assert "task t: created (d=4" in log
    assert "task t: collection closed on the leader" in log
    assert "task t: both servers agree on n=1" in log
    assert "helper at" in log and "unreachable" in log


def test_helper_kill_is_seen_within_seconds(tmp_path: Path):
    """SIGKILL of the helper: the leader logs it once, its reachability gauge drops
    within seconds, analyst calls that need the helper fail fast and say why (a
    chunk on a stream, a stream open, a task creation), and the recovery is logged
    once too."""
    import numpy as np
    from test_metrics import metrics_port, scrape

    import svtagg as sdk
    from svtagg.dp.errors import PeerUnavailable
    from svtagg.dp.queries import Query

    dep = LocalDeployment(tmp_path / "dep", server_args=["--metrics-listen", "127.0.0.1:0"])
    with dep:
        port = metrics_port(tmp_path / "dep" / "leader.log")

        def reachable() -> float:
            return scrape(port)[("svtagg_helper_reachable", ())]

        log = tmp_path / "dep" / "leader.log"
        values = np.zeros((20, 3))
        values[:10, 0] = 1.0
        with sdk.connect(dep.address("leader"), certs=dep.certs, helper=dep.address("helper")) as c:
            task = c.create_task("k", d=3, epsilon=4, min_batch=1)
            c.upload("k", values, batch=10)
            task.close_collection()
            oracle = task.oracle()
            stream = oracle.open_stream("1/2")
            assert stream.ask([(Query(j), 1000.0) for j in range(3)]) is None
            assert wait_for(lambda: reachable() == 1, 10)
            before = log.read_text()

            dep.procs["helper"].kill()
            dep.procs.pop("helper").wait()
            killed = time.monotonic()
            assert wait_for(lambda: reachable() == 0, 10), "the gauge ignored the helper"
            assert time.monotonic() - killed < 5, "the gauge took too long"

            # Mid-selection: the next chunk on the open stream.
            start = time.monotonic()
            try:
                stream.ask([(Query(j), 1000.0) for j in range(3)])
                raise AssertionError("a chunk was answered without the helper")
            except PeerUnavailable as exc:
                assert "helper unreachable" in str(exc), exc
            assert time.monotonic() - start < 6, "the chunk waited on the helper too long"

            start = time.monotonic()
            try:
                oracle.open_stream("1/2")
                raise AssertionError("a stream opened without the helper")
            except PeerUnavailable as exc:
                assert "helper unreachable" in str(exc), exc
            assert time.monotonic() - start < 6, "the open waited on the helper too long"

        base = ["--leader", dep.address("leader"), "--certs", str(dep.certs)]
        start = time.monotonic()
        r = svtagg("analyst", "create-task", *base, "--task", "t2", "--d", "4", "--min-batch", "1")
        elapsed = time.monotonic() - start
        assert r.returncode == 4, r.stderr
        assert "helper unreachable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert elapsed < 8, f"create-task waited {elapsed:.1f} s on a helper that is down"

        during = log.read_text()[len(before) :]
        assert during.count("unreachable:") >= 1
        transitions = [ln for ln in during.splitlines() if "helper at" in ln]
        assert len(transitions) == 1 and "unreachable" in transitions[0], transitions

        dep.start_role("helper")
        assert wait_for(lambda: reachable() == 1, 10), "the gauge did not recover"
        after = log.read_text()[len(before) :]
        transitions = [ln for ln in after.splitlines() if "helper at" in ln]
        assert len(transitions) == 2 and "reachable again" in transitions[1], transitions
        r = svtagg("analyst", "create-task", *base, "--task", "t3", "--d", "4", "--min-batch", "1")
        assert r.returncode == 0, r.stderr
        # The open refused while the helper was down charged neither ledger.
        with sdk.connect(dep.address("leader"), certs=dep.certs, helper=dep.address("helper")) as c:
            state = c.task("k").state()
        assert state.budget.exact["epsilon_spent"] == Fraction(1, 2)
        assert state.helper_budget is not None
        assert state.helper_budget.exact["epsilon_spent"] == Fraction(1, 2)


def test_leader_refuses_a_helper_of_another_ca(tmp_path: Path):
    """A helper whose certificate another CA issued: the leader does not start (one
    line, exit 3).  A helper that is merely not running yet does not stop it."""
    import socket

    from svtagg.deploy.launch import server_command
    from svtagg.proto.tls import write_deployment

    other = write_deployment(tmp_path / "other-certs")
    with LocalDeployment(tmp_path / "dep") as dep:
        cmd = server_command(
            "leader", tmp_path / "l.sqlite", other, tmp_path / "l.port", dep.address("helper")
        )
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert r.returncode == 3, (r.returncode, r.stderr)
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("svtagg: certificate: the helper at"), r.stderr
        assert "not from this leader's CA" in last, last
        assert "Traceback" not in r.stderr and "WARNING" not in r.stderr, r.stderr
        assert time.monotonic() - start < 20
        assert not (tmp_path / "l.port").exists() and not (tmp_path / "l.sqlite").exists()

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    cmd = server_command(
        "leader", tmp_path / "l2.sqlite", other, tmp_path / "l2.port", f"127.0.0.1:{free}"
    )
    with open(tmp_path / "l2.log", "wb") as out:
        proc = subprocess.Popen(cmd + ["--log-level", "INFO"], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: (tmp_path / "l2.port").exists(), 30), "the leader did not start"
        assert wait_for(lambda: "unreachable" in (tmp_path / "l2.log").read_text(), 10)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(15)
