"""A server process assembled: its ports, store, drivers and services, by
role and process kind.  The services themselves are in `servers.services`,
the RPC guard in `servers.rpc`, the metrics in `servers.metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from fractions import Fraction

import grpc

from svtagg.proto import health_pb2_grpc
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import CertificateError, Identity
from svtagg.proto.vocab import SERVER_OPTIONS, SERVER_ROLES
from svtagg.proto.wire import add_service
from svtagg.servers.core import PartyFactory, ServerCore, garbled_circuit_party
from svtagg.servers.datachannel import DataListener, split_host
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.limits import RateLimiter
from svtagg.servers.mainlock import hold_main_lock
from svtagg.servers.metrics import Metrics
from svtagg.servers.peer import GrpcHelperPort
from svtagg.servers.services import (
    AnalystService,
    HealthService,
    HelperProbe,
    IngestService,
    PeerService,
)
from svtagg.servers.store import open_store, sqlite_file
from svtagg.servers.work import LEASE_SECONDS, Worker, WorkQueue

log = logging.getLogger("svtagg.server")


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
