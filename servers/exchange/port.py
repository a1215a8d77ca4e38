"""How the leader reaches the helper: a small port with two implementations, the
gRPC peer (`servers.edge.peer.GrpcHelperPort`) and an in-memory one
(`servers.memory.MemoryHelperPort`) that runs the helper driver in the same
process.  One method per exchange, in the domain values of `servers.exchange.values`
(each port converts them to the Peer service's messages and back); every
failure arrives as a refusal from `svtagg.dp.errors` (an unreachable helper as
PeerUnavailable), never as a transport exception.  `timeout`: the call's
deadline in seconds (None: the port's default)."""

from __future__ import annotations

from typing import Protocol

from svtagg.dp.task import TaskSpec
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


class HelperPort(Protocol):
    """What the leader driver needs from the helper."""

    async def create_task(self, spec: TaskSpec, timeout: float | None = None) -> TaskInfo:
        """Create the task there too (a retry of the same task answers again)."""
        ...

    async def digest(self, task_id: str, timeout: float | None = None) -> ReportSet: ...

    async def close_collection(self, task_id: str, timeout: float | None = None) -> ReportSet:
        """Close there (idempotent): its report set, and whether it agreed on it."""
        ...

    async def list_reports(self, page: ReportPage, timeout: float | None = None) -> ReportIds: ...

    async def drop_reports(self, ids: ReportIds, timeout: float | None = None) -> ReportSet: ...

    async def verify(self, batch: VerifyBatch, timeout: float | None = None) -> VerifyResult:
        """Verify an upload batch of a task with a validity circuit (servers/ingest/batches.py)."""
        ...

    async def mark_agreed(self, agreement: Agreement, timeout: float | None = None) -> TaskInfo: ...

    async def crawl_step(self, step: CrawlStep, timeout: float | None = None) -> CrawlStepResult:
        """The helper's side of a crawl level's check (servers/crawl.py)."""
        ...

    async def budget(self, task_id: str, timeout: float | None = None) -> TaskInfo:
        """The task as the helper holds it, its ledger included."""
        ...

    async def prepare_stream(
        self, request: PrepareStream, timeout: float | None = None
    ) -> StreamInfo: ...

    async def fail_stream(self, stream_id: str, timeout: float | None = None) -> StreamInfo: ...

    async def reserve_plan(
        self, request: PlanRequest, timeout: float | None = None
    ) -> PlanInfo: ...

    async def end_plan(self, plan_id: str, timeout: float | None = None) -> PlanInfo: ...

    async def fail_plan(self, plan_id: str, timeout: float | None = None) -> PlanInfo: ...

    async def open_session(self, factory: PartyFactory) -> LeaderSession:
        """A new comparison session with its base OTs done."""
        ...

    async def close(self) -> None: ...
