"""The helper driver: the helper's side of every leader ↔ helper exchange, free
of any transport.  Each unary method takes and returns the domain values of
`servers.exchange.values` (the gRPC `PeerService` and the in-memory port convert the
Peer service's messages at their edge), and `serve_session` runs one
comparison session over a frame stream (`servers.exchange.session.HelperSession`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import numpy as np

from svtagg.dp.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from svtagg.dp.kinds import StreamKind
from svtagg.dp.task import TaskSpec, parse_task_params
from svtagg.mpc.ring import U64
from svtagg.proto.vocab import PASS_ID_BYTES, REPORT_ID_BYTES, REPORT_PAGE, Role
from svtagg.servers.core import Chunk, ServerCore, parse_chunk
from svtagg.servers.crawl import shares_of
from svtagg.servers.exchange.garbling import garbling_of, ot_of
from svtagg.servers.exchange.joint import Pooled, batch_shares, prepared_shares
from svtagg.servers.exchange.machine import Exchange, Flow, Step
from svtagg.servers.exchange.party import ComparisonParty, PartyFactory
from svtagg.servers.exchange.session import (
    FOLD_LANES,
    DataChannel,
    DataOffer,
    GoChannel,
    HelperSession,
    ReadFrame,
    SwitchChannel,
    WriteFrame,
)
from svtagg.servers.exchange.values import (
    Agreement,
    ChunkHeader,
    ChunkKind,
    CrawlStep,
    CrawlStepResult,
    NoiseBatch,
    PlanInfo,
    PlanRequest,
    PoolDraw,
    PrepareStream,
    ReportIds,
    ReportPage,
    ReportSet,
    RobustChunk,
    StreamChunk,
    StreamInfo,
    TaskInfo,
    VerifyBatch,
    VerifyResult,
)
from svtagg.servers.faults import crash_point
from svtagg.servers.ingest.batches import helper_verify
from svtagg.servers.store.rules import IN_CHUNK, OPEN, StreamState, TaskState

#: An accepted stream chunk, marked durably: its stream, task, queries, pooled noise.
Accepted = tuple[StreamState, TaskState, Chunk, Pooled | None]

#: How long a chunk's header waits for the helper's record of the stream's
#: previous chunk, whose result the leader sent one way just before.
RESULT_WAIT = 5.0


class HelperDriver:
    """Runs on the helper; every method is called only by the leader."""

    def __init__(
        self, core: ServerCore, party: PartyFactory, data: DataOffer | None = None
    ) -> None:
        self.core = core
        self.party = party
        #: Set when the server shuts down: idle sessions end at once.
        self.stopping = asyncio.Event()
        #: The data listener offered to sessions that ask (None: frames only).
        self.data = data
        #: Stream chunks accepted and not yet recorded (`settled`).
        self._unrecorded = 0
        self._recorded = asyncio.Event()
        self._recorded.set()

    async def create_task(self, spec: TaskSpec) -> TaskInfo:
        params = parse_task_params(spec)
        self.core.check_budget_policy(params)  # the helper enforces its own cap too
        if params.task_id in self.core.task_ids():
            existing = self.core.task(params.task_id)
            if existing.params == params:
                # The leader retries after failing between the two creations.
                return replace(TaskInfo.of(existing), verify_key=existing.verify_key)
        task = self.core.create_task(params)
        # The Prio3 verify key goes to the leader in this answer, never further.
        return replace(TaskInfo.of(task), verify_key=task.verify_key)

    async def verify(self, batch: VerifyBatch) -> VerifyResult:
        """Verify an upload batch with the leader's prep shares (servers/ingest/batches.py)."""
        return await helper_verify(self.core, batch)

    async def digest(self, task_id: str) -> ReportSet:
        t = self.core.task(task_id)
        return ReportSet(t.n, t.digest)

    async def close_collection(self, task_id: str) -> ReportSet:
        """Close (idempotent); the report set, and whether it is already agreed
        (a close retried after a lost MarkAgreed reply must not validate again:
        the per-report shares are gone)."""
        t = self.core.task(task_id)
        if t.collection_open:
            t = self.core.close_collection(task_id)
        return ReportSet(t.n, t.digest, t.agreed)

    async def list_reports(self, page: ReportPage) -> ReportIds:
        """One page of the closed task's report ids, ascending, after `after`."""
        t = self.core.task(page.task_id)
        if t.collection_open:
            raise FailedPrecondition("report ids are listed only after the close")
        if page.after and len(page.after) != REPORT_ID_BYTES:
            raise InvalidArgument(f"after: a report id has {REPORT_ID_BYTES} bytes")
        limit = min(page.limit or REPORT_PAGE, REPORT_PAGE)
        ids = self.core.report_ids(page.task_id, page.after, limit + 1)
        return ReportIds(page.task_id, tuple(ids[:limit]), more=len(ids) > limit)

    async def drop_reports(self, ids: ReportIds) -> ReportSet:
        t = self.core.remove_reports(ids.task_id, list(ids.ids))
        return ReportSet(t.n, t.digest)

    async def mark_agreed(self, agreement: Agreement) -> TaskInfo:
        """Record agreement only if this server's report set is the leader's and
        (robust aggregates) the leader's pass `pass_id` re-shared every
        coordinate of that set; only that pass's staged shares are kept."""
        t = self.core.task(agreement.task_id)
        if t.collection_open or (t.n, t.digest) != (agreement.n, agreement.digest):
            raise FailedPrecondition(
                f"helper holds n={t.n} reports with another digest; not agreed"
            )
        if t.agreed and t.streams:
            return TaskInfo.of(t)  # a retry: queries already run on the stored g(S)
        robust = None
        if self.core.robust_aggregates or t.params.validity:
            robust = self.core.staged_robust(t, agreement.pass_id)
            if robust is None:
                raise FailedPrecondition(
                    "the helper holds no complete robust-aggregate pass for this report "
                    "set; close again"
                )
        info = TaskInfo.of(self.core.mark_agreed(agreement.task_id, robust))
        self.core.clear_staged(t.params.task_id)
        return info

    async def budget(self, task_id: str) -> TaskInfo:
        return TaskInfo.of(self.core.task(task_id))

    async def prepare_stream(self, request: PrepareStream) -> StreamInfo:
        """Charge and draw γ_H; or (replay) record the charge of a stream the
        leader failed, as a failed stream, in the plan group it was opened in."""
        return StreamInfo.of(self.core.open_stream(request))

    async def reserve_plan(self, request: PlanRequest) -> PlanInfo:
        """Reserve the leader's plan here too, computing and checking its charge
        against this server's own ledger.  A retry of the same plan answers again."""
        if not request.plan_id:
            raise InvalidArgument("the leader names the plan")
        try:
            _, _, task_id = self.core.plan(request.plan_id)
        except NotFound:
            return self.core.reserve_plan(request.plan_id, request)
        if task_id != request.task_id:
            raise AlreadyExists(f"plan {request.plan_id} belongs to another task")
        return self.core.plan_info(request.plan_id)

    async def end_plan(self, plan_id: str) -> PlanInfo:
        return self.core.end_plan(plan_id)

    async def fail_plan(self, plan_id: str) -> PlanInfo:
        return self.core.fail_plan(plan_id)

    async def fail_stream(self, stream_id: str) -> StreamInfo:
        self.core.fail_stream(stream_id)
        return StreamInfo.of(self.core.stream(stream_id))

    # ------------------------------------------------------------ sessions
    async def serve_session(self, write: WriteFrame, read: ReadFrame) -> None:
        """A comparison session: set up once, then chunks one at a time until the
        stream ends (read returns None), the server stops while idle, or a
        chunk is refused (the leader then discards the session)."""
        session = HelperSession(write, read, self.party)
        sid, data = await session.accept(self.data, garbling_of(self.party), ot_of(self.party))
        try:
            channel = session.channel
            gate = GoChannel(SwitchChannel(channel, data) if data is not None else channel)
            assert session.factory is not None
            party = session.factory(Role.HELPER, gate, sid)
            await party.setup()
            await self._chunks(session, party, gate, data)
        finally:
            if data is not None:
                data.close()

    async def _chunks(
        self,
        session: HelperSession,
        party: ComparisonParty,
        gate: GoChannel,
        data: DataChannel | None,
    ) -> None:
        """One exchange per header (`servers.exchange.machine`), until the
        session ends or a chunk is refused (the session is then discarded)."""
        while True:
            header = await session.next_header(self.stopping)
            if header is None:
                return
            x = Exchange.of(header, leader=False)
            x.take(Step.READ_HEADER)
            try:
                checked = await self._check(x, header)
            except Exception as exc:  # noqa: BLE001 - the refusal goes back to the leader
                x.take(Step.REFUSE)
                await session.refuse(exc)
                await session.discard(data)
                return
            try:
                await self._exchange(x, session, party, gate, header, checked)
            except BaseException:
                if x.committed:  # D4
                    x.take(Step.FAIL)
                    self.core.fail_stream(header.stream_id)  # type: ignore[union-attr]
                raise

    async def _check(self, x: Exchange, header: ChunkHeader) -> Any:
        """The header checked against this server's store, and the MARK where
        the flow has one (durable, D1): what the exchange runs on."""
        if isinstance(header, RobustChunk):
            return self._check_robust(header)
        if isinstance(header, NoiseBatch):
            if header.fills_prepared:  # a task's prepared pool (in memory)
                prepared = self.core.prepared_batch(header)
                x.take(Step.MARK)
                return prepared
            reserved = self.core.reserve_noise_batch(
                header.stream_id, header.count, header.gamma, header.lo
            )
            if header.move:  # prepared samples become the stream's: taken before the go
                batch, stream, task = reserved
                taken = self.core.take_prepared(stream, task, header)
                x.take(Step.MARK)
                return batch, stream, task, taken
            x.take(Step.MARK)
            return reserved
        accepted = await self._accept(header)
        x.take(Step.MARK)
        crash_point("chunk.after_mark")
        return accepted

    async def _exchange(
        self,
        x: Exchange,
        session: HelperSession,
        party: ComparisonParty,
        gate: GoChannel,
        header: ChunkHeader,
        checked: Any,
    ) -> None:
        """The garbler's side of one accepted exchange: the go (held for the
        tables' first fragment on a stream chunk, unless the chunk is large:
        `FOLD_LANES`; sent alone on a close-time flow), the protocol, the
        record, and on a close-time flow the closing status after it (D3).
        The leader sends a stream chunk's result one way and does not wait for
        its record (`settled`)."""
        if x.flow is Flow.STREAM:
            stream, task, chunk, pooled = checked
            self._unrecorded += 1
            self._recorded.clear()
            try:
                gate.arm(x, session.go)
                if len(chunk) > FOLD_LANES:  # the go leaves now: the leader reads it meanwhile
                    gate.release()
                    await session.flush()
                _, progress = await self.core.run_chunk(party, stream, task, chunk, pooled=pooled)
                gate.release()  # a chunk that sent nothing still gets its go
                await session.flush()
                x.take(Step.RUN)
                crash_point("chunk.after_result")
                self.core.end_chunk(stream.stream_id, progress)
                x.take(Step.RECORD)
            finally:
                self._unrecorded -= 1
                if not self._unrecorded:
                    self._recorded.set()
            return
        x.take(Step.SEND_VERDICT)
        await session.ok()
        if isinstance(header, NoiseBatch) and header.fills_prepared:
            task, kind, eps = checked
            width = self.core.shape_width(task, kind, eps)
            nu = await prepared_shares(party, task, kind, eps, header.count, width)
            x.take(Step.RUN)
            assert header.prepared is not None
            if not self.core.prepared.add(header.prepared, header.lo, nu):
                # kept nothing: say so before the closing status (D3)
                raise FailedPrecondition("the prepared pool went away during the batch")
        elif isinstance(header, NoiseBatch) and header.move:
            batch, stream, task, taken = checked
            x.take(Step.RUN)
            self.core.store.add_joint_batch(header.stream_id, batch.lo, taken, None)
        elif isinstance(header, NoiseBatch):
            batch, stream, task = checked
            width = self.core.comparison_width(task, stream)
            gamma, nu = await batch_shares(party, stream, task, batch, width)
            x.take(Step.RUN)
            self.core.store.add_joint_batch(header.stream_id, batch.lo, nu, gamma)
        else:
            assert isinstance(header, RobustChunk)
            task, sums = checked
            y = await self.core.robust_shares(party, task, sums, header.coord_lo, header.coord_hi)
            x.take(Step.RUN)
            self.core.stage_robust(task, header.pass_id, header.coord_lo, y)
        x.take(Step.RECORD)
        x.take(Step.SEND_CLOSING)
        await session.ok()

    async def settled(self) -> None:
        """Return once every stream chunk this process has accepted is recorded
        or failed: the leader's answer does not wait for that (tests and
        benchmarks that read this server's store right after an answer do)."""
        await self._recorded.wait()

    def _check_robust(self, h: RobustChunk) -> tuple[TaskState, U64]:
        task = self.core.task(h.task_id)
        if task.collection_open:
            raise FailedPrecondition("robust aggregates are computed after the close")
        if task.agreed and task.streams:
            raise FailedPrecondition("queries already run on this task's aggregates")
        lo, hi = h.coord_lo, h.coord_hi
        if not 0 <= lo < hi <= task.params.d:
            raise InvalidArgument(f"coordinates [{lo}, {hi}) out of [0, {task.params.d})")
        if len(h.pass_id) != PASS_ID_BYTES:
            raise InvalidArgument(
                f"a robust-aggregate chunk names its pass ({PASS_ID_BYTES} bytes)"
            )
        return task, self.core.sums(task.params.task_id)

    async def _accept(self, h: StreamChunk) -> Accepted:
        stream, task = self.core.stream_and_task(h.stream_id, await self._previous_recorded(h))
        if h.kind != ChunkKind.of_stream(stream.kind):
            raise InvalidArgument("chunk mode does not match the stream kind")
        if h.kind == ChunkKind.CRAWL:
            chunk = self._crawl_chunk(h)
        else:
            chunk = replace(parse_chunk(task, h.queries.index, h.queries.complement), more=h.more)
        self.core.check_queries(stream, chunk)
        # The mark and (a joint-noise stream) the pooled noise it consumes, in
        # one durable step before the go: a sample is never used twice.
        pooled = self.core.begin_pooled(stream, task, h.chunk_no, h.pool, len(chunk))
        return stream, task, chunk, pooled

    def _crawl_chunk(self, h: StreamChunk) -> Chunk:
        """A crawl level's one chunk: its candidates 0..k-1, whose inputs this
        server made at the level's CrawlStep (servers/crawl.py)."""
        k = len(h.queries.index)
        if h.chunk_no != 1 or not k or not np.array_equal(h.queries.index, np.arange(k)):
            raise InvalidArgument("a crawl level's chunk is its first, over candidates 0..k-1")
        if h.queries.complement.any() or h.pool != PoolDraw():
            raise InvalidArgument("a crawl level's chunk has no complements and no pooled noise")
        if not self.core.walks.has_inputs(h.stream_id, k):
            raise FailedPrecondition(
                f"this helper process holds no crawl level of {k} candidates for stream "
                f"{h.stream_id}"
            )
        return Chunk(np.arange(k, dtype=np.int64), np.zeros(k, dtype=bool))

    async def crawl_step(self, step: CrawlStep) -> CrawlStepResult:
        """The helper's side of a crawl level (servers/crawl.py), checked
        against its own ledger and walk: the level's stream charged here and
        not yet answered, the parents candidates it checked at the walk's last
        level.  Any failure fails the stream and ends the walk here."""
        stream = self.core.stream(step.stream_id)
        if stream.kind != StreamKind.CRAWL or stream.task_id != step.task_id:
            raise InvalidArgument(f"stream {step.stream_id} is not a crawl level of this task")
        if stream.state != OPEN or stream.chunks:
            raise FailedPrecondition(f"stream {step.stream_id} has answered already")
        task = self.core.task(step.task_id)
        walks = self.core.walks
        walk = await walks.at(self.core.store, task, step.walk_id, step.depth, step.parents, 1)
        if walk.lock.locked():
            raise FailedPrecondition(f"walk {step.walk_id} is answering another level")
        async with walk.lock:
            try:
                walk.check_level(step.parents, step.depth, step.steps)
                if step.reports != walk.size:
                    raise FailedPrecondition(
                        f"the leader's walk holds {step.reports} reports, this one {walk.size}"
                    )
                leader = shares_of(step.prep_shares, walk.size)
                mine = await asyncio.to_thread(walk.extend, step.parents, step.steps, 1)
                refused = await asyncio.to_thread(walk.decide, leader, mine)
                z = walk.inputs(stream.epsilon, self.core.rng, 1)
                if self.core.stream(step.stream_id).state != OPEN:
                    raise FailedPrecondition(f"stream {step.stream_id} was failed meanwhile")
                walks.stepped(
                    step.stream_id, walk, step.parents, step.depth, step.steps, refused, z
                )
            except BaseException:
                walks.forget(walk)  # the next level rebuilds from the record
                walks.drop_inputs(step.stream_id)
                self.core.fail_stream(step.stream_id)
                raise
        return CrawlStepResult(mine.tobytes())

    async def _previous_recorded(self, h: StreamChunk) -> StreamState:
        """The leader answers a chunk without waiting for this side's record of
        it, so the next chunk's header may come, on another session (or to
        another helper process), before the previous result has been read:
        wait for that record, at most RESULT_WAIT seconds (polling the store,
        which other helper processes write too).  After that, `begin_chunk`
        refuses a stream still in its previous chunk.  The stream as last read."""
        deadline = time.monotonic() + RESULT_WAIT
        pause = 0.0005
        while True:
            s = self.core.stream(h.stream_id)
            if s.state != IN_CHUNK or s.chunks != h.chunk_no - 1 or time.monotonic() > deadline:
                return s
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.05)
