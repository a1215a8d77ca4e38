"""Ledger reconciliation: the leader keeps the helper's privacy ledger up with
its own.  The leader charges first (durably) and the helper second, so after a
failure between the two charges — a crash, a lost reply, a helper that was
down — the leader has spent more, and its ledger wins: what the helper missed
is replayed there (never refunded here) before the task's next charge or
budget read.  `LedgerSync` remembers which tasks may lag and what each owes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from svtagg.dp.errors import NotFound, PeerUnavailable, Refusal
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange.port import HelperPort
from svtagg.servers.exchange.values import PlanRequest, PrepareStream
from svtagg.servers.store.rules import PLAN_ACTIVE, PLAN_FAILED

log = logging.getLogger("svtagg.server")


class LedgerSync:
    """What the helper's ledger may lack, per task, and the reconciliation
    that brings it up to the leader's (`sync`)."""

    def __init__(self, core: ServerCore, helper: HelperPort) -> None:
        self.core = core
        self.helper = helper
        # Tasks whose helper ledger may lag the leader's (after a restart, or after
        # a PrepareStream that failed): reconciled before the next stream opens.
        self._unsynced: set[str] = set(core.task_ids())
        # Streams this leader failed (on recovery, or when the helper's half of the
        # opening failed): failed on the helper as well at the next
        # reconciliation, so that both stores show them failed.
        self._failed_streams: dict[str, list[str]] = {}
        for sid, tid in core.recovered_streams:
            self._failed_streams.setdefault(tid, []).append(sid)
        self._sync_lock = asyncio.Lock()
        # Plans whose reservation on the helper may be missing or may have been
        # made after the leader gave up on it: failed there at the next sync.
        self._failed_plans: dict[str, list[str]] = {}
        # Plans active when this leader started: one it died reserving (after its
        # own reservation, before the helper's) is charged here only; reserved on
        # the helper too at the next reconciliation.
        self._recovered_plans: dict[str, list[str]] = {}
        for plan_id, tid in core.recovered_plans:
            self._recovered_plans.setdefault(tid, []).append(plan_id)

    def owes(self, task_id: str) -> bool:
        """Whether the helper's ledger of this task may lag the leader's."""
        return task_id in self._unsynced

    def owe_stream(self, task_id: str, stream_id: str) -> None:
        """The leader failed a stream whose charge the helper may lack, or may
        hold open (a lost reply): failed there too, replayed first if absent."""
        self._failed_streams.setdefault(task_id, []).append(stream_id)
        self._unsynced.add(task_id)

    def owe_plan(self, task_id: str, plan_id: str) -> None:
        """The leader failed a plan the helper may lack, or may hold active:
        failed there too, reserved first if absent."""
        self._failed_plans.setdefault(task_id, []).append(plan_id)
        self._unsynced.add(task_id)

    async def sync(self, task_id: str) -> int:
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
            pending = (self._failed_streams, self._recovered_plans, self._failed_plans)
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
        """`sync`'s calls to the helper: `recovered`, the streams this
        leader failed since its start; `started`, the plans active at its
        start; `failed`, the plans it failed since.  The charges replayed."""
        task = self.core.task(task_id)
        helper = (await self.helper.budget(task_id)).budget
        mine = task.budget
        replayed = 0
        # Equal ledgers: what this leader knows it failed since its start, and
        # the failed streams of active plans (their charge is inside the plan,
        # so the ledgers are equal whether or not the helper holds them);
        # unequal: every failed stream and plan (replaying is idempotent).
        behind = (helper.epsilon_spent, helper.delta_spent) != (
            mine.epsilon_spent,
            mine.delta_spent,
        )
        core = self.core
        streams = core.failed_streams(task_id)
        plans = failed
        if behind:
            plans = core.plan_ids(task_id, PLAN_FAILED)
        else:
            active = set(core.plan_ids(task_id, PLAN_ACTIVE))
            streams = [core.stream(sid) for sid in recovered] + [
                s
                for s in streams
                if s.stream_id not in recovered and s.plan is not None and s.plan[0] in active
            ]
        for plan_id in started:
            await self._reserve_on_helper(task_id, plan_id)
        for plan_id in plans:
            book, _, _ = self.core.plan(plan_id)
            replayed += await self._fail_or_replay(
                partial(self.helper.fail_plan, plan_id),
                partial(self.helper.reserve_plan, PlanRequest.of_book(task_id, book, plan_id)),
                task_id,
                f"replay the charge of failed plan {plan_id}",
            )
        for s in streams:
            replayed += await self._fail_or_replay(
                partial(self.helper.fail_stream, s.stream_id),
                partial(self.helper.prepare_stream, PrepareStream.replay_of(s)),
                task_id,
                f"replay the charge of failed stream {s.stream_id}",
            )
        return replayed

    async def _reserve_on_helper(self, task_id: str, plan_id: str) -> None:
        """Reserve on the helper a plan that was active at this leader's start
        and still is (the helper leaves a plan it already holds as it is), so
        that both ledgers hold its charge.  The plan stays active on both: the
        leader cannot tell a reservation the analyst never saw confirmed from
        one it did, and an active plan refunds only what no stream used.  A
        refusal is logged, as a refused replay is (see `sync`)."""
        book, state, _ = self.core.plan(plan_id)
        if state == PLAN_ACTIVE:
            await self._unless_refused(
                partial(self.helper.reserve_plan, PlanRequest.of_book(task_id, book, plan_id)),
                task_id,
                f"reserve plan {plan_id}, active here since before the restart",
            )

    async def _unless_refused(
        self, call: Callable[[], Awaitable[object]], task_id: str, what: str
    ) -> bool:
        """A reconciliation call whose refusal is logged, not raised, so the task
        stays usable (see `sync`); an unreachable helper is raised (the
        task stays to be reconciled).  False if refused."""
        try:
            await call()
            return True
        except PeerUnavailable:
            raise
        except Refusal as exc:
            log.warning(
                "task %s: the helper refused to %s (%s); its ledger is left as it is, "
                "the leader's keeps the charge",
                task_id,
                what,
                type(exc).__name__,
            )
            return False

    async def _fail_or_replay(
        self,
        fail: Callable[[], Awaitable[object]],
        replay: Callable[[], Awaitable[object]],
        task_id: str,
        what: str,
    ) -> int:
        """Fail a stream or plan the leader failed on the helper too, replaying
        its charge there first (`replay`, then `fail`) if the helper never saw
        it, so that both ledgers hold it.  1 if a charge was replayed.  A replay
        the helper refuses is logged, not raised (see `sync`); an
        unreachable helper is raised (the task stays to be reconciled)."""
        try:
            await fail()
            return 0
        except NotFound:
            pass
        if not await self._unless_refused(replay, task_id, what):
            return 0
        await fail()
        return 1
