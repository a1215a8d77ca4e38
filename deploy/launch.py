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
    role: str,
    db: Path | str,
    certs: Path,
    port_file: Path,
    helper: str | None = None,
    port: int = 0,
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
    # A local simulation serves both kinds of task: those whose reports prove
    # their validity and those of plain shares (the model-selection demo), so
    # it lifts the default refusal of the latter (`--require-validation`).
    return [*cmd, "--no-require-validation"]


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
    #: Extra arguments for one role's main process only (e.g. {"leader": ["--lease-work"]}).
    role_args: dict[str, list[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    _extra: dict[str, tuple[str, str, list[str]]] = field(default_factory=dict)

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
        helper = self.address("helper") if role == "leader" else None
        # A restarted server keeps its port, so its peer can reconnect.
        cmd = server_command(
            role,
            self.root / f"{role}.sqlite",
            self.certs,
            self.root / f"{role}.port",
            helper,
            self.ports.get(role, 0),
        )
        args = cmd + self.server_args + self.role_args.get(role, [])
        self.ports[role] = self._spawn(role, role, args, env, timeout)

    def start_replica(
        self,
        role: str,
        db: str,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
        helper: str | None = None,
    ) -> str:
        """Start an ingest replica of `role` (`--ingest-only`) on the PostgreSQL
        store `db` of the role's main process; returns its address.  A leader
        replica given `helper` (a helper process's address) verifies proof
        batches with it.  It is stopped with the deployment (or by `stop_role`
        of its name, `<role>-replica-<i>`)."""
        extra = ["--ingest-only"] + (["--helper", helper] if helper else [])
        return self.start_extra(role, db, "replica", extra, env, timeout)

    def start_worker(
        self,
        role: str,
        db: str,
        helper: str | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Start a comparison worker of `role` (`--worker`) on the PostgreSQL store
        `db` of the role's main process; a leader worker pairs with the helper
        process at `helper` (default: the helper's main process).  Named
        `<role>-worker-<i>`; returns its address."""
        extra = ["--worker", *(args or [])]
        if role == "leader":
            extra += ["--helper", helper or self.address("helper")]
        return self.start_extra(role, db, "worker", extra, env, timeout)

    def start_extra(
        self,
        role: str,
        db: str,
        kind: str,
        extra: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Start one more process of `role` on the store `db` with `extra`
        arguments, named `<role>-<kind>-<i>`; its address.  `restart_extra(name)`
        starts it again on the same port."""
        prefix = f"{role}-{kind}"
        name = f"{prefix}-{sum(n.startswith(prefix) for n in self.ports)}"
        self._extra[name] = (role, db, extra)
        return self.restart_extra(name, env, timeout)

    def restart_extra(
        self, name: str, env: dict[str, str] | None = None, timeout: float = 30.0
    ) -> str:
        role, db, extra = self._extra[name]
        cmd = server_command(
            role, db, self.certs, self.root / f"{name}.port", port=self.ports.get(name, 0)
        )
        self.ports[name] = self._spawn(name, role, [*cmd, *extra], env, timeout)
        return self.address(name)

    def _spawn(
        self, name: str, role: str, cmd: list[str], env: dict[str, str] | None, timeout: float
    ) -> int:
        """Run one server process as `name`, wait until it serves; its port."""
        port_file = Path(cmd[cmd.index("--port-file") + 1])
        port_file.unlink(missing_ok=True)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        proc = self.procs[name] = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited; see {self.root / f'{name}.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not start within {timeout}s")
            time.sleep(0.05)
        port = int(port_file.read_text())
        address = f"127.0.0.1:{port}"
        wait_serving(address, Identity.load(self.certs, "analyst"), role, timeout)
        return port

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
        # replicas first, then the leader before the helper
        for name in sorted(self.procs, key=lambda n: (n in ("leader", "helper"), n != "leader")):
            self.stop_role(name)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
