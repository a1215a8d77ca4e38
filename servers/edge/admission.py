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
from svtagg.servers.edge.rpc import ANONYMOUS, abort_with, caller_identity, peer_role, refuse_role

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
    #: Other unary requests being read at once, per caller and in all: any
    #: message may be 64 MiB, so reading is bounded as uploads are (a read
    #: takes its place only while the request arrives, at most READ_SECONDS).
    reads_per_caller: int = 2
    reads_total: int = 8
    #: Calls in flight of callers without a certificate (the ingest port), in
    #: all: they cannot take the places of certificate holders.
    anonymous_total: int = 1024


class Admission:
    """Counts the calls in flight and admits or refuses each new one."""

    def __init__(self, limits: CallLimits | None = None) -> None:
        self.limits = limits or CallLimits()
        self._calls: dict[str, int] = {}
        self._total = 0
        self._uploads = asyncio.Semaphore(max(1, self.limits.uploads_total))
        self._caller_uploads: dict[str, _Slots] = {}
        self._reads = asyncio.Semaphore(max(1, self.limits.reads_total))
        self._caller_reads: dict[str, _Slots] = {}
        self._anonymous = 0

    def in_flight(self, caller: str | None = None) -> int:
        """Calls now held (of `caller`, or in all)."""
        return self._total if caller is None else self._calls.get(caller, 0)

    def _refusal(self, method: str, caller: str) -> ResourceExhausted | None:
        lim = self.limits
        if caller.startswith("addr:") and 0 < lim.anonymous_total <= self._anonymous:
            return ResourceExhausted(
                f"this server holds its limit of {lim.anonymous_total} calls without a "
                "certificate; retry later"
            )
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
    async def admit(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        roles: tuple[str, ...] | None = None,
    ) -> AsyncIterator[None]:
        """Hold a place for one call of `method` while the body runs, or end the
        call (nothing read, nothing held): UNAUTHENTICATED for a caller whose
        role the method does not serve (`roles`, from `rpc`), RESOURCE_EXHAUSTED
        beyond a bound."""
        role = peer_role(context)
        if role == Role.LEADER:
            yield
            return
        name = method.rsplit("/", 1)[-1]
        if roles is not None and (role or ANONYMOUS) not in roles:
            await refuse_role(context, name, roles, role or ANONYMOUS)
        caller = caller_identity(context)
        refused = self._refusal(method, caller)
        if refused is not None:
            await abort_with(context, refused, name)
        anonymous = caller.startswith("addr:")
        self._calls[caller] = self._calls.get(caller, 0) + 1
        self._total += 1
        self._anonymous += anonymous
        try:
            if method in UPLOAD_METHODS and self.limits.uploads_total > 0:
                async with self._upload_slot(caller):
                    yield
            else:
                yield
        finally:
            self._total -= 1
            self._anonymous -= anonymous
            left = self._calls[caller] - 1
            if left:
                self._calls[caller] = left
            else:
                del self._calls[caller]

    @contextlib.asynccontextmanager
    async def reading(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Held while a unary request other than an upload is read (an upload's
        place, taken by `admit`, already bounds its read)."""
        if method in UPLOAD_METHODS or peer_role(context) == Role.LEADER:
            yield
            return
        async with _slot(
            self._caller_reads, caller_identity(context), self.limits.reads_per_caller, self._reads
        ):
            yield

    def _upload_slot(self, caller: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The caller's upload slot, then one of the server's."""
        return _slot(self._caller_uploads, caller, self.limits.uploads_per_caller, self._uploads)


@contextlib.asynccontextmanager
async def _slot(
    table: dict[str, _Slots], caller: str, per: int, shared: asyncio.Semaphore
) -> AsyncIterator[None]:
    """One of the caller's `per` slots (its entry in `table`), then one of the
    `shared` ones (in that order, so a caller waiting on its own slot holds none
    of the server's); per <= 0: the shared one only."""
    if per <= 0:
        async with shared:
            yield
        return
    entry = table.setdefault(caller, _Slots(asyncio.Semaphore(per)))
    entry.users += 1
    try:
        async with entry.slots, shared:
            yield
    finally:
        entry.users -= 1
        if not entry.users:  # no call of this caller holds or awaits it
            del table[caller]


@dataclass
class _Slots:
    """One caller's upload slots and how many of its calls hold or await one."""

    slots: asyncio.Semaphore
    users: int = 0
