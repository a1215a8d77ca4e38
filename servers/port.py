"""How the leader reaches the helper: a small port with two implementations, the
gRPC peer (`servers.peer.GrpcHelperPort`) and an in-memory one
(`servers.memory.MemoryHelperPort`) that runs the helper driver in the same
process.  The messages are the Peer service's protobuf messages; every failure
arrives as a refusal from `svtagg.dp.errors` (an unreachable helper as
PeerUnavailable), never as a transport exception."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol

from svtagg.servers.core import PartyFactory
from svtagg.servers.session import LeaderSession


class PeerMethod(StrEnum):
    """The helper's unary calls (names of the Peer service's RPCs)."""

    CREATE_TASK = "CreateTask"
    DIGEST = "Digest"
    CLOSE_COLLECTION = "CloseCollection"
    LIST_REPORTS = "ListReports"
    DROP_REPORTS = "DropReports"
    MARK_AGREED = "MarkAgreed"
    BUDGET = "Budget"
    PREPARE_STREAM = "PrepareStream"
    FAIL_STREAM = "FailStream"
    RESERVE_PLAN = "ReservePlan"
    END_PLAN = "EndPlan"
    FAIL_PLAN = "FailPlan"


class HelperPort(Protocol):
    """What the leader driver needs from the helper."""

    async def call(self, method: PeerMethod, request: Any, timeout: float | None = None) -> Any:
        """One unary call; a refusal of the helper is raised with its meaning kept."""
        ...

    async def open_session(self, factory: PartyFactory) -> LeaderSession:
        """A new comparison session with its base OTs done."""
        ...

    async def close(self) -> None: ...
