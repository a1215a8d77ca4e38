"""An in-memory `HelperPort`: the helper driver in the same process, sessions over
two asyncio queues of frames.  The one-process reference the gRPC deployment is
tested against (no TLS, no sockets, no subprocesses); it also lets a test drop
the helper in the middle of a chunk."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from svtagg.dp.errors import PeerUnavailable
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.core import PartyFactory
from svtagg.servers.helper import HelperDriver
from svtagg.servers.port import PeerMethod
from svtagg.servers.session import LeaderSession

_END = None  # queued when one side ends the session

#: Sees every message as the wire carries it: (what, name, bytes), what being
#: "call" / "reply" (a unary call to the helper and its answer, named by the
#: RPC) or "to_helper" / "to_leader" (a session frame, named "frame").
Tap = Callable[[str, str, bytes], None]


class MemoryHelperPort:
    """Calls `helper` directly.  Messages pass through serialisation so that the
    exchange is exactly what the wire would carry."""

    def __init__(self, helper: HelperDriver, tap: Tap | None = None) -> None:
        self.helper = helper
        self.tap = tap
        self.sessions: list[asyncio.Task[None]] = []
        self.available = True

    async def call(self, method: PeerMethod, request: Any, timeout: float | None = None) -> Any:
        if not self.available:
            raise PeerUnavailable("helper: UNAVAILABLE (in-memory helper is down)")
        sent = request.SerializeToString()
        if self.tap is not None:
            self.tap("call", method.value, sent)
        reply = await getattr(self.helper, method.value)(type(request).FromString(sent))
        answer = reply.SerializeToString()
        if self.tap is not None:
            self.tap("reply", method.value, answer)
        return type(reply).FromString(answer)

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
