"""The gRPC services a server answers: wire types in, driver calls, status
codes out.  Both roles serve Ingest and Health; the leader serves the Analyst
API (`servers.leader.LeaderDriver`) and probes the helper, whose Peer service
(`servers.helper.HelperDriver`) only the leader may call."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from svtagg.dp.errors import InvalidArgument
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.vocab import Role, kind_from_pb
from svtagg.proto.wire import UNDECODABLE
from svtagg.servers.core import ServerCore
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.limits import RateLimiter
from svtagg.servers.messages import task_info
from svtagg.servers.metrics import Metrics
from svtagg.servers.peer import GrpcHelperPort
from svtagg.servers.rpc import ANONYMOUS, Context, peer_role, rpc

log = logging.getLogger("svtagg.server")


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
