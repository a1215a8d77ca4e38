"""One server's durable state in SQLite: the default store's dialect of
`sql.SqlStore` (which writes every operation once; `rules.Store` names them
and their promises).

WAL, synchronous=FULL and one `BEGIN IMMEDIATE` transaction per step: every
step commits with an fsync, except `confirm_stream` and `end_chunk`, written
with synchronous=NORMAL (losing them fails the stream on restart, which is
safe).  Per-report shares live in a side file per task (`<db>.shares/`), not
in the database, and are deleted at the agreement.  The schema is versioned
by SQLite's user_version up to 9 (the frozen ladder), then by the shared
history in `svtagg_schema` (`servers/store/migrations.py`).  A stream chunk's
record (not durable) waits in memory for the stream's next mark, at most 50 ms
(`SqlStore.end_chunk`; one process owns a SQLite store): a killed process, not
only a crashed machine, can lose it, and the restart then fails the stream.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.dp.errors import AlreadyExists
from svtagg.dp.queries import Budget
from svtagg.mpc.ring import U64
from svtagg.servers.store.migrations import LEGACY
from svtagg.servers.store.rules import assemble, within_capacity
from svtagg.servers.store.sql import SqlStore
from svtagg.servers.store.sqlite_schema import BASE_TABLES

#: Ids per `IN (...)` list: below SQLite's bound on a statement's parameters
#: (32,766 since SQLite 3.32), so an upload batch (MAX_BATCH_REPORTS) is one list.
IN_LIST = 30_000


class SqliteStore(SqlStore):
    """SQLite store of one server (`rules.Store`).  Not thread-safe: one server,
    one event loop; one process per store file."""

    #: The end of SQLite's frozen ladder (its user_version); the shared
    #: history goes on from there (`servers/store/migrations.py`).
    LEGACY_VERSION = LEGACY["sqlite"]
    #: One process per store file: a chunk's record waits for the next mark.
    RECORD_WAIT = 0.05

    def __init__(self, path: str | Path) -> None:
        self._start_records()
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
        try:
            self._stop_records()
        finally:
            self._db.close()

    def _migrate(self) -> None:
        """Bring an older store up to SCHEMA_VERSION, one versioned step at a time:
        SQLite's frozen ladder (user_version 1–9), then the shared history."""
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
        with self._tx():
            self._migrate_shared(self.LEGACY_VERSION)

    def _has_version_table(self) -> bool:
        return bool(
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='svtagg_schema'"
            ).fetchone()
        )

    # ------------------------------------------------------------ the dialect seam
    def _run(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self._db.execute(statement, params)

    def _run_many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        self._db.executemany(statement, rows)

    def _tx(self, durable: bool = True) -> _Transaction:
        return _Transaction(self, durable)

    def _write_alone(self, statement: str, params: Sequence[Any], durable: bool = True) -> Any:
        if self._db.in_transaction:
            return self._db.execute(statement, params)
        # SQLite commits a statement outside BEGIN by itself, as one transaction
        # (the write lock taken and released around it; fsynced when durable)
        if durable:
            return self._db.execute(statement, params)
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            return self._db.execute(statement, params)
        finally:
            self._db.execute("PRAGMA synchronous=FULL")

    def _in(self, ids: Sequence[bytes]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        for start in range(0, len(ids), IN_LIST):
            part = tuple(ids[start : start + IN_LIST])
            yield f"IN ({','.join('?' * len(part))})", part

    def _share_file(self, task_id: str) -> Path:
        return self._shares_dir / f"{task_id}.bin"

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

    def _insert_reports(
        self, task_id: str, report_ids: list[bytes], shares: list[bytes], room: tuple[int, int]
    ) -> None:
        seen = self._count_reports(task_id, report_ids)  # before any share is written
        if seen:
            raise AlreadyExists(
                f"{seen} report id(s) of this batch were already uploaded (replay); batch refused"
            )
        within_capacity(task_id, *room, len(report_ids))
        offset = self._append_shares(task_id, shares)
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

    def _stored_shares(self, task_id: str, report_ids: list[bytes]) -> dict[bytes, bytes | None]:
        at: dict[bytes, tuple[int, int]] = {}
        for cond, args in self._in(report_ids):
            for rid, off, length in self._db.execute(
                f"SELECT report_id, share_off, share_len FROM reports"
                f" WHERE task_id=? AND report_id {cond}",
                (task_id, *args),
            ):
                at[bytes(rid)] = (int(off or 0), int(length or 0))
        path = self._share_file(task_id)
        if not path.exists():  # no share was ever written, or they were dropped
            return {rid: b"" if length == 0 else None for rid, (_, length) in at.items()}
        out: dict[bytes, bytes | None] = {}
        with open(path, "rb") as f:
            for rid, (off, length) in at.items():
                f.seek(off)
                out[rid] = f.read(length)
        return out

    def _drop_shares(self, task_id: str) -> None:
        """The share file goes once the agreement has committed (`_after_agreed`)."""

    def _journal(self, task_id: str, change: tuple[Fraction, Fraction], after: Budget) -> None:
        """No journal table in SQLite's schema: the totals are the ledger."""

    def _after_agreed(self, task_id: str) -> None:
        self._share_file(task_id).unlink(missing_ok=True)

    # ------------------------------------------------------------ robust staging, in memory
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
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception; re-entrant (an
    inner one joins the outer, and its durability).  Not durable: committed
    under synchronous=NORMAL (in WAL mode: no fsync at the commit).  The
    outermost one writes the stream records that wait (`SqlStore.end_chunk`)
    first, and gives them back if it rolls back."""

    def __init__(self, store: SqliteStore, durable: bool = True) -> None:
        self._store = store
        self._db = store._db
        self._outer = False
        self._durable = durable

    def __enter__(self) -> None:
        if self._db.in_transaction:
            return
        if not self._durable:
            self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._restore()
            raise
        self._outer = True
        try:
            self._store._write_records()
        except BaseException:
            self.__exit__(Exception, None, None)
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        self._outer = False
        committed = False
        try:
            self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
            committed = exc_type is None
        finally:
            if committed:
                self._store._writing = {}
            else:
                self._store._records_rolled_back()
            self._restore()

    def _restore(self) -> None:
        if not self._durable:
            self._db.execute("PRAGMA synchronous=FULL")
