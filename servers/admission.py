"""Admission: how many calls a server holds at once, per caller and in all,
decided when a call starts — before its request message is read.

gRPC reads a unary request whole before the method runs, so a bound checked
inside the method comes after the memory is spent (24 calls of 60 MiB took a
server to 5.5 GB).  `proto.wire.add_service` therefore registers every method
as request-streaming on the server side (the wire is the same) and runs
`Admission.admit` first; only an admitted call reads its message.

The bounds (`CallLimits`, stated in docs/services.md):

- calls in flight per caller (unary and streaming alike: a held AskStream or
  Health.Watch counts for as long as it is open), and in all;
- Upload calls reading or processing their batch, per caller and in all.  An
  Upload beyond those waits for a slot (its bytes stay in the peer's send
  buffer under HTTP/2 flow control, not in this server's memory), within the
  per-caller and total call bounds above, which refuse at once.

A caller is its certificate's hash, or its address on the certificate-less
ingest port (`rpc.caller_identity`).  The leader's calls to the helper are not
counted: it is the one holder of the leader certificate and drives the helper
at protocol speed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from svtagg.dp.errors import ResourceExhausted
from svtagg.proto.vocab import Role
from svtagg.servers.rpc import abort_with, caller_identity, peer_role

#: Methods whose request is an upload batch (up to the message cap each).
UPLOAD_METHODS = frozenset({"/svtagg.v1.Ingest/Upload"})


@dataclass(frozen=True)
class CallLimits:
    """A server's call bounds (see the module's text); a bound <= 0 is off."""

    #: Calls in flight per caller, streaming calls included.
    calls_per_caller: int = 64
    #: Calls in flight in all (the leader's calls to the helper not counted).
    calls_total: int = 4096
    #: Upload calls reading or processing a batch, per caller.
    uploads_per_caller: int = 2
    #: Upload calls reading or processing a batch, in all: with the 64 MiB
    #: message cap, the bound on what uploads hold in memory at once.
    uploads_total: int = 8


class Admission:
    """Counts the calls in flight and admits or refuses each new one."""

    def __init__(self, limits: CallLimits | None = None) -> None:
        self.limits = limits or CallLimits()
        self._calls: dict[str, int] = {}
        self._total = 0
        self._uploads = asyncio.Semaphore(max(1, self.limits.uploads_total))
        self._caller_uploads: dict[str, _Slots] = {}

    def in_flight(self, caller: str | None = None) -> int:
        """Calls now held (of `caller`, or in all)."""
        return self._total if caller is None else self._calls.get(caller, 0)

    def _refusal(self, method: str, caller: str) -> ResourceExhausted | None:
        lim = self.limits
        if 0 < lim.calls_per_caller <= self._calls.get(caller, 0):
            return ResourceExhausted(
                f"at most {lim.calls_per_caller} calls in flight per caller; "
                "end some (or wait for them) and retry"
            )
        if 0 < lim.calls_total <= self._total:
            return ResourceExhausted(
                f"this server holds its limit of {lim.calls_total} calls; retry later"
            )
        return None

    @contextlib.asynccontextmanager
    async def admit(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Hold a place for one call of `method` while the body runs, or end the
        call with RESOURCE_EXHAUSTED (nothing read, nothing held)."""
        if peer_role(context) == Role.LEADER:
            yield
            return
        caller = caller_identity(context)
        refused = self._refusal(method, caller)
        if refused is not None:
            await abort_with(context, refused, method.rsplit("/", 1)[-1])
        self._calls[caller] = self._calls.get(caller, 0) + 1
        self._total += 1
        try:
            if method in UPLOAD_METHODS and self.limits.uploads_total > 0:
                async with self._upload_slot(caller):
                    yield
            else:
                yield
        finally:
            self._total -= 1
            left = self._calls[caller] - 1
            if left:
                self._calls[caller] = left
            else:
                del self._calls[caller]

    @contextlib.asynccontextmanager
    async def _upload_slot(self, caller: str) -> AsyncIterator[None]:
        """The caller's upload slot, then one of the server's (in that order, so
        a caller waiting on its own slot holds none of the server's)."""
        per = self.limits.uploads_per_caller
        if per <= 0:
            async with self._uploads:
                yield
            return
        entry = self._caller_uploads.setdefault(caller, _Slots(asyncio.Semaphore(per)))
        entry.users += 1
        try:
            async with entry.slots, self._uploads:
                yield
        finally:
            entry.users -= 1
            if not entry.users:  # no call of this caller holds or awaits it
                del self._caller_uploads[caller]


@dataclass
class _Slots:
    """One caller's upload slots and how many of its calls hold or await one."""

    slots: asyncio.Semaphore
    users: int = 0
