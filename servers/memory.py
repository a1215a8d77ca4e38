"""An in-memory `HelperPort`: the helper driver in the same process, sessions over
two asyncio queues of frames.  The one-process reference the gRPC deployment is
tested against (no TLS, no sockets, no subprocesses); it also lets a test drop
the helper in the middle of a chunk."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from svtagg.dp.errors import PeerUnavailable
from svtagg.dp.task import TaskSpec
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.edge import wire
from svtagg.servers.exchange.party import PartyFactory
from svtagg.servers.exchange.session import LeaderSession
from svtagg.servers.exchange.values import (
    Agreement,
    CrawlStep,
    CrawlStepResult,
    PlanInfo,
    PlanRequest,
    PrepareStream,
    ReportIds,
    ReportPage,
    ReportSet,
    StreamInfo,
    TaskInfo,
    VerifyBatch,
    VerifyResult,
)
from svtagg.servers.helper import HelperDriver

_END = None  # queued when one side ends the session
Q = TypeVar("Q")
R = TypeVar("R")

#: Sees every message as the wire carries it: (what, name, bytes), what being
#: "call" / "reply" (a unary call to the helper and its answer, named by the
#: RPC) or "to_helper" / "to_leader" (a session frame, named "frame").
Tap = Callable[[str, str, bytes], None]


class MemoryHelperPort:
    """Calls `helper` directly.  Every call goes domain value → protobuf →
    bytes → protobuf → domain value, both ways, as over gRPC, so that the
    exchange is exactly what the wire would carry."""

    def __init__(self, helper: HelperDriver, tap: Tap | None = None) -> None:
        self.helper = helper
        self.tap = tap
        self.sessions: list[asyncio.Task[None]] = []
        self.available = True

    async def _call(
        self, call: wire.PeerCall[Q, R], request: Q, serve: Callable[[Q], Awaitable[R]]
    ) -> R:
        if not self.available:
            raise PeerUnavailable("helper: UNAVAILABLE (in-memory helper is down)")
        sent = call.request.encode(request)
        if self.tap is not None:
            self.tap("call", call.name, sent)
        answer = call.reply.encode(await serve(call.request.decode(sent)))
        if self.tap is not None:
            self.tap("reply", call.name, answer)
        return call.reply.decode(answer)

    async def create_task(self, spec: TaskSpec, timeout: float | None = None) -> TaskInfo:
        return await self._call(wire.CREATE_TASK, spec, self.helper.create_task)

    async def digest(self, task_id: str, timeout: float | None = None) -> ReportSet:
        return await self._call(wire.DIGEST, task_id, self.helper.digest)

    async def close_collection(self, task_id: str, timeout: float | None = None) -> ReportSet:
        return await self._call(wire.CLOSE_COLLECTION, task_id, self.helper.close_collection)

    async def list_reports(self, page: ReportPage, timeout: float | None = None) -> ReportIds:
        return await self._call(wire.LIST_REPORTS, page, self.helper.list_reports)

    async def drop_reports(self, ids: ReportIds, timeout: float | None = None) -> ReportSet:
        return await self._call(wire.DROP_REPORTS, ids, self.helper.drop_reports)

    async def mark_agreed(self, agreement: Agreement, timeout: float | None = None) -> TaskInfo:
        return await self._call(wire.MARK_AGREED, agreement, self.helper.mark_agreed)

    async def verify(self, batch: VerifyBatch, timeout: float | None = None) -> VerifyResult:
        return await self._call(wire.VERIFY, batch, self.helper.verify)

    async def crawl_step(self, step: CrawlStep, timeout: float | None = None) -> CrawlStepResult:
        return await self._call(wire.CRAWL, step, self.helper.crawl_step)

    async def budget(self, task_id: str, timeout: float | None = None) -> TaskInfo:
        return await self._call(wire.BUDGET, task_id, self.helper.budget)

    async def prepare_stream(
        self, request: PrepareStream, timeout: float | None = None
    ) -> StreamInfo:
        return await self._call(wire.PREPARE_STREAM, request, self.helper.prepare_stream)

    async def fail_stream(self, stream_id: str, timeout: float | None = None) -> StreamInfo:
        return await self._call(wire.FAIL_STREAM, stream_id, self.helper.fail_stream)

    async def reserve_plan(self, request: PlanRequest, timeout: float | None = None) -> PlanInfo:
        return await self._call(wire.RESERVE_PLAN, request, self.helper.reserve_plan)

    async def end_plan(self, plan_id: str, timeout: float | None = None) -> PlanInfo:
        return await self._call(wire.END_PLAN, plan_id, self.helper.end_plan)

    async def fail_plan(self, plan_id: str, timeout: float | None = None) -> PlanInfo:
        return await self._call(wire.FAIL_PLAN, plan_id, self.helper.fail_plan)

    async def open_session(self, factory: PartyFactory) -> LeaderSession:
        if not self.available:
            raise PeerUnavailable("helper: UNAVAILABLE (in-memory helper is down)")
        to_helper: asyncio.Queue[pb.PeerFrame | None] = asyncio.Queue()
        to_leader: asyncio.Queue[pb.PeerFrame | None] = asyncio.Queue()

        async def serve() -> None:
            try:
                await self.helper.serve_session(
                    self._tapped("to_leader", to_leader.put), to_helper.get
                )
            finally:
                await to_leader.put(_END)

        task = asyncio.ensure_future(serve())
        self.sessions.append(task)

        async def read() -> pb.PeerFrame | None:
            frame = await to_leader.get()
            if frame is _END:
                await to_leader.put(_END)  # every later read sees the end too
            return frame

        def cancel() -> None:
            task.cancel()

        return await LeaderSession.open(
            self._tapped("to_helper", to_helper.put), read, cancel, task.done, factory
        )

    def _tapped(
        self, what: str, put: Callable[[pb.PeerFrame], Awaitable[None]]
    ) -> Callable[[pb.PeerFrame], Awaitable[None]]:
        tap = self.tap
        if tap is None:
            return put

        async def send(frame: pb.PeerFrame) -> None:
            tap(what, "frame", frame.SerializeToString())
            await put(frame)

        return send

    async def close(self) -> None:
        for task in self.sessions:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
