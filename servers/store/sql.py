"""The one store implementation: every operation of `rules.Store` written once,
over SQL that SQLite and PostgreSQL both run.

Statements are written with `?` placeholders and run through `SqlStore._run`;
what truly differs between the two databases is the dialect seam, the short
list of methods and attributes each dialect (`sqlite.SqliteStore`,
`postgres.PgStore`) provides:

- `_run`, `_run_many`: SQLite runs `?` as is; PostgreSQL turns it into
  `%s` (cached per statement);
- `_tx(durable)`: `BEGIN IMMEDIATE` / `BEGIN` and an advisory lock keyed by
  the schema; not durable = `synchronous=NORMAL` / `synchronous_commit off`;
- `_in(ids)`: `IN (?, ...)` of at most 500 ids / `= ANY(?)` of one array;
- `FOR_UPDATE` (the task row a transaction rewrites): nothing, SQLite's
  write lock is the database's / `FOR UPDATE`;
- `STREAM_ORDER`: `rowid` / the `seq` column;
- `_insert_reports`, `_stored_shares`, `_drop_shares`, `_after_agreed`:
  shares in a side file per task with `(offset, length)` in `reports` /
  in `reports.share`, written by binary COPY;
- `_journal`: none (SQLite schema 9 has no journal table) / `spends`,
  append-only;
- robust staging: in memory, one process per SQLite store / the
  `robust_staged` table, where any process may run a pass;
- schema and migrations: `sqlite_schema` and `PRAGMA user_version` /
  `postgres_schema` and `svtagg_schema`.

The rules a row is held to (admission of a batch, the ledger's charge and
refund, the plan's book, the next chunk) are the pure functions of `rules`;
this module only reads the rows, applies them and writes the result, inside
one transaction per step.  A ledger rule therefore lives in `rules.charged` /
`rules.refunded` / `rules.admit_to_plan`, and its one write in
`SqlStore._write_spent`.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np

from svtagg.dp.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import Budget
from svtagg.dp.task import TaskParams
from svtagg.mpc.ring import U64
from svtagg.servers.faults import crash_point
from svtagg.servers.store import jointpool
from svtagg.servers.store.jointpool import Batch, JointPool
from svtagg.servers.store.migrations import HISTORY, VERSION
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
    CrawlRecord,
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
    unknown_task,
    xor_reports,
)

log = logging.getLogger("svtagg.store")


def _marks(count: int) -> str:
    return ",".join("?" * count)


class SqlStore(ABC):
    """`rules.Store` over one database session.  Not thread-safe: one server,
    one event loop.  Every method that changes state commits before it returns
    (or changes nothing and raises)."""

    #: Appended to the SELECT of a task row that a transaction then rewrites.
    FOR_UPDATE = ""
    #: The column that orders a task's streams by their creation.
    STREAM_ORDER = "rowid"
    #: Seconds a stream chunk's record may wait in memory to be written with
    #: the stream's next mark (D2 in servers/exchange/machine.py: one
    #: transaction per chunk); None: written at once, as a dialect must whose
    #: store other processes share (their next chunk would not see it).
    RECORD_WAIT: float | None = None

    recovered_failed: list[tuple[str, str]]
    recovered_plans: list[tuple[str, str]]
    failed_on_recovery: int

    #: The dialect's name in `migrations` ("sqlite" / "postgres").
    DIALECT = "sqlite"
    #: The schema version this code writes (`migrations.VERSION`).
    SCHEMA_VERSION = VERSION

    def schema_version(self) -> int:
        """The store's version in the shared history (0: before it)."""
        if not self._has_version_table():
            return 0
        row = self._one("SELECT version FROM svtagg_schema")
        return 0 if row is None else int(row[0])

    def _migrate_shared(self, version: int) -> None:
        """(Inside the dialect's migration transaction, its frozen ladder climbed
        to `version`.)  The steps of the one history (`migrations.HISTORY`) the
        store lacks, up to SCHEMA_VERSION, and the version stamped."""
        stamped = self.schema_version()
        if max(stamped, version) > self.SCHEMA_VERSION:
            raise RuntimeError(
                f"the store {self.path} has schema version {max(stamped, version)}; this"
                f" svtagg knows versions up to {self.SCHEMA_VERSION} (upgrade svtagg)"
            )
        version = max(stamped, version)
        for step in HISTORY:
            if version < step.version <= self.SCHEMA_VERSION:
                for statement in step.for_dialect(self.DIALECT):
                    self._run(statement)
                version = step.version
        if self._has_version_table():
            self._run(
                "INSERT INTO svtagg_schema (one, version) VALUES (TRUE, ?)"
                " ON CONFLICT (one) DO UPDATE SET version = excluded.version",
                (version,),
            )

    def _start_records(self) -> None:
        """(Each dialect's `__init__`.)  No stream record waits yet."""
        #: stream id → queries its last chunk answered, record not written yet.
        self._ended: dict[str, int] = {}
        #: The records the open transaction writes (back to `_ended` on rollback).
        self._writing: dict[str, int] = {}
        self._record_timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def _stop_records(self) -> None:
        """(Each dialect's `close`, before the database goes.)  The waiting
        records written; from now on a record is written at once (so a record
        after the close fails where it is made, not later in a timer)."""
        if self._record_timer is not None:
            self._record_timer.cancel()
            self._record_timer = None
        self.RECORD_WAIT = None
        self.write_records()

    # ------------------------------------------------------------ the dialect seam
    path: str

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def _has_version_table(self) -> bool:
        """Whether the store has the `svtagg_schema` table (SQLite: from v12)."""

    @abstractmethod
    def _run(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (`?` placeholders); its cursor."""

    @abstractmethod
    def _run_many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row."""

    @abstractmethod
    def _tx(self, durable: bool = True) -> AbstractContextManager[None]:
        """One write transaction (re-entrant: inside another it joins it).
        `durable=False` commits without waiting for the disk."""

    @abstractmethod
    def _write_alone(self, statement: str, params: Sequence[Any], durable: bool = True) -> Any:
        """One write statement as a transaction of its own (inside a caller's
        transaction: part of it); its cursor.  The per-chunk marks are one
        statement each, and a database that commits a lone statement by itself
        saves the BEGIN and COMMIT round trips."""

    @abstractmethod
    def _in(self, ids: Sequence[bytes]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        """`report_id IN ids` as (SQL after the column, parameters), in as many
        parts as the database needs."""

    @abstractmethod
    def _insert_reports(
        self, task_id: str, report_ids: list[bytes], shares: list[bytes], room: tuple[int, int]
    ) -> None:
        """Store a batch's report ids and shares (inside the caller's
        transaction): AlreadyExists if an id was stored before, and
        `rules.within_capacity` applied to `room` = (n, n_max) before any share
        is written where the dialect can, else before it returns."""

    @abstractmethod
    def _stored_shares(self, task_id: str, report_ids: list[bytes]) -> dict[bytes, bytes | None]:
        """The stored reports among `report_ids` and their shares (None: dropped)."""

    @abstractmethod
    def _drop_shares(self, task_id: str) -> None:
        """Drop the task's per-report shares (inside the agreement's transaction)."""

    @abstractmethod
    def _journal(self, task_id: str, change: tuple[Fraction, Fraction], after: Budget) -> None:
        """Append a ledger change to the store's journal, if it keeps one."""

    @abstractmethod
    def _after_agreed(self, task_id: str) -> None:
        """What the dialect does once the agreement has committed."""

    # ------------------------------------------------------------ helpers
    def _one(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self._run(statement, params).fetchone()

    def _count(self, statement: str, params: Sequence[Any]) -> int:
        return int(self._one(statement, params)[0])

    def _count_reports(self, task_id: str, report_ids: Sequence[bytes]) -> int:
        return sum(
            self._count(
                f"SELECT COUNT(*) FROM reports WHERE task_id=? AND report_id {cond}",
                (task_id, *args),
            )
            for cond, args in self._in(report_ids)
        )

    def atomic(self) -> AbstractContextManager[None]:
        """Store.atomic: the steps inside share one (durable) transaction."""
        return self._tx()

    def _recover(self) -> int:
        """Fail closed every stream that was opening or mid-chunk at the last stop,
        and list the plans then active (`recovered_plans`)."""
        with self._tx():
            self.recovered_plans = [
                (r[0], r[1])
                for r in self._run(
                    "SELECT plan_id, task_id FROM plans WHERE state=? ORDER BY plan_id",
                    (PLAN_ACTIVE,),
                )
            ]
            self.recovered_failed = [
                (r[0], r[1])
                for r in self._run(
                    "SELECT stream_id, task_id FROM streams WHERE state IN (?, ?)",
                    (OPENING, IN_CHUNK),
                )
            ]
            cur = self._run(
                "UPDATE streams SET state=? WHERE state IN (?, ?)", (FAILED, OPENING, IN_CHUNK)
            )
            for sid, _ in self.recovered_failed:  # it keeps no joint noise shares
                self._run("DELETE FROM joint_batches WHERE stream_id=?", (sid,))
        return int(cur.rowcount)

    # ------------------------------------------------------------ tasks
    def create_task(self, p: TaskParams, verify_key: bytes = b"") -> TaskState:
        with self._tx():
            if self._one("SELECT 1 FROM tasks WHERE task_id=?", (p.task_id,)):
                raise AlreadyExists(f"task {p.task_id!r} already exists")
            self._run(
                f"INSERT INTO tasks ({NEW_TASK_COLUMNS}) VALUES ({_marks(15)})",
                new_task_row(p, verify_key),
            )
        return self.task(p.task_id)

    def task(self, task_id: str) -> TaskState:
        row = self._one(f"SELECT {TASK_COLUMNS} FROM tasks t WHERE task_id=?", (task_id,))
        return task_state(task_id, row)

    def task_ids(self) -> list[str]:
        return [r[0] for r in self._run("SELECT task_id FROM tasks ORDER BY task_id")]

    def sums(self, task_id: str) -> U64:
        row = self._one("SELECT sums FROM tasks WHERE task_id=?", (task_id,))
        if row is None:
            raise unknown_task(task_id)
        return np.frombuffer(row[0], dtype=np.uint64).copy()

    def robust_sums(self, task_id: str) -> U64 | None:
        row = self._one("SELECT robust_sums FROM tasks WHERE task_id=?", (task_id,))
        if row is None:
            raise unknown_task(task_id)
        return None if row[0] is None else np.frombuffer(row[0], dtype=np.uint64).copy()

    # ------------------------------------------------------------ uploads
    def add_reports(
        self,
        task_id: str,
        report_ids: list[bytes],
        shares: list[bytes],
        share_sum: U64,
        verified: Verified | None = None,
    ) -> int:
        with self._tx():
            row = self._one(
                f"SELECT {BATCH_COLUMNS} FROM tasks WHERE task_id=?{self.FOR_UPDATE}", (task_id,)
            )
            n, n_max, sums_blob, digest = admit_batch(task_id, row, share_sum)
            if len(shares) != len(report_ids):
                raise InvalidArgument(f"{len(report_ids)} report ids, {len(shares)} shares")
            self._insert_reports(task_id, report_ids, shares, (n, n_max))
            crash_point("upload.mid_store")
            assert row is not None  # admit_batch refused a missing task
            rejected = row[7]
            if verified is not None:
                self._record_verified(task_id, verified)
                rejected = counted(rejected, verified.rejected)
            self._run(
                "UPDATE tasks SET n=?, sums=?, digest=?, rejected=? WHERE task_id=?",
                (
                    n + len(report_ids),
                    fold(bytes(sums_blob), share_sum, bool(row[6])),
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
            self._run(
                "INSERT INTO verdicts (task_id, batch_id, verdicts, binding) VALUES (?, ?, ?, ?)",
                (task_id, v.batch_id, v.verdicts, v.binding),
            )
        for cond, args in self._in(v.batch_ids):
            self._run(f"DELETE FROM pending WHERE task_id=? AND report_id {cond}", (task_id, *args))

    def add_pending(
        self, task_id: str, report_ids: list[bytes], blobs: list[bytes], cap: int | None = None
    ) -> int:
        with self._tx():
            row = self._one(
                f"SELECT collection_open FROM tasks WHERE task_id=?{self.FOR_UPDATE}", (task_id,)
            )
            if row is None:
                self.task(task_id)  # NotFound
            if not row[0]:
                raise FailedPrecondition(f"collection of task {task_id!r} is closed")
            if cap is not None:  # the task's row is locked: no other batch counts meanwhile
                held = self._count("SELECT COUNT(*) FROM pending WHERE task_id=?", (task_id,))
                check_pending_cap(held, len(report_ids), cap)
            seen = self._count_reports(task_id, report_ids)
            if seen:
                raise AlreadyExists(
                    f"{seen} report id(s) of this batch were already verified (replay); "
                    "batch refused"
                )
            self._run_many(
                "INSERT INTO pending (task_id, report_id, blob) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                [(task_id, rid, blob) for rid, blob in zip(report_ids, blobs, strict=True)],
            )
            count = self._count("SELECT COUNT(*) FROM pending WHERE task_id=?", (task_id,))
        return count

    def pending(self, task_id: str, report_ids: list[bytes]) -> list[bytes | None]:
        held: dict[bytes, bytes] = {}
        for cond, args in self._in(report_ids):
            for rid, blob in self._run(
                f"SELECT report_id, blob FROM pending WHERE task_id=? AND report_id {cond}",
                (task_id, *args),
            ):
                held[bytes(rid)] = bytes(blob)
        return [held.get(rid) for rid in report_ids]

    def verdicts(self, task_id: str, batch_id: bytes) -> bytes | None:
        row = self._one(
            "SELECT verdicts FROM verdicts WHERE task_id=? AND batch_id=?", (task_id, batch_id)
        )
        return None if row is None else bytes(row[0])

    def counted(self, task_id: str, report_ids: list[bytes]) -> int:
        return self._count_reports(task_id, report_ids)

    def verdict_binding(self, task_id: str, batch_id: bytes) -> bytes | None:
        row = self._one(
            "SELECT binding FROM verdicts WHERE task_id=? AND batch_id=?", (task_id, batch_id)
        )
        return None if row is None or row[0] is None else bytes(row[0])

    def close_collection(self, task_id: str) -> TaskState:
        with self._tx():
            self.task(task_id)
            self._run("UPDATE tasks SET collection_open=0 WHERE task_id=?", (task_id,))
            self._run("DELETE FROM pending WHERE task_id=?", (task_id,))
            self._run("DELETE FROM verdicts WHERE task_id=?", (task_id,))
        return self.task(task_id)

    def shares(self, task_id: str, report_ids: list[bytes]) -> list[bytes]:
        stored = self._stored_shares(task_id, report_ids)
        out = []
        for rid in report_ids:
            if rid not in stored:
                raise NotFound(f"task {task_id!r} has no report {rid.hex()}")
            share = stored[rid]
            if share is None:
                raise FailedPrecondition(
                    f"task {task_id!r}: per-report shares were dropped at the agreement"
                )
            out.append(share)
        return out

    def report_ids(self, task_id: str, after: bytes = b"", limit: int | None = None) -> list[bytes]:
        statement = (
            "SELECT report_id FROM reports WHERE task_id=? AND report_id > ? ORDER BY report_id"
        )
        args: tuple[object, ...] = (task_id, after)
        if limit is not None:
            statement += " LIMIT ?"
            args = (*args, int(limit))
        return [bytes(r[0]) for r in self._run(statement, args)]

    def remove_reports(
        self, task_id: str, report_ids: list[bytes], share_sum: Callable[[list[bytes]], U64]
    ) -> TaskState:
        with self._tx():
            task = self.task(task_id)
            check_removable(task)
            if not report_ids:
                return task
            stored = self._stored_shares(task_id, report_ids)
            present = [rid for rid in report_ids if rid in stored]
            if present:
                shares = [stored[rid] or b"" for rid in present]
                sums_blob, in_field = self._one(
                    "SELECT sums, validity FROM tasks WHERE task_id=?", (task_id,)
                )
                sums = fold(bytes(sums_blob), share_sum(shares), bool(in_field), subtract=True)
                for cond, args in self._in(present):
                    self._run(
                        f"DELETE FROM reports WHERE task_id=? AND report_id {cond}",
                        (task_id, *args),
                    )
                self._run(
                    "UPDATE tasks SET n=n-?, sums=?, digest=? WHERE task_id=?",
                    (len(present), sums, xor_reports(task.digest, present), task_id),
                )
        return self.task(task_id)

    def mark_agreed(self, task_id: str, robust_sums: U64 | None) -> TaskState:
        blob = None if robust_sums is None else np.asarray(robust_sums, np.uint64).tobytes()
        # A crawl task's reports are what its walks read (servers/crawl.py): kept.
        keep = self.task(task_id).params.crawl
        with self._tx():
            self._run("UPDATE tasks SET agreed=1, robust_sums=? WHERE task_id=?", (blob, task_id))
            if not keep:
                self._drop_shares(task_id)
        if not keep:
            self._after_agreed(task_id)
        return self.task(task_id)

    # ------------------------------------------------------------ ledger
    def _write_spent(self, task_id: str, after: Budget) -> None:
        """Write the task's new spent totals, and journal the change where the
        store keeps a journal (inside the caller's transaction)."""
        before = self._one(
            "SELECT epsilon_spent, delta_spent FROM tasks WHERE task_id=?", (task_id,)
        )
        if before is None:
            raise unknown_task(task_id)
        self._run(
            "UPDATE tasks SET epsilon_spent=?, delta_spent=? WHERE task_id=?",
            (str(after.epsilon_spent), str(after.delta_spent), task_id),
        )
        change = (
            after.epsilon_spent - Fraction(before[0]),
            after.delta_spent - Fraction(before[1]),
        )
        self._journal(task_id, change, after)

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
        *,
        replay: bool = False,
    ) -> None:
        with self._tx():
            if self._one("SELECT 1 FROM streams WHERE stream_id=?", (stream_id,)):
                if replay:
                    return
                raise AlreadyExists(f"stream {stream_id!r} already exists")
            budget = self.task(task_id).budget
            extra: tuple[Fraction, Fraction] | None = (epsilon, delta_charge)
            if plan is not None:
                held = self.plan(plan[0])
                extra = admit_to_plan(plan, held, task_id, (epsilon, delta_charge), replay)
                self._run("UPDATE plans SET book=? WHERE plan_id=?", (book_text(held[0]), plan[0]))
            if extra is not None:
                self._write_spent(task_id, charged(budget, *extra))
            self._run(
                f"INSERT INTO streams ({NEW_STREAM_COLUMNS}) VALUES ({_marks(8)})",
                new_stream_row(stream_id, task_id, kind, epsilon, delta, plan, replay),
            )

    def _update_stream(self, statement: str, params: Sequence[Any], refusal: str) -> None:
        """One guarded UPDATE of a stream row; FailedPrecondition(refusal) if no
        row was in the state it names."""
        if self._run(statement, params).rowcount != 1:
            raise FailedPrecondition(refusal)

    def set_threshold_noise(self, stream_id: str, gamma: int, open_now: bool = True) -> None:
        with self._tx():
            self._update_stream(
                "UPDATE streams SET gamma=?, state=? WHERE stream_id=? AND state=?",
                (str(gamma), OPEN if open_now else OPENING, stream_id, OPENING),
                f"stream {stream_id!r} is not being opened",
            )

    def set_joint_threshold_noise(self, stream_id: str, gamma: int) -> None:
        with self._tx():
            self._update_stream(
                "UPDATE streams SET gamma=? WHERE stream_id=? AND state=? AND chunks=1",
                (str(gamma), stream_id, IN_CHUNK),
                f"stream {stream_id!r} is not in its first chunk",
            )

    def set_noisy_max_carry(self, stream_id: str, carry: bytes) -> None:
        with self._tx():
            self._update_stream(
                "UPDATE streams SET carry=?, carry_chunk=chunks WHERE stream_id=? AND state=?",
                (carry, stream_id, IN_CHUNK),
                f"stream {stream_id!r} is not in a chunk",
            )

    def noisy_max_carry(self, stream_id: str) -> tuple[int, bytes] | None:
        row = self._one("SELECT carry_chunk, carry FROM streams WHERE stream_id=?", (stream_id,))
        if row is None:
            raise NotFound(f"unknown stream {stream_id!r}")
        return None if row[1] is None else (int(row[0]), bytes(row[1]))

    def add_crawl_level(self, record: CrawlRecord) -> None:
        r = record
        with self._tx():
            self._run("DELETE FROM crawl_levels WHERE walk_id=? AND level=?", (r.walk_id, r.level))
            self._run(
                "INSERT INTO crawl_levels (walk_id, level, task_id, depth, steps, parents,"
                " refused) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (r.walk_id, r.level, r.task_id, r.depth, r.steps, r.parents, r.refused),
            )

    def crawl_levels(self, walk_id: str) -> list[CrawlRecord]:
        rows = self._run(
            "SELECT walk_id, level, task_id, depth, steps, parents, refused FROM crawl_levels"
            " WHERE walk_id=? ORDER BY level",
            (walk_id,),
        ).fetchall()
        return [
            CrawlRecord(str(w), int(lv), str(t), int(d), int(s), bytes(p), bytes(rf))
            for w, lv, t, d, s, p, rf in rows
        ]

    def confirm_stream(self, stream_id: str) -> None:
        """Committed without waiting for the disk (losing it fails the stream
        on restart, which is safe)."""
        with self._tx(durable=False):
            self._update_stream(
                "UPDATE streams SET state=? WHERE stream_id=? AND state=? AND gamma IS NOT NULL",
                (OPEN, stream_id, OPENING),
                f"stream {stream_id!r} is not being opened",
            )

    def stream_ids(self, task_id: str, state: str) -> list[str]:
        self.write_records()
        rows = self._run(
            "SELECT stream_id FROM streams WHERE task_id=? AND state=?"
            f" ORDER BY {self.STREAM_ORDER}",
            (task_id, state),
        ).fetchall()
        return [r[0] for r in rows]

    def stream(self, stream_id: str) -> StreamState:
        row = self._one(f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id=?", (stream_id,))
        state = stream_state(stream_id, row)
        answered = self._ended.get(stream_id)
        if answered is not None and state.state == IN_CHUNK:  # its record waits (D2)
            state = replace(state, state=OPEN, queries=state.queries + answered)
        return state

    def begin_chunk(self, stream_id: str, chunk_no: int | None = None) -> int:
        others = len(self._ended) - (stream_id in self._ended)
        if chunk_no is not None and not others:
            # The servers' path: one guarded statement, durable.  It changes a
            # row only where `rules.next_chunk` would accept the chunk (with the
            # previous chunk's record folded in, if it waits: D2); when it
            # changes none, the transaction below says why.
            answered = self._ended.get(stream_id)
            marked = self._write_alone(
                "UPDATE streams SET state=?, chunks=chunks+1, queries=queries+?"
                " WHERE stream_id=? AND state=? AND chunks=?",
                (
                    IN_CHUNK,
                    answered or 0,
                    stream_id,
                    OPEN if answered is None else IN_CHUNK,
                    chunk_no - 1,
                ),
            )
            if marked.rowcount == 1:
                self._ended.pop(stream_id, None)
                return chunk_no
        with self._tx():  # writes any waiting record first (`_write_records`)
            number = next_chunk(self.stream(stream_id), chunk_no)
            self._run(
                "UPDATE streams SET state=?, chunks=chunks+1 WHERE stream_id=?",
                (IN_CHUNK, stream_id),
            )
        return number

    def end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        """Not durable (D2 in servers/exchange/machine.py).  Where the dialect
        lets records wait (`RECORD_WAIT`), a chunk that does not close its
        stream leaves its record in memory: the stream's next mark writes it
        in the same statement, or the next transaction of any kind, or a timer
        after RECORD_WAIT seconds, or `close`.  Until then `stream` reads it
        from memory; a crash loses it, and the restart fails the stream closed."""
        if self.RECORD_WAIT is None or close:
            self._write_alone(
                "UPDATE streams SET state=?, queries=queries+? WHERE stream_id=? AND state=?",
                (CLOSED if close else OPEN, answered, stream_id, IN_CHUNK),
                durable=False,
            )
            return
        self._ended[stream_id] = answered
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to wake us: write it now
            self.write_records()
            return
        if self._record_timer is None or self._timer_loop is not loop:
            # (a handle of a loop that has ended would never fire)
            self._record_timer = loop.call_later(self.RECORD_WAIT, self._records_due)
            self._timer_loop = loop

    def _records_due(self) -> None:
        self._record_timer = None
        try:
            self.write_records()
        except Exception as exc:  # noqa: BLE001 - the records wait for the next write
            log.warning("writing stream records failed: %s", exc)

    def write_records(self) -> None:
        """Write the stream records that wait in memory (not durably)."""
        if self._ended:
            with self._tx(durable=False):
                pass  # the transaction writes them as it begins

    def _write_records(self) -> None:
        """(The dialect calls this first in each outermost transaction.)  The
        waiting records, written in the caller's transaction; given back to
        memory by `_records_rolled_back` if it rolls back."""
        self._writing, self._ended = self._ended, {}
        for stream_id, answered in self._writing.items():
            self._run(
                "UPDATE streams SET state=?, queries=queries+? WHERE stream_id=? AND state=?",
                (OPEN, answered, stream_id, IN_CHUNK),
            )

    def _records_rolled_back(self) -> None:
        self._ended.update(self._writing)
        self._writing = {}

    def fail_stream(self, stream_id: str) -> None:
        with self._tx():
            self._run(
                "UPDATE streams SET state=? WHERE stream_id=? AND state NOT IN (?, ?)",
                (FAILED, stream_id, CLOSED, FAILED),
            )

    # ------------------------------------------------------------ joint noise pool
    # (the rules are `jointpool`'s; every method commits before it returns)
    def _batches(self, stream_id: str, below: int) -> list[Batch]:
        """The held batches that start below `below`."""
        rows = self._run(
            "SELECT lo, shares FROM joint_batches WHERE stream_id=? AND lo<? ORDER BY lo",
            (stream_id, below),
        )
        return [(int(lo), jointpool.decode(blob)) for lo, blob in rows]

    def joint_pool(self, stream_id: str) -> JointPool:
        row = self._one(
            "SELECT next_seq, used_seq, gamma_ready FROM joint_pools WHERE stream_id=?",
            (stream_id,),
        )
        if row is None:
            return JointPool()
        sizes = self._run(
            "SELECT lo, length(shares) / 8 FROM joint_batches WHERE stream_id=? ORDER BY lo",
            (stream_id,),
        ).fetchall()
        runs = jointpool.runs_of([(int(lo), int(n)) for lo, n in sizes])
        return JointPool(int(row[0]), int(row[1]), bool(row[2]), runs)

    def _set_pool(self, stream_id: str, pool: JointPool) -> None:
        self._run(
            "INSERT INTO joint_pools (stream_id, next_seq, used_seq, gamma_ready)"
            " VALUES (?,?,?,?) ON CONFLICT (stream_id) DO UPDATE SET next_seq=excluded.next_seq,"
            " used_seq=excluded.used_seq, gamma_ready=excluded.gamma_ready",
            (stream_id, pool.next, pool.used, pool.gamma_ready),
        )

    def reserve_joint_batch(self, stream_id: str, count: int, lo: int | None = None) -> int:
        with self._tx():
            if self.stream(stream_id).state not in (OPEN, IN_CHUNK):
                raise FailedPrecondition(f"stream {stream_id!r} answers no more")
            pool = self.joint_pool(stream_id)
            first = jointpool.reserve(pool, count, lo)
            self._set_pool(stream_id, replace(pool, next=first + count))
        return first

    def add_joint_batch(self, stream_id: str, lo: int, nu: U64, gamma: int | None) -> bool:
        with self._tx():
            s = self.stream(stream_id)
            pool = self.joint_pool(stream_id)
            if s.state not in (OPEN, IN_CHUNK) or lo < pool.used or lo + len(nu) > pool.next:
                return False
            self._run(
                "INSERT INTO joint_batches (stream_id, lo, shares) VALUES (?,?,?)",
                (stream_id, lo, jointpool.encode(nu)),
            )
            if gamma is not None and s.state == OPEN and s.chunks == 0:
                self._run("UPDATE streams SET gamma=? WHERE stream_id=?", (str(gamma), stream_id))
                self._set_pool(stream_id, replace(pool, gamma_ready=True))
        return True

    def take_joint_noise(self, stream_id: str, lo: int, count: int) -> U64:
        with self._tx():
            if self.stream(stream_id).state != IN_CHUNK:
                raise FailedPrecondition(f"stream {stream_id!r} is not in a chunk")
            pool = self.joint_pool(stream_id)
            end = lo + count
            taken, keep = jointpool.take(self._batches(stream_id, end), pool.used, lo, count)
            self._run("DELETE FROM joint_batches WHERE stream_id=? AND lo<?", (stream_id, end))
            for first, shares in keep:
                self._run(
                    "INSERT INTO joint_batches (stream_id, lo, shares) VALUES (?,?,?)",
                    (stream_id, first, jointpool.encode(shares)),
                )
            self._set_pool(stream_id, replace(pool, used=end))
        return taken

    def begin_pooled_chunk(
        self, stream_id: str, chunk_no: int | None, lo: int, count: int
    ) -> tuple[int, U64]:
        with self._tx():
            number = self.begin_chunk(stream_id, chunk_no)
            return number, self.take_joint_noise(stream_id, lo, count)

    def discard_joint_pool(self, stream_id: str) -> None:
        with self._tx():
            self._run("DELETE FROM joint_batches WHERE stream_id=?", (stream_id,))

    # ------------------------------------------------------------ plans
    def plan(self, plan_id: str) -> tuple[PlanBook, str, str]:
        row = self._one(f"SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id=?", (plan_id,))
        return plan_state(plan_id, row)

    def reserve_plan(self, plan_id: str, task_id: str, book: PlanBook) -> None:
        with self._tx():
            budget = self.task(task_id).budget
            if self._one("SELECT 1 FROM plans WHERE plan_id=?", (plan_id,)):
                raise AlreadyExists(f"plan {plan_id!r} already exists")
            self._write_spent(task_id, charged(budget, book.charge.epsilon, book.charge.delta))
            self._run(
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
            self._run("UPDATE plans SET state=? WHERE plan_id=?", (PLAN_ENDED, plan_id))
        return back_e, back_d

    def fail_plan(self, plan_id: str) -> None:
        with self._tx():
            self.plan(plan_id)
            self._run(
                "UPDATE plans SET state=? WHERE plan_id=? AND state=?",
                (PLAN_FAILED, plan_id, PLAN_ACTIVE),
            )

    def plan_ids(self, task_id: str, state: str) -> list[str]:
        return [
            r[0]
            for r in self._run(
                "SELECT plan_id FROM plans WHERE task_id=? AND state=? ORDER BY plan_id",
                (task_id, state),
            )
        ]

    # ------------------------------------------------------------ robust staging
    # (in the `robust_staged` table; a dialect whose one process owns the
    # store may keep them in memory instead)
    def stage_robust(
        self, task_id: str, pass_id: bytes, digest: bytes, lo: int, shares: U64
    ) -> None:
        with self._tx(durable=False):
            self._run(
                "INSERT INTO robust_staged (task_id, pass_id, digest, lo, hi, shares)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id, pass_id, lo)"
                " DO UPDATE SET digest=excluded.digest, hi=excluded.hi, shares=excluded.shares",
                (
                    task_id,
                    pass_id,
                    digest,
                    lo,
                    lo + len(shares),
                    np.asarray(shares, np.uint64).tobytes(),
                ),
            )

    def staged_robust(self, task_id: str, pass_id: bytes, digest: bytes, d: int) -> U64 | None:
        rows = self._run(
            "SELECT lo, hi, shares FROM robust_staged WHERE task_id=? AND pass_id=? AND digest=?",
            (task_id, pass_id, digest),
        ).fetchall()
        return assemble(d, [(int(lo), np.frombuffer(b, np.uint64)) for lo, _, b in rows])

    def clear_staged(self, task_id: str) -> None:
        with self._tx(durable=False):
            self._run("DELETE FROM robust_staged WHERE task_id=?", (task_id,))
