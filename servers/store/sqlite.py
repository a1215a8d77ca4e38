"""One server's durable state in SQLite (the default store; `store.Store`
names its operations and promises).

WAL, synchronous=FULL and one `BEGIN IMMEDIATE` transaction per step: every
step commits with an fsync, except `confirm_stream` and `end_chunk`, written
with synchronous=NORMAL (losing them fails the stream on restart, which is
safe).  Per-report shares live in a side file per task (`<db>.shares/`), not
in the database, and are deleted at the agreement.  The schema is versioned
by SQLite's user_version (`SqliteStore.SCHEMA_VERSION`).
"""

from __future__ import annotations

import io
import os
import sqlite3
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from svtagg.dp.errors import AlreadyExists, FailedPrecondition, NotFound
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import Budget
from svtagg.dp.task import TaskParams
from svtagg.mpc.ring import U64
from svtagg.servers.faults import crash_point
from svtagg.servers.store.jointpool_tables import JointPoolTables
from svtagg.servers.store.rules import (
    BATCH_COLUMNS,
    CLOSED,
    FAILED,
    IN_CHUNK,
    NEW_STREAM_COLUMNS,
    NEW_TASK_COLUMNS,
    OPEN,
    OPENING,
    PLAN_ACTIVE,
    PLAN_COLUMNS,
    PLAN_ENDED,
    PLAN_FAILED,
    STREAM_COLUMNS,
    TASK_COLUMNS,
    StreamState,
    TaskState,
    Verified,
    admit_batch,
    admit_to_plan,
    assemble,
    book_text,
    charged,
    check_pending_cap,
    check_removable,
    counted,
    fold,
    new_stream_row,
    new_task_row,
    next_chunk,
    plan_state,
    refunded,
    stream_state,
    task_state,
    within_capacity,
    xor_reports,
)
from svtagg.servers.store.sqlite_schema import BASE_TABLES


class SqliteStore(JointPoolTables):
    """SQLite store of one server (`store.Store`).  Not thread-safe: one server,
    one event loop; one process per store file."""

    #: Schema version this code writes (SQLite's user_version).
    SCHEMA_VERSION = 9

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._shares_dir = Path(self.path + ".shares")
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(BASE_TABLES)
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
            version = 4
        if version < 5:
            # v5: validity proofs — the task's circuit, its Prio3 verify key and
            # the count of refused reports by reason.
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(tasks)")}
            for col, kind in (
                ("validity", "TEXT NOT NULL DEFAULT ''"),
                ("verify_key", "BLOB"),
                ("rejected", "TEXT NOT NULL DEFAULT '{}'"),
            ):
                if col not in cols:
                    self._db.execute(f"ALTER TABLE tasks ADD COLUMN {col} {kind}")
            self._db.execute("PRAGMA user_version = 5")
            version = 5
        if version < 6:
            # v6: the task's noise option (tasks stored before: independent).
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(tasks)")}
            if "noise" not in cols:
                self._db.execute(
                    "ALTER TABLE tasks ADD COLUMN noise TEXT NOT NULL DEFAULT 'independent'"
                )
            self._db.execute("PRAGMA user_version = 6")
            version = 6
        if version < 7:
            # v7: a chunked report-noisy-max's carried winner (this server's share).
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(streams)")}
            for col, kind in (("carry_chunk", "INTEGER"), ("carry", "BLOB")):
                if col not in cols:
                    self._db.execute(f"ALTER TABLE streams ADD COLUMN {col} {kind}")
            self._db.execute("PRAGMA user_version = 7")
            version = 7
        if version < 8:
            # v8: ahead-of-time joint noise — each stream's pool counters and the
            # batches of this server's shares it holds (servers/store/jointpool.py).
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS joint_pools (stream_id TEXT PRIMARY KEY,"
                " next_seq INTEGER NOT NULL DEFAULT 0, used_seq INTEGER NOT NULL DEFAULT 0,"
                " gamma_ready INTEGER NOT NULL DEFAULT 0)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS joint_batches (stream_id TEXT NOT NULL,"
                " lo INTEGER NOT NULL, shares BLOB NOT NULL, PRIMARY KEY (stream_id, lo))"
                " WITHOUT ROWID"
            )
            self._db.execute("PRAGMA user_version = 8")
            version = 8
        if version < 9:
            # v9: a verified batch's verdicts bound to the leader's prep shares
            # they were decided on (`Verified.binding`), so a retry that changed
            # them is refused (rows recorded before hold NULL: no retry of those).
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(verdicts)")}
            if "binding" not in cols:
                self._db.execute("ALTER TABLE verdicts ADD COLUMN binding BLOB")
            self._db.execute("PRAGMA user_version = 9")

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
            for sid, _ in self.recovered_failed:  # it keeps no joint noise shares
                self._db.execute("DELETE FROM joint_batches WHERE stream_id=?", (sid,))
        return cur.rowcount

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    atomic = _tx  # Store.atomic: the steps inside share one (durable) transaction

    # ------------------------------------------------------------ tasks
    def create_task(self, p: TaskParams, verify_key: bytes = b"") -> TaskState:
        with self._tx():
            if self._db.execute("SELECT 1 FROM tasks WHERE task_id=?", (p.task_id,)).fetchone():
                raise AlreadyExists(f"task {p.task_id!r} already exists")
            self._db.execute(
                f"INSERT INTO tasks ({NEW_TASK_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                new_task_row(p, verify_key),
            )
        return self.task(p.task_id)

    def task(self, task_id: str) -> TaskState:
        row = self._db.execute(
            f"SELECT {TASK_COLUMNS} FROM tasks t WHERE task_id=?", (task_id,)
        ).fetchone()
        return task_state(task_id, row)

    def task_ids(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT task_id FROM tasks ORDER BY task_id")]

    def sums(self, task_id: str) -> U64:
        row = self._db.execute("SELECT sums FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        return np.frombuffer(row[0], dtype=np.uint64).copy()

    def robust_sums(self, task_id: str) -> U64 | None:
        row = self._db.execute(
            "SELECT robust_sums FROM tasks WHERE task_id=?", (task_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        return None if row[0] is None else np.frombuffer(row[0], dtype=np.uint64).copy()

    # ------------------------------------------------------------ uploads
    def _share_file(self, task_id: str) -> Path:
        return self._shares_dir / f"{task_id}.bin"

    def _read_shares(self, task_id: str) -> BinaryIO:
        """The task's share file for reading (empty if no share was ever stored:
        a task whose reports keep their ids only)."""
        path = self._share_file(task_id)
        return open(path, "rb") if path.exists() else io.BytesIO()

    def _append_shares(self, task_id: str, shares: list[bytes]) -> int:
        """Append shares to the task's share file and fsync; returns the offset.
        Shares live outside SQLite because they are large and needed only until
        the collection closes; a crash before the SQLite commit leaves an
        unreferenced tail, which is harmless."""
        blob = b"".join(shares)
        if not blob:  # ids only (the leader of a task with proofs): nothing to sync
            return 0
        self._shares_dir.mkdir(exist_ok=True)
        with open(self._share_file(task_id), "ab") as f:
            offset = f.tell()
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        return offset

    def add_reports(
        self,
        task_id: str,
        report_ids: list[bytes],
        shares: list[bytes],
        share_sum: U64,
        verified: Verified | None = None,
    ) -> int:
        with self._tx():
            row = self._db.execute(
                f"SELECT {BATCH_COLUMNS} FROM tasks WHERE task_id=?", (task_id,)
            ).fetchone()
            n, n_max, sums_blob, digest = admit_batch(task_id, row, share_sum)
            placeholders = ",".join("?" * len(report_ids))
            seen = (
                self._db.execute(
                    "SELECT COUNT(*) FROM reports WHERE task_id=? "
                    f"AND report_id IN ({placeholders})",
                    (task_id, *report_ids),
                ).fetchone()[0]
                if 0 < len(report_ids) < 30_000
                else 0
            )
            if seen:
                raise AlreadyExists(
                    f"{seen} report id(s) of this batch were already uploaded (replay); "
                    "batch refused"
                )
            within_capacity(task_id, n, n_max, len(report_ids))
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
            rejected = row[7]
            if verified is not None:
                self._record_verified(task_id, verified)
                rejected = counted(rejected, verified.rejected)
            self._db.execute(
                "UPDATE tasks SET n=?, sums=?, digest=?, rejected=? WHERE task_id=?",
                (
                    n + len(report_ids),
                    fold(sums_blob, share_sum, bool(row[6])),
                    xor_reports(bytes(digest), report_ids),
                    rejected,
                    task_id,
                ),
            )
        return int(n + len(report_ids))

    def _record_verified(self, task_id: str, v: Verified) -> None:
        """A verified batch's verdicts, and its pending shares dropped (inside
        the caller's transaction)."""
        if v.batch_id:  # the helper's record (a retried verification reads it)
            self._db.execute(
                "INSERT INTO verdicts (task_id, batch_id, verdicts, binding) VALUES (?, ?, ?, ?)",
                (task_id, v.batch_id, v.verdicts, v.binding),
            )
        self._db.executemany(
            "DELETE FROM pending WHERE task_id=? AND report_id=?",
            [(task_id, rid) for rid in v.batch_ids],
        )

    def add_pending(
        self, task_id: str, report_ids: list[bytes], blobs: list[bytes], cap: int | None = None
    ) -> int:
        with self._tx():
            task = self.task(task_id)
            if not task.collection_open:
                raise FailedPrecondition(f"collection of task {task_id!r} is closed")
            if cap is not None:
                held = self._db.execute(
                    "SELECT COUNT(*) FROM pending WHERE task_id=?", (task_id,)
                ).fetchone()[0]
                check_pending_cap(held, len(report_ids), cap)
            placeholders = ",".join("?" * len(report_ids))
            seen = self._db.execute(
                f"SELECT COUNT(*) FROM reports WHERE task_id=? AND report_id IN ({placeholders})",
                (task_id, *report_ids),
            ).fetchone()[0]
            if seen:
                raise AlreadyExists(
                    f"{seen} report id(s) of this batch were already verified (replay); "
                    "batch refused"
                )
            self._db.executemany(
                "INSERT OR IGNORE INTO pending (task_id, report_id, blob) VALUES (?, ?, ?)",
                [(task_id, rid, blob) for rid, blob in zip(report_ids, blobs, strict=True)],
            )
            count = self._db.execute(
                "SELECT COUNT(*) FROM pending WHERE task_id=?", (task_id,)
            ).fetchone()[0]
        return int(count)

    def pending(self, task_id: str, report_ids: list[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for rid in report_ids:
            row = self._db.execute(
                "SELECT blob FROM pending WHERE task_id=? AND report_id=?", (task_id, rid)
            ).fetchone()
            out.append(None if row is None else bytes(row[0]))
        return out

    def verdicts(self, task_id: str, batch_id: bytes) -> bytes | None:
        row = self._db.execute(
            "SELECT verdicts FROM verdicts WHERE task_id=? AND batch_id=?", (task_id, batch_id)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def counted(self, task_id: str, report_ids: list[bytes]) -> int:
        total = 0
        for start in range(0, len(report_ids), 500):  # SQLite's bound on parameters
            part = report_ids[start : start + 500]
            total += self._db.execute(
                "SELECT COUNT(*) FROM reports WHERE task_id=? AND report_id IN "
                f"({','.join('?' * len(part))})",
                (task_id, *part),
            ).fetchone()[0]
        return int(total)

    def verdict_binding(self, task_id: str, batch_id: bytes) -> bytes | None:
        row = self._db.execute(
            "SELECT binding FROM verdicts WHERE task_id=? AND batch_id=?", (task_id, batch_id)
        ).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def close_collection(self, task_id: str) -> TaskState:
        with self._tx():
            self.task(task_id)
            self._db.execute("UPDATE tasks SET collection_open=0 WHERE task_id=?", (task_id,))
            self._db.execute("DELETE FROM pending WHERE task_id=?", (task_id,))
            self._db.execute("DELETE FROM verdicts WHERE task_id=?", (task_id,))
        return self.task(task_id)

    def _share_at(self, task_id: str, rid: bytes) -> tuple[int, int] | None:
        """(offset, length) of a report's share in the task's share file."""
        row = self._db.execute(
            "SELECT share_off, share_len FROM reports WHERE task_id=? AND report_id=?",
            (task_id, rid),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def shares(self, task_id: str, report_ids: list[bytes]) -> list[bytes]:
        out = []
        with self._read_shares(task_id) as f:
            for rid in report_ids:
                at = self._share_at(task_id, rid)
                if at is None:
                    raise NotFound(f"task {task_id!r} has no report {rid.hex()}")
                f.seek(at[0])
                out.append(f.read(at[1]))
        return out

    def report_ids(self, task_id: str, after: bytes = b"", limit: int | None = None) -> list[bytes]:
        sql = "SELECT report_id FROM reports WHERE task_id=? AND report_id > ? ORDER BY report_id"
        args: tuple[object, ...] = (task_id, after)
        if limit is not None:
            sql += " LIMIT ?"
            args = (*args, int(limit))
        return [bytes(r[0]) for r in self._db.execute(sql, args)]

    def remove_reports(
        self, task_id: str, report_ids: list[bytes], share_sum: Callable[[list[bytes]], U64]
    ) -> TaskState:
        with self._tx():
            task = self.task(task_id)
            check_removable(task)
            shares: list[bytes] = []
            present: list[bytes] = []
            if not report_ids:
                return task
            with self._read_shares(task_id) as f:
                for rid in report_ids:
                    at = self._share_at(task_id, rid)
                    if at is not None:
                        present.append(rid)
                        f.seek(at[0])
                        shares.append(f.read(at[1]))
            if present:
                sums_blob, in_field = self._db.execute(
                    "SELECT sums, validity FROM tasks WHERE task_id=?", (task_id,)
                ).fetchone()
                sums = fold(sums_blob, share_sum(shares), bool(in_field), subtract=True)
                self._db.executemany(
                    "DELETE FROM reports WHERE task_id=? AND report_id=?",
                    [(task_id, rid) for rid in present],
                )
                self._db.execute(
                    "UPDATE tasks SET n=n-?, sums=?, digest=? WHERE task_id=?",
                    (len(present), sums, xor_reports(task.digest, present), task_id),
                )
        return self.task(task_id)

    def mark_agreed(self, task_id: str, robust_sums: U64 | None) -> TaskState:
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
        with self._tx():
            if self._db.execute("SELECT 1 FROM streams WHERE stream_id=?", (stream_id,)).fetchone():
                if replay:
                    return
                raise AlreadyExists(f"stream {stream_id!r} already exists")
            budget = self.task(task_id).budget
            extra: tuple[Fraction, Fraction] | None = (epsilon, delta_charge)
            if plan is not None:
                held = self.plan(plan[0])
                extra = admit_to_plan(plan, held, task_id, (epsilon, delta_charge), replay)
                self._db.execute(
                    "UPDATE plans SET book=? WHERE plan_id=?", (book_text(held[0]), plan[0])
                )
            if extra is not None:
                self._write_spent(task_id, charged(budget, *extra))
            self._db.execute(
                f"INSERT INTO streams ({NEW_STREAM_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                new_stream_row(stream_id, task_id, kind, epsilon, delta, plan, replay),
            )

    def _write_spent(self, task_id: str, after: Budget) -> None:
        """Write the task's new spent totals (inside the caller's transaction)."""
        self._db.execute(
            "UPDATE tasks SET epsilon_spent=?, delta_spent=? WHERE task_id=?",
            (str(after.epsilon_spent), str(after.delta_spent), task_id),
        )

    def set_threshold_noise(self, stream_id: str, gamma: int, open_now: bool = True) -> None:
        with self._tx():
            cur = self._db.execute(
                "UPDATE streams SET gamma=?, state=? WHERE stream_id=? AND state=?",
                (str(gamma), OPEN if open_now else OPENING, stream_id, OPENING),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not being opened")

    def set_joint_threshold_noise(self, stream_id: str, gamma: int) -> None:
        with self._tx():
            cur = self._db.execute(
                "UPDATE streams SET gamma=? WHERE stream_id=? AND state=? AND chunks=1",
                (str(gamma), stream_id, IN_CHUNK),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not in its first chunk")

    def set_noisy_max_carry(self, stream_id: str, carry: bytes) -> None:
        with self._tx():
            cur = self._db.execute(
                "UPDATE streams SET carry=?, carry_chunk=chunks WHERE stream_id=? AND state=?",
                (carry, stream_id, IN_CHUNK),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not in a chunk")

    def noisy_max_carry(self, stream_id: str) -> tuple[int, bytes] | None:
        row = self._db.execute(
            "SELECT carry_chunk, carry FROM streams WHERE stream_id=?", (stream_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown stream {stream_id!r}")
        return None if row[1] is None else (int(row[0]), bytes(row[1]))

    def confirm_stream(self, stream_id: str) -> None:
        """Not fsynced (synchronous=NORMAL)."""
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
        rows = self._db.execute(
            "SELECT stream_id FROM streams WHERE task_id=? AND state=? ORDER BY rowid",
            (task_id, state),
        ).fetchall()
        return [r[0] for r in rows]

    def stream(self, stream_id: str) -> StreamState:
        row = self._db.execute(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id=?", (stream_id,)
        ).fetchone()
        return stream_state(stream_id, row)

    def begin_chunk(self, stream_id: str, chunk_no: int | None = None) -> int:
        with self._tx():
            number = next_chunk(self.stream(stream_id), chunk_no)
            self._db.execute(
                "UPDATE streams SET state=?, chunks=chunks+1 WHERE stream_id=?",
                (IN_CHUNK, stream_id),
            )
        return number

    def end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        """Not fsynced (synchronous=NORMAL)."""
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._tx():
                self._db.execute(
                    "UPDATE streams SET state=?, queries=queries+? WHERE stream_id=? AND state=?",
                    (CLOSED if close else OPEN, answered, stream_id, IN_CHUNK),
                )
        finally:
            self._db.execute("PRAGMA synchronous=FULL")

    def fail_stream(self, stream_id: str) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE streams SET state=? WHERE stream_id=? AND state!=?",
                (FAILED, stream_id, CLOSED),
            )

    # ------------------------------------------------------------ joint noise pool
    def _sql(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """A statement of the shared joint-pool code (`store_jointpool`)."""
        return self._db.execute(statement, params)

    # ------------------------------------------------------------ plans
    def plan(self, plan_id: str) -> tuple[PlanBook, str, str]:
        row = self._db.execute(
            f"SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id=?", (plan_id,)
        ).fetchone()
        return plan_state(plan_id, row)

    def reserve_plan(self, plan_id: str, task_id: str, book: PlanBook) -> None:
        with self._tx():
            budget = self.task(task_id).budget
            if self._db.execute("SELECT 1 FROM plans WHERE plan_id=?", (plan_id,)).fetchone():
                raise AlreadyExists(f"plan {plan_id!r} already exists")
            self._write_spent(task_id, charged(budget, book.charge.epsilon, book.charge.delta))
            self._db.execute(
                "INSERT INTO plans (plan_id, task_id, book, state) VALUES (?,?,?,?)",
                (plan_id, task_id, book_text(book), PLAN_ACTIVE),
            )

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        with self._tx():
            book, state, task_id = self.plan(plan_id)
            if state != PLAN_ACTIVE:
                return Fraction(0), Fraction(0)
            back_e, back_d = book.refund()
            self._write_spent(task_id, refunded(self.task(task_id).budget, back_e, back_d))
            self._db.execute("UPDATE plans SET state=? WHERE plan_id=?", (PLAN_ENDED, plan_id))
        return back_e, back_d

    def fail_plan(self, plan_id: str) -> None:
        with self._tx():
            self.plan(plan_id)
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

    # ------------------------------------------------------------ robust staging
    def stage_robust(
        self, task_id: str, pass_id: bytes, digest: bytes, lo: int, shares: U64
    ) -> None:
        held, parts = self._staged.setdefault(task_id, {}).get(pass_id, (digest, {}))
        if held != digest:
            parts = {}
        parts[lo] = np.array(shares, dtype=np.uint64)
        self._staged[task_id][pass_id] = (digest, parts)

    def staged_robust(self, task_id: str, pass_id: bytes, digest: bytes, d: int) -> U64 | None:
        held, parts = self._staged.get(task_id, {}).get(pass_id, (b"", {}))
        return assemble(d, list(parts.items())) if held == digest else None

    def clear_staged(self, task_id: str) -> None:
        self._staged.pop(task_id, None)


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
