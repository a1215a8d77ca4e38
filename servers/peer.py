"""Leader ↔ helper transport: the comparison protocol's `Channel` over a gRPC
bidirectional stream, and a pool of long-lived comparison sessions.

The base OTs of a garbler/evaluator pair cost about half a second, so the
leader keeps a few sessions open (each one Peer.Session call, set up once) and
runs every chunk on an idle one; a session is discarded after any error, so a
broken protocol state is never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.servers.core import ComparisonParty, PartyFactory
from svtagg.servers.errors import PeerUnavailable
from svtagg.servers.tls import Identity, tls_target

log = logging.getLogger("svtagg.peer")

#: Largest protocol fragment per gRPC message; chunks of 10^5 comparisons send
#: ~350 MB of garbled tables, which would never fit one message.
FRAGMENT = 1 << 20
MAX_MESSAGE_BYTES = 64 << 20
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
#: Deadline of every unary leader → helper call, and of one chunk on a session.
PEER_DEADLINE = 15.0
CHUNK_DEADLINE = 600.0
SETUP_DEADLINE = 60.0


class FrameChannel:
    """`mpc.channel.Channel` over a stream of PeerFrames (fragments only)."""

    def __init__(
        self,
        write: Callable[[pb.PeerFrame], Awaitable[None]],
        read: Callable[[], Awaitable[Any]],
    ) -> None:
        self._write = write
        self._read = read
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, max(len(view), 1), FRAGMENT):
            end = start + FRAGMENT
            await self._write(pb.PeerFrame(fragment=bytes(view[start:end]), more=end < len(view)))
        self.bytes_sent += len(data)
        self.messages_sent += 1

    async def recv(self) -> bytes:
        parts: list[bytes] = []
        while True:
            frame = await self.read_frame()
            if frame.WhichOneof("body") != "fragment":
                raise PeerUnavailable("unexpected frame inside the comparison protocol")
            parts.append(frame.fragment)
            if not frame.more:
                break
        data = b"".join(parts)
        self.bytes_received += len(data)
        self.messages_received += 1
        return data

    async def read_frame(self) -> pb.PeerFrame:
        frame = await self._read()
        if frame is grpc.aio.EOF or frame is None:
            raise PeerUnavailable("peer closed the session")
        return frame  # type: ignore[no-any-return]

    async def write_frame(self, frame: pb.PeerFrame) -> None:
        await self._write(frame)

    @property
    def traffic(self) -> int:
        return self.bytes_sent + self.bytes_received


class PeerClient:
    """The leader's connection to the helper's Peer service."""

    def __init__(self, address: str, identity: Identity) -> None:
        creds = grpc.ssl_channel_credentials(identity.ca, identity.key, identity.cert)
        # Reconnect quickly after a helper restart; calls wait for the connection
        # (wait_for_ready) up to their deadline instead of failing at once.
        self.channel = grpc.aio.secure_channel(address, creds, options=[
            *OPTIONS,
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
            *tls_target("helper"),
        ])
        self.stub = pb_grpc.PeerStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()


class LeaderSession:
    """One set-up garbler on one Peer.Session call."""

    def __init__(self, call: Any, channel: FrameChannel, party: ComparisonParty) -> None:
        self.call = call
        self.channel = channel
        self.party = party

    @classmethod
    async def open(cls, peer: PeerClient, factory: PartyFactory) -> LeaderSession:
        call = peer.stub.Session(wait_for_ready=True)
        sid = os.urandom(16)
        channel = FrameChannel(call.write, call.read)
        try:
            await call.write(pb.PeerFrame(open=pb.SessionOpen(session_id=sid)))
            party = factory("leader", channel, sid)
            await asyncio.wait_for(party.setup(), SETUP_DEADLINE)
        except BaseException:
            call.cancel()
            raise
        return cls(call, channel, party)

    async def status(self) -> pb.PeerStatus:
        frame = await self.channel.read_frame()
        if frame.WhichOneof("body") != "status":
            raise PeerUnavailable("expected the helper's status frame")
        return frame.status

    def close(self) -> None:
        self.call.cancel()


class SessionPool:
    """At most `size` sessions; chunks borrow one and return it only if healthy."""

    def __init__(self, peer: PeerClient, factory: PartyFactory, size: int = 2) -> None:
        self.peer = peer
        self.factory = factory
        self.size = size
        self._idle: list[LeaderSession] = []
        self._count = 0
        self._cond = asyncio.Condition()

    async def acquire(self) -> LeaderSession:
        async with self._cond:
            while True:
                while self._idle:
                    session = self._idle.pop()
                    if not session.call.done():
                        return session
                    self._count -= 1  # the helper restarted or dropped it: open anew
                if self._count < self.size:
                    break
                await self._cond.wait()
            self._count += 1
        try:
            return await LeaderSession.open(self.peer, self.factory)
        except BaseException as exc:
            async with self._cond:
                self._count -= 1
                self._cond.notify()
            if isinstance(exc, grpc.aio.AioRpcError):
                raise PeerUnavailable(f"helper: {exc.code().name} {exc.details()}") from None
            raise

    async def release(self, session: LeaderSession, healthy: bool) -> None:
        async with self._cond:
            if healthy:
                self._idle.append(session)
            else:
                session.close()
                self._count -= 1
            self._cond.notify()

    async def warm(self) -> None:
        """Open one session in the background so the first chunk does not pay setup."""
        with contextlib.suppress(Exception):
            s = await self.acquire()
            await self.release(s, True)

    async def close(self) -> None:
        async with self._cond:
            for s in self._idle:
                s.close()
            self._count -= len(self._idle)
            self._idle.clear()
