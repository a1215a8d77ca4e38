"""Operating a deployment: the leader's health follows the helper, a close with
the helper down closes nothing, describe names the missing ledger, and the
leader's log records task creation, close and spending with task ids."""

from __future__ import annotations

import json
import subprocess
import sys
import time
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
        r = svtagg("analyst", "create-task", *base, "--d", "4", "--min-batch", "1")
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
    assert "task t: both servers agree on n=0" in log
    assert "helper at" in log and "unreachable" in log
