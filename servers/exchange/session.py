"""Comparison sessions between the leader and the helper, free of any transport.

A session is an ordered stream of PeerFrames: SessionOpen, then per chunk the
leader's header right followed by its first protocol message (it evaluates:
its OT-extension message), the helper's verdict followed by its garbled
tables, and the leader's one-way result; a close-time chunk ends with the
helper's closing status (`servers.leader.LeaderDriver._exchange`).  The
framing is a protobuf edge: the drivers hand a session domain chunk headers
(`servers.exchange.values`) and get refusals back (`LeaderSession`, `HelperSession`);
the frames never leave this module and the transports that carry them.
`FrameChannel` carries the protocol's byte messages as fragments; the
transport (a gRPC stream or two in-memory queues) only moves frames.  When the
helper offers a data channel (`servers/edge/datachannel.py`), the protocol's
messages travel there instead and only control frames use the stream.  The
base OTs of a session cost ≈ 0.04 s (Ed25519), so the leader keeps a pool of
set-up sessions and discards any session after an error or a refused chunk
(whose first protocol message already went out), so a broken protocol state
is never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from svtagg.dp.errors import InvalidArgument, PeerUnavailable, Refusal
from svtagg.mpc import millionaire, streaming
from svtagg.mpc.channel import Channel, Message
from svtagg.mpc.ot import MAX_SETUP_MESSAGE
from svtagg.mpc.softspoken import parse_ot, server_ot
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import (
    FRAGMENT,
    SETUP_DEADLINE,
    Role,
    refusal_from_status,
    refusal_status,
)
from svtagg.servers.edge.wire import CHUNK_HEADER
from svtagg.servers.exchange.garbling import (
    DEFAULT_GARBLING,
    check_garbling,
    comparison_of,
    garbling_of,
    helper_factory,
    ot_of,
)
from svtagg.servers.exchange.machine import Exchange, Step
from svtagg.servers.exchange.party import ComparisonParty, PartyFactory
from svtagg.servers.exchange.values import ChunkHeader, NoiseBatch, RobustChunk

#: Reads the next frame; returns None at the end of the stream.
ReadFrame = Callable[[], Awaitable[Any]]
WriteFrame = Callable[[pb.PeerFrame], Awaitable[None]]
#: (helper's data port, session id) → a data connection that has announced the id.
ConnectData = Callable[[int, bytes], Awaitable["DataChannel"]]


class DataChannel(Channel, Protocol):
    """A `Channel` that can be closed and bounds what it accepts: what a data
    connection provides."""

    def limit_messages(self, limit: int) -> None: ...

    def close(self) -> None: ...

    @property
    def is_closed(self) -> bool: ...


class DataOffer(Protocol):
    """The helper's data listener, as a session sees it."""

    port: int

    async def claim(self, sid: bytes, timeout: float) -> DataChannel: ...


class FrameChannel:
    """`mpc.channel.Channel` over a stream of PeerFrames (fragments only)."""

    def __init__(self, write: WriteFrame, read: ReadFrame) -> None:
        self._write = write
        self._read = read
        #: Longest message accepted: the base OTs' until a chunk sets its own.
        self.limit = MAX_SETUP_MESSAGE
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        #: A control frame waiting to carry the next message's first fragment.
        self._held: pb.PeerFrame | None = None
        #: The fragment the last control frame read carried, read next.
        self._carried: pb.PeerFrame | None = None

    def hold(self, frame: pb.PeerFrame) -> None:
        """Write `frame` (a header or a status) together with the first
        fragment of the next protocol message sent here (`then_fragment`), or
        alone before any other frame (`flush`, `write_frame`)."""
        self._held = frame

    async def flush(self) -> None:
        """Write the held control frame now, if any."""
        if self._held is not None:
            frame, self._held = self._held, None
            await self._write(frame)

    async def send(self, data: Message) -> None:
        view = memoryview(data)
        for start in range(0, max(len(view), 1), FRAGMENT):
            end = start + FRAGMENT
            part, more = bytes(view[start:end]), end < len(view)
            frame, self._held = self._held, None
            if frame is None:
                frame = pb.PeerFrame(fragment=part, more=more)
            else:
                frame.then_fragment, frame.more = part, more
            await self._write(frame)
        self.bytes_sent += len(data)
        self.messages_sent += 1

    def limit_messages(self, limit: int) -> None:
        """Refuse messages longer than `limit` bytes (the protocol's bound for
        the chunk about to run)."""
        self.limit = limit

    async def recv(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            frame = await self.read_frame()
            if frame.WhichOneof("body") == "status" and not frame.status.ok:
                raise PeerUnavailable(f"helper refused the session: {frame.status.message}")
            if frame.WhichOneof("body") != "fragment":
                raise PeerUnavailable("unexpected frame inside the comparison protocol")
            size += len(frame.fragment)
            # Empty fragments count too: a flood of them is no honest message.
            if size > self.limit or len(parts) > self.limit // FRAGMENT:
                raise PeerUnavailable(f"protocol message over the {self.limit}-byte bound")
            parts.append(frame.fragment)
            if not frame.more:
                break
        data = b"".join(parts)
        self.bytes_received += len(data)
        self.messages_received += 1
        return data

    async def read_frame(self) -> pb.PeerFrame:
        if self._carried is not None:
            frame, self._carried = self._carried, None
            return frame
        frame = await self._read()
        if frame is None:
            raise PeerUnavailable("peer closed the session")
        return self.split(frame)

    def split(self, frame: pb.PeerFrame) -> pb.PeerFrame:
        """A frame read from the transport, without the fragment it carries,
        which the next `read_frame` returns as a frame of its own."""
        if frame.HasField("then_fragment"):
            if frame.WhichOneof("body") not in ("header", "status"):
                raise PeerUnavailable("only a header or a status carries a fragment")
            self._carried = pb.PeerFrame(fragment=frame.then_fragment, more=frame.more)
            frame.ClearField("then_fragment")
            frame.more = False
        return frame

    async def write_frame(self, frame: pb.PeerFrame) -> None:
        await self.flush()
        await self._write(frame)

    @property
    def traffic(self) -> int:
        return self.bytes_sent + self.bytes_received


class SwitchChannel:
    """The protocol's channel when a data connection exists: chunks of more than
    `DATA_LANES` input lanes run on the data connection (bulk bytes, interpreter
    lock released), smaller ones and the base OTs on the session's frames (one
    hop less per message: lower latency).  The protocol calls `select(lanes)`
    with the chunk's public size, so both parties switch alike."""

    #: Above this many evaluator input lanes (about 1.4 KB each at w = 40) a chunk
    #: uses the data connection.  Below a few hundred lanes the session's frames
    #: win (one thread hop less per message); from about 500 the data connection
    #: does (a 1.4 MB message cut into gRPC fragments costs more than the hops):
    #: measured, docs/mpc.md "Peer transport".  Independent of the lane batch
    #: (4,096), from which chunks are also streamed.
    DATA_LANES = 512

    def __init__(self, frames: FrameChannel, data: DataChannel) -> None:
        self.frames = frames
        self.data = data
        self._cur: Channel = frames

    def select(self, lanes: int) -> None:
        self._cur = self.data if lanes > self.DATA_LANES else self.frames

    def limit_messages(self, limit: int) -> None:
        self.frames.limit_messages(limit)
        self.data.limit_messages(limit)

    async def send(self, data: Message) -> None:
        if self._cur is self.data:
            await self.frames.flush()  # a held control frame goes first, alone
        await self._cur.send(data)

    async def recv(self) -> bytes:
        return await self._cur.recv()

    async def send_pieces(self, total: int, pieces: Iterator[memoryview]) -> None:
        if self._cur is self.data:
            await self.frames.flush()
        await streaming.send_pieces(self._cur, total, pieces)

    async def recv_progressive(self) -> streaming.Arriving:
        return await streaming.recv_progressive(self._cur)

    @property
    def bytes_sent(self) -> int:
        return self.frames.bytes_sent + self.data.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.frames.bytes_received + self.data.bytes_received

    @property
    def messages_sent(self) -> int:
        return self.frames.messages_sent + self.data.messages_sent


class _Wrapping:
    """A protocol channel around `inner`: lane selection, message limits and the
    byte and message counts are inner's."""

    inner: Channel

    def select(self, lanes: int) -> None:
        select = getattr(self.inner, "select", None)
        if select is not None:
            select(lanes)

    def limit_messages(self, limit: int) -> None:
        self.inner.limit_messages(limit)  # type: ignore[attr-defined]

    @property
    def bytes_sent(self) -> int:
        return self.inner.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.inner.bytes_received

    @property
    def messages_sent(self) -> int:
        return self.inner.messages_sent


class VerdictChannel(_Wrapping):
    """The leader's protocol channel: a chunk's first protocol message goes out
    right behind its header, without waiting for the helper's go.  Before the
    chunk's first reply is read, the exchange's due steps are taken (its MARK,
    durable while the message is in flight, unless it marked first: D1 in
    `servers.exchange.machine`), then the helper's verdict is read from the
    control frames: a refusal is raised there, ahead of any tables."""

    def __init__(self, frames: FrameChannel, inner: Channel) -> None:
        self.frames = frames
        self.inner = inner
        self._exchange: Exchange | None = None
        self._mark: Callable[[], None] | None = None

    def arm(self, exchange: Exchange, mark: Callable[[], None] | None) -> None:
        """The next reply is the first of `exchange`'s chunk: read the verdict
        first, after `mark` if its MARK is still due."""
        self._exchange = exchange
        self._mark = mark

    @property
    def armed(self) -> bool:
        return self._exchange is not None

    async def verdict(self) -> None:
        """The mark, then the helper's verdict on the chunk (raised if refused)."""
        x, mark, self._exchange, self._mark = self._exchange, self._mark, None, None
        assert x is not None
        await self.frames.flush()  # the header, if no protocol message carried it
        if x.may(Step.MARK):
            assert mark is not None, "a chunk that marks gives its mark"
            mark()
            x.take(Step.MARK)
        status = await _status(self.frames)
        if not status.ok:
            raise refusal_from_status(status, "helper: ")
        x.take(Step.READ_VERDICT)

    async def send(self, data: Message) -> None:
        await self.inner.send(data)

    async def send_pieces(self, total: int, pieces: Iterator[memoryview]) -> None:
        await streaming.send_pieces(self.inner, total, pieces)

    async def recv(self) -> bytes:
        if self._exchange is not None:
            await self.verdict()
        return await self.inner.recv()


class GoChannel(_Wrapping):
    """The helper's protocol channel: before a chunk's first protocol message
    leaves, its exchange takes SEND_VERDICT and the go is held
    (`HelperSession.go`), so that it travels in the frame of the tables'
    first fragment."""

    def __init__(self, inner: Channel) -> None:
        self.inner = inner
        self._exchange: Exchange | None = None
        self._go: Callable[[], None] | None = None

    def arm(self, exchange: Exchange, go: Callable[[], None]) -> None:
        self._exchange = exchange
        self._go = go

    def release(self) -> None:
        """Send the go now (held for the next frame), unless a send has."""
        x, go, self._exchange, self._go = self._exchange, self._go, None, None
        if x is not None and go is not None:
            x.take(Step.SEND_VERDICT)  # OutOfOrder before the MARK (D1)
            go()

    async def send(self, data: Message) -> None:
        self.release()
        await self.inner.send(data)

    async def send_pieces(self, total: int, pieces: Iterator[memoryview]) -> None:
        self.release()
        await streaming.send_pieces(self.inner, total, pieces)

    async def recv(self) -> bytes:
        return await self.inner.recv()

    async def recv_progressive(self) -> streaming.Arriving:
        return await streaming.recv_progressive(self.inner)


class LeaderSession:
    """One set-up evaluator on one session; `cancel` ends the session, `done`
    says whether the transport has ended it.  `channel` carries the control
    frames; the evaluator runs on `data` when the helper offered a data
    channel, through `verdicts` (which reads the helper's go first)."""

    def __init__(
        self,
        channel: FrameChannel,
        party: ComparisonParty,
        cancel: Callable[[], Any],
        done: Callable[[], bool],
        verdicts: VerdictChannel,
        data: DataChannel | None = None,
    ) -> None:
        self.channel = channel
        self.party = party
        self.verdicts = verdicts
        self.data = data
        self._cancel = cancel
        self._done = done

    @classmethod
    async def open(
        cls,
        write: WriteFrame,
        read: ReadFrame,
        cancel: Callable[[], Any],
        done: Callable[[], bool],
        factory: PartyFactory,
        connect_data: ConnectData | None = None,
    ) -> LeaderSession:
        """SessionOpen with a fresh id, the data channel if the helper offers one,
        then the base OTs (all within SETUP_DEADLINE)."""
        sid = os.urandom(16)
        channel = FrameChannel(write, read)
        data: DataChannel | None = None

        def abort() -> None:
            cancel()
            if data is not None:
                data.close()

        try:
            await write(
                pb.PeerFrame(
                    open=pb.SessionOpen(
                        session_id=sid,
                        data_channel=bool(connect_data),
                        ot_extension=ot_of(factory),
                        garbling=garbling_of(factory),
                        # Empty for garbled: the wire of a garbled deployment is unchanged.
                        comparison_path=millionaire.announce(comparison_of(factory)),
                    )
                )
            )
            if connect_data is not None:
                offer = await asyncio.wait_for(_status(channel), SETUP_DEADLINE)
                if not offer.ok:
                    raise PeerUnavailable(f"helper refused the session: {offer.message}")
                if offer.data_port:
                    data = await asyncio.wait_for(
                        connect_data(offer.data_port, sid), SETUP_DEADLINE
                    )
            verdicts = VerdictChannel(
                channel, SwitchChannel(channel, data) if data is not None else channel
            )
            party = factory(Role.LEADER, verdicts, sid)
            await asyncio.wait_for(party.setup(), SETUP_DEADLINE)
        except BaseException:
            abort()
            raise
        return cls(channel, party, abort, done, verdicts, data)

    async def send_header(
        self, exchange: Exchange, header: ChunkHeader, mark: Callable[[], None] | None = None
    ) -> None:
        """Start `exchange`'s chunk: its header, for the helper to check and
        mark; a small chunk's header waits for the protocol's first message and
        carries it (`FOLD_LANES`), a larger one's leaves now, so that the helper
        marks and draws while the leader prepares that message.  Before the
        first reply is read: `mark`, if the exchange's MARK is still due, and
        then the helper's verdict."""
        frame = pb.PeerFrame(header=CHUNK_HEADER.to_pb(header))
        if _lanes(header) <= FOLD_LANES:
            self.channel.hold(frame)
        else:
            await self.channel.write_frame(frame)
        # Sent (or handed to the protocol's first message) only now: a write
        # that failed leaves the exchange uncommitted (D4 fails nothing).
        exchange.take(Step.SEND_HEADER)
        self.verdicts.arm(exchange, mark)

    async def verdict(self) -> None:
        """The helper's verdict on the chunk, unless the protocol has read it
        (a refusal raised)."""
        if self.verdicts.armed:
            await self.verdicts.verdict()

    async def status(self) -> Refusal | None:
        """The helper's closing status of a close-time chunk: None when it has
        recorded the result, else its refusal."""
        status = await _status(self.channel)
        return None if status.ok else refusal_from_status(status, "helper: ")

    @property
    def traffic(self) -> int:
        """Bytes both ways so far, control frames and data channel together."""
        extra = 0 if self.data is None else self.data.bytes_sent + self.data.bytes_received
        return self.channel.traffic + extra

    def done(self) -> bool:
        return self._done() or (self.data is not None and self.data.is_closed)

    def close(self) -> None:
        self._cancel()


#: Chunks of at most this many queries (coordinates, samples) send their
#: header in the frame of the protocol's first message: one frame less, the
#: fixed cost of a small chunk; a larger chunk's header goes ahead of it.
FOLD_LANES = 64


def _lanes(header: ChunkHeader) -> int:
    if isinstance(header, RobustChunk):
        return header.coord_hi - header.coord_lo
    if isinstance(header, NoiseBatch):
        return header.count
    return len(header.queries.index)


async def _status(channel: FrameChannel) -> pb.PeerStatus:
    frame = await channel.read_frame()
    if frame.WhichOneof("body") != "status":
        raise PeerUnavailable("expected the helper's status frame")
    return frame.status


_OK = pb.PeerFrame(status=pb.PeerStatus(ok=True))
#: What a discarded session's data connection may still carry: its own hard cap.
DRAIN_LIMIT = 1 << 30


class HelperSession:
    """The helper's end of a session: the leader's SessionOpen (and the data
    channel, when it asks for one), then one chunk header at a time, each
    answered by the helper's verdicts."""

    def __init__(
        self, write: WriteFrame, read: ReadFrame, factory: PartyFactory | None = None
    ) -> None:
        self._write = write
        self._read = read
        self.channel = FrameChannel(write, read)
        #: The helper's party factory, under the leader's path rule once accepted.
        self.factory = factory
        self.comparison_path = "garbled"

    async def accept(
        self, offer: DataOffer | None, garbling: str = DEFAULT_GARBLING, ot: str | None = None
    ) -> tuple[bytes, DataChannel | None]:
        """The session's id, and its data connection if the leader asked for one
        and the helper offers it (`offer`); refused (InvalidArgument) if the
        leader garbles under another scheme than this helper's `garbling`, or
        runs another OT extension than `ot` (None: `server_ot()`).  The
        leader's comparison path rule is kept in `comparison_path` (`party`
        makes the helper's factory for it)."""
        first = await self.channel.read_frame()
        if first.WhichOneof("body") != "open" or len(first.open.session_id) != 16:
            raise InvalidArgument("a session starts with SessionOpen (16-byte id)")
        sid = first.open.session_id
        try:
            theirs, own = first.open.ot_extension, ot or server_ot()
            if theirs and _ot_of(theirs) != parse_ot(own):
                raise InvalidArgument(
                    f"the leader's OT extension {theirs!r} is not this helper's {own!r} "
                    "(start both servers with the same --ot)"
                )
            check_garbling(first.open.garbling, garbling)
            try:
                self.comparison_path = millionaire.announced_rule(first.open.comparison_path)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
            if self.factory is not None:
                self.factory = helper_factory(self.factory, self.comparison_path)
        except InvalidArgument as exc:  # told to the leader, whatever it reads next
            await self._write(pb.PeerFrame(status=refusal_status(exc)))
            raise
        data: DataChannel | None = None
        if first.open.data_channel:
            port = offer.port if offer is not None else 0
            await self._write(pb.PeerFrame(status=pb.PeerStatus(ok=True, data_port=port)))
            if offer is not None:
                data = await offer.claim(sid, SETUP_DEADLINE)
        return sid, data

    async def next_header(self, stopping: asyncio.Event) -> ChunkHeader | None:
        """The next chunk's header, or None when the session ends, or once
        `stopping` is set while the session is idle (so a stopping helper ends
        its sessions at once instead of after the grace)."""
        reading = asyncio.ensure_future(self._read())
        stop = asyncio.ensure_future(stopping.wait())
        done, _ = await asyncio.wait({reading, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if reading not in done:
            reading.cancel()
            return None
        frame = reading.result()
        if frame is None:
            return None
        frame = self.channel.split(frame)
        if frame.WhichOneof("body") != "header":
            raise InvalidArgument("expected a chunk header")
        return CHUNK_HEADER.from_pb(frame.header)

    async def ok(self) -> None:
        """Go ahead with the chunk; or, after it, its result is recorded."""
        await self.channel.write_frame(_OK)

    def go(self) -> None:
        """Go ahead with the chunk, in the frame of the next protocol message
        (`FrameChannel.hold`; `flush` sends it alone)."""
        self.channel.hold(pb.PeerFrame(status=pb.PeerStatus(ok=True)))

    async def flush(self) -> None:
        await self.channel.flush()

    async def refuse(self, exc: BaseException) -> None:
        """Refuse the chunk; then `discard` the session."""
        await self.channel.write_frame(pb.PeerFrame(status=refusal_status(exc)))

    async def discard(self, data: DataChannel | None) -> None:
        """After a refusal: the leader's first protocol message of the chunk was
        sent behind the header, so the session's protocol state is spent (the
        leader counted a chunk this side did not).  Read and drop whatever comes,
        on the frames and the data connection, until the leader ends the session
        (it does on reading the refusal), so its sends never block unread."""

        async def frames() -> None:
            with contextlib.suppress(Exception):
                while await self._read() is not None:
                    pass

        async def bulk(conn: DataChannel) -> None:
            conn.limit_messages(DRAIN_LIMIT)
            with contextlib.suppress(Exception):
                while True:
                    await conn.recv()

        drain = asyncio.ensure_future(bulk(data)) if data is not None else None
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(frames(), SETUP_DEADLINE)
        finally:
            if drain is not None:
                drain.cancel()


class SessionPool:
    """At most `size` sessions; chunks borrow one and return it only if healthy."""

    def __init__(self, open_session: Callable[[], Awaitable[LeaderSession]], size: int = 2) -> None:
        self.open_session = open_session
        self.size = size
        self._idle: list[LeaderSession] = []
        self._count = 0
        self._cond = asyncio.Condition()

    async def acquire(self) -> LeaderSession:
        async with self._cond:
            while True:
                while self._idle:
                    session = self._idle.pop()
                    if not session.done():
                        return session
                    self._count -= 1  # the helper restarted or dropped it: open anew
                if self._count < self.size:
                    break
                await self._cond.wait()
            self._count += 1
        try:
            return await self.open_session()
        except BaseException:
            async with self._cond:
                self._count -= 1
                self._cond.notify()
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


def _ot_of(spec: str) -> tuple[str, int] | None:
    """The parsed OT extension a leader announces, None if this helper does not know it."""
    try:
        return parse_ot(spec)
    except ValueError:
        return None
