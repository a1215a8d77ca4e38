"""The message channel the two-party protocol runs over: opaque byte messages,
with counters, so the same protocol code runs in memory (tests) or over gRPC."""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

#: What a channel sends: bytes, or a view of a buffer the sender reuses after
#: the send returns (garbled tables and OT messages are sent without a copy).
Message = bytes | memoryview


@runtime_checkable
class Channel(Protocol):
    """An ordered, reliable, bidirectional stream of byte messages to one peer."""

    # Read-only here: a channel may compute its counters (servers' SwitchChannel).
    @property
    def bytes_sent(self) -> int: ...

    @property
    def bytes_received(self) -> int: ...

    @property
    def messages_sent(self) -> int: ...

    async def send(self, data: Message) -> None: ...

    async def recv(self) -> bytes: ...


class MemoryChannel:
    """One end of an in-process channel built on two asyncio queues."""

    def __init__(self, inbox: asyncio.Queue[bytes], outbox: asyncio.Queue[bytes]) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0

    @classmethod
    def pair(cls) -> tuple[MemoryChannel, MemoryChannel]:
        """Two connected ends: what one sends, the other receives."""
        a: asyncio.Queue[bytes] = asyncio.Queue()
        b: asyncio.Queue[bytes] = asyncio.Queue()
        return cls(a, b), cls(b, a)

    async def send(self, data: Message) -> None:
        copy = bytes(data)
        self.bytes_sent += len(copy)
        self.messages_sent += 1
        await self._outbox.put(copy)

    async def recv(self) -> bytes:
        data = await self._inbox.get()
        self.bytes_received += len(data)
        self.messages_received += 1
        return data
