"""The helper driver: the helper's side of every leader ↔ helper exchange, free
of any transport.  Each unary method takes and returns the Peer service's
messages (the gRPC `PeerService` and the in-memory port both call it), and
`serve_session` runs one comparison session over a frame stream."""

from __future__ import annotations

import asyncio
from typing import Any

from svtagg.dp.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from svtagg.dp.kinds import StreamKind
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import (
    PASS_ID_BYTES,
    REPORT_ID_BYTES,
    REPORT_PAGE,
    SETUP_DEADLINE,
    Role,
    kind_from_pb,
    refusal_status,
    split_ids,
)
from svtagg.servers.core import Chunk, ComparisonParty, PartyFactory, ServerCore, parse_chunk
from svtagg.servers.faults import crash_point
from svtagg.servers.messages import collection_digest, spec_params, stream_info, task_info
from svtagg.servers.session import (
    DataChannel,
    DataOffer,
    FrameChannel,
    ReadFrame,
    SwitchChannel,
    WriteFrame,
)
from svtagg.servers.store import StreamState, TaskState

_OK = pb.PeerFrame(status=pb.PeerStatus(ok=True))


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

    async def CreateTask(self, request: pb.TaskSpec) -> pb.TaskInfo:
        params = spec_params(request)
        self.core.check_budget_policy(params)  # the helper enforces its own cap too
        if params.task_id in self.core.store.task_ids():
            existing = self.core.store.task(params.task_id)
            if existing.params == params:
                # The leader retries after failing between the two creations.
                return task_info(existing)
        return task_info(self.core.store.create_task(params))

    async def Digest(self, request: pb.TaskRef) -> pb.CollectionDigest:
        return collection_digest(self.core.store.task(request.task_id))

    async def CloseCollection(self, request: pb.TaskRef) -> pb.CollectionDigest:
        """Close (idempotent); the report set, and whether it is already agreed
        (a close retried after a lost MarkAgreed reply must not validate again:
        the per-report shares are gone)."""
        t = self.core.store.task(request.task_id)
        if t.collection_open:
            t = self.core.store.close_collection(request.task_id)
        out = collection_digest(t)
        out.agreed = t.agreed
        return out

    async def ListReports(self, request: pb.ReportPage) -> pb.ReportIds:
        """One page of the closed task's report ids, ascending, after `after`."""
        t = self.core.store.task(request.task_id)
        if t.collection_open:
            raise FailedPrecondition("report ids are listed only after the close")
        if request.after and len(request.after) != REPORT_ID_BYTES:
            raise InvalidArgument(f"after: a report id has {REPORT_ID_BYTES} bytes")
        limit = min(request.limit or REPORT_PAGE, REPORT_PAGE)
        ids = self.core.store.report_ids(request.task_id, request.after, limit + 1)
        return pb.ReportIds(
            task_id=request.task_id, report_ids=b"".join(ids[:limit]), more=len(ids) > limit
        )

    async def DropReports(self, request: pb.ReportIds) -> pb.CollectionDigest:
        return collection_digest(
            self.core.remove_reports(request.task_id, split_ids(request.report_ids))
        )

    async def MarkAgreed(self, request: pb.CollectionDigest) -> pb.TaskInfo:
        """Record agreement only if this server's report set is the leader's and
        (robust aggregates) the leader's pass `pass_id` re-shared every
        coordinate of that set; only that pass's staged shares are kept."""
        t = self.core.store.task(request.task_id)
        if t.collection_open or (t.n, t.digest) != (request.n, request.report_digest):
            raise FailedPrecondition(
                f"helper holds n={t.n} reports with another digest; not agreed"
            )
        if t.agreed and t.streams:
            return task_info(t)  # a retry: queries already run on the stored g(S)
        robust = None
        if self.core.robust_aggregates:
            robust = self.core.store.staged_robust(
                t.params.task_id, request.pass_id, t.digest, t.params.d
            )
            if robust is None:
                raise FailedPrecondition(
                    "the helper holds no complete robust-aggregate pass for this report "
                    "set; close again"
                )
        info = task_info(self.core.store.mark_agreed(request.task_id, robust))
        self.core.store.clear_staged(t.params.task_id)
        return info

    async def Budget(self, request: pb.TaskRef) -> pb.TaskInfo:
        return task_info(self.core.store.task(request.task_id))

    async def PrepareStream(self, request: pb.PrepareStreamRequest) -> pb.StreamInfo:
        """Charge and draw γ_H; or (replay) record the charge of a stream the
        leader failed, as a failed stream, in the plan group it was opened in."""
        state = self.core.open_stream(
            request.stream_id,
            request.task_id,
            kind_from_pb(request.kind),
            request.epsilon,
            request.delta,
            plan=(request.plan_id, request.plan_group) if request.plan_id else None,
            replay=request.replay,
        )
        return stream_info(state)

    async def ReservePlan(self, request: pb.PlanRequest) -> pb.PlanInfo:
        """Reserve the leader's plan here too, computing and checking its charge
        against this server's own ledger.  A retry of the same plan answers again."""
        if not request.plan_id:
            raise InvalidArgument("the leader names the plan")
        try:
            _, _, task_id = self.core.store.plan(request.plan_id)
        except NotFound:
            return self.core.reserve_plan(request.plan_id, request)
        if task_id != request.task_id:
            raise AlreadyExists(f"plan {request.plan_id} belongs to another task")
        return self.core.plan_info(request.plan_id)

    async def EndPlan(self, request: pb.PlanRef) -> pb.PlanInfo:
        return self.core.plan_info(request.plan_id, self.core.store.end_plan(request.plan_id))

    async def FailPlan(self, request: pb.PlanRef) -> pb.PlanInfo:
        self.core.store.fail_plan(request.plan_id)
        return self.core.plan_info(request.plan_id)

    async def FailStream(self, request: pb.StreamRef) -> pb.StreamInfo:
        self.core.store.fail_stream(request.stream_id)
        return stream_info(self.core.store.stream(request.stream_id))

    # ------------------------------------------------------------ sessions
    async def serve_session(self, write: WriteFrame, read: ReadFrame) -> None:
        """A comparison session: set up once, then chunks one at a time until the
        stream ends (read returns None) or the server stops while idle."""
        channel = FrameChannel(write, read)
        first = await channel.read_frame()
        if first.WhichOneof("body") != "open" or len(first.open.session_id) != 16:
            raise InvalidArgument("a session starts with SessionOpen (16-byte id)")
        sid = first.open.session_id
        data: DataChannel | None = None
        if first.open.data_channel:
            port = self.data.port if self.data is not None else 0
            await write(pb.PeerFrame(status=pb.PeerStatus(ok=True, data_port=port)))
            if self.data is not None:
                data = await self.data.claim(sid, SETUP_DEADLINE)
        try:
            party = self.party(
                Role.HELPER, SwitchChannel(channel, data) if data is not None else channel, sid
            )
            await party.setup()
            await self._chunks(write, read, party)
        finally:
            if data is not None:
                data.close()

    async def _chunks(self, write: WriteFrame, read: ReadFrame, party: ComparisonParty) -> None:
        while True:
            frame = await self._next_frame(read)
            if frame is None:
                return
            if frame.WhichOneof("body") != "header":
                raise InvalidArgument("expected a chunk header")
            if frame.header.validate_task_id:
                await self._validate(write, party, frame.header)
                continue
            if frame.header.robust_task_id:
                await self._robust(write, party, frame.header)
                continue
            try:
                stream, task, chunk = self._accept(frame.header)
            except Exception as exc:  # noqa: BLE001 - refusal goes back, session lives
                await write(pb.PeerFrame(status=refusal_status(exc)))
                continue
            crash_point("chunk.after_mark")
            try:
                await write(_OK)
            except BaseException:
                # Marked, and the leader gone before the go: failed now, not left
                # `in_chunk` until this server's next restart.
                self.core.store.fail_stream(stream.stream_id)
                raise
            await self._run(party, stream, task, chunk, frame.header.compare)
            await write(_OK)

    async def _validate(self, write: WriteFrame, party: ComparisonParty, h: pb.ChunkHeader) -> None:
        """The evaluator's side of one range-validation chunk (see the leader's
        `validate_reports`); a refusal goes back and the session lives on."""
        try:
            task = self.core.store.task(h.validate_task_id)
            if not task.params.validate_reports:
                raise FailedPrecondition("this task does not validate its reports")
            if task.agreed:
                raise FailedPrecondition("the report set is already agreed")
            z = self.core.validation_inputs(task, split_ids(h.report_ids))
        except Exception as exc:  # noqa: BLE001 - refusal goes back, session lives
            await write(pb.PeerFrame(status=refusal_status(exc)))
            return
        await write(_OK)
        await party.any_per_group(z, 2 * task.params.d)
        await write(_OK)

    async def _robust(self, write: WriteFrame, party: ComparisonParty, h: pb.ChunkHeader) -> None:
        """The evaluator's side of one robust-aggregate chunk (see the leader's
        `robust_pass`): its new shares of g(S) for coordinates [lo, hi), staged
        until MarkAgreed.  A refusal goes back and the session lives on."""
        try:
            task = self.core.store.task(h.robust_task_id)
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
            z = self.core.store.sums(task.params.task_id)[lo:hi]
        except Exception as exc:  # noqa: BLE001 - refusal goes back, session lives
            await write(pb.PeerFrame(status=refusal_status(exc)))
            return
        await write(_OK)
        y = await party.clamp_reshare(z, self.core.clamp_bound(task))
        self.core.store.stage_robust(task.params.task_id, h.pass_id, task.digest, lo, y)
        await write(_OK)

    async def _next_frame(self, read: ReadFrame) -> Any:
        """The next frame, or None once shutdown begins while the session is idle
        (so a stopping helper ends its sessions at once instead of after the grace)."""
        reading = asyncio.ensure_future(read())
        stop = asyncio.ensure_future(self.stopping.wait())
        done, _ = await asyncio.wait({reading, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if reading in done:
            return reading.result()
        reading.cancel()
        return None

    def _accept(self, h: pb.ChunkHeader) -> tuple[StreamState, TaskState, Chunk]:
        stream, task = self.core.stream_and_task(h.stream_id)
        if h.compare != (stream.kind == StreamKind.CTT):
            raise InvalidArgument("chunk mode does not match the stream kind")
        chunk = parse_chunk(task, h.queries.index, h.queries.complement)
        self.core.store.begin_chunk(h.stream_id, h.chunk_no)
        return stream, task, chunk

    async def _run(
        self,
        party: ComparisonParty,
        stream: StreamState,
        task: TaskState,
        chunk: Chunk,
        compare: bool,
    ) -> None:
        try:
            if compare:
                z_high, z_low = self.core.compare_inputs(stream, task, chunk, None)
                width = self.core.comparison_width(task, stream)
                out = list(await party.compare_to_thresholds(z_high, z_low, width))
                answered, close = self.core.compare_progress(out)
            else:
                z = self.core.ask_inputs(stream, task, chunk, None)
                j = await party.first_yes(z, self.core.comparison_width(task, stream))
                answered, close = (len(chunk), False) if j is None else (j + 1, True)
        except BaseException:
            self.core.store.fail_stream(stream.stream_id)
            raise
        crash_point("chunk.after_result")
        self.core.store.end_chunk(stream.stream_id, answered, close)
