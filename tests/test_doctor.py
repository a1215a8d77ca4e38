"""`svtagg doctor` against a real deployment (leader and helper processes): all
checks pass on a healthy one, and each way of getting it wrong (a wrong port,
certificates of another CA, swapped addresses, a helper that is down) fails
with its exit code and one line saying what is wrong and what to do."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ProcessDeployment, running

from svtagg.deploy.cli import EXIT_ENVIRONMENT, EXIT_UNREACHABLE, EXIT_USAGE, main
from svtagg.proto import health_pb2


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the command line names the deployment (no SVTAGG_* or config file)."""
    for var in ("SVTAGG_LEADER", "SVTAGG_HELPER", "SVTAGG_CERTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SVTAGG_CONFIG", "")


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessDeployment]:
    with running(tmp_path_factory.mktemp("doctor")) as d:
        yield d


def doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, str]]:
    """Run `svtagg doctor ARGV`; its exit code and its lines by check name."""
    rc = main(["doctor", *argv])
    out = capsys.readouterr().out
    lines = {}
    for line in out.splitlines():
        status, _, rest = line.partition(" ")
        assert status in ("ok", "warn", "FAIL", "skip", "n/a"), line
        names = ("leader -> helper", "leader", "helper", "certificates", "clock skew")
        lines[next(n for n in names if rest.lstrip().startswith(n))] = line
    return rc, lines


def test_a_healthy_deployment_passes(pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]):
    args = ["--leader", pd.address("leader"), "--helper", pd.address("helper")]
    rc, lines = doctor(capsys, *args, "--certs", str(pd.certs))
    assert rc == 0, lines
    assert set(lines) == {"certificates", "leader", "helper", "leader -> helper", "clock skew"}
    for name in ("certificates", "leader", "helper", "leader -> helper"):
        assert lines[name].startswith("ok "), lines[name]
    assert "leader certificate from your CA" in lines["leader"]
    assert "analyst API answers" in lines["leader"] and "Health SERVING" in lines["leader"]
    assert "as client" in lines["helper"] and "Ingest answers" in lines["helper"]
    assert "reaches its helper" in lines["leader -> helper"]
    assert lines["clock skew"] == (
        "n/a  clock skew: not measurable from the client (servers expose no time)"
    )

    rc = main(["doctor", *args, "--certs", str(pd.certs), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"] and report["exit_code"] == 0
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["leader"]["address"] == pd.address("leader")
    assert checks["leader"]["figures"]["rtt_ms"] > 0
    assert 300 < checks["helper"]["figures"]["days_left"] <= 365
    assert 300 < min(checks["certificates"]["figures"]["days_left"].values())


def test_a_wrong_port_says_nothing_answers(
    pd: ProcessDeployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        wrong = f"127.0.0.1:{s.getsockname()[1]}"
    rc, lines = doctor(capsys, "--leader", wrong, "--certs", str(pd.certs))
    assert rc == EXIT_UNREACHABLE
    assert lines["leader"].startswith("FAIL ")
    assert f"nothing answers at {wrong}" in lines["leader"]
    assert "is the leader's address right" in lines["leader"]
    assert lines["leader -> helper"].startswith("skip ")


def test_certificates_of_another_ca_fail_the_handshake(
    pd: ProcessDeployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    other = tmp_path / "other"
    assert main(["certs", "--out", str(other)]) == 0
    capsys.readouterr()
    args = ["--leader", pd.address("leader"), "--helper", pd.address("helper")]
    rc, lines = doctor(capsys, *args, "--certs", str(other))
    assert rc == EXIT_UNREACHABLE
    assert lines["certificates"].startswith("ok "), "the directory itself is consistent"
    for role in ("leader", "helper"):
        assert lines[role].startswith("FAIL ")
        assert (
            "TLS handshake failed: the server's certificate was not issued by the CA"
            in (lines[role])
        )
        assert f"it presents a {role} certificate of another CA" in lines[role]
        assert "use the certificates of this deployment's CA" in lines[role]


def test_swapped_addresses_name_the_server_found(
    pd: ProcessDeployment, capsys: pytest.CaptureFixture[str]
):
    args = ["--leader", pd.address("helper"), "--helper", pd.address("leader")]
    rc, lines = doctor(capsys, *args, "--certs", str(pd.certs))
    assert rc == EXIT_UNREACHABLE
    assert "it presents a helper certificate" in lines["leader"]
    assert "It is the helper's" in lines["leader"]
    assert "it presents a leader certificate" in lines["helper"]


def test_certificate_problems_are_the_environment(
    pd: ProcessDeployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    leader = pd.address("leader")
    assert main(["doctor", "--leader", leader]) == EXIT_USAGE
    assert "needs --certs" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, lines = doctor(capsys, "--leader", leader, "--certs", str(empty))
    assert rc == EXIT_ENVIRONMENT
    assert lines["certificates"].startswith("FAIL ") and "no ca.pem" in lines["certificates"]
    assert lines["leader"].startswith("skip ")
    # --local: this installation's check, whatever the deployment options say.
    assert main(["doctor", "--local", "--k", "50", "--leader", leader]) == 0
    assert "comparison engine" in capsys.readouterr().out


def test_a_stopped_helper_fails_the_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    d = ProcessDeployment(tmp_path).start()
    try:
        d.dep.stop_role("helper")
        health = d.stub("analyst", "Health")
        deadline = time.monotonic() + 20
        # The leader probes its helper about once a second.
        while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != (
            health_pb2.HealthCheckResponse.NOT_SERVING
        ):
            assert time.monotonic() < deadline, "the leader never noticed its helper stop"
            time.sleep(0.1)
        args = ["--leader", d.address("leader"), "--helper", d.address("helper")]
        rc, lines = doctor(capsys, *args, "--certs", str(d.certs))
        assert rc == EXIT_UNREACHABLE
        assert lines["leader"].startswith("warn ") and "Health NOT_SERVING" in lines["leader"]
        assert lines["helper"].startswith("FAIL ") and "nothing answers" in lines["helper"]
        link = lines["leader -> helper"]
        assert link.startswith("FAIL ") and "the helper is unreachable from the leader" in link
        # Without --helper the link check still names the cause.
        rc, lines = doctor(capsys, "--leader", d.address("leader"), "--certs", str(d.certs))
        assert rc == EXIT_UNREACHABLE
        assert "the helper is unreachable from the leader" in lines["leader -> helper"]
    finally:
        d.stop()
