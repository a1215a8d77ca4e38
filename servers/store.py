"""One server's durable state in SQLite: tasks, seen report ids, running share
sums, the privacy ledger and each stream's secret threshold noise.

Durability rules (WAL, synchronous=FULL, one transaction per step):
- an upload batch is stored atomically: its report ids, the sum and n move
  together, so a kill -9 never half-counts a batch and a replay is refused;
- opening a stream charges the ledger and records the stream as `opening` in
  one committed transaction *before* any noise is drawn; a crash never refunds;
- a chunk is marked `in_chunk` (committed) before the comparison runs, and on
  restart every `opening` / `in_chunk` stream is failed closed, so a stream
  interrupted mid-protocol never answers again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.dp.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.ledger import Ledger
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import Budget
from svtagg.dp.task import TaskParams
from svtagg.mpc.ring import U64
from svtagg.servers.faults import crash_point

DIGEST_BYTES = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    d INTEGER NOT NULL, frac_bits INTEGER NOT NULL,
    n_max INTEGER NOT NULL, min_batch INTEGER NOT NULL,
    epsilon_total TEXT NOT NULL, delta_total TEXT NOT NULL, epsilon_min TEXT NOT NULL,
    n INTEGER NOT NULL DEFAULT 0,
    digest BLOB NOT NULL,
    sums BLOB NOT NULL,
    collection_open INTEGER NOT NULL DEFAULT 1,
    epsilon_spent TEXT NOT NULL DEFAULT '0',
    delta_spent TEXT NOT NULL DEFAULT '0',
    agreed INTEGER NOT NULL DEFAULT 0,
    validate_reports INTEGER NOT NULL DEFAULT 0,
    embedding TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS reports (
    task_id TEXT NOT NULL, report_id BLOB NOT NULL,
    share_off INTEGER,
    share_len INTEGER,
    PRIMARY KEY (task_id, report_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (
    stream_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    kind TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
    gamma TEXT,
    state TEXT NOT NULL,
    chunks INTEGER NOT NULL DEFAULT 0,
    queries INTEGER NOT NULL DEFAULT 0,
    plan_id TEXT,
    plan_group INTEGER
);
-- task() counts a task's streams on every call: without this index that count
-- scanned every stream of every task (an index only: no schema version change).
CREATE INDEX IF NOT EXISTS streams_by_task ON streams (task_id, state);
"""


#: Stream states.  Only `open` answers; `closed` and `failed` are final.
class StreamStatus(StrEnum):
    """Life of a stream in a store (the strings are what the database holds)."""

    OPENING = "opening"  # charged, waiting for the other server (failed on a restart)
    OPEN = "open"
    IN_CHUNK = "in_chunk"  # a chunk is running (failed on a restart: never answers twice)
    CLOSED = "closed"  # answered YES / Close
    FAILED = "failed"  # failed closed; its charge stays spent


OPENING, OPEN, IN_CHUNK, CLOSED, FAILED = StreamStatus

#: Plan states: `active` admits its streams; `ended` (refunded what was unused)
#: and `failed` (never refunded) admit none.
PLAN_ACTIVE, PLAN_ENDED, PLAN_FAILED = "active", "ended", "failed"


@dataclass(frozen=True)
class TaskState:
    params: TaskParams
    n: int
    collection_open: bool
    budget: Budget
    digest: bytes
    streams: int
    #: Both servers hold the same report set (checked when the collection closed).
    agreed: bool = False


@dataclass(frozen=True)
class StreamState:
    stream_id: str
    task_id: str
    kind: StreamKind
    epsilon: Fraction
    delta: Fraction
    gamma: int | None
    state: StreamStatus
    chunks: int
    queries: int
    #: (plan id, group) of a stream charged to a plan's group, None for the task's ledger.
    plan: tuple[str, int] | None = None

    @property
    def closed(self) -> bool:
        return self.state != OPEN


def report_digest(report_ids: list[bytes]) -> bytes:
    """Order-independent digest of a set of report ids (XOR of truncated hashes)."""
    acc = 0
    for rid in report_ids:
        acc ^= int.from_bytes(hashlib.sha256(rid).digest()[:DIGEST_BYTES], "little")
    return acc.to_bytes(DIGEST_BYTES, "little")


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


class Store:
    """SQLite store of one server.  Not thread-safe: one server, one event loop."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._shares_dir = Path(self.path + ".shares")
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._migrate()
        #: Streams this start failed closed (opening / in_chunk at the last stop).
        self.recovered_failed: list[tuple[str, str]] = []
        #: (plan, task) of the plans active at the last stop, left active: a leader
        #: killed inside ReservePlan may hold one the helper never reserved.
        self.recovered_plans: list[tuple[str, str]] = []
        self.failed_on_recovery = self._recover()
        #: The helper's robust-aggregate shares between the close's passes and
        #: MarkAgreed: task → pass id → (report digest, {lo: shares}).  In memory
        #: here (one process per SQLite store; a restart runs the close again); in
        #: a table in the PostgreSQL store, where any process may run a pass.
        self._staged: dict[str, dict[bytes, tuple[bytes, dict[int, U64]]]] = {}

    def close(self) -> None:
        self._db.close()

    #: Schema version this code writes (SQLite's user_version).
    SCHEMA_VERSION = 4

    def _migrate(self) -> None:
        """Bring an older store up to SCHEMA_VERSION, one versioned step at a time."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version < 1:
            # v1: the robust aggregate g(S) of each coordinate, written at agreement.
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(tasks)")}
            if "robust_sums" not in cols:
                self._db.execute("ALTER TABLE tasks ADD COLUMN robust_sums BLOB")
            self._db.execute("PRAGMA user_version = 1")
            version = 1
        if version < 2:
            # v2: budget plans, reserved on the ledger before their streams open.
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS plans (plan_id TEXT PRIMARY KEY,"
                " task_id TEXT NOT NULL, book TEXT NOT NULL, state TEXT NOT NULL)"
            )
            self._db.execute("PRAGMA user_version = 2")
            version = 2
        if version < 3:
            # v3: the embedding the task's clients use ("" = not recorded).
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(tasks)")}
            if "embedding" not in cols:
                self._db.execute("ALTER TABLE tasks ADD COLUMN embedding TEXT NOT NULL DEFAULT ''")
            self._db.execute("PRAGMA user_version = 3")
            version = 3
        if version < 4:
            # v4: the plan group a stream was charged to, so that reconciliation
            # replays it there (streams stored before hold NULL: the task's ledger).
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(streams)")}
            for col, kind in (("plan_id", "TEXT"), ("plan_group", "INTEGER")):
                if col not in cols:
                    self._db.execute(f"ALTER TABLE streams ADD COLUMN {col} {kind}")
            self._db.execute("PRAGMA user_version = 4")

    def _recover(self) -> int:
        """Fail closed every stream that was opening or mid-chunk at the last stop,
        and list the plans then active (`recovered_plans`)."""
        with self._tx():
            self.recovered_plans = [
                (r[0], r[1])
                for r in self._db.execute(
                    "SELECT plan_id, task_id FROM plans WHERE state=? ORDER BY plan_id",
                    (PLAN_ACTIVE,),
                )
            ]
            self.recovered_failed = [
                (r[0], r[1])
                for r in self._db.execute(
                    "SELECT stream_id, task_id FROM streams WHERE state IN (?, ?)",
                    (OPENING, IN_CHUNK),
                )
            ]
            cur = self._db.execute(
                "UPDATE streams SET state=? WHERE state IN (?, ?)", (FAILED, OPENING, IN_CHUNK)
            )
        return cur.rowcount

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    # ------------------------------------------------------------ tasks
    def create_task(self, p: TaskParams) -> TaskState:
        with self._tx():
            if self._db.execute("SELECT 1 FROM tasks WHERE task_id=?", (p.task_id,)).fetchone():
                raise AlreadyExists(f"task {p.task_id!r} already exists")
            self._db.execute(
                "INSERT INTO tasks (task_id, d, frac_bits, n_max, min_batch, epsilon_total,"
                " delta_total, epsilon_min, digest, sums, validate_reports, embedding)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    p.task_id,
                    p.d,
                    p.frac_bits,
                    p.n_max,
                    p.min_batch,
                    str(p.epsilon_total),
                    str(p.delta_total),
                    str(p.epsilon_min),
                    bytes(DIGEST_BYTES),
                    np.zeros(p.d, dtype=np.uint64).tobytes(),
                    int(p.validate_reports),
                    p.embedding,
                ),
            )
        return self.task(p.task_id)

    def task(self, task_id: str) -> TaskState:
        row = self._db.execute(
            "SELECT task_id, d, frac_bits, n_max, min_batch, epsilon_total, delta_total,"
            " epsilon_min, n, collection_open, epsilon_spent, delta_spent, digest,"
            " (SELECT COUNT(*) FROM streams s WHERE s.task_id = t.task_id), agreed,"
            " validate_reports, embedding FROM tasks t WHERE task_id=?",
            (task_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        params = TaskParams(
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            Fraction(row[5]),
            Fraction(row[6]),
            Fraction(row[7]),
            bool(row[15]),
            row[16],
        )
        budget = Budget(
            params.epsilon_total, params.delta_total, Fraction(row[10]), Fraction(row[11])
        )
        return TaskState(
            params, row[8], bool(row[9]), budget, bytes(row[12]), row[13], bool(row[14])
        )

    def task_ids(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT task_id FROM tasks ORDER BY task_id")]

    def sums(self, task_id: str) -> U64:
        """This server's share of S = Σ reports (what uploads add to)."""
        row = self._db.execute("SELECT sums FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        return np.frombuffer(row[0], dtype=np.uint64).copy()

    def robust_sums(self, task_id: str) -> U64 | None:
        """This server's share of g(S) (robust aggregates), None before agreement."""
        row = self._db.execute(
            "SELECT robust_sums FROM tasks WHERE task_id=?", (task_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        return None if row[0] is None else np.frombuffer(row[0], dtype=np.uint64).copy()

    # ------------------------------------------------------------ uploads
    def _share_file(self, task_id: str) -> Path:
        return self._shares_dir / f"{task_id}.bin"

    def _append_shares(self, task_id: str, shares: list[bytes]) -> int:
        """Append shares to the task's share file and fsync; returns the offset.
        Shares live outside SQLite because they are large and needed only until
        the collection closes; a crash before the SQLite commit leaves an
        unreferenced tail, which is harmless."""
        self._shares_dir.mkdir(exist_ok=True)
        with open(self._share_file(task_id), "ab") as f:
            offset = f.tell()
            f.write(b"".join(shares))
            f.flush()
            os.fsync(f.fileno())
        return offset

    @staticmethod
    def _admit_batch(
        task_id: str, row: Any, count: int, share_sum: U64
    ) -> tuple[int, bytes, bytes, int]:
        """The checks every store makes on an upload batch before looking for
        replayed ids, from the task's row (n, n_max, collection_open, sums,
        digest, d): (n, sums, digest, d).  Capacity is checked after the replay
        check (`_within_capacity`), so that a batch resent after a lost answer is
        refused as a replay, not as a full task, and a resuming client counts it
        as held."""
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        n, n_max, is_open, sums_blob, digest, d = row
        if not is_open:
            raise FailedPrecondition(f"collection of task {task_id!r} is closed")
        if share_sum.shape != (d,):
            raise InvalidArgument(f"share sum has length {share_sum.size}, task has d={d}")
        return n, sums_blob, digest, d

    @staticmethod
    def _within_capacity(task_id: str, row: Any, count: int) -> None:
        """Refuse a batch (of ids not held yet) that would take n above n_max."""
        n, n_max = row[0], row[1]
        if n + count > n_max:
            raise ResourceExhausted(
                f"task {task_id!r} accepts at most n_max={n_max} reports (has {n})"
            )

    def add_reports(
        self, task_id: str, report_ids: list[bytes], shares: list[bytes], share_sum: U64
    ) -> int:
        """Store one batch atomically; returns the task's n afterwards.  Each report's
        own share (explicit share or seed) is kept until the servers agree on the
        report set, so that a report only one server received can be taken out."""
        with self._tx():
            row = self._db.execute(
                "SELECT n, n_max, collection_open, sums, digest, d FROM tasks WHERE task_id=?",
                (task_id,),
            ).fetchone()
            n, sums_blob, digest, d = self._admit_batch(task_id, row, len(report_ids), share_sum)
            placeholders = ",".join("?" * len(report_ids))
            seen = (
                self._db.execute(
                    "SELECT COUNT(*) FROM reports WHERE task_id=? "
                    f"AND report_id IN ({placeholders})",
                    (task_id, *report_ids),
                ).fetchone()[0]
                if len(report_ids) < 30_000
                else 0
            )
            if seen:
                raise AlreadyExists(
                    f"{seen} report id(s) of this batch were already uploaded (replay); "
                    "batch refused"
                )
            self._within_capacity(task_id, row, len(report_ids))
            offset = self._append_shares(task_id, shares)
            crash_point("upload.mid_store")
            rows = []
            for rid, sh in zip(report_ids, shares, strict=True):
                rows.append((task_id, rid, offset, len(sh)))
                offset += len(sh)
            try:
                self._db.executemany(
                    "INSERT INTO reports (task_id, report_id, share_off, share_len)"
                    " VALUES (?, ?, ?, ?)",
                    rows,
                )
            except sqlite3.IntegrityError:
                raise AlreadyExists(
                    "a report id of this batch was already uploaded (replay); batch refused"
                ) from None
            sums = np.frombuffer(sums_blob, dtype=np.uint64) + share_sum
            new_digest = _xor(bytes(digest), report_digest(report_ids))
            self._db.execute(
                "UPDATE tasks SET n=?, sums=?, digest=? WHERE task_id=?",
                (n + len(report_ids), sums.tobytes(), new_digest, task_id),
            )
        return int(n + len(report_ids))

    def close_collection(self, task_id: str) -> TaskState:
        with self._tx():
            self.task(task_id)
            self._db.execute("UPDATE tasks SET collection_open=0 WHERE task_id=?", (task_id,))
        return self.task(task_id)

    def shares(self, task_id: str, report_ids: list[bytes]) -> list[bytes]:
        """This server's stored share of each report (until the agreement)."""
        out = []
        with open(self._share_file(task_id), "rb") as f:
            for rid in report_ids:
                row = self._db.execute(
                    "SELECT share_off, share_len FROM reports WHERE task_id=? AND report_id=?",
                    (task_id, rid),
                ).fetchone()
                if row is None:
                    raise NotFound(f"task {task_id!r} has no report {rid.hex()}")
                f.seek(row[0])
                out.append(f.read(row[1]))
        return out

    def report_ids(self, task_id: str, after: bytes = b"", limit: int | None = None) -> list[bytes]:
        """The task's report ids in ascending order: all, or the page of at most
        `limit` after `after` (reconciliation in bounded messages)."""
        sql = "SELECT report_id FROM reports WHERE task_id=? AND report_id > ? ORDER BY report_id"
        args: tuple[object, ...] = (task_id, after)
        if limit is not None:
            sql += " LIMIT ?"
            args = (*args, int(limit))
        return [bytes(r[0]) for r in self._db.execute(sql, args)]

    def remove_reports(
        self, task_id: str, report_ids: list[bytes], share_sum: Callable[[list[bytes]], U64]
    ) -> TaskState:
        """Take reports out of a closed collection (atomically): their ids, their
        shares' sum (`share_sum` of their stored shares), n and the digest."""
        with self._tx():
            task = self.task(task_id)
            if task.collection_open:
                raise FailedPrecondition("reports are reconciled only after the close")
            if task.agreed:
                raise FailedPrecondition("the report set is already agreed; nothing to remove")
            shares: list[bytes] = []
            present: list[bytes] = []
            if not report_ids:
                return task
            with open(self._share_file(task_id), "rb") as f:
                for rid in report_ids:
                    row = self._db.execute(
                        "SELECT share_off, share_len FROM reports WHERE task_id=? AND report_id=?",
                        (task_id, rid),
                    ).fetchone()
                    if row is not None:
                        present.append(rid)
                        f.seek(row[0])
                        shares.append(f.read(row[1]))
            if present:
                sums = self.sums(task_id) - share_sum(shares)
                self._db.executemany(
                    "DELETE FROM reports WHERE task_id=? AND report_id=?",
                    [(task_id, rid) for rid in present],
                )
                self._db.execute(
                    "UPDATE tasks SET n=n-?, sums=?, digest=? WHERE task_id=?",
                    (
                        len(present),
                        sums.tobytes(),
                        _xor(task.digest, report_digest(present)),
                        task_id,
                    ),
                )
        return self.task(task_id)

    def mark_agreed(self, task_id: str, robust_sums: U64 | None) -> TaskState:
        """Record that both servers hold the same reports, with this server's share
        of the robust aggregates (atomically); per-report shares are no longer
        needed and are dropped."""
        blob = None if robust_sums is None else np.asarray(robust_sums, np.uint64).tobytes()
        with self._tx():
            self._db.execute(
                "UPDATE tasks SET agreed=1, robust_sums=? WHERE task_id=?", (blob, task_id)
            )
        self._share_file(task_id).unlink(missing_ok=True)
        return self.task(task_id)

    # ------------------------------------------------------------ streams
    def open_stream(
        self,
        stream_id: str,
        task_id: str,
        kind: StreamKind,
        epsilon: Fraction,
        delta: Fraction,
        delta_charge: Fraction,
        plan: tuple[str, int] | None = None,
        replay: bool = False,
    ) -> None:
        """Charge (ε, delta_charge) — to the task's ledger, or to a group of a
        reserved plan — and record the stream as `opening`, in one committed
        transaction, before the caller draws any noise.

        `replay` (reconciliation): the other server opened and failed this
        stream while this one never saw it.  It is recorded `failed` (it never
        answers here) with its charge where the stream's own went: the task's
        ledger, or its plan's group whatever the plan's state now — a plan
        ended since refunded that group's unused part without this stream, so
        the task is charged what the refund would have kept back.  Idempotent:
        a stream already recorded is left as it is."""
        with self._tx():
            if self._db.execute("SELECT 1 FROM streams WHERE stream_id=?", (stream_id,)).fetchone():
                if replay:
                    return
                raise AlreadyExists(f"stream {stream_id!r} already exists")
            self._charge_stream(task_id, epsilon, delta_charge, plan, replay)
            plan_id, group = plan if plan is not None else (None, None)
            self._db.execute(
                "INSERT INTO streams (stream_id, task_id, kind, epsilon, delta, state,"
                " plan_id, plan_group) VALUES (?,?,?,?,?,?,?,?)",
                (
                    stream_id,
                    task_id,
                    kind.value,
                    str(epsilon),
                    str(delta),
                    FAILED if replay else OPENING,
                    plan_id,
                    group,
                ),
            )

    def _charge_stream(
        self,
        task_id: str,
        epsilon: Fraction,
        delta_charge: Fraction,
        plan: tuple[str, int] | None,
        replay: bool,
    ) -> None:
        """A stream's charge (inside the caller's transaction): the task's ledger,
        or its plan's group (an active plan; any plan when replayed)."""
        state = self.task(task_id)
        if plan is None:
            self._charge(state, epsilon, delta_charge)
            return
        plan_id, group = plan
        book, plan_state, plan_task = self._plan_row(plan_id)
        if plan_task != task_id or (plan_state != PLAN_ACTIVE and not replay):
            raise FailedPrecondition(f"plan {plan_id} is {plan_state} or of another task")
        kept = book.refund()
        book.admit(group, epsilon, delta_charge)
        after = book.refund()
        if plan_state == PLAN_ENDED and after != kept:  # only basic plans refund
            self._charge(state, kept[0] - after[0], kept[1] - after[1])
        self._db.execute(
            "UPDATE plans SET book=? WHERE plan_id=?", (json.dumps(book.to_json()), plan_id)
        )

    def _charge(self, state: TaskState, epsilon: Fraction, delta: Fraction) -> None:
        """Spend (ε, δ) of the task's budget (inside the caller's transaction)."""
        ledger = Ledger(
            state.budget.epsilon_total,
            state.budget.delta_total,
            state.budget.epsilon_spent,
            state.budget.delta_spent,
        )
        ledger.charge(epsilon, delta)  # raises BudgetExhausted
        self._write_spent(state.params.task_id, ledger)

    def _write_spent(self, task_id: str, ledger: Ledger) -> None:
        after = ledger.budget()
        self._db.execute(
            "UPDATE tasks SET epsilon_spent=?, delta_spent=? WHERE task_id=?",
            (str(after.epsilon_spent), str(after.delta_spent), task_id),
        )

    # ------------------------------------------------------------ plans
    def _plan_row(self, plan_id: str) -> tuple[PlanBook, str, str]:
        row = self._db.execute(
            "SELECT book, state, task_id FROM plans WHERE plan_id=?", (plan_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown plan {plan_id!r}")
        return PlanBook.from_json(json.loads(row[0])), row[1], row[2]

    def plan(self, plan_id: str) -> tuple[PlanBook, str, str]:
        """(book, state, task id) of a plan."""
        return self._plan_row(plan_id)

    def reserve_plan(self, plan_id: str, task_id: str, book: PlanBook) -> None:
        """Charge the plan's composed (ε, δ) to the ledger and record it, atomically
        (BudgetExhausted: nothing is spent)."""
        with self._tx():
            state = self.task(task_id)
            if self._db.execute("SELECT 1 FROM plans WHERE plan_id=?", (plan_id,)).fetchone():
                raise AlreadyExists(f"plan {plan_id!r} already exists")
            self._charge(state, book.charge.epsilon, book.charge.delta)
            self._db.execute(
                "INSERT INTO plans (plan_id, task_id, book, state) VALUES (?,?,?,?)",
                (plan_id, task_id, json.dumps(book.to_json()), PLAN_ACTIVE),
            )

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        """End an active plan and return what it did not use (basic plans; see
        `PlanBook.refund`) to the ledger.  Idempotent: an ended plan refunds 0."""
        with self._tx():
            book, state, task_id = self._plan_row(plan_id)
            if state != PLAN_ACTIVE:
                return Fraction(0), Fraction(0)
            back_e, back_d = book.refund()
            b = self.task(task_id).budget
            ledger = Ledger(b.epsilon_total, b.delta_total, b.epsilon_spent, b.delta_spent)
            ledger.refund(back_e, back_d)
            self._write_spent(task_id, ledger)
            self._db.execute("UPDATE plans SET state=? WHERE plan_id=?", (PLAN_ENDED, plan_id))
        return back_e, back_d

    def fail_plan(self, plan_id: str) -> None:
        """No more streams of this plan, and never a refund."""
        with self._tx():
            self._plan_row(plan_id)
            self._db.execute(
                "UPDATE plans SET state=? WHERE plan_id=? AND state=?",
                (PLAN_FAILED, plan_id, PLAN_ACTIVE),
            )

    def plan_ids(self, task_id: str, state: str) -> list[str]:
        return [
            r[0]
            for r in self._db.execute(
                "SELECT plan_id FROM plans WHERE task_id=? AND state=? ORDER BY plan_id",
                (task_id, state),
            )
        ]

    def set_threshold_noise(self, stream_id: str, gamma: int, open_now: bool = True) -> None:
        """Store γ; the stream opens now, or (leader) stays `opening` until
        `confirm_stream` once the helper has charged too."""
        with self._tx():
            cur = self._db.execute(
                "UPDATE streams SET gamma=?, state=? WHERE stream_id=? AND state=?",
                (str(gamma), OPEN if open_now else OPENING, stream_id, OPENING),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not being opened")

    def confirm_stream(self, stream_id: str) -> None:
        """The leader's stream opens once the helper has charged and drawn its γ.
        Not fsynced: losing it leaves the stream `opening`, failed on restart (safe;
        the ledger reconciliation then makes sure the helper's charge stands)."""
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._tx():
                cur = self._db.execute(
                    "UPDATE streams SET state=? WHERE stream_id=? AND state=?"
                    " AND gamma IS NOT NULL",
                    (OPEN, stream_id, OPENING),
                )
                if cur.rowcount != 1:
                    raise FailedPrecondition(f"stream {stream_id!r} is not being opened")
        finally:
            self._db.execute("PRAGMA synchronous=FULL")

    def stream_ids(self, task_id: str, state: str) -> list[str]:
        """The ids of a task's streams in `state` (ledger reconciliation)."""
        rows = self._db.execute(
            "SELECT stream_id FROM streams WHERE task_id=? AND state=? ORDER BY rowid",
            (task_id, state),
        ).fetchall()
        return [r[0] for r in rows]

    def stream(self, stream_id: str) -> StreamState:
        row = self._db.execute(
            "SELECT stream_id, task_id, kind, epsilon, delta, gamma, state, chunks, queries,"
            " plan_id, plan_group FROM streams WHERE stream_id=?",
            (stream_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown stream {stream_id!r}")
        return StreamState(
            row[0],
            row[1],
            StreamKind(row[2]),
            Fraction(row[3]),
            Fraction(row[4]),
            None if row[5] is None else int(row[5]),
            row[6],
            row[7],
            row[8],
            None if row[9] is None else (row[9], int(row[10])),
        )

    def begin_chunk(self, stream_id: str, chunk_no: int | None = None) -> int:
        """Mark the stream mid-chunk (durably) and return the chunk's number.

        The helper passes the leader's chunk number and refuses anything but the
        next one, so a session id is never reused."""
        with self._tx():
            s = self.stream(stream_id)
            if s.state != OPEN:
                raise FailedPrecondition(f"stream {stream_id!r} is {s.state}; it answers no more")
            if chunk_no is not None and chunk_no != s.chunks + 1:
                raise FailedPrecondition(
                    f"stream {stream_id!r}: chunk {chunk_no} out of order (expected {s.chunks + 1})"
                )
            self._db.execute(
                "UPDATE streams SET state=?, chunks=chunks+1 WHERE stream_id=?",
                (IN_CHUNK, stream_id),
            )
        return s.chunks + 1

    def end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        """Record a chunk's result.  Not fsynced (synchronous=NORMAL): if a power
        loss drops this record, the stream is back to `in_chunk` and is failed
        closed on restart, which is safe; the fsync the chunk needs is the one
        of its `in_chunk` mark."""
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            self._end_chunk(stream_id, answered, close)
        finally:
            self._db.execute("PRAGMA synchronous=FULL")

    def _end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE streams SET state=?, queries=queries+? WHERE stream_id=? AND state=?",
                (CLOSED if close else OPEN, answered, stream_id, IN_CHUNK),
            )

    def fail_stream(self, stream_id: str) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE streams SET state=? WHERE stream_id=? AND state!=?",
                (FAILED, stream_id, CLOSED),
            )

    # ------------------------------------------------------------ robust staging
    def stage_robust(
        self, task_id: str, pass_id: bytes, digest: bytes, lo: int, shares: U64
    ) -> None:
        """Keep the helper's new shares of coordinates [lo, lo + len(shares)) of the
        report set `digest`, computed by the pass `pass_id`.  Each pass stages
        apart: a late chunk of an abandoned pass never replaces a newer pass's."""
        held, parts = self._staged.setdefault(task_id, {}).get(pass_id, (digest, {}))
        if held != digest:
            parts = {}
        parts[lo] = np.array(shares, dtype=np.uint64)
        self._staged[task_id][pass_id] = (digest, parts)

    def staged_robust(self, task_id: str, pass_id: bytes, digest: bytes, d: int) -> U64 | None:
        """The shares pass `pass_id` staged for report set `digest`, if they
        cover all d coordinates."""
        held, parts = self._staged.get(task_id, {}).get(pass_id, (b"", {}))
        return _assemble(d, list(parts.items())) if held == digest else None

    def clear_staged(self, task_id: str) -> None:
        """Drop every pass staged for the task (at the agreement)."""
        self._staged.pop(task_id, None)


def _assemble(d: int, parts: list[tuple[int, U64]]) -> U64 | None:
    """d shares from (lo, shares) pieces, or None unless every coordinate is covered."""
    out = np.zeros(d, dtype=np.uint64)
    filled = np.zeros(d, dtype=bool)
    for lo, shares in parts:
        if lo < 0 or lo + len(shares) > d:
            return None
        out[lo : lo + len(shares)] = shares
        filled[lo : lo + len(shares)] = True
    return out if filled.all() else None


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception; re-entrant."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._outer = False

    def __enter__(self) -> None:
        if not self._db.in_transaction:
            self._db.execute("BEGIN IMMEDIATE")
            self._outer = True

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")


#: `--db` values that name a PostgreSQL store.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def sqlite_file(db: str | Path) -> str | None:
    """The SQLite file a `--db` value names (a path or `sqlite:///path`, with
    `sqlite:////abs/path` for an absolute one), None for a PostgreSQL URL."""
    text = str(db)
    if text.startswith(POSTGRES_SCHEMES):
        return None
    if text.startswith("sqlite:///"):
        return text[len("sqlite:///") :]
    if "://" in text:
        raise InvalidArgument(
            f"--db {text.split('://', 1)[0]}://...: use a file path, sqlite:///path "
            "or postgresql://..."
        )
    return text


def open_store(db: str | Path, recover: bool = True) -> Store:
    """The store a `--db` value names: SQLite for a file path or `sqlite:///path`
    (the default), PostgreSQL for `postgresql://user@host:port/dbname` (needs
    the `postgres` extra: `pip install "svtagg[postgres]"`).  `recover=False`
    (ingest replicas) skips failing the in-flight streams at start: another
    process of the same server owns them; only PostgreSQL allows it."""
    path = sqlite_file(db)
    if path is not None:
        if not recover:
            raise ValueError("ingest replicas share a PostgreSQL store (--db postgresql://...)")
        return Store(path)
    try:
        from svtagg.servers.store_pg import PgStore
    except ImportError as e:
        raise RuntimeError(
            'a postgresql:// store needs psycopg: pip install "svtagg[postgres]"'
        ) from e
    return PgStore(str(db), recover=recover)
