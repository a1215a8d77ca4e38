"""The leader driver: every analyst request the leader serves, and how it drives
the helper through a `HelperPort` — close / reconcile / re-share, stream
opening and the chunk exchange with fail-closed handling (the ledgers are kept
together by `servers.reconcile`).  Free of any transport: it takes and returns
the domain values of `servers.exchange.values`, the gRPC `AnalystService` converts
them at its edge, and tests run it against an in-memory helper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from svtagg.dp.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    PeerUnavailable,
    Refusal,
    StreamClosed,
)
from svtagg.dp.jointsvt import JOINT, JOINT_SVT_KINDS
from svtagg.dp.kinds import MAX_STREAM_EPSILON, StreamKind, check_epsilon
from svtagg.dp.plans import check_groups_usable, parse_groups
from svtagg.dp.queries import Progress
from svtagg.dp.task import TaskSpec, parse_task_params
from svtagg.mpc.ring import U64
from svtagg.proto.vocab import CHUNK_DEADLINE, OUTCOME_OF_CODE, PASS_ID_BYTES, REPORT_PAGE
from svtagg.servers.core import (
    Chunk,
    ServerCore,
    Thresholds,
    parse_chunk,
    parse_taus,
)
from svtagg.servers.crawl import shares_of, step_deadline
from svtagg.servers.exchange.joint import (
    Pooled,
    PoolPolicy,
    PreparePolicy,
    batch_shares,
    pools_noise,
    prepared_shares,
    stream_noise,
)
from svtagg.servers.exchange.machine import Exchange, Step
from svtagg.servers.exchange.party import ComparisonParty, PartyFactory
from svtagg.servers.exchange.port import HelperPort
from svtagg.servers.exchange.prepared import PrepareStatus, parse_shape, shape_key
from svtagg.servers.exchange.session import SessionPool
from svtagg.servers.exchange.values import (
    Agreement,
    Ask,
    AskAnswer,
    ChunkHeader,
    ChunkKind,
    Compare,
    CompareAnswer,
    CrawlAnswer,
    CrawlLevel,
    CrawlStep,
    JobAnswer,
    JobInputs,
    NoiseBatch,
    NoisyMax,
    NoisyMaxAnswer,
    OpenStream,
    PlanInfo,
    PlanRequest,
    PoolDraw,
    PrepareStream,
    Queries,
    ReportIds,
    ReportPage,
    ReportSet,
    RobustChunk,
    StreamChunk,
    StreamInfo,
    TaskInfo,
)
from svtagg.servers.faults import crash_point
from svtagg.servers.reconcile import LedgerSync
from svtagg.servers.store.jointpool import MAX_BATCH
from svtagg.servers.store.rules import (
    FAILED,
    IN_CHUNK,
    OPEN,
    StreamState,
    TaskState,
)
from svtagg.servers.work import Job, JobQueue, WorkerLost, run_leased, serve_job

log = logging.getLogger("svtagg.server")

#: Coordinates per robust-aggregate chunk: about 315 AND gates each, so ~45 MB of
#: tables per chunk.
ROBUST_LANES = 4096

#: Close-time chunks a leasing leader keeps queued or running at once (more
#: than any pool of workers it pairs; bounds the work table and the waiters).
PASS_JOBS = 32
#: How long `close_collection` waits for the helper before closing anything.
HELPER_CHECK_DEADLINE = 5.0

#: How often a chunk waiting for its stream's noise batches looks at the pool (s).
POOL_POLL = 0.01

#: How a refusal names a stream kind and the call each chunk kind answers.
_STREAM_NAMES = {StreamKind.CTT: "a CompareToThresholds", StreamKind.NMAX: "a report-noisy-max"}
_CHUNK_CALLS = {ChunkKind.ASK: "Ask", ChunkKind.COMPARE: "Compare", ChunkKind.NMAX: "NoisyMax"}


class LeaderDriver:
    """The leader's analyst API; every state change is mirrored on the helper."""

    def __init__(
        self,
        core: ServerCore,
        helper: HelperPort,
        party: PartyFactory,
        work: JobQueue | None = None,
    ) -> None:
        self.core = core
        self.helper = helper
        self.pool = SessionPool(lambda: helper.open_session(party))
        self._busy: set[str] = set()
        #: A joint-noise Ask chunk's queries whose ν it drew itself, by stream.
        self._drawn: dict[str, int] = {}
        self._close_lock = asyncio.Lock()
        #: The helper's ledger kept up with this one (servers/reconcile.py).
        self.ledgers = LedgerSync(core, helper)
        #: Leased work (servers/work.py): when set, chunks and close-time passes
        #: are queued for worker processes instead of run in this process.
        self.work = work
        #: How this process keeps joint-noise streams' pools filled ahead of
        #: their chunks (servers/exchange/joint.py); None: it does not (a leased-work
        #: worker leaves it to the front end), and chunks draw what their
        #: pool lacks in the chunk.
        self.noise_pool: PoolPolicy | None = PoolPolicy()
        self._fills: dict[str, asyncio.Task[None]] = {}
        #: One background batch at a time, so that it never holds every pooled
        #: session (two by default): chunks keep at least one.
        self._fill_slot = asyncio.Semaphore(1)
        #: Prepared noise (servers/exchange/prepared.py): None, or how much of
        #: what joint-noise streams consumed the leader makes again, ahead of
        #: the next run, once no chunk has run for `idle` seconds.
        self.prepare: PreparePolicy | None = PreparePolicy()
        #: (task id, shape) → samples to make: what the streams of that shape
        #: consumed (from any source) less what has been made since.
        self._demand: dict[tuple[str, str], int] = {}
        #: The keys of `_demand` the analyst asked for (PrepareNoise), in order.
        self._asked: list[tuple[str, str]] = []
        self._preparer: asyncio.Task[None] | None = None
        self._last_chunk = 0.0

    # ------------------------------------------------------------ plans
    async def reserve_plan(self, request: PlanRequest) -> PlanInfo:
        """Reserve the plan's composed charge on the leader, then on the helper
        (each computes and checks it); refused whole, nothing spent, if it does
        not fit either ledger.  Leader first, as for streams: a failure after the
        leader's reservation fails the plan (never refunded) and is reconciled."""
        plan_id = secrets.token_hex(16)
        if self.ledgers.owes(request.task_id):
            self.core.task(request.task_id)
            await self.ledgers.sync(request.task_id)
        # A plan no stream could use is refused here, before either ledger is charged.
        check_groups_usable(
            parse_groups(request.pairs()),
            self.core.task(request.task_id).params.epsilon_min,
        )
        info = self.core.reserve_plan(plan_id, request)
        crash_point("plan.before_helper")
        try:
            await self.helper.reserve_plan(replace(request, plan_id=plan_id))
        except BaseException:
            # The leader's reservation stays spent (never refund); the helper may
            # hold the plan after all (a lost reply) or may have refused it (its
            # own ledger): the next sync fails it there, reserving it first if absent.
            self.core.fail_plan(plan_id)
            self.ledgers.owe_plan(request.task_id, plan_id)
            raise
        log.info(
            "task %s: plan %s reserved (epsilon %s, delta %s, %d groups)",
            request.task_id,
            plan_id,
            info.epsilon,
            info.delta,
            len(request.groups),
        )
        return info

    async def end_plan(self, plan_id: str) -> PlanInfo:
        """End the plan on the helper, then here; each returns what the plan did
        not use (basic plans only).  Idempotent."""
        _, _, task_id = self.core.plan(plan_id)  # NOT_FOUND before any peer call
        if self.ledgers.owes(task_id):
            # A stream of this plan the helper missed is replayed into the plan
            # first, so that both servers refund the same unused part.
            await self.ledgers.sync(task_id)
        await self.helper.end_plan(plan_id)
        info = self.core.end_plan(plan_id)
        log.info(
            "plan %s: ended (refunded epsilon %s, delta %s)",
            plan_id,
            info.refunded_epsilon,
            info.refunded_delta,
        )
        return info

    # ------------------------------------------------------------ tasks
    async def create_task(self, spec: TaskSpec) -> TaskInfo:
        params = parse_task_params(spec)
        self.core.check_budget_policy(params)
        if params.task_id in self.core.task_ids():
            raise AlreadyExists(f"task {params.task_id!r} already exists")
        there = await self.helper.create_task(spec)
        if params.validity and not there.verify_key:
            raise FailedPrecondition("the helper sent no Prio3 verify key (an older helper?)")
        info = TaskInfo.of(self.core.create_task(params, there.verify_key))
        log.info(
            "task %s: created (d=%d, n_max=%d, total epsilon %s, delta %s, validity %s)",
            params.task_id,
            spec.d,
            spec.n_max,
            spec.epsilon_total,
            spec.delta_total,
            params.validity or "none",
        )
        return info

    async def describe(self, task_id: str) -> TaskInfo:
        """The task with both ledgers (the leader's view alone while the helper is down)."""
        task = self.core.task(task_id)
        try:
            # A short first call: a helper that is down costs seconds, not the
            # caller's whole deadline.
            await self.helper.budget(task_id, timeout=HELPER_CHECK_DEADLINE)
            await self.ledgers.sync(task_id)
            task = self.core.task(task_id)
            helper = await self.helper.budget(task_id)
        except PeerUnavailable as exc:
            log.warning("task %s: described without the helper's ledger (%s)", task_id, exc)
            return TaskInfo.of(task)
        return replace(TaskInfo.of(task), helper_budget=helper.budget)

    def list_tasks(self) -> list[TaskInfo]:
        return [TaskInfo.of(self.core.task(t)) for t in self.core.task_ids()]

    async def close_collection(self, task_id: str) -> TaskInfo:
        """Close on both servers, then reconcile: a report only one server stored
        (a client that gave up between the two uploads) is taken out on that server,
        so n and the sums cover exactly the reports both hold.  Idempotent; queries
        are refused until both servers have recorded the agreement."""
        async with self._close_lock:  # one reconciliation at a time
            return await self._close(task_id)

    async def _close(self, task_id: str) -> TaskInfo:
        task = self.core.task(task_id)
        if task.agreed:
            return TaskInfo.of(task)
        if task.collection_open:
            # The helper must answer before the leader's side closes, so an outage
            # refuses the close cleanly instead of closing one server only.
            await self.helper.budget(task_id, timeout=HELPER_CHECK_DEADLINE)
            if task.n < task.params.min_batch:
                # A task closed below min_batch could never be queried, reopened
                # or removed: refuse, saying what is missing.
                raise FailedPrecondition(
                    f"task {task_id!r} holds {task.n} reports and needs min_batch="
                    f"{task.params.min_batch} to be queried: upload "
                    f"{task.params.min_batch - task.n} more before closing (nothing closed)"
                )
            task = self.core.close_collection(task_id)
            log.info("task %s: collection closed on the leader (n=%d)", task_id, task.n)
        helper = await self.helper.close_collection(task_id)
        dropped = 0
        if not helper.same_as(task):
            only_mine, only_theirs = await self._difference(task_id)
            task, helper = await self._drop(task_id, only_mine, only_theirs)
            dropped = len(only_mine) + len(only_theirs)
            log.info("task %s: dropped %d reports only one server had", task_id, dropped)
            if not helper.same_as(task):
                raise FailedPrecondition(
                    f"servers still disagree on the reports (leader n={task.n}, "
                    f"helper n={helper.n}); try closing again"
                )
        if task.params.validate_reports:
            # A task made before the garbled range check was retired: its reports
            # carry no proofs; the robust aggregates still bound each one.
            log.warning(
                "task %s was created with the retired garbled range check; closing it "
                "without that check (each report is still bounded by the robust aggregates)",
                task_id,
            )
        # Each pass has its own id: the helper keeps only this pass's shares.
        pass_id = secrets.token_bytes(PASS_ID_BYTES)
        # A task with a validity circuit always runs it: it is the field-to-ring conversion.
        robust = (
            await self.robust_pass(task, pass_id)
            if self.core.robust_aggregates or task.params.validity
            else None
        )
        await self.helper.mark_agreed(Agreement(task_id, task.n, task.digest, pass_id))
        info = replace(
            TaskInfo.of(self.core.mark_agreed(task_id, robust)),
            dropped_reports=dropped,
        )
        log.info(
            "task %s: both servers agree on n=%d (dropped %d)",
            task_id,
            info.n,
            info.dropped_reports,
        )
        return info

    async def _drop(
        self, task_id: str, mine: list[bytes], theirs: list[bytes]
    ) -> tuple[TaskState, ReportSet]:
        """Remove `mine` here and `theirs` on the helper (in batches of at most
        REPORT_PAGE ids per message); both servers' new digests."""
        task = self.core.remove_reports(task_id, mine)
        helper = None
        for lo in range(0, max(len(theirs), 1), REPORT_PAGE):
            part = theirs[lo : lo + REPORT_PAGE]
            helper = await self.helper.drop_reports(ReportIds(task_id, tuple(part)))
        assert helper is not None
        return task, helper

    async def _difference(self, task_id: str) -> tuple[list[bytes], list[bytes]]:
        """(ids only this server holds, ids only the helper holds), by walking both
        sorted id lists page by page: messages and memory bounded by the page,
        not by the task (only the differences are kept)."""
        only_mine: list[bytes] = []
        only_theirs: list[bytes] = []
        after_theirs = b""
        theirs: list[bytes] = []
        t_more = True
        after_mine = b""
        mine: list[bytes] = []
        m_more = True
        ti = mi = 0
        while True:
            if ti == len(theirs) and t_more:
                page = await self.helper.list_reports(
                    ReportPage(task_id, after_theirs, REPORT_PAGE)
                )
                theirs, ti, t_more = list(page.ids), 0, page.more
                if theirs:
                    after_theirs = theirs[-1]
                elif t_more:
                    raise FailedPrecondition("helper sent an empty page with more to come")
            if mi == len(mine) and m_more:
                mine = self.core.report_ids(task_id, after_mine, REPORT_PAGE)
                mi, m_more = 0, len(mine) == REPORT_PAGE
                if mine:
                    after_mine = mine[-1]
            t_done = ti == len(theirs) and not t_more
            m_done = mi == len(mine) and not m_more
            if t_done and m_done:
                return only_mine, only_theirs
            if t_done or (not m_done and mine[mi] < theirs[ti]):
                only_mine.append(mine[mi])
                mi += 1
            elif m_done or theirs[ti] < mine[mi]:
                only_theirs.append(theirs[ti])
                ti += 1
            else:
                mi += 1
                ti += 1

    async def robust_pass(self, task: TaskState, pass_id: bytes) -> U64:
        """Re-share every coordinate's aggregate as g(S) = min(tri(S), n·2^F): the
        leader's new shares (fresh randomness), the helper's staged on its side
        under `pass_id`.  One garbled pass per coordinate, ROBUST_LANES
        coordinates per chunk (run in parallel by the workers when the work is
        leased: the id travels in each job's header)."""
        task_id, d = task.params.task_id, task.params.d
        headers = [
            RobustChunk(task_id, lo, min(d, lo + ROBUST_LANES), pass_id)
            for lo in range(0, d, ROBUST_LANES)
        ]
        sums = self.core.sums(task_id) if self.work is None else None  # read once here
        parts = await self._passes(headers, lambda h: self.robust_chunk(task, h, sums))
        for h, p in zip(headers, parts, strict=True):  # a short one would shift every later share
            if len(p) != 8 * (h.coord_hi - h.coord_lo):
                raise PeerUnavailable(f"robust chunk at {h.coord_lo}: {len(p)} bytes of shares")
        return np.concatenate([np.frombuffer(p, dtype=np.uint64) for p in parts])

    async def robust_chunk(self, task: TaskState, h: RobustChunk, sums: U64 | None = None) -> bytes:
        """The leader's new shares of coordinates [coord_lo, coord_hi) (one chunk);
        `sums`: the task's aggregates if the caller holds them (else read)."""
        if sums is None:
            sums = self.core.sums(task.params.task_id)
        lo, hi = h.coord_lo, h.coord_hi
        x = Exchange.of(h, leader=True)
        out, _ = await self._exchange(
            x, h, lambda party: self.core.robust_shares(party, task, sums, lo, hi)
        )
        x.take(Step.RECORD)  # kept by the caller until MarkAgreed
        return np.asarray(out, dtype=np.uint64).tobytes()

    async def _passes(
        self, headers: Sequence[RobustChunk], run_here: Callable[[RobustChunk], Awaitable[bytes]]
    ) -> list[bytes]:
        """A close-time pass's chunks: here one after another, or as leased jobs
        that the workers run in parallel, at most PASS_JOBS queued at a time
        (every job is waited for; the first failure is raised once all have
        ended)."""
        if self.work is None:
            return [await run_here(h) for h in headers]
        work = self.work
        slots = asyncio.Semaphore(PASS_JOBS)

        async def leased(h: RobustChunk) -> bytes:
            async with slots:
                return await run_leased(work, h)

        results = await asyncio.gather(*(leased(h) for h in headers), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [bytes(r) for r in results]  # type: ignore[arg-type]

    # ------------------------------------------------------------ streams
    async def open_stream(self, request: OpenStream, *, crawl: bool = False) -> StreamInfo:
        """Charge the leader's ledger, then the helper's; each draws its own γ.
        A CRAWL stream is opened only by a crawl level (`crawl_level`)."""
        if (request.kind == StreamKind.CRAWL) != crawl:
            raise InvalidArgument("a crawl level's stream is opened by CrawlLevel, not OpenStream")
        stream_id = secrets.token_hex(16)
        if self.ledgers.owes(request.task_id):
            self.core.task(request.task_id)  # NOT_FOUND before any peer call
            await self.ledgers.sync(request.task_id)
        # The leader's stream stays `opening` (failed closed on a restart) until the
        # helper has charged too, so a crash between the two charges is reconciled.
        prepare = PrepareStream.opened(stream_id, request)
        self.core.open_stream(prepare, open_now=False)
        crash_point("open.before_helper")
        try:
            await self.helper.prepare_stream(prepare)
        except BaseException:
            # The leader's charge stays spent (never refund); the stream never answers.
            # The helper may or may not have charged (a lost reply leaves its copy
            # OPEN): reconcile before the next open, failing the copy there too.
            self.core.fail_stream(stream_id)
            self.ledgers.owe_stream(request.task_id, stream_id)
            raise
        self.core.confirm_stream(stream_id)
        stream, task = self.core.stream_and_task(stream_id)
        if pools_noise(stream, task):
            self._want_pool(stream_id, 0)  # γ and the first batch, before any chunk
        log.info(
            "task %s: stream %s opened (%s, epsilon %s, delta %s%s)",
            request.task_id,
            stream_id,
            request.kind.value,
            request.epsilon,
            request.delta or "0",
            f", plan {request.plan[0]} group {request.plan[1]}" if request.plan else "",
        )
        return StreamInfo.of(self.core.stream(stream_id))

    # ------------------------------------------------------------ the prefix crawl
    async def crawl_level(self, request: CrawlLevel) -> CrawlAnswer:
        """One level of a prefix crawl (servers/crawl.py): the request checked
        against this server's walk, the level's CRAWL stream charged on both
        ledgers, the level's check exchanged with the helper, and one
        comparison chunk revealing each candidate's bit.  A failure once the
        stream is charged fails it on both servers and ends the walk."""
        r = request
        task = self.core.task(r.task_id)
        if self.work is not None:
            raise FailedPrecondition(
                "this leader leases chunks to workers; a crawl runs in one process only "
                "(start the leader without --workers)"
            )
        if not r.walk_id and (r.depth or r.parents):
            raise InvalidArgument("a new walk starts at the root: no parents, depth 0")
        walk_id = r.walk_id or secrets.token_hex(16)
        walk = await self.core.walks.at(self.core.store, task, walk_id, r.depth, r.parents, 0)
        if walk.lock.locked():
            raise FailedPrecondition(f"walk {walk_id} is answering another level; one at a time")
        async with walk.lock:
            k = walk.check_level(r.parents, r.depth, r.steps)
            if not 1 <= r.tau <= 4 * task.params.n_max:
                raise InvalidArgument(
                    f"tau is a count of users in [1, 4·n_max = {4 * task.params.n_max}], "
                    f"got {r.tau}"
                )
            info = await self.open_stream(
                OpenStream(r.task_id, StreamKind.CRAWL, r.epsilon), crawl=True
            )
            sid = info.stream_id
            try:
                return await self._crawl_level(walk, r, sid, k)
            except BaseException:
                self.core.walks.forget(walk)  # the next level rebuilds from the record
                self.core.walks.drop_inputs(sid)
                if self.core.stream(sid).state == OPEN:
                    self.core.fail_stream(sid)
                    await self._fail_helper(sid)
                raise

    async def _crawl_level(self, walk: Any, r: CrawlLevel, sid: str, k: int) -> CrawlAnswer:
        mine = await asyncio.to_thread(walk.extend, r.parents, r.steps, 0)
        step = CrawlStep(
            sid, r.task_id, walk.walk_id, r.parents, r.depth, r.steps, mine.tobytes(), walk.size
        )
        deadline = step_deadline(walk.size, len(r.parents), r.steps)
        answer = await self.helper.crawl_step(step, timeout=deadline)
        theirs = shares_of(answer.prep_shares, walk.size)
        invalid = await asyncio.to_thread(walk.decide, mine, theirs)
        stream, task = self.core.stream_and_task(sid)
        z = walk.inputs(stream.epsilon, self.core.rng, 0, r.tau)
        self.core.walks.stepped(sid, walk, r.parents, r.depth, r.steps, invalid, z)
        index = np.arange(k, dtype=np.int64)
        chunk = Chunk(index, np.zeros(k, dtype=bool))
        bits, _, nbytes = await self._run_chunk(stream, task, chunk, None)
        if len(bits) != k:
            raise PeerUnavailable(f"the comparison returned {len(bits)} bits for {k} candidates")
        log.info(
            "task %s: walk %s level %d (%d bits, %d candidates) answered, %d reports refused",
            r.task_id,
            walk.walk_id,
            walk.levels,
            r.depth + r.steps,
            k,
            int(invalid.sum()),
        )
        step_bytes = 2 * len(step.prep_shares)
        return CrawlAnswer(
            walk.walk_id, sid, tuple(bool(b) for b in bits), int(invalid.sum()), nbytes + step_bytes
        )

    def _open_stream(self, stream_id: str, kind: ChunkKind) -> tuple[StreamState, TaskState]:
        self._mark_chunk()  # any task's chunk: the preparer waits for quiet
        stream, task = self.core.stream_and_task(stream_id)
        answers = ChunkKind.of_stream(stream.kind)
        if kind != answers:
            raise InvalidArgument(
                f"{_STREAM_NAMES.get(stream.kind, 'an AboveThreshold')} stream answers "
                f"{_CHUNK_CALLS[answers]}, not {_CHUNK_CALLS[kind]}"
            )
        if stream.state != OPEN:
            raise StreamClosed(f"stream {stream_id} is {stream.state}; it answers no more")
        return stream, task

    async def ask(self, request: Ask) -> AskAnswer:
        stream, task = self._open_stream(request.stream_id, ChunkKind.ASK)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        taus = parse_taus(task, request.tau, len(chunk))
        self.core.check_queries(stream, chunk)
        pools = pools_noise(stream, task)
        if pools:
            await self._move_prepared(stream, task, len(chunk))
            await self._pool_ready(stream, len(chunk))
        if self.work is not None:
            answer = await self._leased(request, stream.stream_id)
            assert isinstance(answer, AskAnswer)
        else:
            try:
                j, closed, nbytes = await self._run_chunk(stream, task, chunk, taus)
            finally:
                drawn = self._drawn.pop(stream.stream_id, 0)
            answer = AskAnswer(j, closed, nbytes, drawn)
        if pools:
            self._want_prepared(
                task.params.task_id, shape_key(stream.kind, stream.epsilon), len(chunk)
            )
        if pools and not answer.closed:
            self._want_pool(stream.stream_id, len(chunk))
        return answer

    async def compare(self, request: Compare) -> CompareAnswer:
        stream, task = self._open_stream(request.stream_id, ChunkKind.COMPARE)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        lows = parse_taus(task, request.tau_low, len(chunk), "tau_low")
        highs = parse_taus(task, request.tau_high, len(chunk), "tau_high")
        self.core.check_gap(stream, task, lows, highs)
        self.core.check_queries(stream, chunk)
        if self.work is not None:
            answer = await self._leased(request, stream.stream_id)
            assert isinstance(answer, CompareAnswer)
            return answer
        out, closed, nbytes = await self._run_chunk(stream, task, chunk, (lows, highs))
        return CompareAnswer(tuple(OUTCOME_OF_CODE[o] for o in out), closed, nbytes)

    async def noisy_max(self, request: NoisyMax) -> NoisyMaxAnswer:
        """Report-noisy-max on an open NMAX stream: the candidates are checked,
        then the chunk runs as an Ask chunk does (durable mark on both servers,
        each server's own noise on its share, the garbled tournament, the
        result recorded); its one answer closes the stream.  A chunk with
        `more` to follow answers no index and leaves the stream open: the
        tournament goes on in the next chunk, from the winner carried
        secret-shared (`ServerCore.noisy_max`)."""
        stream, task = self._open_stream(request.stream_id, ChunkKind.NMAX)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        chunk = replace(chunk, more=request.more)
        self.core.check_queries(stream, chunk)
        if self.work is not None:
            answer = await self._leased(request, stream.stream_id)
            assert isinstance(answer, NoisyMaxAnswer)
            return answer
        j, closed, nbytes = await self._run_chunk(stream, task, chunk, None)
        return NoisyMaxAnswer(j, closed, nbytes)

    async def _run_chunk(
        self, stream: StreamState, task: TaskState, chunk: Chunk, thresholds: Thresholds | None
    ) -> tuple[Any, bool, int]:
        """One chunk at a time per stream (concurrent chunks are refused)."""
        sid = stream.stream_id
        if sid in self._busy:
            raise FailedPrecondition(f"stream {sid} is answering another chunk; send one at a time")
        self._busy.add(sid)
        try:
            return await self._chunk(stream, task, chunk, thresholds)
        finally:
            self._busy.discard(sid)
            self._mark_chunk()

    def _mark_chunk(self) -> None:
        """A chunk of any stream, on any task, starts or ends now: the preparer
        makes noise only once none has for `PreparePolicy.idle` seconds."""
        self._last_chunk = asyncio.get_running_loop().time()

    async def _chunk(
        self, stream: StreamState, task: TaskState, chunk: Chunk, thresholds: Thresholds | None
    ) -> tuple[Any, bool, int]:
        """One stream chunk's exchange (`servers.exchange.machine`, flow STREAM):
        the header with the protocol's first message, the durable mark while
        they travel (before them when the chunk's inputs are the pooled shares
        it consumes), the evaluation, the result recorded.  Once the header is
        out, any failure or refusal fails the stream closed on both servers;
        nothing is refunded.  Result, whether it closed, bytes."""
        sid, next_chunk = stream.stream_id, stream.chunks + 1
        draw = self.core.pool_draw(stream, task, len(chunk))
        if pools_noise(stream, task):  # what the chunk draws itself: shown to the analyst
            self._drawn[sid] = len(chunk) - draw.count
        header = StreamChunk(
            ChunkKind.of_stream(stream.kind),
            sid,
            next_chunk,
            Queries(chunk.index, chunk.complement[: len(chunk) if chunk.complement.any() else 0]),
            chunk.more,
            draw,
        )
        x = Exchange.of(header, leader=True)
        pooled: list[Pooled | None] = [None]

        def mark() -> None:
            # Both servers fsync their mark in parallel, the helper's before its
            # go, this one before the go is read: no result before its own mark.
            pooled[0] = self.core.begin_pooled(stream, task, next_chunk, draw, len(chunk))
            crash_point("chunk.after_mark")

        async def run(party: ComparisonParty) -> tuple[Any, Progress]:
            if draw != PoolDraw() and x.may(Step.MARK):
                mark()  # the inputs are the pooled shares the mark consumes
                x.take(Step.MARK)
            return await self.core.run_chunk(party, stream, task, chunk, thresholds, pooled[0])

        (result, progress), traffic = await self._exchange(x, header, run, mark)
        self.core.end_chunk(sid, progress)
        x.take(Step.RECORD)
        return result, progress.closes, traffic

    # ------------------------------------------------------------ joint noise pool
    async def fill_pool(self, stream_id: str, count: int, gamma: bool = False) -> int | None:
        """One batch of a joint-noise stream's noise, ahead of its chunks: `count`
        ν samples (and, `gamma`, its γ) numbered from the leader's next unreserved
        sequence number, reserved durably on both servers first, generated on a
        pooled session, kept by the helper before its closing status and by the
        leader after it (so the leader never holds a sample the helper lacks).
        The bytes the batch exchanged, or None if it was not kept (the stream
        answers no more, or went past it).  A failed batch is never used: its
        numbers stay reserved, its shares are gone."""
        batch, stream, task = self.core.reserve_noise_batch(stream_id, count, gamma)
        width = self.core.comparison_width(task, stream)
        return await self._noise_batch(
            batch,
            lambda party: batch_shares(party, stream, task, batch, width),
            lambda shares: self.core.store.add_joint_batch(
                stream_id, batch.lo, shares[1], shares[0]
            ),
        )

    async def _noise_batch(
        self,
        batch: NoiseBatch,
        run: Callable[[ComparisonParty], Awaitable[Any]],
        keep: Callable[[Any], bool],
    ) -> int | None:
        """A noise batch whose numbers this server has reserved (its MARK: durable
        for a stream's pool, in memory for a prepared one): the exchange, then
        `keep` its result once the helper's closing status says the helper kept
        its own.  The bytes exchanged, or None if not kept."""
        x = Exchange.of(batch, leader=True)
        x.take(Step.MARK)
        result, traffic = await self._exchange(x, batch, run)
        kept = keep(result)
        x.take(Step.RECORD)
        return traffic if kept else None

    # ------------------------------------------------------------ prepared noise
    async def fill_prepared(self, task: TaskState, shape: str, count: int) -> int | None:
        """One batch of a task's prepared pool of one shape: `count` ν samples,
        numbered from the pool's next, reserved on both servers before the
        sampler runs, kept by the helper before its closing status and by the
        leader after it.  The bytes exchanged, or None if not kept."""
        kind, eps = parse_shape(shape)
        ref = self.core.prepared.start(task.params.task_id, shape)
        lo = self.core.prepared.reserve(ref, count)
        width = self.core.shape_width(task, kind, eps)
        return await self._noise_batch(
            NoiseBatch("", lo, count, False, ref),
            lambda party: prepared_shares(party, task, kind, eps, count, width),
            lambda nu: self.core.prepared.add(ref, lo, nu),
        )

    async def _move_prepared(self, stream: StreamState, task: TaskState, k: int) -> None:
        """Before a chunk of k queries: what the stream's pool lacks of k, moved
        out of the task's prepared pool of the stream's shape (no sampler runs).
        What it lacks is counted once, before the first move: a pool with a gap
        (numbers reserved by a batch that failed) never sees its first run
        grow, and recounting would empty the prepared pool into it.  A move
        that fails drops the prepared pool (the helper may have lost its own);
        the chunk then draws what is missing as before."""
        shape = shape_key(stream.kind, stream.epsilon)
        if not self.core.prepared.first_run(task.params.task_id, shape)[1]:
            return  # nothing prepared: no store read on the chunk's path
        need = k - self.core.store.joint_pool(stream.stream_id).first_run()[1]
        while need > 0:
            async with self._fill_slot:
                moved = await self._try_move(stream, task.params.task_id, need)
            if not moved:
                return
            need -= moved

    async def _try_move(self, stream: StreamState, task_id: str, count: int) -> int:
        """Move up to `count` prepared samples of the stream's shape into its
        pool (the caller holds the fill slot); how many moved.  Only a failed
        exchange drops the prepared pool (the helper may have lost its own); a
        stream that answers no more just takes nothing."""
        shape = shape_key(stream.kind, stream.epsilon)
        ref = self.core.prepared.ref(task_id, shape)
        src_lo, held = self.core.prepared.first_run(task_id, shape)
        count = min(count, held, MAX_BATCH)
        if ref is None or count <= 0:
            return 0
        try:
            batch, _, _ = self.core.reserve_noise_batch(stream.stream_id, count, False)
        except Refusal:  # the stream answers no more (or draws no joint noise)
            return 0
        taken = self.core.prepared.take(ref, src_lo, count)  # used once, whatever follows

        async def nothing(party: ComparisonParty) -> None:
            return None  # nothing is generated: both servers take their own shares

        try:
            kept = await self._noise_batch(
                NoiseBatch(stream.stream_id, batch.lo, count, False, ref, True, src_lo),
                nothing,
                lambda _: self.core.store.add_joint_batch(stream.stream_id, batch.lo, taken, None),
            )
        except Exception as exc:  # noqa: BLE001 - the chunk draws in the chunk instead
            log.warning("task %s: prepared noise not moved (%s); dropping it", task_id, exc)
            self.core.prepared.drop(task_id, shape)
            return 0
        return count if kept is not None else 0

    def prepare_noise(
        self, task_id: str, kind: StreamKind, epsilon: str, count: int
    ) -> PrepareStatus:
        """The analyst's PrepareNoise: hold `count` samples of the shape (kind, ε)
        for a joint-noise task's streams — made by the preparer, as what runs
        consumed is, while no chunk runs (a level: samples already held or
        pending count towards it); count 0 only reports.  Allowed while the
        collection is open (the noise depends on the task's parameters, not on
        its data).  Charges nothing: a sample is charged by the stream that
        uses it.  InvalidArgument for a task without joint noise, a kind whose
        noise is not prepared, an ε no stream of the task may take, a count
        above the bound; FailedPrecondition where preparing is off."""
        task = self.core.task(task_id)
        if task.params.noise != JOINT:
            raise InvalidArgument(f"task {task_id!r} draws no joint noise: nothing to prepare")
        if kind not in JOINT_SVT_KINDS:
            raise InvalidArgument(
                "noise is prepared for lap24, lap3 and exp3 streams (ctt and report-noisy-max "
                f"draw theirs in their chunks), not {kind.value}"
            )
        try:
            eps = check_epsilon(epsilon)
        except (ValueError, ArithmeticError) as exc:
            raise InvalidArgument(str(exc)) from None
        if not task.params.epsilon_min <= eps <= MAX_STREAM_EPSILON:
            raise InvalidArgument(
                f"epsilon={eps}: a stream of task {task_id!r} takes ε in "
                f"[{task.params.epsilon_min}, {MAX_STREAM_EPSILON}]"
            )
        stream_noise(kind, eps, task.params.frac_bits)  # the sampler fits
        cap = self.core.prepared.cap
        if not 0 <= count <= cap:
            raise InvalidArgument(f"count must be in [0, {cap:,}] (a task's prepared bound)")
        if self.prepare is None or self.noise_pool is None:
            raise FailedPrecondition("this process does not prepare noise")
        key = (task_id, shape_key(kind, eps))
        held = self.core.prepared.held(*key)
        if count > held + self._demand.get(key, 0):
            # Asked for: made after what was asked before, before what runs consumed.
            self._demand.pop(key, None)
            asked = [k for k in self._asked if k in self._demand]
            self._asked = [*asked, key]
            rest = {k: v for k, v in self._demand.items() if k not in self._asked}
            self._demand = {**{k: self._demand[k] for k in asked}, key: count - held, **rest}
            self._start_preparer()
        return PrepareStatus(held, self._demand.get(key, 0), cap, self.core.prepared.held(task_id))

    def _want_prepared(self, task_id: str, shape: str, used: int) -> None:
        """Count what a joint-noise chunk used towards its shape's prepared
        pool and make sure the preparer runs."""
        policy = self.prepare
        if policy is None or self.noise_pool is None:  # a worker: its front end prepares
            return
        key = (task_id, shape)
        self._demand[key] = self._demand.get(key, 0) + math.ceil(used * (1 + policy.margin))
        self._start_preparer()

    def _start_preparer(self) -> None:
        if self._preparer is None or self._preparer.done():
            self._preparer = asyncio.create_task(self._prepare_loop())

    async def _prepare_loop(self) -> None:
        """Make the wanted samples, one batch at a time, only once no
        chunk of any task has run for `prepare.idle` seconds (so between runs,
        not during them); ends when nothing is wanted (or preparing is off).
        The policy is read afresh at every step."""
        loop = asyncio.get_running_loop()
        while self._demand and self.prepare is not None:
            policy = self.prepare
            quiet = loop.time() - self._last_chunk
            if quiet < policy.idle:
                await asyncio.sleep(min(policy.idle - quiet, 1.0))
                continue
            (task_id, shape), want = next(iter(self._demand.items()))
            room = self.core.prepared.cap - self.core.prepared.held(task_id)
            count = min(want, policy.batch, MAX_BATCH, room)
            if count <= 0:  # made, or the bound reached
                del self._demand[(task_id, shape)]
                continue
            try:
                task = self.core.task(task_id)
                async with self._fill_slot:
                    kept = await self.fill_prepared(task, shape, count)
            except Exception as exc:  # noqa: BLE001 - a pool that cannot fill is let go
                log.warning("task %s: noise not prepared (%s)", task_id, exc)
                self._demand.pop((task_id, shape), None)
                continue
            if kept is None:
                self._demand.pop((task_id, shape), None)
                continue
            # What is wanted now, less this batch (an analyst's request may have
            # raised it while the batch ran).
            left = max(0, self._demand.get((task_id, shape), want) - count)
            self._demand[(task_id, shape)] = left
            if left == 0:
                held = self.core.prepared.held(task_id, shape)
                log.info("task %s: %d joint-noise samples of %s prepared", task_id, held, shape)

    def _want_pool(self, stream_id: str, k: int) -> None:
        """Fill the stream's pool in the background (one filler per stream at a
        time) up to max(policy reserve, k) samples, with γ before the first chunk."""
        policy = self.noise_pool
        if policy is None or stream_id in self._fills:
            return
        want = max(policy.reserve, k)
        task = asyncio.create_task(self._fill(stream_id, want, policy))
        self._fills[stream_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._fills.get(stream_id) is t:
                del self._fills[stream_id]

        task.add_done_callback(done)

    async def _fill(self, stream_id: str, want: int, policy: PoolPolicy) -> None:
        try:
            while await self._fill_once(stream_id, want, policy):
                pass
        except Exception as exc:  # noqa: BLE001 - the chunks draw in the chunk instead
            log.warning("stream %s: joint noise batch failed: %s", stream_id, exc)

    async def _fill_once(self, stream_id: str, want: int, policy: PoolPolicy) -> bool:
        """One batch towards `want` held samples (and γ); whether to go on."""
        async with self._fill_slot:
            stream = self.core.stream(stream_id)
            if stream.state not in (OPEN, IN_CHUNK):
                return False
            pool = self.core.store.joint_pool(stream_id)
            gamma = stream.chunks == 0 and not pool.gamma_ready
            if pool.held >= want and not gamma:
                return False
            count = policy.first if gamma else want - pool.held
            count = max(1, min(count, policy.batch, MAX_BATCH))
            shape = shape_key(stream.kind, stream.epsilon)
            if not gamma and self.core.prepared.first_run(stream.task_id, shape)[1]:
                # Prepared samples wait for the next chunk's own move, which takes
                # exactly what it needs: moved now, they would be lost with the
                # stream if it closes on its next YES.
                return False
            return await self.fill_pool(stream_id, count, gamma) is not None

    async def stop_noise_fills(self) -> None:
        """Cancel the background fillers (shutdown); a batch cut short is never used."""
        fills = list(self._fills.values())
        if self._preparer is not None:
            fills.append(self._preparer)
        for t in fills:
            t.cancel()
        for t in fills:
            with contextlib.suppress(BaseException):
                await t

    async def _pool_ready(self, stream: StreamState, k: int) -> None:
        """Before a chunk of k queries: while its stream's pool is being filled
        and lacks γ (first chunk) or k samples, wait for the filler's batches,
        since finishing a batch already under way costs the chunk less than
        drawing in it.  A filler that ends (or fails) leaves the chunk to draw
        in the chunk what the pool lacks."""
        fill = self._fills.get(stream.stream_id)
        while fill is not None and not fill.done():
            pool = self.core.store.joint_pool(stream.stream_id)
            if not (stream.chunks == 0 and not pool.gamma_ready) and pool.first_run()[1] >= k:
                return
            await asyncio.wait({fill}, timeout=POOL_POLL)

    async def _fail_closed(self, x: Exchange, stream_id: str | None) -> None:
        """D4: once an exchange is committed, its stream fails closed here and
        on the helper."""
        if x.committed and stream_id is not None:
            x.take(Step.FAIL)
            self.core.fail_stream(stream_id)
            await self._fail_helper(stream_id)

    async def _exchange(
        self,
        x: Exchange,
        header: ChunkHeader,
        run: Callable[[ComparisonParty], Awaitable[Any]],
        mark: Callable[[], None] | None = None,
    ) -> tuple[Any, int]:
        """The leader's side of one exchange on a pooled session, in one round
        trip (`servers.exchange.machine`): the header, the first protocol
        message right behind it, `mark` while they travel if the exchange's
        MARK is still due, the helper's verdict and tables, the result sent
        one way; a close-time flow also reads the helper's closing status.
        A failure once committed fails the stream (D4), and a failed session is
        discarded.  Result and bytes exchanged; the caller takes RECORD."""
        session = await self.pool.acquire()
        healthy = False
        try:
            before = session.traffic
            await session.send_header(x, header, mark)
            # A deadline on this task, not a task of its own (as wait_for makes):
            # one loop hop less per chunk.
            async with asyncio.timeout(CHUNK_DEADLINE):
                result = await run(session.party)
                await session.verdict()  # read already, unless the protocol never replied
            x.take(Step.RUN)
            crash_point("chunk.after_result")
            if x.flow.close_time:
                refused = await session.status()
                if refused is not None:
                    raise refused
                x.take(Step.READ_CLOSING)
            healthy = True
        except BaseException as exc:
            await self._fail_closed(x, getattr(header, "stream_id", None))
            if isinstance(exc, asyncio.TimeoutError):
                raise PeerUnavailable("the protocol with the helper timed out") from None
            raise
        finally:
            await self.pool.release(session, healthy)
        return result, session.traffic - before

    async def _leased(self, request: Ask | Compare | NoisyMax, stream_id: str) -> JobAnswer:
        """A chunk run by a worker.  When it failed the stream (its helper process
        may have been the one that died, leaving the helper's copy mid-chunk),
        the stream is failed through the helper's main process as well."""
        assert self.work is not None
        try:
            return await run_leased(self.work, request, stream_id, self._lost)
        except WorkerLost:
            raise  # `_lost` has failed it on both servers already
        except Refusal:
            if self.core.stream(stream_id).state == FAILED:
                await self._fail_helper(stream_id)
            raise

    async def _lost(self, stream_id: str) -> None:
        """A worker died mid-chunk: fail the stream closed on both servers."""
        self.core.fail_stream(stream_id)
        await self._fail_helper(stream_id)

    async def run_job(self, job: Job) -> bytes:
        """A leased job, run in this (worker) process exactly as the front end
        would run it in process; the result as the bytes the front end returns."""
        return await serve_job(job, self._run_inputs)

    async def _run_inputs(self, inputs: JobInputs) -> JobAnswer:
        if isinstance(inputs, Ask):
            return await self.ask(inputs)
        if isinstance(inputs, Compare):
            return await self.compare(inputs)
        if isinstance(inputs, NoisyMax):
            return await self.noisy_max(inputs)
        task = self.core.task(inputs.task_id)
        return await self.robust_chunk(task, inputs)

    async def _fail_helper(self, stream_id: str) -> None:
        try:
            await self.helper.fail_stream(stream_id, timeout=5.0)
        except Refusal:
            log.warning("could not fail stream %s on the helper", stream_id)
