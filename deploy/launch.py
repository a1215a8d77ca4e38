"""Start a leader and a helper as separate processes on this machine (demo, sim,
benchmarks, subprocess tests): throwaway certificates, temporary SQLite stores,
ports chosen by the OS and reported through port files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto.tls import Identity, tls_target, write_deployment

#: Server arguments that lift the default budget caps, for test and benchmark
#: deployments whose tasks use huge budgets so that no stream is ever refused.
UNCAPPED_SERVER_ARGS = ["--max-epsilon-total", "none", "--max-delta-total", "none"]


def server_command(
    role: str, db: Path, certs: Path, port_file: Path, helper: str | None = None, port: int = 0
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "svtagg.deploy.cli",
        "server",
        "--role",
        role,
        "--db",
        str(db),
        "--certs",
        str(certs),
        "--listen",
        f"127.0.0.1:{port}",
        "--port-file",
        str(port_file),
    ]
    if helper:
        cmd += ["--helper", helper]
    return cmd


def wait_serving(address: str, identity: Identity, role: str, timeout: float = 30.0) -> None:
    """Block until the `role` server's health service answers SERVING."""
    creds = grpc.ssl_channel_credentials(identity.ca, identity.key, identity.cert)
    deadline = time.monotonic() + timeout
    with grpc.secure_channel(address, creds, options=tls_target(role)) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)


@dataclass
class LocalDeployment:
    """Leader + helper subprocesses; use as a context manager."""

    workdir: Path | None = None
    log_to: Path | None = None
    #: Extra `svtagg server` arguments (e.g. ["--log-level", "DEBUG"]) for both roles.
    server_args: list[str] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    def __post_init__(self) -> None:
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="svtagg-")
            self.workdir = Path(self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not (self.certs / "ca.pem").exists():
            write_deployment(self.certs)

    @property
    def root(self) -> Path:
        assert self.workdir is not None
        return self.workdir

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    def address(self, role: str) -> str:
        return f"127.0.0.1:{self.ports[role]}"

    def start_role(
        self, role: str, timeout: float = 30.0, env: dict[str, str] | None = None
    ) -> None:
        """Start `role` (again, on its previous port and store); `env` adds
        environment variables, e.g. SVTAGG_CRASH_AT for fault injection."""
        port_file = self.root / f"{role}.port"
        port_file.unlink(missing_ok=True)
        helper = self.address("helper") if role == "leader" else None
        log = open(self.root / f"{role}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[role] = subprocess.Popen(
            # A restarted server keeps its port, so its peer can reconnect.
            server_command(
                role,
                self.root / f"{role}.sqlite",
                self.certs,
                port_file,
                helper,
                self.ports.get(role, 0),
            )
            + self.server_args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.procs[role].poll() is not None:
                raise RuntimeError(f"{role} exited; see {self.root / f'{role}.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{role} did not start within {timeout}s")
            time.sleep(0.05)
        self.ports[role] = int(port_file.read_text())
        wait_serving(self.address(role), Identity.load(self.certs, "analyst"), role, timeout)

    def start(self) -> LocalDeployment:
        self.start_role("helper")
        self.start_role("leader")
        return self

    def stop_role(self, role: str, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        proc = self.procs.pop(role)
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return int(proc.returncode)

    def stop(self) -> None:
        for role in ("leader", "helper"):
            if role in self.procs:
                self.stop_role(role)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
