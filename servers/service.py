"""One server process assembled from its parts: its ports, store, drivers and
gRPC services, chosen by its role and its process kind.  The services are in
`servers.edge.services`, the RPC guard in `servers.edge.rpc`, the metrics in
`servers.edge.metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Any

import grpc

from svtagg.mpc.softspoken import parse_ot
from svtagg.proto import health_pb2_grpc
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import CertificateError, Identity
from svtagg.proto.vocab import MAX_TASKS, SERVER_OPTIONS, SERVER_ROLES, Role
from svtagg.proto.wire import add_service
from svtagg.servers.core import ServerCore
from svtagg.servers.edge.admission import Admission, CallLimits
from svtagg.servers.edge.datachannel import DataListener, split_host
from svtagg.servers.edge.limits import RateLimiter
from svtagg.servers.edge.metrics import Metrics
from svtagg.servers.edge.peer import GrpcHelperPort
from svtagg.servers.edge.services import (
    AnalystService,
    HealthService,
    HelperProbe,
    IngestService,
    PeerService,
    VerifyService,
)
from svtagg.servers.exchange.garbling import (
    DEFAULT_GARBLING,
    GarbledCircuitParties,
    check_comparison,
    check_scheme_name,
)
from svtagg.servers.exchange.party import PartyFactory
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.store.mainlock import MainLock, hold_main_lock
from svtagg.servers.store.opener import open_store, sqlite_file
from svtagg.servers.store.rules import Store
from svtagg.servers.work import LEASE_SECONDS, Worker, WorkQueue

log = logging.getLogger("svtagg.server")


class ProcessKind(Enum):
    """What one server process does for its role.  Each role has one main
    process; replicas and workers share its PostgreSQL store and start beside it."""

    #: Serves everything its role serves and runs the protocol itself.
    MAIN = "main"
    #: `--ingest-only`: serves Ingest (and Health) only; uploads stay
    #: idempotent across replicas (report ids are unique per task in the store).
    #: A leader replica given `--helper` verifies proofs with that helper
    #: process; a helper replica also answers Peer.Verify.
    INGEST_REPLICA = "ingest replica"
    #: `--worker`: leader: takes leased jobs (serves Health only); helper:
    #: serves the Peer service and comparison sessions for the leader's workers.
    WORKER = "worker"
    #: `--lease-work`, leader only: the main process, queueing Ask / Compare
    #: chunks and the close-time passes in the store for its workers
    #: (servers/work.py) instead of running them.
    LEASED_FRONT_END = "leased front end"

    @property
    def flag(self) -> str:
        """The `svtagg server` flag that asks for this kind ('' for the main process)."""
        return _FLAGS[self]

    @property
    def owns_store(self) -> bool:
        """Holds the store's main lock and recovers the store at its start.  A
        replica or a worker must not: the main process owns the streams."""
        return self in (ProcessKind.MAIN, ProcessKind.LEASED_FRONT_END)

    @property
    def serves_ingest(self) -> bool:
        return self is not ProcessKind.WORKER

    @property
    def runs_protocol(self) -> bool:
        """Talks to the other server (a leader's driver, a helper's Peer service)."""
        return self is not ProcessKind.INGEST_REPLICA

    @property
    def compares(self) -> bool:
        """Runs comparison sessions itself (a front end's workers hold them)."""
        return self in (ProcessKind.MAIN, ProcessKind.WORKER)

    def check_store(self, store_path: str) -> None:
        """Every kind but the main process shares a PostgreSQL store; ValueError
        (one line, naming the flag) on SQLite."""
        if self is ProcessKind.MAIN or sqlite_file(store_path) is None:
            return
        if self is ProcessKind.INGEST_REPLICA:
            raise ValueError(
                "--ingest-only replicas share a PostgreSQL store: --db postgresql://..."
            )
        raise ValueError(f"{self.flag} needs the PostgreSQL store: --db postgresql://...")

    def check_role(self, role: Role) -> None:
        if self is ProcessKind.LEASED_FRONT_END and role != Role.LEADER:
            raise ValueError("--lease-work is for the leader only")

    @classmethod
    def from_flags(
        cls, role: Role, store_path: str, *, ingest_only: bool, worker: bool, lease_work: bool
    ) -> ProcessKind:
        """The kind `svtagg server`'s flags ask for, checked against the role and
        the store before anything is created: ValueError, one line naming the
        flags.  --lease-work beside --ingest-only changes nothing: a replica
        runs no chunks."""
        named = [
            kind
            for kind, on in (
                (cls.INGEST_REPLICA, ingest_only),
                (cls.WORKER, worker),
                (cls.LEASED_FRONT_END, lease_work),
            )
            if on
        ]
        for kind in named:
            kind.check_store(store_path)
        if worker and len(named) > 1:
            raise ValueError("--worker cannot be combined with --ingest-only or --lease-work")
        for kind in named:
            kind.check_role(role)
        return named[0] if named else cls.MAIN


_FLAGS = {
    ProcessKind.MAIN: "",
    ProcessKind.INGEST_REPLICA: "--ingest-only",
    ProcessKind.WORKER: "--worker",
    ProcessKind.LEASED_FRONT_END: "--lease-work",
}


@dataclass
class ServerConfig:
    role: Role
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
    #: Calls in flight per caller and in all, uploads among them
    #: (servers/edge/admission.py), checked before a request is read.
    call_limits: CallLimits = field(default_factory=CallLimits)
    #: Tasks this server holds at most (ListTasks answers them in one message).
    max_tasks: int = MAX_TASKS
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
    #: What this process does for its role.
    kind: ProcessKind = ProcessKind.MAIN
    #: A leader worker's lease on each job (s), renewed every third of it.
    lease_seconds: float = LEASE_SECONDS
    #: Leader: seconds between two health checks of the helper (the
    #: `svtagg_helper_reachable` gauge, the log line on each change, the
    #: leader's own health).
    helper_probe_interval: float = 1.0
    #: The garbling scheme of this server's comparison sessions (both servers
    #: must name the same; the helper refuses a leader on another).
    garbling: str = DEFAULT_GARBLING
    #: The OT extension of those sessions (both servers must name the same);
    #: None: `SVTAGG_OT`, else the default (`mpc.softspoken.server_ot`).
    ot: str | None = None
    #: Leader: which path first-YES / CTT chunks take ("garbled", "ot" or
    #: "auto:RTT_MS:MBPS", `mpc.millionaire.PathRule`); the helper runs the
    #: rule its leader announces.
    comparison: str | None = None

    def check(self) -> None:
        """ValueError (one line) for a configuration no server can run."""
        if self.role not in SERVER_ROLES:
            raise ValueError(f"role must be leader or helper, got {str(self.role)!r}")
        if self.role == Role.LEADER and not self.helper_address and self.kind.runs_protocol:
            raise ValueError("the leader needs the helper's address")
        self.kind.check_store(self.store_path)
        self.kind.check_role(self.role)
        check_scheme_name(self.garbling)
        if self.ot is not None:
            parse_ot(self.ot)
        if self.comparison is not None:
            check_comparison(self.comparison)


class SvtaggServer:
    """A running leader or helper process: `await start()`, `port`, `await stop()`.

    The constructor builds what needs no connection, ports first (a port in use
    fails before the store file is created).  `start` connects what must be
    awaited — the helper's certificate, the data listener, the work queue —
    then builds the role's driver and services on them, and serves."""

    def __init__(self, config: ServerConfig, party: PartyFactory | None = None) -> None:
        config.check()
        self.config = config
        self.party = (
            party
            if party is not None
            else GarbledCircuitParties(config.garbling, config.ot, config.comparison)
        )
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.port, self.ingest_port = _bind_ports(self.server, config)
        self.data_listener = _data_listener(config)
        self.metrics = Metrics(config.role)
        self.metrics_port = (
            self.metrics.serve(config.metrics_listen) if config.metrics_listen else None
        )
        self.main_lock, self.store = _open_store(config)
        self.core = ServerCore(
            config.role,
            self.store,
            max_epsilon_total=config.max_epsilon_total,
            max_delta_total=config.max_delta_total,
            require_validation=config.require_validation,
        )
        self.core.max_tasks = config.max_tasks
        self.core.on_path = lambda path: self.metrics.comparison_paths.labels(path=path).inc()
        self.limiter = RateLimiter(config.rate_limit, config.rate_burst)
        self.admission = Admission(config.call_limits)
        self.peer = _helper_port(config)
        self.helper_probe = (
            HelperProbe(
                self.peer, config.helper_probe_interval, gauge=self.metrics.helper_reachable
            )
            if self.peer is not None
            else None
        )
        self.health = HealthService(self.helper_probe, self.limiter)
        for task_id in self.store.task_ids():
            self.metrics.budget(self.store, task_id)
        if config.kind.serves_ingest:
            ingest = IngestService(
                self.core, helper=self.peer, limiter=self.limiter, metrics=self.metrics
            )
            self._serve(pb_grpc.add_IngestServicer_to_server, ingest)
        self._serve(health_pb2_grpc.add_HealthServicer_to_server, self.health)
        # Built by `start`, once what they need is connected.
        self.work: WorkQueue | None = None
        #: The leader's driver (main process, front end or worker); None on the helper.
        self.driver: LeaderDriver | None = None
        self.analyst: AnalystService | None = None
        self.peer_service: PeerService | None = None
        self.worker: Worker | None = None
        self._warm: asyncio.Future[None] | None = None
        self._work_loop: asyncio.Future[None] | None = None
        self._probe: asyncio.Future[None] | None = None
        #: Set when this process can no longer do its job (a worker whose
        #: database failed): `svtagg server` then stops with exit status 1.
        self.failed = asyncio.Event()

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
        if self.peer is not None and self.config.kind.runs_protocol:
            await self._build_leader(self.peer)
        elif self.config.kind.runs_protocol:
            await self._build_helper()
        elif self.config.role == Role.HELPER:
            # A helper replica verifies the upload batches of leader replicas
            # paired with it (Peer.Verify only, on its shared store).
            self._serve(pb_grpc.add_PeerServicer_to_server, VerifyService(self.core))
        await self.server.start()
        if self.worker is not None:
            self._work_loop = asyncio.ensure_future(self.worker.run())
            self._work_loop.add_done_callback(self._worker_ended)
        if warm and self.driver is not None and self.config.kind.compares:
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

    async def _build_leader(self, peer: GrpcHelperPort) -> None:
        """The leader's driver, and what its kind serves with it: the analyst
        API (main process, front end) or a worker's loop."""
        kind = self.config.kind
        if kind is ProcessKind.WORKER:
            self.work = await WorkQueue.connect(self.store, ("new",))
            self.driver = LeaderDriver(self.core, peer, self.party)
            self.driver.noise_pool = None  # the front end fills joint-noise pools
            self.worker = Worker(self.work, self.driver.run_job, self.config.lease_seconds)
            return  # Health only: the jobs come from the store
        if kind is ProcessKind.LEASED_FRONT_END:
            # The front end waits for results; its workers wait for new jobs.
            self.work = await WorkQueue.connect(self.store, ("done",), self.metrics)
            withdrawn = await self.work.reset()
            if withdrawn:
                log.info("work queue: withdrew %d job(s) queued before this start", withdrawn)
        self.driver = LeaderDriver(self.core, peer, self.party, work=self.work)
        self.analyst = AnalystService(
            self.driver, helper=peer, limiter=self.limiter, metrics=self.metrics
        )
        self._serve(pb_grpc.add_AnalystServicer_to_server, self.analyst)

    async def _build_helper(self) -> None:
        """The helper's Peer service, offering the data listener once it listens."""
        if self.data_listener is not None:
            await self.data_listener.start()
            log.info("helper data channel on port %d", self.data_listener.port)
        driver = HelperDriver(self.core, self.party, data=self.data_listener)
        self.peer_service = PeerService(driver, metrics=self.metrics)
        self._serve(pb_grpc.add_PeerServicer_to_server, self.peer_service)

    def _serve(self, add: Any, servicer: Any) -> None:
        """Register a service: every call admitted, and its request read, within
        this server's call bounds (servers/edge/admission.py)."""
        add_service(add, servicer, self.server, self.admission.admit, self.admission.reading)

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful shutdown: report NOT_SERVING, let calls finish, close the store."""
        self.health.set_serving(False)
        if self.peer_service is not None:
            self.peer_service.driver.stopping.set()
        if self._warm is not None and not self._warm.done():
            self._warm.cancel()
        if self.worker is not None and self._work_loop is not None:
            # Take no new job; let the one running finish within the grace.
            self.worker.stopping.set()
            loop = self._work_loop
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(loop), grace)
            loop.cancel()
            with contextlib.suppress(BaseException):
                await loop
        if self.analyst is not None:
            self.analyst.end_idle_calls()
        await self.server.stop(grace)
        if self.work is not None:
            await self.work.close()
        if self.data_listener is not None:
            await self.data_listener.close()
        if self.driver is not None:
            await self.driver.stop_noise_fills()
            await self.driver.pool.close()
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
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


def _bind_ports(server: grpc.aio.Server, config: ServerConfig) -> tuple[int, int | None]:
    """The main port (mutual TLS) and the optional certificate-less ingest port."""
    ident = config.identity
    mutual = grpc.ssl_server_credentials(
        [(ident.key, ident.cert)], root_certificates=ident.ca, require_client_auth=True
    )
    port = _bind(server, config.listen, mutual)
    if not config.ingest_listen:
        return port, None
    server_only = grpc.ssl_server_credentials([(ident.key, ident.cert)])
    return port, _bind(server, config.ingest_listen, server_only)


def _bind(server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials) -> int:
    """The bound port; OSError (one line) when the address cannot be bound."""
    try:
        port = server.add_secure_port(address, creds)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address}: port in use or address not available")
    return port


def _data_listener(config: ServerConfig) -> DataListener | None:
    """The helper's comparison data channel, bound here (OSError, one line, if
    the port is taken) and started by `SvtaggServer.start`."""
    if config.role != Role.HELPER or config.data_port is None or not config.kind.runs_protocol:
        return None
    listener = DataListener(config.identity, split_host(config.listen), config.data_port)
    listener.bind()
    return listener


def _open_store(config: ServerConfig) -> tuple[MainLock | None, Store]:
    """The store, and the main lock when this process owns the store.  The lock
    is taken first: opening recovers (fails the streams left open), which
    nothing may do under a running main process, neither a second main
    process nor a replica or a worker beside it."""
    owner = config.kind.owns_store
    lock = hold_main_lock(config.store_path, config.role) if owner else None
    try:
        return lock, open_store(config.store_path, recover=owner)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _helper_port(config: ServerConfig) -> GrpcHelperPort | None:
    """The leader's connection to the helper.  An ingest replica runs no
    protocol, but one given `--helper` verifies its upload batches with that
    helper process (the helper's main process or a helper replica)."""
    if config.role != Role.LEADER:
        return None
    if not config.kind.runs_protocol:
        if config.helper_address is None:
            return None
        return GrpcHelperPort(config.helper_address, config.identity, data_channel=False)
    assert config.helper_address is not None  # ServerConfig.check
    return GrpcHelperPort(
        config.helper_address, config.identity, data_channel=config.data_port is not None
    )
