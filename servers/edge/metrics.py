"""A server's Prometheus metrics: counts and timings in the server's own
registry, served over plain HTTP when the operator asks for it."""

from __future__ import annotations

from typing import Any, Protocol

from svtagg.proto.vocab import Role
from svtagg.servers.store.rules import TaskState


class TaskSource(Protocol):
    """Where a task's ledger is read: the server's core (or, at the start, its store)."""

    def task(self, task_id: str) -> TaskState: ...


class Metrics:
    """Prometheus metrics of one server, in its own registry (several servers may
    share a process in tests).  Counts and timings only: task ids and public
    budget figures, never data, thresholds or shares.  The endpoint is
    unauthenticated, so nothing here depends on an answer (a first-YES index, an
    outcome, whether a chunk closed its stream): chunks and queries are counted
    as the analyst sent them (docs/threat-model.md)."""

    #: Chunk latency buckets (seconds): a chunk takes from milliseconds (small d,
    #: warm pool) to minutes (10^5 queries).
    CHUNK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600)

    def __init__(self, role: Role) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Gauge("svtagg_server_info", "This server's role", ["role"], registry=r)
        self.info.labels(role=role).set(1)
        self.reports = Counter(
            "svtagg_reports_ingested", "Reports stored from client uploads", ["task"], registry=r
        )
        self.rejected = Counter(
            "svtagg_reports_rejected",
            "Reports refused at ingest for a failed validity proof (leader), by reason",
            ["task", "reason"],
            registry=r,
        )
        self.batches = Counter(
            "svtagg_upload_batches", "Upload batches stored", ["task"], registry=r
        )
        self.streams = Counter(
            "svtagg_streams_opened", "SVT streams opened (each charges the ledger)",
            ["task", "kind"], registry=r,
        )  # fmt: skip
        self.queries = Counter(
            "svtagg_queries",
            "Queries in the chunks answered (leader): each chunk's length, whatever its answer",
            ["task"],
            registry=r,
        )
        self.chunks = Counter("svtagg_chunks", "Chunks answered (leader)", ["task"], registry=r)
        self.comparison_paths = Counter(
            "svtagg_comparison_chunks",
            "First-YES and CompareToThresholds chunks run, by the path they took "
            "(garbled or ot; --comparison)",
            ["path"],
            registry=r,
        )
        self.peer_bytes = Counter(
            "svtagg_peer_bytes",
            "Bytes exchanged with the helper by chunk protocols (leader)",
            registry=r,
        )
        self.chunk_seconds = Histogram(
            "svtagg_chunk_seconds",
            "Latency of one Ask/Compare chunk at the leader",
            buckets=self.CHUNK_BUCKETS,
            registry=r,
        )
        self.epsilon_spent = Gauge(
            "svtagg_task_epsilon_spent", "ε spent on this server's ledger", ["task"], registry=r
        )
        self.delta_spent = Gauge(
            "svtagg_task_delta_spent", "δ spent on this server's ledger", ["task"], registry=r
        )
        self.epsilon_total = Gauge(
            "svtagg_task_epsilon_total", "The task's total ε", ["task"], registry=r
        )
        self.refusals = Counter(
            "svtagg_refusals", "Calls refused, by method and status code", ["method", "code"],
            registry=r,
        )  # fmt: skip
        self.jobs = Counter(
            "svtagg_work_jobs",
            "Leased jobs queued by the leader front end, by kind and outcome (done, refused, "
            "lost: the worker died, unclaimed: no worker took it, abandoned: the caller left)",
            ["kind", "outcome"],
            registry=r,
        )
        self.workers_alive = Gauge(
            "svtagg_workers_alive", "Leader workers seen within three leases (front end)",
            registry=r,
        )  # fmt: skip
        self.helper_reachable = Gauge(
            "svtagg_helper_reachable", "1 if the leader's last health probe reached the helper",
            registry=r,
        )  # fmt: skip
        self._http: Any = None

    def budget(self, tasks: TaskSource, task_id: str) -> None:
        """Refresh one task's ledger gauges (on the server's loop)."""
        try:
            b = tasks.task(task_id).budget
        except Exception:  # noqa: BLE001 - an unknown task has no gauges
            return
        self.epsilon_spent.labels(task=task_id).set(float(b.epsilon_spent))
        self.delta_spent.labels(task=task_id).set(float(b.delta_spent))
        self.epsilon_total.labels(task=task_id).set(float(b.epsilon_total))

    def serve(self, address: str) -> int:
        """Serve /metrics over plain HTTP on host:port (port 0: pick one); the port."""
        from prometheus_client import start_http_server

        host, _, port = address.rpartition(":")
        try:
            self._http, _ = start_http_server(
                int(port), host or "127.0.0.1", registry=self.registry
            )
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot serve metrics on {address}: {exc}") from None
        return int(self._http.server_port)

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
