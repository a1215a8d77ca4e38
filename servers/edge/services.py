"""The gRPC services a server answers: wire types in, driver calls, status
codes out.  Both roles serve Ingest and Health; the leader serves the Analyst
API (`servers.leader.LeaderDriver`) and probes the helper, whose Peer service
(`servers.helper.HelperDriver`) only the leader may call."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from svtagg.dp.errors import FailedPrecondition, InvalidArgument, RateLimited
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.vocab import Role, kind_from_pb
from svtagg.proto.wire import UNDECODABLE
from svtagg.servers.core import ServerCore
from svtagg.servers.edge import wire
from svtagg.servers.edge.limits import RateLimiter
from svtagg.servers.edge.metrics import Metrics
from svtagg.servers.edge.peer import GrpcHelperPort
from svtagg.servers.edge.rpc import (
    ANONYMOUS,
    Context,
    abort_with,
    caller_identity,
    check_rate,
    peer_role,
    rpc,
)
from svtagg.servers.exchange.port import HelperPort
from svtagg.servers.helper import HelperDriver
from svtagg.servers.ingest.batches import ProofReport, helper_receive, helper_verify, verify_upload
from svtagg.servers.leader import LeaderDriver

if TYPE_CHECKING:
    from prometheus_client import Gauge

log = logging.getLogger("svtagg.server")
Q = TypeVar("Q")
R = TypeVar("R")

#: Streams whose task the chunk metrics remember (`LeaderService._task_of`).
_STREAM_TASKS = 4096


class IngestService(pb_grpc.IngestServicer):
    """Uploads and the task's public parameters, on both servers."""

    def __init__(
        self,
        core: ServerCore,
        *,
        helper: HelperPort | None = None,
        limiter: RateLimiter | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.core = core
        #: The leader's connection to the helper, which verifies proofs with it.
        self.helper = helper
        self.limiter = limiter
        self.metrics = metrics

    @rpc(Role.CLIENT, ANONYMOUS)
    async def Upload(self, request: pb.UploadBatch, context: Context) -> pb.UploadResult:
        """Store (plain shares) or verify and fold (Prio3 reports) one batch.  The
        answer's n stays 0: the task's count is not the uploader's to learn
        (GetTask withholds it from clients too; the analyst reads it)."""
        if not request.reports:
            raise InvalidArgument("empty upload batch")
        if request.reports and request.reports[0].WhichOneof("share") == "input_share":
            result = await self._proofs(request)
        else:
            field = "explicit_share" if self.core.role == Role.LEADER else "seed"
            reports = []
            for r in request.reports:
                if r.WhichOneof("share") != field:
                    raise InvalidArgument(f"the {self.core.role} takes reports with a {field}")
                reports.append((r.report_id, getattr(r, field)))
            self.core.upload(request.task_id, reports)
            result = pb.UploadResult(accepted=len(reports))
        if self.metrics is not None:
            self.metrics.reports.labels(task=request.task_id).inc(result.accepted)
            self.metrics.batches.labels(task=request.task_id).inc()
            for reason, count in result.rejected.items():
                self.metrics.rejected.labels(task=request.task_id, reason=reason).inc(count)
        return result

    async def _proofs(self, request: pb.UploadBatch) -> pb.UploadResult:
        """A batch of Prio3 reports (servers/ingest/batches.py): pending on the helper,
        verified with the helper and folded on the leader."""
        reports = []
        for r in request.reports:
            if r.WhichOneof("share") != "input_share":
                raise InvalidArgument("a batch holds Prio3 reports only, or plain shares only")
            reports.append(ProofReport(r.report_id, r.input_share, r.public_share))
        if self.core.role == Role.HELPER:
            helper_receive(self.core, request.task_id, reports)
            return pb.UploadResult(accepted=len(reports))
        if self.helper is None:
            raise FailedPrecondition(
                "this process does not take uploads with proofs (no helper connection: start "
                "a leader replica with --helper, the helper's main process or a helper replica)"
            )
        out = await verify_upload(self.core, self.helper, request.task_id, reports)
        return pb.UploadResult(accepted=out.accepted, rejected=out.rejected)

    @rpc(Role.CLIENT, Role.ANALYST, Role.LEADER, ANONYMOUS)
    async def GetTask(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        """The task as this server holds it.  Whoever may upload (a client, or no
        certificate on the ingest port) gets the public parameters an upload
        needs (the spec, whether collection is open) and nothing else; n, the
        ledger and the stream count only go to the analyst and the leader."""
        info = wire.task_info(self.core.task(request.task_id))
        if peer_role(context) in (Role.ANALYST, Role.LEADER):
            return info
        return pb.TaskInfo(spec=info.spec, collection_open=info.collection_open)


class AnalystService(pb_grpc.AnalystServicer):
    """The leader's analyst API: each RPC is one `LeaderDriver` call."""

    def __init__(
        self,
        driver: LeaderDriver,
        *,
        helper: GrpcHelperPort | None = None,
        limiter: RateLimiter | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.driver = driver
        #: The connection to the helper: calls that charge a ledger first wait (a
        #: few seconds at most) for it, so a helper that is down charges nothing.
        self.helper = helper
        self.limiter = limiter
        self.metrics = metrics
        #: Each stream's task, for the chunk metrics' labels: a stream never
        #: changes task, so one store read per stream, not one per chunk.
        self._stream_tasks: dict[str, str] = {}
        #: AskStream calls waiting for their next request (`end_idle_calls`).
        self._idle_calls: set[asyncio.Task[Any]] = set()
        self._ending = False

    def end_idle_calls(self) -> None:
        """Cancel the AskStream calls that wait for a request (at shutdown: an
        open call would otherwise hold the server for its whole grace); a call
        answering a chunk finishes it first, within the grace."""
        self._ending = True
        for task in list(self._idle_calls):
            task.cancel()

    async def _helper_connected(self) -> None:
        if self.helper is not None:
            await self.helper.connected()

    def _budget(self, task_id: str) -> None:
        if self.metrics is not None:
            self.metrics.budget(self.driver.core, task_id)

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
        info = await self.driver.create_task(wire.TASK_SPEC.from_pb(request))
        self._budget(request.task_id)
        return wire.TASK_INFO.to_pb(info)

    @rpc(Role.ANALYST)
    async def DescribeTask(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return wire.TASK_INFO.to_pb(await self.driver.describe(request.task_id))

    @rpc(Role.ANALYST)
    async def Budget(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return wire.TASK_INFO.to_pb(await self.driver.describe(request.task_id))

    @rpc(Role.ANALYST)
    async def ListTasks(self, request: pb.Empty, context: Context) -> pb.TaskList:
        return wire.task_list(self.driver.list_tasks())

    @rpc(Role.ANALYST)
    async def CloseCollection(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return wire.TASK_INFO.to_pb(await self.driver.close_collection(request.task_id))

    @rpc(Role.ANALYST)
    async def OpenStream(self, request: pb.OpenStreamRequest, context: Context) -> pb.StreamInfo:
        await self._helper_connected()
        open_stream = wire.OPEN_STREAM.from_pb(request)
        info = await self.driver.open_stream(open_stream)
        if self.metrics is not None:
            kind = open_stream.kind.value
            self.metrics.streams.labels(task=request.task_id, kind=kind).inc()
        self._budget(request.task_id)
        return wire.STREAM_INFO.to_pb(info)

    @rpc(Role.ANALYST)
    async def Ask(self, request: pb.AskRequest, context: Context) -> pb.AskResponse:
        return await self._ask(request)

    async def _ask(self, request: pb.AskRequest) -> pb.AskResponse:
        start = time.perf_counter()
        answer = await self.driver.ask(wire.ASK.from_pb(request))
        self._chunk(request.stream_id, start, len(request.queries.index), answer.peer_bytes)
        return wire.ASK_ANSWER.to_pb(answer)

    @rpc(Role.ANALYST)
    async def AskStream(self, requests: AsyncIterator[pb.AskRequest], context: Context) -> None:
        """Ask, request after request on one call (the caller authenticated and
        rate limited at the call's start by `rpc`, each further request counted
        against the caller's limit as a call would be).  A refusal ends the call
        with the status Ask would return."""
        first, caller = True, caller_identity(context)  # one call, one caller
        task = asyncio.current_task()
        assert task is not None
        pending = requests.__aiter__()
        while not self._ending:  # a call that answered a chunk during shutdown ends after it
            self._idle_calls.add(task)
            try:
                request = await pending.__anext__()
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if self._ending:  # shutting down: end the call with OK, at once
                    return
                raise
            finally:
                self._idle_calls.discard(task)
            try:
                if request is UNDECODABLE:
                    raise InvalidArgument("AskStream: a request does not parse as AskRequest")
                if not first:
                    check_rate(self.limiter, context, caller)
                first = False
                await context.write(await self._ask(request))
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - a refusal named by its request
                await abort_with(context, exc, "AskStream", request, self.metrics)
                raise

    @rpc(Role.ANALYST)
    async def Compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
        start = time.perf_counter()
        answer = await self.driver.compare(wire.COMPARE.from_pb(request))
        self._chunk(request.stream_id, start, len(request.queries.index), answer.peer_bytes)
        return wire.COMPARE_ANSWER.to_pb(answer)

    @rpc(Role.ANALYST)
    async def NoisyMax(self, request: pb.NoisyMaxRequest, context: Context) -> pb.NoisyMaxResponse:
        start = time.perf_counter()
        answer = await self.driver.noisy_max(wire.NOISY_MAX.from_pb(request))
        self._chunk(request.stream_id, start, len(request.queries.index), answer.peer_bytes)
        return wire.NOISY_MAX_ANSWER.to_pb(answer)

    @rpc(Role.ANALYST)
    async def CrawlLevel(
        self, request: pb.CrawlLevelRequest, context: Context
    ) -> pb.CrawlLevelResponse:
        start = time.perf_counter()
        answer = await self.driver.crawl_level(wire.CRAWL_LEVEL.from_pb(request))
        self._chunk(answer.stream_id, start, len(answer.above), answer.peer_bytes)
        return wire.CRAWL_ANSWER.to_pb(answer)

    def _task_of(self, stream_id: str) -> str:
        task_id = self._stream_tasks.get(stream_id)
        if task_id is not None:
            return task_id
        try:
            task_id = str(self.driver.core.stream(stream_id).task_id)
        except Exception:  # noqa: BLE001 - metrics never fail a call
            return ""
        if len(self._stream_tasks) >= _STREAM_TASKS:
            self._stream_tasks.clear()  # bounded; a cleared stream reads once more
        self._stream_tasks[stream_id] = task_id
        return task_id

    @rpc(Role.ANALYST)
    async def ReservePlan(self, request: pb.PlanRequest, context: Context) -> pb.PlanInfo:
        await self._helper_connected()
        info = await self.driver.reserve_plan(wire.PLAN_REQUEST.from_pb(request))
        self._budget(request.task_id)
        return wire.PLAN_INFO.to_pb(info)

    @rpc(Role.ANALYST)
    async def PrepareNoise(
        self, request: pb.PrepareNoiseRequest, context: Context
    ) -> pb.PrepareNoiseResponse:
        """Joint-noise samples of one shape made ahead (`LeaderDriver.prepare_noise`)."""
        await self._helper_connected()
        status = self.driver.prepare_noise(
            request.task_id, kind_from_pb(request.kind), request.epsilon, int(request.count)
        )
        return pb.PrepareNoiseResponse(
            held=status.held, pending=status.pending, cap=status.cap, task_held=status.task_held
        )

    @rpc(Role.ANALYST)
    async def ListPlans(self, request: pb.TaskRef, context: Context) -> pb.PlanList:
        """The task's active plans (reserved, not ended), as the leader holds them."""
        core = self.driver.core
        core.task(request.task_id)  # NOT_FOUND for an unknown task
        ids = core.plan_ids(request.task_id, "active")
        return pb.PlanList(plans=[wire.PLAN_INFO.to_pb(core.plan_info(p)) for p in ids])

    @rpc(Role.ANALYST)
    async def EndPlan(self, request: pb.PlanRef, context: Context) -> pb.PlanInfo:
        info = await self.driver.end_plan(request.plan_id)
        if self.metrics is not None:
            for task_id in self.driver.core.task_ids():
                self._budget(task_id)
        return wire.PLAN_INFO.to_pb(info)


class VerifyService(pb_grpc.PeerServicer):
    """A helper ingest replica's Peer service: `Verify` only (an upload batch
    with the prep shares of a leader replica paired with it), on the shared
    store; every other Peer call is the main process's (UNIMPLEMENTED here)."""

    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc(Role.LEADER)
    async def Verify(self, request: pb.VerifyBatch, context: Context) -> pb.VerifyResult:
        batch = wire.VERIFY.request.from_pb(request)
        return wire.VERIFY.reply.to_pb(await helper_verify(self.core, batch))


class PeerService(pb_grpc.PeerServicer):
    """The helper's side: only the leader may call it; each RPC is one
    `HelperDriver` call."""

    def __init__(self, driver: HelperDriver, *, metrics: Metrics | None = None) -> None:
        self.driver = driver
        self.metrics = metrics

    def _budget(self, task_id: str) -> None:
        if self.metrics is not None:
            self.metrics.budget(self.driver.core, task_id)

    async def _serve(
        self, call: wire.PeerCall[Q, R], serve: Callable[[Q], Awaitable[R]], request: Any
    ) -> Any:
        """One unary call: the request as a domain value to the driver, its
        answer back as the reply message."""
        return call.reply.to_pb(await serve(call.request.from_pb(request)))

    @rpc(Role.LEADER)
    async def CreateTask(self, request: pb.TaskSpec, context: Context) -> pb.TaskInfo:
        info = await self._serve(wire.CREATE_TASK, self.driver.create_task, request)
        self._budget(request.task_id)
        return info

    @rpc(Role.LEADER)
    async def Digest(self, request: pb.TaskRef, context: Context) -> pb.CollectionDigest:
        return await self._serve(wire.DIGEST, self.driver.digest, request)

    @rpc(Role.LEADER)
    async def CloseCollection(self, request: pb.TaskRef, context: Context) -> pb.CollectionDigest:
        return await self._serve(wire.CLOSE_COLLECTION, self.driver.close_collection, request)

    @rpc(Role.LEADER)
    async def ListReports(self, request: pb.ReportPage, context: Context) -> pb.ReportIds:
        return await self._serve(wire.LIST_REPORTS, self.driver.list_reports, request)

    @rpc(Role.LEADER)
    async def DropReports(self, request: pb.ReportIds, context: Context) -> pb.CollectionDigest:
        return await self._serve(wire.DROP_REPORTS, self.driver.drop_reports, request)

    @rpc(Role.LEADER)
    async def Verify(self, request: pb.VerifyBatch, context: Context) -> pb.VerifyResult:
        return await self._serve(wire.VERIFY, self.driver.verify, request)

    @rpc(Role.LEADER)
    async def CrawlStep(self, request: pb.CrawlStepRequest, context: Context) -> pb.CrawlStepResult:
        return await self._serve(wire.CRAWL, self.driver.crawl_step, request)

    @rpc(Role.LEADER)
    async def MarkAgreed(self, request: pb.CollectionDigest, context: Context) -> pb.TaskInfo:
        return await self._serve(wire.MARK_AGREED, self.driver.mark_agreed, request)

    @rpc(Role.LEADER)
    async def Budget(self, request: pb.TaskRef, context: Context) -> pb.TaskInfo:
        return await self._serve(wire.BUDGET, self.driver.budget, request)

    @rpc(Role.LEADER)
    async def PrepareStream(
        self, request: pb.PrepareStreamRequest, context: Context
    ) -> pb.StreamInfo:
        prepare = wire.PREPARE_STREAM.request.from_pb(request)
        info = await self.driver.prepare_stream(prepare)
        if self.metrics is not None:
            self.metrics.streams.labels(task=request.task_id, kind=prepare.kind.value).inc()
        self._budget(request.task_id)
        return wire.PREPARE_STREAM.reply.to_pb(info)

    @rpc(Role.LEADER)
    async def FailStream(self, request: pb.StreamRef, context: Context) -> pb.StreamInfo:
        return await self._serve(wire.FAIL_STREAM, self.driver.fail_stream, request)

    @rpc(Role.LEADER)
    async def ReservePlan(self, request: pb.PlanRequest, context: Context) -> pb.PlanInfo:
        info = await self._serve(wire.RESERVE_PLAN, self.driver.reserve_plan, request)
        self._budget(request.task_id)
        return info

    @rpc(Role.LEADER)
    async def EndPlan(self, request: pb.PlanRef, context: Context) -> pb.PlanInfo:
        return await self._serve(wire.END_PLAN, self.driver.end_plan, request)

    @rpc(Role.LEADER)
    async def FailPlan(self, request: pb.PlanRef, context: Context) -> pb.PlanInfo:
        return await self._serve(wire.FAIL_PLAN, self.driver.fail_plan, request)

    @rpc(Role.LEADER)
    async def Session(self, request_iterator: Any, context: Context) -> None:
        """A comparison session (see `HelperDriver.serve_session`)."""

        async def read() -> Any:
            frame = await context.read()
            if frame is UNDECODABLE:
                raise InvalidArgument("Session: a frame does not parse as PeerFrame")
            return None if frame is grpc.aio.EOF else frame

        await self.driver.serve_session(context.write, read)


class HelperProbe:
    """The leader's view of the helper: a health check with a short deadline every
    `interval` seconds (`run`), exported as `svtagg_helper_reachable`, logged once
    per change ("helper at ... unreachable: why" / "... reachable again"), and
    read by the leader's own health check."""

    def __init__(
        self,
        port: GrpcHelperPort,
        interval: float = 1.0,
        timeout: float = 2.0,
        gauge: Gauge | None = None,
    ) -> None:
        self.port = port
        self.interval = interval
        self.timeout = timeout
        self.reachable: bool | None = None
        self.detail = "not checked yet"
        #: Set to 1 or 0 after each check (`svtagg_helper_reachable`).
        self.gauge = gauge

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

    def __init__(
        self, helper: HelperProbe | None = None, limiter: RateLimiter | None = None
    ) -> None:
        self.serving = True
        self.helper = helper
        self.limiter = limiter
        self._changed = asyncio.Event()

    async def _rate(self, context: Any) -> None:
        """One request against the caller's rate limit (RESOURCE_EXHAUSTED beyond)."""
        try:
            check_rate(self.limiter, context)
        except RateLimited as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

    def set_serving(self, serving: bool) -> None:
        self.serving = serving
        self._changed.set()

    def _status(self) -> health_pb2.HealthCheckResponse:
        s = health_pb2.HealthCheckResponse
        return s(status=s.SERVING if self.serving else s.NOT_SERVING)

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        if peer_role(context) != Role.LEADER:
            await self._rate(context)
        if request is UNDECODABLE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "undecodable request")
        if request.service not in ("", "svtagg.v1.Ingest", "svtagg.v1.Analyst", "svtagg.v1.Peer"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        if self.serving and self.helper is not None and self.helper.reachable is False:
            s = health_pb2.HealthCheckResponse
            return s(status=s.NOT_SERVING)
        return self._status()

    async def Watch(self, request: Any, context: Any) -> Any:
        """Status changes, for as long as the call is held: only for a caller
        with a certificate (an anonymous watcher on the ingest port is refused;
        Check answers anyone), within its rate limit, and counted among its
        calls in flight (servers/edge/admission.py) while it lasts."""
        if peer_role(context) is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "Watch needs a certificate; Check needs none"
            )
        if request is UNDECODABLE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "undecodable request")
        await self._rate(context)
        while True:
            yield self._status()
            if not self.serving:
                return
            self._changed.clear()
            await self._changed.wait()
