"""The gRPC edge of a server: wire types in, driver calls, status codes out.

One process serves one role.  Both roles serve Ingest and Health; the leader
serves the Analyst API (`servers.leader.LeaderDriver`) and drives the helper's
Peer service (`servers.helper.HelperDriver`).  Every RPC first checks the role
in the caller's (CA-verified) certificate and the caller's rate limit, then maps
refusals to status codes with `svtagg.proto.vocab`'s one table.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeAlias, TypeVar

import grpc

from svtagg.dp.errors import InvalidArgument, RateLimited
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import CertificateError, Identity, role_of_pem
from svtagg.proto.vocab import (
    REFUSAL_KEY,
    SERVER_OPTIONS,
    SERVER_ROLES,
    Role,
    kind_from_pb,
    status_of,
)
from svtagg.proto.wire import UNDECODABLE, add_service
from svtagg.servers.core import PartyFactory, ServerCore, garbled_circuit_party
from svtagg.servers.datachannel import DataListener, split_host
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.limits import RateLimiter
from svtagg.servers.mainlock import hold_main_lock
from svtagg.servers.messages import task_info
from svtagg.servers.peer import GrpcHelperPort
from svtagg.servers.store import Store
from svtagg.servers.store_open import open_store, sqlite_file
from svtagg.servers.work import LEASE_SECONDS, Worker, WorkQueue

log = logging.getLogger("svtagg.server")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Stands for "no client certificate", possible only on the optional
#: server-only-TLS ingest port (the main port's handshake demands a certificate).
ANONYMOUS = ""


def request_ref(request: Any) -> str:
    """The task / stream / plan a request names, for log lines ('' if none).
    Identifiers only: never values, thresholds or shares."""
    parts = []
    for attr in ("task_id", "stream_id", "plan_id"):
        value = getattr(request, attr, "")
        if isinstance(value, str) and value:
            parts.append(f"{attr.removesuffix('_id')}={value[:64]!r}")
    return " ".join(parts)


async def _abort(
    context: grpc.aio.ServicerContext,
    exc: BaseException,
    method: str,
    request: Any = None,
    metrics: Metrics | None = None,
) -> None:
    found = status_of(exc)
    ref = request_ref(request)
    if found is None:
        log.exception("internal error in %s %s", method, ref)
        await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
        return
    code, name = found
    if metrics is not None:
        metrics.refusals.labels(method=method, code=code.name).inc()
    # The method, the ids it names and the code: messages may name parameters, never data.
    log.info("%s %s refused: %s (%s)", method, ref or "-", code.name, name)
    await context.abort(code, str(exc), trailing_metadata=((REFUSAL_KEY, name),))


def rpc(*roles: str) -> Callable[[F], F]:
    """Allow only callers whose certificate has one of `roles` (ANONYMOUS: none at
    all) and within their rate limit; map refusals to statuses."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            caller = peer_role(context) or ANONYMOUS
            if caller not in roles:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"{method.__name__} needs a certificate of role "
                    f"{' or '.join(r or 'none' for r in roles)}; "
                    f"caller presented {caller or 'none'}",
                )
            try:
                if request is UNDECODABLE:
                    raise InvalidArgument(
                        f"{method.__name__}: the request does not parse as its protobuf message"
                    )
                limiter: RateLimiter | None = getattr(self, "limiter", None)
                # The leader (the only holder of the leader certificate) drives the
                # helper at protocol speed; every other caller is rate limited.
                if (
                    limiter is not None
                    and caller != Role.LEADER
                    and not limiter.allow(caller_identity(context))
                ):
                    raise RateLimited(
                        f"rate limit: at most {limiter.rate:g} requests/s "
                        f"(bursts of {limiter.burst:g}) per caller; retry later"
                    )
                return await method(self, request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - every refusal becomes a status
                await _abort(context, exc, method.__name__, request, getattr(self, "metrics", None))
                raise

        return handler  # type: ignore[return-value]

    return wrap


def caller_identity(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for rate limits: the certificate's hash, else the address."""
    certs = context.auth_context().get("x509_pem_cert")
    if certs:
        return "cert:" + hashlib.sha256(certs[0]).hexdigest()
    peer = context.peer() or ""
    return "addr:" + peer.rsplit(":", 1)[0]


def peer_role(context: grpc.aio.ServicerContext) -> Role | None:
    certs = context.auth_context().get("x509_pem_cert")
    return role_of_pem(certs[0]) if certs else None


#: The servicer context every handler receives.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


# ---------------------------------------------------------------- metrics
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

    def __init__(self, role: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Gauge("svtagg_server_info", "This server's role", ["role"], registry=r)
        self.info.labels(role=role).set(1)
        self.reports = Counter(
            "svtagg_reports_ingested", "Reports stored from client uploads", ["task"], registry=r
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

    def budget(self, store: Store, task_id: str) -> None:
        """Refresh one task's ledger gauges from the store (on the server's loop)."""
        try:
            b = store.task(task_id).budget
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


# ---------------------------------------------------------------- services
class IngestService(pb_grpc.IngestServicer):
    limiter: RateLimiter | None = None
    metrics: Metrics | None = None

    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc(Role.CLIENT, ANONYMOUS)
    async def Upload(self, request: pb.UploadBatch, context: Context) -> pb.UploadResult:
        field = "explicit_share" if self.core.role == Role.LEADER else "seed"
        reports = []
        for r in request.reports:
            if r.WhichOneof("share") != field:
                raise InvalidArgument(f"the {self.core.role} takes reports with a {field}")
            reports.append((r.report_id, getattr(r, field)))
        n = self.core.upload(request.task_id, reports)
        if self.metrics is not None:
            self.metrics.reports.labels(task=request.task_id).inc(len(reports))
            self.metrics.batches.labels(task=request.task_id).inc()
        return pb.UploadResult(accepted=len(reports), n=n)

    @rpc(Role.CLIENT, Role.ANALYST, Role.LEADER, ANONYMOUS)
    async def GetTask(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        """The task as this server holds it.  Whoever may upload (a client, or no
        certificate on the ingest port) gets the public parameters an upload
        needs (the spec, whether collection is open) and nothing else; n, the
        ledger and the stream count only go to the analyst and the leader."""
        info = task_info(self.core.store.task(request.task_id))
        if peer_role(context) in (Role.ANALYST, Role.LEADER):
            return info
        return pb.TaskInfo(spec=info.spec, collection_open=info.collection_open)


class AnalystService(pb_grpc.AnalystServicer):
    """The leader's analyst API: each RPC is one `LeaderDriver` call."""

    limiter: RateLimiter | None = None
    metrics: Metrics | None = None
    #: The connection to the helper: calls that charge a ledger first wait (a
    #: few seconds at most) for it, so a helper that is down charges nothing.
    helper: GrpcHelperPort | None = None

    def __init__(self, driver: LeaderDriver) -> None:
        self.driver = driver

    async def _helper_connected(self) -> None:
        if self.helper is not None:
            await self.helper.connected()

    def _budget(self, task_id: str) -> None:
        if self.metrics is not None:
            self.metrics.budget(self.driver.core.store, task_id)

    def _chunk(self, stream_id: str, start: float, queries: int, peer_bytes: int) -> None:
        """Count a chunk by what the analyst sent (its length), never by its answer."""
        if self.metrics is not None:
            m = self.metrics
            task_id = self._task_of(stream_id)
            m.chunk_seconds.observe(time.perf_counter() - start)
            m.chunks.labels(task=task_id).inc()
            m.queries.labels(task=task_id).inc(queries)
            m.peer_bytes.inc(peer_bytes)

    @rpc(Role.ANALYST)
    async def CreateTask(self, request: pb.TaskSpec, context: Context) -> pb.TaskInfo:
        info = await self.driver.create_task(request)
        self._budget(request.task_id)
        return info

    @rpc(Role.ANALYST)
    async def DescribeTask(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return await self.driver.describe(request.task_id)

    @rpc(Role.ANALYST)
    async def Budget(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return await self.driver.describe(request.task_id)

    @rpc(Role.ANALYST)
    async def ListTasks(self, request: pb.Empty, context: Context) -> pb.TaskList:
        return self.driver.list_tasks()

    @rpc(Role.ANALYST)
    async def CloseCollection(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return await self.driver.close_collection(request.task_id)

    @rpc(Role.ANALYST)
    async def OpenStream(self, request: pb.OpenStreamRequest, context: Context) -> pb.StreamInfo:
        await self._helper_connected()
        info = await self.driver.open_stream(request)
        if self.metrics is not None:
            kind = kind_from_pb(request.kind).value
            self.metrics.streams.labels(task=request.task_id, kind=kind).inc()
        self._budget(request.task_id)
        return info

    @rpc(Role.ANALYST)
    async def Ask(self, request: pb.AskRequest, context: Context) -> pb.AskResponse:
        start = time.perf_counter()
        resp = await self.driver.ask(request)
        self._chunk(request.stream_id, start, len(request.queries.index), resp.peer_bytes)
        return resp

    @rpc(Role.ANALYST)
    async def Compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
        start = time.perf_counter()
        resp = await self.driver.compare(request)
        self._chunk(request.stream_id, start, len(request.queries.index), resp.peer_bytes)
        return resp

    def _task_of(self, stream_id: str) -> str:
        try:
            return str(self.driver.core.store.stream(stream_id).task_id)
        except Exception:  # noqa: BLE001 - metrics never fail a call
            return ""

    @rpc(Role.ANALYST)
    async def ReservePlan(self, request: pb.PlanRequest, context: Context) -> pb.PlanInfo:
        await self._helper_connected()
        info = await self.driver.reserve_plan(request)
        self._budget(request.task_id)
        return info

    @rpc(Role.ANALYST)
    async def EndPlan(self, request: pb.PlanRef, context: Context) -> pb.PlanInfo:
        info = await self.driver.end_plan(request.plan_id)
        if self.metrics is not None:
            for task_id in self.driver.core.store.task_ids():
                self._budget(task_id)
        return info


class PeerService(pb_grpc.PeerServicer):
    """The helper's side: only the leader may call it; each RPC is one
    `HelperDriver` call."""

    metrics: Metrics | None = None

    def __init__(self, driver: HelperDriver) -> None:
        self.driver = driver

    def _budget(self, task_id: str) -> None:
        if self.metrics is not None:
            self.metrics.budget(self.driver.core.store, task_id)

    @rpc(Role.LEADER)
    async def CreateTask(self, request: pb.TaskSpec, context: Context) -> pb.TaskInfo:
        info = await self.driver.CreateTask(request)
        self._budget(request.task_id)
        return info

    @rpc(Role.LEADER)
    async def Digest(self, request: pb.TaskRef, context: Context) -> pb.CollectionDigest:
        return await self.driver.Digest(request)

    @rpc(Role.LEADER)
    async def CloseCollection(self, request: pb.TaskRef, context: Context) -> pb.CollectionDigest:
        return await self.driver.CloseCollection(request)

    @rpc(Role.LEADER)
    async def ListReports(self, request: pb.ReportPage, context: Context) -> pb.ReportIds:
        return await self.driver.ListReports(request)

    @rpc(Role.LEADER)
    async def DropReports(self, request: pb.ReportIds, context: Context) -> pb.CollectionDigest:
        return await self.driver.DropReports(request)

    @rpc(Role.LEADER)
    async def MarkAgreed(self, request: pb.CollectionDigest, context: Context) -> pb.TaskInfo:
        return await self.driver.MarkAgreed(request)

    @rpc(Role.LEADER)
    async def Budget(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return await self.driver.Budget(request)

    @rpc(Role.LEADER)
    async def PrepareStream(
        self, request: pb.PrepareStreamRequest, context: Context
    ) -> pb.StreamInfo:
        info = await self.driver.PrepareStream(request)
        if self.metrics is not None:
            kind = kind_from_pb(request.kind).value
            self.metrics.streams.labels(task=request.task_id, kind=kind).inc()
        self._budget(request.task_id)
        return info

    @rpc(Role.LEADER)
    async def FailStream(self, request: pb.StreamRef, context: Context) -> pb.StreamInfo:
        return await self.driver.FailStream(request)

    @rpc(Role.LEADER)
    async def ReservePlan(self, request: pb.PlanRequest, context: Context) -> pb.PlanInfo:
        info = await self.driver.ReservePlan(request)
        self._budget(request.task_id)
        return info

    @rpc(Role.LEADER)
    async def EndPlan(self, request: pb.PlanRef, context: Context) -> pb.PlanInfo:
        return await self.driver.EndPlan(request)

    @rpc(Role.LEADER)
    async def FailPlan(self, request: pb.PlanRef, context: Context) -> pb.PlanInfo:
        return await self.driver.FailPlan(request)

    @rpc(Role.LEADER)
    async def Session(self, request_iterator: Any, context: Context) -> None:
        """A comparison session (see `HelperDriver.serve_session`)."""

        async def read() -> Any:
            frame = await context.read()
            return None if frame is grpc.aio.EOF else frame

        await self.driver.serve_session(context.write, read)


class HelperProbe:
    """The leader's view of the helper: a health check with a short deadline every
    `interval` seconds (`run`), exported as `svtagg_helper_reachable`, logged once
    per change ("helper at ... unreachable: why" / "... reachable again"), and
    read by the leader's own health check."""

    def __init__(self, port: GrpcHelperPort, interval: float = 1.0, timeout: float = 2.0) -> None:
        self.port = port
        self.interval = interval
        self.timeout = timeout
        self.reachable: bool | None = None
        self.detail = "not checked yet"
        self.gauge: Any = None

    async def check(self) -> bool:
        """Probe the helper now; whether it answered SERVING."""
        why = await self.port.probe(self.timeout)
        ok = not why
        if ok != self.reachable:
            if ok:
                again = " again" if self.reachable is False else ""
                log.info("helper at %s reachable%s", self.port.address, again)
            else:
                log.warning("helper at %s unreachable: %s", self.port.address, why)
        self.reachable, self.detail = ok, why or "SERVING"
        if self.gauge is not None:
            self.gauge.set(1 if ok else 0)
        return ok

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval)


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: SERVING while up, NOT_SERVING once shutdown begins.  On the
    leader, Check also answers NOT_SERVING while the helper is unreachable (as
    `HelperProbe` last saw it), since no task can be created, closed or queried then."""

    def __init__(self, helper: HelperProbe | None = None) -> None:
        self.serving = True
        self.helper = helper
        self._changed = asyncio.Event()

    def set_serving(self, serving: bool) -> None:
        self.serving = serving
        self._changed.set()

    def _status(self) -> health_pb2.HealthCheckResponse:
        s = health_pb2.HealthCheckResponse
        return s(status=s.SERVING if self.serving else s.NOT_SERVING)

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        if request is UNDECODABLE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "undecodable request")
        if request.service not in ("", "svtagg.v1.Ingest", "svtagg.v1.Analyst", "svtagg.v1.Peer"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        if self.serving and self.helper is not None and self.helper.reachable is False:
            s = health_pb2.HealthCheckResponse
            return s(status=s.NOT_SERVING)
        return self._status()

    async def Watch(self, request: Any, context: Any) -> Any:
        while True:
            yield self._status()
            if not self.serving:
                return
            self._changed.clear()
            await self._changed.wait()


# ---------------------------------------------------------------- server
def _bind(server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials) -> int:
    """The bound port; OSError (one line) when the address cannot be bound."""
    try:
        port = server.add_secure_port(address, creds)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address}: port in use or address not available")
    return port


@dataclass
class ServerConfig:
    role: str
    store_path: str
    identity: Identity
    listen: str = "127.0.0.1:0"
    helper_address: str | None = None
    #: Optional second port for clients holding no certificate (server-only TLS);
    #: only Ingest answers there, every other service sees no role and refuses.
    ingest_listen: str | None = None
    #: Per-caller token bucket (requests/s, burst); the leader's calls to the
    #: helper are exempt.  rate <= 0 disables the limit.
    rate_limit: float = 1000.0
    rate_burst: float = 2000.0
    #: Budget policy: largest total (ε, δ) a task may have on this server (None: no cap).
    max_epsilon_total: Fraction | None = None
    max_delta_total: Fraction | None = None
    #: Refuse tasks that do not range-check their reports.
    require_validation: bool = False
    #: Helper: port of the comparison data channel on the host of `listen` (0:
    #: pick a free one, announced to the leader per session; None: none, the
    #: protocol then runs inside the gRPC session stream).  Leader: ask for it.
    data_port: int | None = 0
    #: host:port for the Prometheus /metrics endpoint (plain HTTP; None: off).
    metrics_listen: str | None = None
    #: An ingest replica: serves Ingest (and Health) only, on a PostgreSQL store
    #: shared with the server's main process; uploads stay idempotent across
    #: replicas (report ids are unique per task in the store).
    ingest_only: bool = False
    #: Leader: queue Ask / Compare chunks and the close-time passes in the
    #: PostgreSQL store for worker processes (servers/work.py) instead of
    #: running them in this process.
    lease_work: bool = False
    #: A worker process over the PostgreSQL store shared with the server's main
    #: process.  Leader: takes leased jobs (serves Health only); helper: serves
    #: the Peer service and comparison sessions for the leader's workers.
    worker: bool = False
    #: A leader worker's lease on each job (s), renewed every third of it.
    lease_seconds: float = LEASE_SECONDS
    #: Leader: seconds between two health checks of the helper (the
    #: `svtagg_helper_reachable` gauge, the log line on each change, the
    #: leader's own health).
    helper_probe_interval: float = 1.0


def check_modes(
    role: str, store_path: str, *, ingest_only: bool, worker: bool, lease_work: bool
) -> None:
    """What kind of process this is must fit the role and the store: replicas,
    workers and leased work share a PostgreSQL store with the role's main
    process.  Raises ValueError (one line, naming the flags); used by the CLI
    before anything is created and by `SvtaggServer`."""
    on_sqlite = sqlite_file(store_path) is not None
    if ingest_only and on_sqlite:
        raise ValueError("--ingest-only replicas share a PostgreSQL store: --db postgresql://...")
    for flag, on in (("--worker", worker), ("--lease-work", lease_work)):
        if on and on_sqlite:
            raise ValueError(f"{flag} needs the PostgreSQL store: --db postgresql://...")
    if worker and (ingest_only or lease_work):
        raise ValueError("--worker cannot be combined with --ingest-only or --lease-work")
    if lease_work and role != "leader":
        raise ValueError("--lease-work is for the leader only")


class SvtaggServer:
    """A running leader or helper: `await start()`, `port`, `await stop()`."""

    def __init__(self, config: ServerConfig, party: PartyFactory = garbled_circuit_party) -> None:
        if config.role not in SERVER_ROLES:
            raise ValueError(f"role must be leader or helper, got {config.role!r}")
        if config.role == "leader" and not config.helper_address and not config.ingest_only:
            raise ValueError("the leader needs the helper's address")
        check_modes(
            config.role,
            config.store_path,
            ingest_only=config.ingest_only,
            worker=config.worker,
            lease_work=config.lease_work,
        )
        self.config = config
        # Ports first: a port in use fails here, before the store file is created.
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        ident = config.identity
        creds = grpc.ssl_server_credentials(
            [(ident.key, ident.cert)], root_certificates=ident.ca, require_client_auth=True
        )
        self.port = _bind(self.server, config.listen, creds)
        self.ingest_port: int | None = None
        if config.ingest_listen:
            self.ingest_port = _bind(
                self.server,
                config.ingest_listen,
                grpc.ssl_server_credentials([(ident.key, ident.cert)]),
            )
        self.data_listener: DataListener | None = None
        if config.role == "helper" and config.data_port is not None and not config.ingest_only:
            self.data_listener = DataListener(
                config.identity, split_host(config.listen), config.data_port
            )
            self.data_listener.bind()  # OSError (one line) if the port is taken
        self.metrics = Metrics(config.role)
        self.metrics_port: int | None = None
        if config.metrics_listen:
            self.metrics_port = self.metrics.serve(config.metrics_listen)
        # An ingest replica shares the store of the server's main process, which
        # owns the streams: it must not fail them at its start.
        # Neither do workers: the main process recovers its store at its start.
        main = not (config.ingest_only or config.worker)
        # Taken before the store opens: opening recovers, which a second main
        # process must not do under the first one.
        self.main_lock = hold_main_lock(config.store_path, config.role) if main else None
        try:
            self.store = open_store(config.store_path, recover=main)
        except BaseException:
            if self.main_lock is not None:
                self.main_lock.release()
            raise
        self.core = ServerCore(
            config.role,  # type: ignore[arg-type]
            self.store,
            max_epsilon_total=config.max_epsilon_total,
            max_delta_total=config.max_delta_total,
            require_validation=config.require_validation,
        )
        self.peer: GrpcHelperPort | None = None
        self.helper_probe: HelperProbe | None = None
        if config.role == "leader" and not config.ingest_only:
            assert config.helper_address is not None
            self.peer = GrpcHelperPort(
                config.helper_address, config.identity, data_channel=config.data_port is not None
            )
            self.helper_probe = HelperProbe(self.peer, config.helper_probe_interval)
            self.helper_probe.gauge = self.metrics.helper_reachable
        self.health = HealthService(self.helper_probe)
        for task_id in self.store.task_ids():
            self.metrics.budget(self.store, task_id)
        self.analyst: AnalystService | None = None
        #: The leader's driver (main process or worker); None on the helper.
        self.driver: LeaderDriver | None = None
        self.peer_service: PeerService | None = None
        self.limiter = RateLimiter(config.rate_limit, config.rate_burst)
        if not config.worker:
            ingest = IngestService(self.core)
            ingest.limiter = self.limiter
            ingest.metrics = self.metrics
            add_service(pb_grpc.add_IngestServicer_to_server, ingest, self.server)
        add_service(health_pb2_grpc.add_HealthServicer_to_server, self.health, self.server)
        self.work: WorkQueue | None = None
        self.worker: Worker | None = None
        #: Set when this process can no longer do its job (a worker whose
        #: database failed): `svtagg server` then stops with exit status 1.
        self.failed = asyncio.Event()
        if config.ingest_only:
            return  # Ingest and Health only: no analyst, no peer, no sessions
        if self.peer is not None:
            self.driver = LeaderDriver(self.core, self.peer, party)
            if config.worker:
                return  # Health only: the jobs come from the store
            self.analyst = AnalystService(self.driver)
            self.analyst.limiter = self.limiter
            self.analyst.metrics = self.metrics
            self.analyst.helper = self.peer
            add_service(pb_grpc.add_AnalystServicer_to_server, self.analyst, self.server)
        else:
            self.peer_service = PeerService(HelperDriver(self.core, party))
            self.peer_service.metrics = self.metrics
            add_service(pb_grpc.add_PeerServicer_to_server, self.peer_service, self.server)

    async def start(self, warm: bool = True) -> None:
        """Serve.  A leader first checks the helper's certificate: one another CA
        issued stops the start here (CertificateError, one line, the store closed)."""
        if self.peer is not None:
            try:
                await self.peer.check_certificates()
            except CertificateError:
                await self.stop(0)
                raise
        if self.helper_probe is not None:
            # Known before the first health check is answered.
            await self.helper_probe.check()
        if self.peer_service is not None and self.data_listener is not None:
            await self.data_listener.start()
            self.peer_service.driver.data = self.data_listener
            log.info("helper data channel on port %d", self.data_listener.port)
        if self.driver is not None and self.config.lease_work:
            # The front end waits for results; its workers wait for new jobs.
            self.work = await WorkQueue.connect(self.store, ("done",))
            withdrawn = await self.work.reset()
            if withdrawn:
                log.info("work queue: withdrew %d job(s) queued before this start", withdrawn)
            self.driver.work = self.work
            self.work.metrics = self.metrics
            warm = False  # the workers hold the sessions
        elif self.driver is not None and self.config.worker:
            self.work = await WorkQueue.connect(self.store, ("new",))
            self.worker = Worker(self.work, self.driver.run_job, self.config.lease_seconds)
        await self.server.start()
        if self.worker is not None:
            self._work_loop = asyncio.ensure_future(self.worker.run())
            self._work_loop.add_done_callback(self._worker_ended)
        if self.driver is not None and warm:
            # Base OTs with the helper before the first chunk needs them.
            self._warm = asyncio.ensure_future(self.driver.pool.warm())
        log.info(
            "%s listening on port %d (failed closed on recovery: %d streams)",
            self.config.role,
            self.port,
            self.store.failed_on_recovery,
        )
        if self.metrics_port is not None:
            host = (self.config.metrics_listen or "").rpartition(":")[0] or "127.0.0.1"
            log.info("metrics on http://%s:%d/metrics", host, self.metrics_port)
        if self.helper_probe is not None:
            self._probe = asyncio.ensure_future(self.helper_probe.run())

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful shutdown: report NOT_SERVING, let calls finish, close the store."""
        self.health.set_serving(False)
        if self.peer_service is not None:
            self.peer_service.driver.stopping.set()
        warm = getattr(self, "_warm", None)
        if warm is not None and not warm.done():
            warm.cancel()
        if self.worker is not None:
            # Take no new job; let the one running finish within the grace.
            self.worker.stopping.set()
            loop = getattr(self, "_work_loop", None)
            if loop is not None:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(loop), grace)
                loop.cancel()
                with contextlib.suppress(BaseException):
                    await loop
        await self.server.stop(grace)
        if self.work is not None:
            await self.work.close()
        if self.data_listener is not None:
            await self.data_listener.close()
        if self.driver is not None:
            await self.driver.pool.close()
        probe = getattr(self, "_probe", None)
        if probe is not None and not probe.done():
            probe.cancel()
        if self.peer is not None:
            await self.peer.close()
        self.metrics.stop()
        self.store.close()
        if self.main_lock is not None:
            self.main_lock.release()

    def _worker_ended(self, loop: asyncio.Future[None]) -> None:
        """A worker's loop ends only when it stops, or when its database fails:
        then the process should end too (its supervisor starts a fresh one)."""
        if not loop.cancelled() and loop.exception() is not None:
            log.error("worker: taking work failed: %s; stopping", loop.exception())
            self.failed.set()

    async def wait(self) -> None:
        await self.server.wait_for_termination()
