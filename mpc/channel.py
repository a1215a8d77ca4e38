"""The message channel the two-party protocol runs over: opaque byte messages,
with counters, so the same protocol code runs in memory (tests) or over gRPC."""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable


@runtime_checkable
class Channel(Protocol):
    """An ordered, reliable, bidirectional stream of byte messages to one peer."""

    bytes_sent: int
    bytes_received: int
    messages_sent: int

    async def send(self, data: bytes) -> None: ...

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

    async def send(self, data: bytes) -> None:
        data = bytes(data)
        self.bytes_sent += len(data)
        self.messages_sent += 1
        await self._outbox.put(data)

    async def recv(self) -> bytes:
        data = await self._inbox.get()
        self.bytes_received += len(data)
        self.messages_received += 1
        return data
