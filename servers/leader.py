"""The leader driver: every analyst request the leader serves, and how it drives
the helper through a `HelperPort` — ledger reconciliation, close / reconcile /
validate, stream opening and the chunk exchange with fail-closed handling.
Free of any transport: the gRPC `AnalystService` is a thin wrapper, and tests
run it against an in-memory helper."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from svtagg.dp.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PeerUnavailable,
    Refusal,
    StreamClosed,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import check_groups_usable, parse_groups
from svtagg.mpc.ring import U64
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import (
    CHUNK_DEADLINE,
    KIND_TO_PB,
    OUTCOME_OF_CODE,
    OUTCOME_TO_PB,
    PASS_ID_BYTES,
    REPORT_PAGE,
    kind_from_pb,
    plan_request,
    refusal_from_status,
    split_ids,
)
from svtagg.servers.core import (
    Chunk,
    ComparisonParty,
    PartyFactory,
    ServerCore,
    parse_chunk,
    parse_taus,
)
from svtagg.servers.faults import crash_point
from svtagg.servers.messages import spec_params, stream_info, task_info
from svtagg.servers.port import HelperPort, PeerMethod
from svtagg.servers.session import SessionPool
from svtagg.servers.store import (
    FAILED,
    OPEN,
    PLAN_ACTIVE,
    PLAN_FAILED,
    StreamState,
    TaskState,
)
from svtagg.servers.work import ASK, COMPARE, ROBUST, VALIDATE, Job, WorkerLost, WorkQueue

log = logging.getLogger("svtagg.server")

#: Coordinates per robust-aggregate chunk: about 315 AND gates each, so ~45 MB of
#: tables per chunk.
ROBUST_LANES = 4096

#: Lanes per range-validation chunk (2d per report): about 150 MB of protocol
#: traffic, well inside the chunk deadline.
VALIDATION_LANES = 50_000
#: Close-time chunks a leasing leader keeps queued or running at once (more
#: than any pool of workers it pairs; bounds the work table and the waiters).
PASS_JOBS = 32
#: How long `close_collection` waits for the helper before closing anything.
HELPER_CHECK_DEADLINE = 5.0

#: What one chunk's protocol run returns: (result, queries answered, stream closes).
ChunkRun = Callable[[ComparisonParty, StreamState], Awaitable[tuple[Any, int, bool]]]


class LeaderDriver:
    """The leader's analyst API; every state change is mirrored on the helper."""

    def __init__(
        self,
        core: ServerCore,
        helper: HelperPort,
        party: PartyFactory,
        work: WorkQueue | None = None,
    ) -> None:
        self.core = core
        self.helper = helper
        self.pool = SessionPool(lambda: helper.open_session(party))
        self._busy: set[str] = set()
        self._close_lock = asyncio.Lock()
        # Tasks whose helper ledger may lag the leader's (after a restart, or after
        # a PrepareStream that failed): reconciled before the next stream opens.
        self._unsynced: set[str] = set(core.store.task_ids())
        # Streams this leader failed on recovery: failed on the helper as well at
        # the next reconciliation, so that both stores show them failed.
        self._recovered: dict[str, list[str]] = {}
        for sid, tid in core.store.recovered_failed:
            self._recovered.setdefault(tid, []).append(sid)
        self._sync_lock = asyncio.Lock()
        # Plans whose reservation on the helper may be missing or may have been
        # made after the leader gave up on it: failed there at the next sync.
        self._failed_plans: dict[str, list[str]] = {}
        # Plans active when this leader started: one it died reserving (after its
        # own reservation, before the helper's) is charged here only; reserved on
        # the helper too at the next reconciliation.
        self._recovered_plans: dict[str, list[str]] = {}
        for plan_id, tid in core.store.recovered_plans:
            self._recovered_plans.setdefault(tid, []).append(plan_id)
        #: Leased work (servers/work.py): when set, chunks and close-time passes
        #: are queued for worker processes instead of run in this process.
        self.work = work

    async def _call(self, method: PeerMethod, request: Any) -> Any:
        return await self.helper.call(method, request)

    # ------------------------------------------------------------ ledgers
    async def sync_ledgers(self, task_id: str) -> int:
        """Bring the helper's ledger up to the leader's; returns the charges replayed.

        Who wins: the leader charges first (committed) and the helper second, so
        after a crash between the two charges the leader has spent more.  The
        leader's ledger wins.  Plans first, so that a stream replayed into a plan
        finds it: a plan active at this leader's start is reserved on the helper
        (ReservePlan is idempotent there: a plan it holds, in any state, is left
        as it is), and every plan the leader failed is failed there too,
        reserved first if absent.  Then every stream the leader failed is failed
        on the helper too, and one the helper never saw is replayed there
        (PrepareStream with `replay`: charged where the stream was charged — the
        task's ledger or its plan's group — and recorded failed; no γ drawn).
        Both ledgers then show the larger spend; nothing is ever refunded.

        A replay the helper refuses (its ledger or plan already holds more than
        the leader's, as an older version could leave it) is logged and skipped,
        so the task stays usable: the ledgers may then differ, but each still
        covers every stream that answered on it — the leader's because it always
        charges first, the helper's because the refused stream never answered
        there (docs/services.md, "How a chunk runs")."""
        async with self._sync_lock:
            if task_id not in self._unsynced:
                return 0
            # Taken now, so that what a call failing meanwhile adds waits for the
            # next sync; put back if this one fails half-way (it starts over).
            pending = (self._recovered, self._recovered_plans, self._failed_plans)
            owed = [p.pop(task_id, []) for p in pending]
            try:
                replayed = await self._reconcile(task_id, *owed)
            except BaseException:
                for p, ids in zip(pending, owed, strict=True):
                    if ids:
                        p[task_id] = ids + p.get(task_id, [])
                raise
            if replayed:
                log.info(
                    "task %s: ledgers reconciled, %d charge(s) replayed on the helper",
                    task_id,
                    replayed,
                )
            if not any(task_id in p for p in pending):  # else a call failed meanwhile
                self._unsynced.discard(task_id)
            return replayed

    async def _reconcile(
        self, task_id: str, recovered: list[str], started: list[str], failed: list[str]
    ) -> int:
        """`sync_ledgers`' calls to the helper: `recovered`, the streams this
        leader failed since its start; `started`, the plans active at its
        start; `failed`, the plans it failed since.  The charges replayed."""
        task = self.core.store.task(task_id)
        helper = (await self._call(PeerMethod.BUDGET, pb.TaskRef(task_id=task_id))).budget
        mine = task.budget
        replayed = 0
        # Equal ledgers: what this leader knows it failed since its start, and
        # the failed streams of active plans (their charge is inside the plan,
        # so the ledgers are equal whether or not the helper holds them);
        # unequal: every failed stream and plan (replaying is idempotent).
        behind = (helper.epsilon_spent, helper.delta_spent) != (
            str(mine.epsilon_spent),
            str(mine.delta_spent),
        )
        store = self.core.store
        streams = [store.stream(sid) for sid in store.stream_ids(task_id, FAILED)]
        plans = failed
        if behind:
            plans = store.plan_ids(task_id, PLAN_FAILED)
        else:
            active = set(store.plan_ids(task_id, PLAN_ACTIVE))
            streams = [store.stream(sid) for sid in recovered] + [
                s
                for s in streams
                if s.stream_id not in recovered and s.plan is not None and s.plan[0] in active
            ]
        for plan_id in started:
            await self._reserve_on_helper(task_id, plan_id)
        for plan_id in plans:
            book, _, _ = self.core.store.plan(plan_id)
            replayed += await self._fail_or_replay(
                PeerMethod.FAIL_PLAN,
                pb.PlanRef(plan_id=plan_id),
                PeerMethod.RESERVE_PLAN,
                plan_request(task_id, book, plan_id),
            )
        for s in streams:
            plan_id, group = s.plan if s.plan is not None else ("", 0)
            replayed += await self._fail_or_replay(
                PeerMethod.FAIL_STREAM,
                pb.StreamRef(stream_id=s.stream_id),
                PeerMethod.PREPARE_STREAM,
                pb.PrepareStreamRequest(
                    stream_id=s.stream_id,
                    task_id=s.task_id,
                    kind=KIND_TO_PB[s.kind],
                    epsilon=str(s.epsilon),
                    delta=str(s.delta) if s.delta else "",
                    plan_id=plan_id,
                    plan_group=group,
                    replay=True,
                ),
            )
        return replayed

    async def _reserve_on_helper(self, task_id: str, plan_id: str) -> None:
        """Reserve on the helper a plan that was active at this leader's start
        and still is (the helper leaves a plan it already holds as it is), so
        that both ledgers hold its charge.  The plan stays active on both: the
        leader cannot tell a reservation the analyst never saw confirmed from
        one it did, and an active plan refunds only what no stream used.  A
        refusal is logged, as a refused replay is (see `sync_ledgers`)."""
        book, state, _ = self.core.store.plan(plan_id)
        if state == PLAN_ACTIVE:
            await self._unless_refused(
                PeerMethod.RESERVE_PLAN,
                plan_request(task_id, book, plan_id),
                f"reserve plan {plan_id}, active here since before the restart",
            )

    async def _unless_refused(self, method: PeerMethod, request: Any, what: str) -> bool:
        """A reconciliation call whose refusal is logged, not raised, so the task
        stays usable (see `sync_ledgers`); an unreachable helper is raised (the
        task stays to be reconciled).  False if refused."""
        try:
            await self._call(method, request)
            return True
        except PeerUnavailable:
            raise
        except Refusal as exc:
            log.warning(
                "task %s: the helper refused to %s (%s); its ledger is left as it is, "
                "the leader's keeps the charge",
                request.task_id,
                what,
                type(exc).__name__,
            )
            return False

    async def _fail_or_replay(
        self, fail: PeerMethod, ref: Any, replay: PeerMethod, charge: Any
    ) -> int:
        """Fail a stream or plan the leader failed on the helper too, replaying
        its charge there first (`replay`, then `fail`) if the helper never saw
        it, so that both ledgers hold it.  1 if a charge was replayed.  A replay
        the helper refuses is logged, not raised (see `sync_ledgers`); an
        unreachable helper is raised (the task stays to be reconciled)."""
        try:
            await self._call(fail, ref)
            return 0
        except NotFound:
            pass
        what = (
            f"replay the charge of failed stream {ref.stream_id}"
            if replay == PeerMethod.PREPARE_STREAM
            else f"replay the charge of failed plan {ref.plan_id}"
        )
        if not await self._unless_refused(replay, charge, what):
            return 0
        await self._call(fail, ref)
        return 1

    # ------------------------------------------------------------ plans
    async def reserve_plan(self, request: pb.PlanRequest) -> pb.PlanInfo:
        """Reserve the plan's composed charge on the leader, then on the helper
        (each computes and checks it); refused whole, nothing spent, if it does
        not fit either ledger.  Leader first, as for streams: a failure after the
        leader's reservation fails the plan (never refunded) and is reconciled."""
        plan_id = secrets.token_hex(16)
        if request.task_id in self._unsynced:
            self.core.store.task(request.task_id)
            await self.sync_ledgers(request.task_id)
        # A plan no stream could use is refused here, before either ledger is charged.
        check_groups_usable(
            parse_groups([(g.epsilon, g.delta) for g in request.groups]),
            self.core.store.task(request.task_id).params.epsilon_min,
        )
        info = self.core.reserve_plan(plan_id, request)
        crash_point("plan.before_helper")
        forward = pb.PlanRequest()
        forward.CopyFrom(request)
        forward.plan_id = plan_id
        try:
            await self._call(PeerMethod.RESERVE_PLAN, forward)
        except BaseException:
            # The leader's reservation stays spent (never refund); the helper may
            # hold the plan after all (a lost reply) or may have refused it (its
            # own ledger): the next sync fails it there, reserving it first if absent.
            self.core.store.fail_plan(plan_id)
            self._failed_plans.setdefault(request.task_id, []).append(plan_id)
            self._unsynced.add(request.task_id)
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

    async def end_plan(self, plan_id: str) -> pb.PlanInfo:
        """End the plan on the helper, then here; each returns what the plan did
        not use (basic plans only).  Idempotent."""
        _, _, task_id = self.core.store.plan(plan_id)  # NOT_FOUND before any peer call
        if task_id in self._unsynced:
            # A stream of this plan the helper missed is replayed into the plan
            # first, so that both servers refund the same unused part.
            await self.sync_ledgers(task_id)
        await self._call(PeerMethod.END_PLAN, pb.PlanRef(plan_id=plan_id))
        info = self.core.plan_info(plan_id, self.core.store.end_plan(plan_id))
        log.info(
            "plan %s: ended (refunded epsilon %s, delta %s)",
            plan_id,
            info.refunded_epsilon or "0",
            info.refunded_delta or "0",
        )
        return info

    # ------------------------------------------------------------ tasks
    async def create_task(self, request: pb.TaskSpec) -> pb.TaskInfo:
        params = spec_params(request)
        self.core.check_budget_policy(params)
        if params.task_id in self.core.store.task_ids():
            raise AlreadyExists(f"task {params.task_id!r} already exists")
        await self._call(PeerMethod.CREATE_TASK, request)
        info = task_info(self.core.store.create_task(params))
        log.info(
            "task %s: created (d=%d, n_max=%d, total epsilon %s, delta %s, validate_reports=%s)",
            params.task_id,
            request.d,
            request.n_max,
            request.epsilon_total,
            request.delta_total,
            request.validate_reports,
        )
        return info

    async def describe(self, task_id: str) -> pb.TaskInfo:
        """The task with both ledgers (the leader's view alone while the helper is down)."""
        task = self.core.store.task(task_id)
        ref = pb.TaskRef(task_id=task_id)
        try:
            # A short first call: a helper that is down costs seconds, not the
            # caller's whole deadline.
            await self.helper.call(PeerMethod.BUDGET, ref, timeout=HELPER_CHECK_DEADLINE)
            await self.sync_ledgers(task_id)
            task = self.core.store.task(task_id)
            helper = await self._call(PeerMethod.BUDGET, ref)
        except PeerUnavailable as exc:
            log.warning("task %s: described without the helper's ledger (%s)", task_id, exc)
            return task_info(task)
        info = task_info(task)
        info.helper_budget.CopyFrom(helper.budget)
        return info

    def list_tasks(self) -> pb.TaskList:
        store = self.core.store
        return pb.TaskList(tasks=[task_info(store.task(t)) for t in store.task_ids()])

    async def close_collection(self, task_id: str) -> pb.TaskInfo:
        """Close on both servers, then reconcile: a report only one server stored
        (a client that gave up between the two uploads) is taken out on that server,
        so n and the sums cover exactly the reports both hold.  Idempotent; queries
        are refused until both servers have recorded the agreement."""
        async with self._close_lock:  # one reconciliation at a time
            return await self._close(task_id)

    async def _close(self, task_id: str) -> pb.TaskInfo:
        task = self.core.store.task(task_id)
        if task.agreed:
            return task_info(task)
        ref = pb.TaskRef(task_id=task_id)
        if task.collection_open:
            # The helper must answer before the leader's side closes, so an outage
            # refuses the close cleanly instead of closing one server only.
            await self.helper.call(PeerMethod.BUDGET, ref, timeout=HELPER_CHECK_DEADLINE)
            task = self.core.store.close_collection(task_id)
            log.info("task %s: collection closed on the leader (n=%d)", task_id, task.n)
        helper = await self._call(PeerMethod.CLOSE_COLLECTION, ref)
        dropped = 0
        if (helper.n, helper.report_digest) != (task.n, task.digest):
            only_mine, only_theirs = await self._difference(task_id)
            task, helper = await self._drop(task_id, only_mine, only_theirs)
            dropped = len(only_mine) + len(only_theirs)
            log.info("task %s: dropped %d reports only one server had", task_id, dropped)
            if (helper.n, helper.report_digest) != (task.n, task.digest):
                raise FailedPrecondition(
                    f"servers still disagree on the reports (leader n={task.n}, "
                    f"helper n={helper.n}); try closing again"
                )
        invalid: list[bytes] = []
        # A close retried after a lost MarkAgreed reply: the helper agreed on this
        # very set (validated then) and dropped its per-report shares, so the set
        # is not validated again; the robust pass and the agreement run again.
        agreed_there = helper.agreed and (helper.n, helper.report_digest) == (task.n, task.digest)
        if task.params.validate_reports and not agreed_there:
            invalid = await self._validate_reports(task)
            if invalid:
                task, helper = await self._drop(task_id, invalid, invalid)
                log.info(
                    "task %s: dropped %d reports with values out of range", task_id, len(invalid)
                )
                if (helper.n, helper.report_digest) != (task.n, task.digest):
                    raise FailedPrecondition("servers disagree after validation; close again")
        # Each pass has its own id: the helper keeps only this pass's shares.
        pass_id = secrets.token_bytes(PASS_ID_BYTES)
        robust = await self.robust_pass(task, pass_id) if self.core.robust_aggregates else None
        await self._call(
            PeerMethod.MARK_AGREED,
            pb.CollectionDigest(
                n=task.n, report_digest=task.digest, task_id=task_id, pass_id=pass_id
            ),
        )
        info = task_info(self.core.store.mark_agreed(task_id, robust))
        info.dropped_reports = dropped + len(invalid)
        log.info(
            "task %s: both servers agree on n=%d (dropped %d)",
            task_id,
            info.n,
            info.dropped_reports,
        )
        return info

    async def _drop(
        self, task_id: str, mine: list[bytes], theirs: list[bytes]
    ) -> tuple[TaskState, Any]:
        """Remove `mine` here and `theirs` on the helper (in batches of at most
        REPORT_PAGE ids per message); both servers' new digests."""
        task = self.core.remove_reports(task_id, mine)
        helper = None
        for lo in range(0, max(len(theirs), 1), REPORT_PAGE):
            part = theirs[lo : lo + REPORT_PAGE]
            helper = await self._call(
                PeerMethod.DROP_REPORTS, pb.ReportIds(task_id=task_id, report_ids=b"".join(part))
            )
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
                page = await self._call(
                    PeerMethod.LIST_REPORTS,
                    pb.ReportPage(task_id=task_id, after=after_theirs, limit=REPORT_PAGE),
                )
                theirs, ti, t_more = split_ids(page.report_ids), 0, bool(page.more)
                if theirs:
                    after_theirs = theirs[-1]
                elif t_more:
                    raise FailedPrecondition("helper sent an empty page with more to come")
            if mi == len(mine) and m_more:
                mine = self.core.store.report_ids(task_id, after_mine, REPORT_PAGE)
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
            pb.ChunkHeader(
                robust_task_id=task_id,
                coord_lo=lo,
                coord_hi=min(d, lo + ROBUST_LANES),
                pass_id=pass_id,
            )
            for lo in range(0, d, ROBUST_LANES)
        ]
        sums = self.core.store.sums(task_id) if self.work is None else None  # read once here
        parts = await self._passes(ROBUST, headers, lambda h: self.robust_chunk(task, h, sums))
        for h, p in zip(headers, parts, strict=True):  # a short one would shift every later share
            if len(p) != 8 * (h.coord_hi - h.coord_lo):
                raise PeerUnavailable(f"robust chunk at {h.coord_lo}: {len(p)} bytes of shares")
        return np.concatenate([np.frombuffer(p, dtype=np.uint64) for p in parts])

    async def robust_chunk(
        self, task: TaskState, h: pb.ChunkHeader, sums: U64 | None = None
    ) -> bytes:
        """The leader's new shares of coordinates [coord_lo, coord_hi) (one chunk);
        `sums`: the task's aggregates if the caller holds them (else read)."""
        if sums is None:
            sums = self.core.store.sums(task.params.task_id)
        z = sums[h.coord_lo : h.coord_hi]
        bound = self.core.clamp_bound(task)
        out, _ = await self._exchange(h, lambda party: party.clamp_reshare(z, bound))
        return np.asarray(out, dtype=np.uint64).tobytes()

    async def _passes(
        self,
        kind: str,
        headers: list[pb.ChunkHeader],
        run_here: Callable[[pb.ChunkHeader], Awaitable[bytes]],
    ) -> list[bytes]:
        """A close-time pass's chunks: here one after another, or as leased jobs
        that the workers run in parallel, at most PASS_JOBS queued at a time
        (every job is waited for; the first failure is raised once all have
        ended)."""
        if self.work is None:
            return [await run_here(h) for h in headers]
        work = self.work
        slots = asyncio.Semaphore(PASS_JOBS)

        async def leased(h: pb.ChunkHeader) -> bytes:
            async with slots:
                return await work.run(kind, h.SerializeToString())

        results = await asyncio.gather(*(leased(h) for h in headers), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [bytes(r) for r in results]  # type: ignore[arg-type]

    async def _validate_reports(self, task: TaskState) -> list[bytes]:
        """Range-check every report in one garbled pass; the invalid ones.

        Reports go in sorted id order, VALIDATION_LANES lanes (2d per report) at a
        time; the circuit ORs each report's 2d sign tests, so the servers learn
        one bit per report ("invalid") and nothing about which value failed."""
        task_id = task.params.task_id
        ids = sorted(self.core.store.report_ids(task_id))
        batch = max(1, VALIDATION_LANES // (2 * task.params.d))
        parts = [ids[i : i + batch] for i in range(0, len(ids), batch)]
        headers = [pb.ChunkHeader(validate_task_id=task_id, report_ids=b"".join(p)) for p in parts]
        bits = await self._passes(VALIDATE, headers, lambda h: self.validation_chunk(task, h))
        return [
            rid
            for p, b in zip(parts, bits, strict=True)
            for rid, bad in zip(p, b, strict=True)
            if bad
        ]

    async def validation_chunk(self, task: TaskState, h: pb.ChunkHeader) -> bytes:
        """One byte per report of the chunk: 1 if any of its values is out of range."""
        z = self.core.validation_inputs(task, split_ids(h.report_ids))
        per = 2 * task.params.d
        bits, _ = await self._exchange(h, lambda party: party.any_per_group(z, per))
        return bytes(bytearray(int(b) for b in bits))

    # ------------------------------------------------------------ streams
    async def open_stream(self, request: pb.OpenStreamRequest) -> pb.StreamInfo:
        """Charge the leader's ledger, then the helper's; each draws its own γ."""
        stream_id = secrets.token_hex(16)
        kind = kind_from_pb(request.kind)
        if request.task_id in self._unsynced:
            self.core.store.task(request.task_id)  # NOT_FOUND before any peer call
            await self.sync_ledgers(request.task_id)
        # The leader's stream stays `opening` (failed closed on a restart) until the
        # helper has charged too, so a crash between the two charges is reconciled.
        plan = (request.plan_id, request.plan_group) if request.plan_id else None
        self.core.open_stream(
            stream_id,
            request.task_id,
            kind,
            request.epsilon,
            request.delta,
            open_now=False,
            plan=plan,
        )
        crash_point("open.before_helper")
        try:
            await self._call(
                PeerMethod.PREPARE_STREAM,
                pb.PrepareStreamRequest(
                    stream_id=stream_id,
                    task_id=request.task_id,
                    kind=request.kind,
                    epsilon=request.epsilon,
                    delta=request.delta,
                    plan_id=request.plan_id,
                    plan_group=request.plan_group,
                ),
            )
        except BaseException:
            # The leader's charge stays spent (never refund); the stream never answers.
            # The helper may or may not have charged (a lost reply leaves its copy
            # OPEN): reconcile before the next open, failing the copy there too.
            self.core.store.fail_stream(stream_id)
            self._recovered.setdefault(request.task_id, []).append(stream_id)
            self._unsynced.add(request.task_id)
            raise
        self.core.store.confirm_stream(stream_id)
        log.info(
            "task %s: stream %s opened (%s, epsilon %s, delta %s%s)",
            request.task_id,
            stream_id,
            kind.value,
            request.epsilon,
            request.delta or "0",
            f", plan {request.plan_id} group {request.plan_group}" if request.plan_id else "",
        )
        return stream_info(self.core.store.stream(stream_id))

    def _open_stream(self, stream_id: str, compare: bool) -> tuple[StreamState, TaskState]:
        stream, task = self.core.stream_and_task(stream_id)
        if compare != (stream.kind == StreamKind.CTT):
            raise InvalidArgument(
                "a CompareToThresholds stream answers Compare, not Ask"
                if stream.kind == StreamKind.CTT
                else "only a CompareToThresholds stream answers Compare"
            )
        if stream.state != OPEN:
            raise StreamClosed(f"stream {stream_id} is {stream.state}; it answers no more")
        return stream, task

    async def ask(self, request: pb.AskRequest) -> pb.AskResponse:
        stream, task = self._open_stream(request.stream_id, compare=False)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        taus = parse_taus(task, request.tau, len(chunk))
        if self.work is not None:
            out = await self._leased(ASK, request.SerializeToString(), stream.stream_id)
            return pb.AskResponse.FromString(out)

        async def run(party: ComparisonParty, s: StreamState) -> tuple[Any, int, bool]:
            z = self.core.ask_inputs(s, task, chunk, taus)
            j = await party.first_yes(z, self.core.comparison_width(task, s))
            return j, len(chunk) if j is None else j + 1, j is not None

        j, closed, nbytes = await self._run_chunk(stream, chunk, False, run)
        return pb.AskResponse(yes=j is not None, index=j or 0, closed=closed, peer_bytes=nbytes)

    async def compare(self, request: pb.CompareRequest) -> pb.CompareResponse:
        stream, task = self._open_stream(request.stream_id, compare=True)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        lows = parse_taus(task, request.tau_low, len(chunk), "tau_low")
        highs = parse_taus(task, request.tau_high, len(chunk), "tau_high")
        self.core.check_gap(stream, task, lows, highs)
        if self.work is not None:
            out = await self._leased(COMPARE, request.SerializeToString(), stream.stream_id)
            return pb.CompareResponse.FromString(out)

        async def run(party: ComparisonParty, s: StreamState) -> tuple[Any, int, bool]:
            z_high, z_low = self.core.compare_inputs(s, task, chunk, (lows, highs))
            width = self.core.comparison_width(task, s)
            out = list(await party.compare_to_thresholds(z_high, z_low, width))
            return (out, *self.core.compare_progress(out))

        out, closed, nbytes = await self._run_chunk(stream, chunk, True, run)
        return pb.CompareResponse(
            outcomes=[OUTCOME_TO_PB[OUTCOME_OF_CODE[o]] for o in out],
            closed=closed,
            peer_bytes=nbytes,
        )

    async def _run_chunk(
        self, stream: StreamState, chunk: Chunk, compare: bool, run: ChunkRun
    ) -> tuple[Any, bool, int]:
        """One chunk at a time per stream (concurrent chunks are refused)."""
        sid = stream.stream_id
        if sid in self._busy:
            raise FailedPrecondition(f"stream {sid} is answering another chunk; send one at a time")
        self._busy.add(sid)
        try:
            return await self._chunk(stream, chunk, compare, run)
        finally:
            self._busy.discard(sid)

    async def _chunk(
        self, stream: StreamState, chunk: Chunk, compare: bool, run: ChunkRun
    ) -> tuple[Any, bool, int]:
        """Send the header, mark the chunk in progress durably (while the helper
        does the same), run the garbled comparison on a pooled session, record
        the result.  Once marked, any failure or refusal fails the stream closed
        on both servers; nothing is refunded."""
        sid, next_chunk = stream.stream_id, stream.chunks + 1
        header = pb.ChunkHeader(
            stream_id=sid,
            chunk_no=next_chunk,
            compare=compare,
            queries=pb.Queries(
                index=chunk.index.tolist(),
                complement=chunk.complement.tolist() if chunk.complement.any() else [],
            ),
        )

        def mark() -> None:
            # Both servers fsync their "chunk in progress" mark in parallel; neither
            # runs the circuit before its own mark is durable.
            self.core.store.begin_chunk(sid, next_chunk)
            crash_point("chunk.after_mark")

        async def fail() -> None:
            self.core.store.fail_stream(sid)
            await self._fail_helper(sid)

        (result, answered, close), traffic = await self._exchange(
            header, lambda party: run(party, stream), mark, fail
        )
        self.core.store.end_chunk(sid, answered, close)
        return result, close, traffic

    async def _exchange(
        self,
        header: pb.ChunkHeader,
        run: Callable[[ComparisonParty], Awaitable[Any]],
        on_written: Callable[[], None] | None = None,
        on_failure: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Any, int]:
        """One chunk on a pooled session: send the header, (on_written: the durable
        mark), wait for the helper's go, run the garbled protocol, wait for its
        done.  A failure after on_written calls on_failure.  Returns the result and
        the bytes exchanged."""
        session = await self.pool.acquire()
        healthy = False
        written = False
        try:
            before = session.traffic
            await session.channel.write_frame(pb.PeerFrame(header=header))
            if on_written is not None:
                on_written()
            written = True
            verdict = await session.status()
            if not verdict.ok:
                healthy = True  # the protocol never started; the session is intact
                raise refusal_from_status(verdict, "helper: ")
            result = await asyncio.wait_for(run(session.party), CHUNK_DEADLINE)
            crash_point("chunk.after_result")
            done = await session.status()
            if not done.ok:
                raise refusal_from_status(done, "helper: ")
            healthy = True
        except BaseException as exc:
            if written and on_failure is not None:
                await on_failure()
            if isinstance(exc, asyncio.TimeoutError):
                raise PeerUnavailable("the protocol with the helper timed out") from None
            raise
        finally:
            await self.pool.release(session, healthy)
        return result, session.traffic - before

    async def _leased(self, kind: str, payload: bytes, stream_id: str) -> bytes:
        """A chunk run by a worker.  When it failed the stream (its helper process
        may have been the one that died, leaving the helper's copy mid-chunk),
        the stream is failed through the helper's main process as well."""
        assert self.work is not None
        try:
            return await self.work.run(kind, payload, stream_id, self._lost)
        except WorkerLost:
            raise  # `_lost` has failed it on both servers already
        except Refusal:
            if self.core.store.stream(stream_id).state == FAILED:
                await self._fail_helper(stream_id)
            raise

    async def _lost(self, stream_id: str) -> None:
        """A worker died mid-chunk: fail the stream closed on both servers."""
        self.core.store.fail_stream(stream_id)
        await self._fail_helper(stream_id)

    async def run_job(self, job: Job) -> bytes:
        """A leased job, run in this (worker) process exactly as the front end
        would run it in process; the result as the bytes the front end returns."""
        if job.kind == ASK:
            return (await self.ask(pb.AskRequest.FromString(job.payload))).SerializeToString()
        if job.kind == COMPARE:
            response = await self.compare(pb.CompareRequest.FromString(job.payload))
            return response.SerializeToString()
        h = pb.ChunkHeader.FromString(job.payload)
        if job.kind == ROBUST:
            return await self.robust_chunk(self.core.store.task(h.robust_task_id), h)
        if job.kind == VALIDATE:
            return await self.validation_chunk(self.core.store.task(h.validate_task_id), h)
        raise InvalidArgument(f"unknown job kind {job.kind!r}")

    async def _fail_helper(self, stream_id: str) -> None:
        try:
            await self.helper.call(PeerMethod.FAIL_STREAM, pb.StreamRef(stream_id=stream_id), 5.0)
        except Refusal:
            log.warning("could not fail stream %s on the helper", stream_id)
