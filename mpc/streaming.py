"""Streamed chunks: the garbler's tables go out lane batch by lane batch while
it garbles, and the evaluator pulls them from a worker thread as they arrive
(`protocol.ComparisonGarbler._run` and `ComparisonEvaluator._run`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import Any, Protocol

from svtagg.mpc.aes import Blocks
from svtagg.mpc.channel import Channel
from svtagg.mpc.softspoken import SoftSpokenReceiver, SoftSpokenSender


class Arriving(Protocol):
    """A message read as it arrives (`servers.edge.datachannel.Arriving`)."""

    size: int
    buffer: Any

    def wait(self, end: int) -> memoryview: ...


class Arrived:
    """A message already whole, read like one still arriving."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.buffer = data
        self.size = len(data)

    def wait(self, end: int) -> memoryview:
        return memoryview(self.buffer)[:end]


async def send_pieces(channel: Channel, total: int, pieces: Iterator[memoryview]) -> None:
    """One message made piece by piece: the channel's `send_pieces` where it has
    one (a wrapper passes it on to the channel it sends on), else one `send` of
    the pieces joined (the same bytes)."""
    fn = getattr(channel, "send_pieces", None)
    if fn is not None:
        await fn(total, pieces)
    else:
        await channel.send(b"".join(bytes(p) for p in pieces))


async def recv_progressive(channel: Channel) -> Arriving:
    """The next message, readable by prefixes as it arrives where the channel
    can (`recv_progressive`), else whole."""
    fn = getattr(channel, "recv_progressive", None)
    if fn is not None:
        return await fn()  # type: ignore[no-any-return]
    return Arrived(await channel.recv())


async def send_ot_message(
    channel: Channel, ext: Any, choices: list[Any], nonce: int, streamed: bool
) -> None:
    """The evaluator's OT-extension message of a chunk: in a streamed chunk, on a
    channel that can, piece by piece (each lane batch's piece travels while the
    next is made; the same bytes in one message), else whole."""
    if streamed and hasattr(channel, "send_pieces") and isinstance(ext, SoftSpokenReceiver):
        await send_pieces(channel, *ext.u_pieces(choices, nonce))
    else:
        await channel.send(ext.u_message(choices, nonce))


async def ot_labels(
    channel: Channel, ext: Any, widths: list[int], nonce: int, streamed: bool
) -> Iterator[Blocks]:
    """The garbler's labels of a chunk from the evaluator's OT message: in a
    streamed chunk, on a channel that can, read on while the first lane batches
    are garbled (each batch's labels wait for their piece), else once it is in."""
    if streamed and hasattr(channel, "recv_progressive") and isinstance(ext, SoftSpokenSender):
        msg = await recv_progressive(channel)
        return ext.labels(msg.buffer, widths, nonce, ready=msg.wait)
    labels: Iterator[Blocks] = ext.labels(await channel.recv(), widths, nonce)
    return labels


class _OrderedSends:
    """Sends submitted from any thread go out one after another, in order (a
    channel's `send` is not safe to run concurrently with itself)."""

    def __init__(self, channel: Channel, loop: asyncio.AbstractEventLoop) -> None:
        self._channel = channel
        self._loop = loop
        self._last: asyncio.Future[None] | None = None

    def submit_threadsafe(self, data: memoryview) -> None:
        self._loop.call_soon_threadsafe(self.submit, data)

    def submit(self, data: bytes | memoryview) -> None:
        self._last = asyncio.ensure_future(self._send(self._last, data))

    async def _send(self, before: asyncio.Future[None] | None, data: bytes | memoryview) -> None:
        if before is not None:
            await before
        await self._channel.send(data)  # type: ignore[arg-type]

    async def wait(self) -> None:
        if self._last is not None:
            await self._last

    def cancel(self) -> None:
        if self._last is not None:
            self._last.cancel()


class _Parts:
    """The evaluator's side of a streamed chunk: a task receives the garbler's
    parts as they come; the circuit, running in a worker thread, pulls them.
    The last part ends with the `nd` output-decoding bytes."""

    def __init__(self, channel: Channel, parts: int, nd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self._parts = parts
        self._nd = nd
        self._pulled = 0
        self._aborted = False
        self.decoding: memoryview | None = None
        self._task = asyncio.ensure_future(self._receive(channel))

    async def _receive(self, channel: Channel) -> None:
        try:
            for _ in range(self._parts):
                self._inbox.put_nowait(await channel.recv())
        except BaseException as exc:  # the puller must not wait forever
            self._inbox.put_nowait(exc if isinstance(exc, Exception) else ConnectionError())
            raise

    def pull(self) -> memoryview:
        """The next part's tables (called from the worker thread)."""
        if self._pulled == self._parts:
            raise ValueError("garbled tables too short for the circuit")
        fut = asyncio.run_coroutine_threadsafe(self._inbox.get(), self._loop)
        while True:  # wake up now and then: a closed loop must not strand this thread
            try:
                item = fut.result(timeout=1.0)
                break
            except concurrent.futures.TimeoutError:
                if self._aborted or self._loop.is_closed():
                    fut.cancel()
                    raise ConnectionError("chunk aborted") from None
        return self._accept(item)

    def _accept(self, item: bytes | BaseException) -> memoryview:
        if isinstance(item, BaseException):
            raise item
        self._pulled += 1
        msg = memoryview(item)
        if self._pulled < self._parts:
            return msg
        if len(msg) < self._nd or (len(msg) - self._nd) % 16:
            raise ValueError("malformed garbled-circuit message")
        self.decoding = msg[len(msg) - self._nd :]
        return msg[: len(msg) - self._nd]

    async def finish(self) -> memoryview:
        """After the circuit: every part was used; the decoding bits.  A circuit
        with no gates after the sign test never pulls the last part, which then
        must hold the decoding bits alone."""
        if self._pulled == self._parts - 1:
            if len(self._accept(await self._inbox.get())):
                raise ValueError("garbled tables longer than the circuit")
        await self._task
        if self._pulled != self._parts or self.decoding is None:
            raise ValueError("garbled tables longer than the circuit")
        return self.decoding

    def abort(self) -> None:
        self._aborted = True
        self._task.cancel()
        self._inbox.put_nowait(ConnectionError("chunk aborted"))
