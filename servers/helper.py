"""The helper driver: the helper's side of every leader ↔ helper exchange, free
of any transport.  Each unary method takes and returns the domain values of
`servers.exchange.values` (the gRPC `PeerService` and the in-memory port convert the
Peer service's messages at their edge), and `serve_session` runs one
comparison session over a frame stream (`servers.exchange.session.HelperSession`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from svtagg.dp.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from svtagg.dp.task import TaskSpec, parse_task_params
from svtagg.mpc.ring import U64
from svtagg.proto.vocab import PASS_ID_BYTES, REPORT_ID_BYTES, REPORT_PAGE, Role
from svtagg.servers.core import Chunk, ServerCore, parse_chunk
from svtagg.servers.exchange.garbling import garbling_of, ot_of
from svtagg.servers.exchange.joint import Pooled, batch_shares
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
    ChunkKind,
    NoiseBatch,
    PlanInfo,
    PlanRequest,
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
from svtagg.servers.store.rules import IN_CHUNK, StreamState, TaskState

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
        session = HelperSession(write, read)
        sid, data = await session.accept(self.data, garbling_of(self.party), ot_of(self.party))
        try:
            channel = session.channel
            gate = GoChannel(SwitchChannel(channel, data) if data is not None else channel)
            party = self.party(Role.HELPER, gate, sid)
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
        while True:
            header = await session.next_header(self.stopping)
            if header is None:
                return
            if isinstance(header, RobustChunk):
                try:
                    robust = self._check_robust(header)
                except Exception as exc:  # noqa: BLE001 - the refusal goes back to the leader
                    await self._refuse(session, data, exc)
                    return
                await self._robust(session, party, header, robust)
            elif isinstance(header, NoiseBatch):
                try:
                    reserved = self.core.reserve_noise_batch(
                        header.stream_id, header.count, header.gamma, header.lo
                    )
                except Exception as exc:  # noqa: BLE001 - the refusal goes back to the leader
                    await self._refuse(session, data, exc)
                    return
                await self._noise_batch(session, party, header, reserved)
            else:
                try:
                    accepted = await self._accept(header)
                except Exception as exc:  # noqa: BLE001 - the refusal goes back to the leader
                    await self._refuse(session, data, exc)
                    return
                await self._stream_chunk(session, party, gate, accepted)

    @staticmethod
    async def _refuse(session: HelperSession, data: DataChannel | None, exc: Exception) -> None:
        """Refuse the chunk, then drop the session (`HelperSession.discard`)."""
        await session.refuse(exc)
        await session.discard(data)

    async def _stream_chunk(
        self,
        session: HelperSession,
        party: ComparisonParty,
        gate: GoChannel,
        accepted: Accepted,
    ) -> None:
        """The garbler's side of one stream chunk, marked in progress durably
        before the garbling, its go sent then (a small chunk's with the first
        fragment of the tables, `FOLD_LANES`); the result, which the leader
        sends one way, recorded (not waited for by the leader: a helper that
        never records it fails the stream closed, now or at its restart)."""
        stream, task, chunk, pooled = accepted
        self._unrecorded += 1
        self._recorded.clear()
        crash_point("chunk.after_mark")
        gate.arm(session.go)
        try:
            await self._run(party, session, (stream, task, chunk, pooled), gate)
        finally:
            self._unrecorded -= 1
            if not self._unrecorded:
                self._recorded.set()

    async def _noise_batch(
        self,
        session: HelperSession,
        party: ComparisonParty,
        h: NoiseBatch,
        reserved: tuple[NoiseBatch, StreamState, TaskState],
    ) -> None:
        """The garbler's side of a joint-noise batch: its sequence numbers
        reserved durably before the go (the leader cannot have one generated
        twice), the shares kept (durably) before the closing status, so the
        leader keeps a batch only if this server holds it too (the leader waits
        for that status).  A batch that fails is never used."""
        batch, stream, task = reserved
        await session.ok()
        gamma, nu = await batch_shares(party, stream, task, batch)
        self.core.store.add_joint_batch(h.stream_id, batch.lo, nu, gamma)
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

    async def _robust(
        self,
        session: HelperSession,
        party: ComparisonParty,
        h: RobustChunk,
        checked: tuple[TaskState, U64],
    ) -> None:
        """The garbler's side of one robust-aggregate chunk (see the leader's
        `robust_pass`): its new shares of g(S) for coordinates [lo, hi), staged
        until MarkAgreed, and a closing status once staged (the leader waits
        for it before MarkAgreed)."""
        task, sums = checked
        await session.ok()
        y = await self.core.robust_shares(party, task, sums, h.coord_lo, h.coord_hi)
        self.core.stage_robust(task, h.pass_id, h.coord_lo, y)
        await session.ok()

    async def _accept(self, h: StreamChunk) -> Accepted:
        stream, task = self.core.stream_and_task(h.stream_id, await self._previous_recorded(h))
        if h.kind != ChunkKind.of_stream(stream.kind):
            raise InvalidArgument("chunk mode does not match the stream kind")
        chunk = replace(parse_chunk(task, h.queries.index, h.queries.complement), more=h.more)
        if h.kind == ChunkKind.NMAX:
            self.core.check_tournament(stream, chunk)
        # The mark and (a joint-noise stream) the pooled noise it consumes, in
        # one durable step before the go: a sample is never used twice.
        pooled = self.core.begin_pooled(stream, task, h.chunk_no, h.pool, len(chunk))
        return stream, task, chunk, pooled

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

    async def _run(
        self,
        party: ComparisonParty,
        session: HelperSession,
        chunk_of: tuple[StreamState, TaskState, Chunk, Pooled | None],
        gate: GoChannel,
    ) -> None:
        """Garble (the go leaves with the first message: `GoChannel`), then
        record the result.  A failure (the leader gone before the go, too)
        fails the stream now, not left `in_chunk` until the next restart."""
        stream, task, chunk, pooled = chunk_of
        try:
            if len(chunk) > FOLD_LANES:  # the go leaves now: the leader reads it meanwhile
                gate.release()
                await session.flush()
            _, progress = await self.core.run_chunk(party, stream, task, chunk, pooled=pooled)
            gate.release()  # a chunk that sent nothing still gets its go
            await session.flush()
        except BaseException:
            self.core.fail_stream(stream.stream_id)
            raise
        crash_point("chunk.after_result")
        self.core.end_chunk(stream.stream_id, progress)
