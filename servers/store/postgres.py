"""One server's durable state in PostgreSQL (`store.Store` names its
operations and promises; `store_sqlite.SqliteStore` is the default store),
for deployments that keep each server's state in a database server.

Selected by a `--db postgresql://...` URL (`store_open.open_store`).

Durability and isolation:
- every committed transaction is durable: the session runs with
  `synchronous_commit = on` (the server's fsync setting is the operator's);
  the uploads' batches, the ledger charge with the `opening` mark and γ, and
  the `in_chunk` mark all commit before the caller goes on, as in SQLite.
  `confirm_stream` and `end_chunk` commit with
  `synchronous_commit = off`, as SQLite writes them with synchronous=NORMAL:
  losing them leaves the stream `opening` / `in_chunk`, failed on restart;
- each write transaction runs at READ COMMITTED and first takes a transaction
  advisory lock keyed by the store's schema, so writers of one store are
  serialised exactly as SQLite's `BEGIN IMMEDIATE` serialises them (each
  statement after the lock sees every earlier commit): read-modify-write of the
  running sums and of the ledger cannot lose an update, even with several
  connections to one store;
- constraints make double counting impossible: (task, report id) is the
  primary key of `reports`; `spends` is an append-only journal of every ledger
  change (a trigger refuses UPDATE, DELETE and TRUNCATE), written in the
  transaction that changes the task's running totals; a closed or failed stream
  can never be reopened (trigger); n stays within [0, n_max] (CHECK).

Per-report shares live in the `share` column (bytea) of `reports`, not in side
files: a database server may be on another machine, the share must commit
atomically with its report id, and a column needs no second fsync.  At the
agreement they are set to NULL (the SQLite store deletes its share file).

The schema is versioned in `svtagg_schema` (`store_pg_schema.MIGRATIONS`), and
a store written by a newer version is refused.

One server process per store, as with SQLite: at start the store fails closed
every stream that was `opening` or `in_chunk`, which would be wrong for a
second live process sharing it (ingest replicas and workers open it with
`recover=False`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.pq import TransactionStatus
from psycopg.types.string import StrDumperUnknown

from svtagg.dp.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import Budget
from svtagg.dp.task import TaskParams
from svtagg.mpc.ring import U64
from svtagg.servers.faults import crash_point
from svtagg.servers.store.jointpool_tables import JointPoolTables
from svtagg.servers.store.postgres_pending import PgPending
from svtagg.servers.store.postgres_schema import MIGRATIONS
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


def redact(url: str) -> str:
    """The URL without its password (for logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=netloc[0].split(":", 1)[0] + ":***@" + netloc[1]))


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
_COPY_TRAILER = struct.pack("!h", -1)


def _copy_rows(task_id: str, report_ids: list[bytes], shares: list[bytes]) -> bytes:
    """(task id, report id, share) rows in COPY's binary format (header, tuples
    of three length-prefixed fields, trailer), built in one pass."""
    if "\x00" in task_id:
        raise InvalidArgument("ids and values cannot contain NUL characters")
    tid = task_id.encode()
    head = struct.pack("!hi", 3, len(tid)) + tid
    pack = struct.Struct("!i").pack
    parts = [_COPY_HEADER]
    for rid, share in zip(report_ids, shares, strict=True):
        parts += (head, pack(len(rid)), rid, pack(len(share)), share)
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


class _TextDumper(StrDumperUnknown):
    """Python strings as PostgreSQL text; a NUL character (which text cannot hold,
    and no stored id has) is the caller's invalid argument, not a database error."""

    def dump(self, obj: str) -> Buffer | None:
        if "\x00" in obj:
            raise InvalidArgument("ids and values cannot contain NUL characters")
        return super().dump(obj)


class _Transaction:
    """BEGIN, the store's lock, ... COMMIT (ROLLBACK on any exception); re-entrant.
    `durable=False` commits without waiting for the WAL flush."""

    def __init__(self, conn: psycopg.Connection[Any], durable: bool = True) -> None:
        self._conn = conn
        self._outer = False
        self._durable = durable

    def __enter__(self) -> None:
        if self._conn.info.transaction_status != TransactionStatus.IDLE:
            return
        self._conn.execute("BEGIN")
        self._outer = True
        try:
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()))")
            if not self._durable:
                self._conn.execute("SET LOCAL synchronous_commit = off")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def connect(url: str, application_name: str = "svtagg") -> psycopg.Connection[Any]:
    """An autocommit session; ConnectionError (one line, no password) if none."""
    try:
        return psycopg.connect(url, autocommit=True, application_name=application_name)
    except psycopg.OperationalError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConnectionError(f"store: no PostgreSQL at {redact(url)}: {first}") from None


def missing_path_schema(conn: psycopg.Connection[Any]) -> str | None:
    """The schema a store on this session is to create: the search_path's first
    entry when no schema of the path exists yet (None: current_schema() exists)."""
    if conn.execute("SELECT current_schema()").fetchone() != (None,):
        return None
    path = conn.execute("SELECT current_setting('search_path')").fetchone()
    first = str(path[0] if path else "").split(",")[0].strip().strip('"')
    return first if first and first != "$user" else None


class PgStore(PgPending, JointPoolTables):
    """PostgreSQL store of one server (`store.Store`).

    `schema` (optional) keeps the store in that schema of the database (created
    if missing); otherwise the connection's search_path decides (`public`
    unless the URL says otherwise, e.g. `?options=-csearch_path%3Dleader`)."""

    #: Schema version this code writes (the `svtagg_schema` table; not SQLite's numbering).
    SCHEMA_VERSION = len(MIGRATIONS)

    def __init__(self, url: str, schema: str | None = None, recover: bool = True) -> None:
        """`recover=False`: an ingest replica or a worker, which must not fail
        the streams the server's main process has in flight."""
        self.path = redact(url)
        conn = connect(url)
        conn.adapters.register_dumper(str, _TextDumper)
        self._conn = conn
        self._url = url  # for the work queue's own sessions (never logged)
        try:
            conn.execute("SET synchronous_commit = on")
            if schema is None:
                schema = missing_path_schema(conn)
            if schema is not None:
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            self._migrate()
            row = conn.execute("SELECT current_schema()").fetchone()
            #: The database schema the store lives in (one store per schema).
            self.schema: str = str(row[0]) if row else "public"
            self.recovered_failed: list[tuple[str, str]] = []
            self.recovered_plans: list[tuple[str, str]] = []
            self.failed_on_recovery = self._recover() if recover else 0
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        self._conn.close()

    async def open_session(self, application_name: str) -> psycopg.AsyncConnection[Any]:
        """A new autocommit asynchronous session on this store's database, in its
        schema (the work queue's own connections); the caller closes it."""
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, application_name=application_name
        )
        try:
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        except BaseException:
            await conn.close()
            raise
        return conn

    def _tx(self, durable: bool = True) -> _Transaction:
        return _Transaction(self._conn, durable)

    atomic = _tx  # Store.atomic: the steps inside share one (durable) transaction

    def _migrate(self) -> None:
        with self._tx():
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS svtagg_schema ("
                " one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)"
            )
            row = self._conn.execute("SELECT version FROM svtagg_schema").fetchone()
            version = 0 if row is None else int(row[0])
            if version > self.SCHEMA_VERSION:
                raise RuntimeError(
                    f"the store {self.path} has schema version {version}; this svtagg "
                    f"knows versions up to {self.SCHEMA_VERSION} (upgrade svtagg)"
                )
            for step in MIGRATIONS[version:]:
                for statement in step:
                    self._conn.execute(statement.encode())
            self._conn.execute(
                "INSERT INTO svtagg_schema (version) VALUES (%s)"
                " ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version",
                (self.SCHEMA_VERSION,),
            )

    def schema_version(self) -> int:
        row = self._conn.execute("SELECT version FROM svtagg_schema").fetchone()
        return 0 if row is None else int(row[0])

    def _recover(self) -> int:
        """Fail closed every stream that was opening or mid-chunk at the last stop,
        and list the plans then active (`recovered_plans`)."""
        with self._tx():
            self.recovered_plans = [
                (r[0], r[1])
                for r in self._conn.execute(
                    "SELECT plan_id, task_id FROM plans WHERE state=%s ORDER BY plan_id",
                    (PLAN_ACTIVE,),
                )
            ]
            self.recovered_failed = [
                (r[0], r[1])
                for r in self._conn.execute(
                    "SELECT stream_id, task_id FROM streams WHERE state IN (%s, %s)",
                    (OPENING, IN_CHUNK),
                )
            ]
            cur = self._conn.execute(
                "UPDATE streams SET state=%s WHERE state IN (%s, %s)", (FAILED, OPENING, IN_CHUNK)
            )
            for sid, _ in self.recovered_failed:  # it keeps no joint noise shares
                self._conn.execute("DELETE FROM joint_batches WHERE stream_id=%s", (sid,))
        return cur.rowcount

    # ------------------------------------------------------------ tasks
    def create_task(self, p: TaskParams, verify_key: bytes = b"") -> TaskState:
        with self._tx():
            if self._conn.execute("SELECT 1 FROM tasks WHERE task_id=%s", (p.task_id,)).fetchone():
                raise AlreadyExists(f"task {p.task_id!r} already exists")
            self._conn.execute(
                f"INSERT INTO tasks ({NEW_TASK_COLUMNS})"
                " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                new_task_row(p, verify_key),
            )
        return self.task(p.task_id)

    def task(self, task_id: str) -> TaskState:
        row = self._conn.execute(
            f"SELECT {TASK_COLUMNS} FROM tasks t WHERE task_id=%s", (task_id,)
        ).fetchone()
        return task_state(task_id, row)

    def task_ids(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT task_id FROM tasks ORDER BY task_id")]

    def sums(self, task_id: str) -> U64:
        row = self._conn.execute("SELECT sums FROM tasks WHERE task_id=%s", (task_id,)).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
        return np.frombuffer(row[0], dtype=np.uint64).copy()

    def robust_sums(self, task_id: str) -> U64 | None:
        row = self._conn.execute(
            "SELECT robust_sums FROM tasks WHERE task_id=%s", (task_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown task {task_id!r}")
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
            row = self._conn.execute(
                f"SELECT {BATCH_COLUMNS} FROM tasks WHERE task_id=%s FOR UPDATE", (task_id,)
            ).fetchone()
            n, n_max, sums_blob, digest = admit_batch(task_id, row, share_sum)
            if len(shares) != len(report_ids):
                raise InvalidArgument(f"{len(report_ids)} report ids, {len(shares)} shares")
            # a replayed id violates the primary key: the COPY fails and the
            # whole batch rolls back (no lookup before: it would double the cost)
            try:
                with (
                    self._conn.cursor() as cur,
                    cur.copy(
                        "COPY reports (task_id, report_id, share) FROM STDIN (FORMAT BINARY)"
                    ) as copy,
                ):
                    copy.write(_copy_rows(task_id, report_ids, shares))
            except psycopg.errors.UniqueViolation:
                raise AlreadyExists(
                    "a report id of this batch was already uploaded (replay); batch refused"
                ) from None
            within_capacity(task_id, n, n_max, len(report_ids))
            crash_point("upload.mid_store")
            assert row is not None  # admit_batch refused a missing task
            rejected = row[7]
            if verified is not None:
                self._record_verified(task_id, verified)
                rejected = counted(rejected, verified.rejected)
            self._conn.execute(
                "UPDATE tasks SET n=%s, sums=%s, digest=%s, rejected=%s WHERE task_id=%s",
                (
                    n + len(report_ids),
                    fold(bytes(sums_blob), share_sum, bool(row[6])),
                    xor_reports(bytes(digest), report_ids),
                    rejected,
                    task_id,
                ),
            )
        return int(n + len(report_ids))

    def close_collection(self, task_id: str) -> TaskState:
        with self._tx():
            self.task(task_id)
            self._conn.execute("UPDATE tasks SET collection_open=0 WHERE task_id=%s", (task_id,))
            self._conn.execute("DELETE FROM pending WHERE task_id=%s", (task_id,))
            self._conn.execute("DELETE FROM verdicts WHERE task_id=%s", (task_id,))
        return self.task(task_id)

    def _stored_shares(self, task_id: str, report_ids: list[bytes]) -> dict[bytes, bytes | None]:
        rows = self._conn.execute(
            "SELECT report_id, share FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
            (task_id, report_ids),
        ).fetchall()
        return {bytes(r[0]): None if r[1] is None else bytes(r[1]) for r in rows}

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
        if limit is None:
            rows = self._conn.execute(
                "SELECT report_id FROM reports WHERE task_id=%s AND report_id > %s"
                " ORDER BY report_id",
                (task_id, after),
            )
        else:
            rows = self._conn.execute(
                "SELECT report_id FROM reports WHERE task_id=%s AND report_id > %s"
                " ORDER BY report_id LIMIT %s",
                (task_id, after, int(limit)),
            )
        return [bytes(r[0]) for r in rows]

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
                held = self._conn.execute(
                    "SELECT sums, validity FROM tasks WHERE task_id=%s", (task_id,)
                ).fetchone()
                assert held is not None  # self.task() found it
                sums_blob, in_field = held
                sums = fold(bytes(sums_blob), share_sum(shares), bool(in_field), subtract=True)
                self._conn.execute(
                    "DELETE FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
                    (task_id, present),
                )
                self._conn.execute(
                    "UPDATE tasks SET n=n-%s, sums=%s, digest=%s WHERE task_id=%s",
                    (len(present), sums, xor_reports(task.digest, present), task_id),
                )
        return self.task(task_id)

    def mark_agreed(self, task_id: str, robust_sums: U64 | None) -> TaskState:
        blob = None if robust_sums is None else np.asarray(robust_sums, np.uint64).tobytes()
        with self._tx():
            self._conn.execute(
                "UPDATE tasks SET agreed=1, robust_sums=%s WHERE task_id=%s", (blob, task_id)
            )
            self._conn.execute(
                "UPDATE reports SET share=NULL WHERE task_id=%s AND share IS NOT NULL",
                (task_id,),
            )
        return self.task(task_id)

    # ------------------------------------------------------------ ledger
    def _write_spent(self, task_id: str, after: Budget) -> None:
        """Write the task's new spent totals and append the change to the
        `spends` journal (inside the caller's transaction)."""
        before = self._conn.execute(
            "SELECT epsilon_spent, delta_spent FROM tasks WHERE task_id=%s", (task_id,)
        ).fetchone()
        if before is None:
            raise NotFound(f"unknown task {task_id!r}")
        self._conn.execute(
            "UPDATE tasks SET epsilon_spent=%s, delta_spent=%s WHERE task_id=%s",
            (str(after.epsilon_spent), str(after.delta_spent), task_id),
        )
        self._conn.execute(
            "INSERT INTO spends (task_id, epsilon, delta, epsilon_spent, delta_spent)"
            " VALUES (%s, %s, %s, %s, %s)",
            (
                task_id,
                str(after.epsilon_spent - Fraction(before[0])),
                str(after.delta_spent - Fraction(before[1])),
                str(after.epsilon_spent),
                str(after.delta_spent),
            ),
        )

    def spends(self, task_id: str) -> list[tuple[Fraction, Fraction]]:
        """The journal of a task's ledger changes (ε, δ), oldest first."""
        rows = self._conn.execute(
            "SELECT epsilon, delta FROM spends WHERE task_id=%s ORDER BY seq", (task_id,)
        ).fetchall()
        return [(Fraction(r[0]), Fraction(r[1])) for r in rows]

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
            if self._conn.execute(
                "SELECT 1 FROM streams WHERE stream_id=%s", (stream_id,)
            ).fetchone():
                if replay:
                    return
                raise AlreadyExists(f"stream {stream_id!r} already exists")
            budget = self.task(task_id).budget
            extra: tuple[Fraction, Fraction] | None = (epsilon, delta_charge)
            if plan is not None:
                held = self.plan(plan[0])
                extra = admit_to_plan(plan, held, task_id, (epsilon, delta_charge), replay)
                self._conn.execute(
                    "UPDATE plans SET book=%s WHERE plan_id=%s", (book_text(held[0]), plan[0])
                )
            if extra is not None:
                self._write_spent(task_id, charged(budget, *extra))
            self._conn.execute(
                f"INSERT INTO streams ({NEW_STREAM_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                new_stream_row(stream_id, task_id, kind, epsilon, delta, plan, replay),
            )

    def set_threshold_noise(self, stream_id: str, gamma: int, open_now: bool = True) -> None:
        with self._tx():
            cur = self._conn.execute(
                "UPDATE streams SET gamma=%s, state=%s WHERE stream_id=%s AND state=%s",
                (str(gamma), OPEN if open_now else OPENING, stream_id, OPENING),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not being opened")

    def set_joint_threshold_noise(self, stream_id: str, gamma: int) -> None:
        with self._tx():
            cur = self._conn.execute(
                "UPDATE streams SET gamma=%s WHERE stream_id=%s AND state=%s AND chunks=1",
                (str(gamma), stream_id, IN_CHUNK),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not in its first chunk")

    def set_noisy_max_carry(self, stream_id: str, carry: bytes) -> None:
        with self._tx():
            cur = self._conn.execute(
                "UPDATE streams SET carry=%s, carry_chunk=chunks WHERE stream_id=%s AND state=%s",
                (carry, stream_id, IN_CHUNK),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not in a chunk")

    def noisy_max_carry(self, stream_id: str) -> tuple[int, bytes] | None:
        row = self._conn.execute(
            "SELECT carry_chunk, carry FROM streams WHERE stream_id=%s", (stream_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown stream {stream_id!r}")
        return None if row[1] is None else (int(row[0]), bytes(row[1]))

    def confirm_stream(self, stream_id: str) -> None:
        """Committed with synchronous_commit off."""
        with self._tx(durable=False):
            cur = self._conn.execute(
                "UPDATE streams SET state=%s WHERE stream_id=%s AND state=%s AND gamma IS NOT NULL",
                (OPEN, stream_id, OPENING),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not being opened")

    def stream_ids(self, task_id: str, state: str) -> list[str]:
        rows = self._conn.execute(
            "SELECT stream_id FROM streams WHERE task_id=%s AND state=%s ORDER BY seq",
            (task_id, state),
        ).fetchall()
        return [r[0] for r in rows]

    def stream(self, stream_id: str) -> StreamState:
        row = self._conn.execute(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id=%s", (stream_id,)
        ).fetchone()
        return stream_state(stream_id, row)

    def begin_chunk(self, stream_id: str, chunk_no: int | None = None) -> int:
        with self._tx():
            number = next_chunk(self.stream(stream_id), chunk_no)
            self._conn.execute(
                "UPDATE streams SET state=%s, chunks=chunks+1 WHERE stream_id=%s",
                (IN_CHUNK, stream_id),
            )
        return number

    def end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        """Committed with synchronous_commit off."""
        with self._tx(durable=False):
            self._conn.execute(
                "UPDATE streams SET state=%s, queries=queries+%s WHERE stream_id=%s AND state=%s",
                (CLOSED if close else OPEN, answered, stream_id, IN_CHUNK),
            )

    def fail_stream(self, stream_id: str) -> None:
        with self._tx():
            self._conn.execute(
                "UPDATE streams SET state=%s WHERE stream_id=%s AND state NOT IN (%s, %s)",
                (FAILED, stream_id, CLOSED, FAILED),
            )

    # ------------------------------------------------------------ joint noise pool
    def _sql(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """A statement of the shared joint-pool code (`store_jointpool`), its
        `?` placeholders as psycopg's."""
        return self._conn.execute(statement.replace("?", "%s").encode(), params)

    # ------------------------------------------------------------ plans
    def plan(self, plan_id: str) -> tuple[PlanBook, str, str]:
        row = self._conn.execute(
            f"SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id=%s", (plan_id,)
        ).fetchone()
        return plan_state(plan_id, row)

    def reserve_plan(self, plan_id: str, task_id: str, book: PlanBook) -> None:
        with self._tx():
            budget = self.task(task_id).budget
            if self._conn.execute("SELECT 1 FROM plans WHERE plan_id=%s", (plan_id,)).fetchone():
                raise AlreadyExists(f"plan {plan_id!r} already exists")
            self._write_spent(task_id, charged(budget, book.charge.epsilon, book.charge.delta))
            self._conn.execute(
                "INSERT INTO plans (plan_id, task_id, book, state) VALUES (%s,%s,%s,%s)",
                (plan_id, task_id, book_text(book), PLAN_ACTIVE),
            )

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        with self._tx():
            book, state, task_id = self.plan(plan_id)
            if state != PLAN_ACTIVE:
                return Fraction(0), Fraction(0)
            back_e, back_d = book.refund()
            self._write_spent(task_id, refunded(self.task(task_id).budget, back_e, back_d))
            self._conn.execute("UPDATE plans SET state=%s WHERE plan_id=%s", (PLAN_ENDED, plan_id))
        return back_e, back_d

    def fail_plan(self, plan_id: str) -> None:
        with self._tx():
            self.plan(plan_id)
            self._conn.execute(
                "UPDATE plans SET state=%s WHERE plan_id=%s AND state=%s",
                (PLAN_FAILED, plan_id, PLAN_ACTIVE),
            )

    def plan_ids(self, task_id: str, state: str) -> list[str]:
        return [
            r[0]
            for r in self._conn.execute(
                "SELECT plan_id FROM plans WHERE task_id=%s AND state=%s ORDER BY plan_id",
                (task_id, state),
            )
        ]

    # ------------------------------------------------------------ robust staging
    def stage_robust(
        self, task_id: str, pass_id: bytes, digest: bytes, lo: int, shares: U64
    ) -> None:
        with self._tx(durable=False):
            self._conn.execute(
                "INSERT INTO robust_staged (task_id, pass_id, digest, lo, hi, shares)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (task_id, pass_id, lo)"
                " DO UPDATE SET digest=EXCLUDED.digest, hi=EXCLUDED.hi, shares=EXCLUDED.shares",
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
        rows = self._conn.execute(
            "SELECT lo, hi, shares FROM robust_staged"
            " WHERE task_id=%s AND pass_id=%s AND digest=%s",
            (task_id, pass_id, digest),
        ).fetchall()
        return assemble(d, [(int(lo), np.frombuffer(b, np.uint64)) for lo, _, b in rows])

    def clear_staged(self, task_id: str) -> None:
        with self._tx(durable=False):
            self._conn.execute("DELETE FROM robust_staged WHERE task_id=%s", (task_id,))
