"""One server's durable state in PostgreSQL: the store of `store.Store` (SQLite)
for deployments that keep each server's state in a database server.

Selected by a `--db postgresql://...` URL (`store.open_store`).  Every public
method behaves as the SQLite store's; the SQL that both dialects share is the
SQLite store's own (through `_Connection`, which speaks `?` placeholders), and
this module overrides only what differs.

Durability and isolation:
- every committed transaction is durable: the session runs with
  `synchronous_commit = on` (the server's fsync setting is the operator's);
  the uploads' batches, the ledger charge with the `opening` mark, and the
  `in_chunk` mark all commit before the caller goes on (and before any noise is
  drawn), as in SQLite.  `confirm_stream` and `end_chunk` commit with
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

The schema is versioned in `svtagg_schema` (its own numbering, from 1);
`_MIGRATIONS[v]` brings version v to v + 1, in one transaction under the
store's lock, and a store written by a newer version is refused.

One server process per store, as with SQLite: at start the store fails closed
every stream that was `opening` or `in_chunk`, which would be wrong for a
second live process sharing it.
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
from svtagg.dp.ledger import Ledger
from svtagg.mpc.ring import U64
from svtagg.servers.faults import crash_point
from svtagg.servers.store import (
    CLOSED,
    FAILED,
    OPEN,
    OPENING,
    Store,
    TaskState,
    _assemble,
    _Transaction,
    _xor,
    report_digest,
)


def _final_states(table: str, noun: str, key: str, final: tuple[str, str]) -> tuple[str, str]:
    """A trigger function and trigger refusing to move a row of `table` out of
    one of its `final` states."""
    return (
        f"""CREATE FUNCTION svtagg_final_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.state IN ('{final[0]}', '{final[1]}') AND NEW.state <> OLD.state THEN
            RAISE EXCEPTION '{noun} % is %; its state is final', OLD.{key}, OLD.state;
        END IF;
        RETURN NEW;
    END $$""",
        f"""CREATE TRIGGER {table}_final BEFORE UPDATE ON {table}
        FOR EACH ROW EXECUTE FUNCTION svtagg_final_{table}()""",
    )


_V1 = (
    """CREATE TABLE tasks (
        task_id TEXT COLLATE "C" PRIMARY KEY,
        d INTEGER NOT NULL CHECK (d > 0), frac_bits INTEGER NOT NULL,
        n_max BIGINT NOT NULL, min_batch BIGINT NOT NULL,
        epsilon_total TEXT NOT NULL, delta_total TEXT NOT NULL, epsilon_min TEXT NOT NULL,
        n BIGINT NOT NULL DEFAULT 0 CHECK (n >= 0 AND n <= n_max),
        digest BYTEA NOT NULL,
        sums BYTEA NOT NULL,
        collection_open INTEGER NOT NULL DEFAULT 1,
        epsilon_spent TEXT NOT NULL DEFAULT '0',
        delta_spent TEXT NOT NULL DEFAULT '0',
        agreed INTEGER NOT NULL DEFAULT 0,
        validate_reports INTEGER NOT NULL DEFAULT 0,
        robust_sums BYTEA
    )""",
    """CREATE TABLE reports (
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        report_id BYTEA NOT NULL,
        share BYTEA,
        PRIMARY KEY (task_id, report_id)
    )""",
    """CREATE TABLE streams (
        seq BIGSERIAL NOT NULL UNIQUE,
        stream_id TEXT COLLATE "C" PRIMARY KEY,
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        kind TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
        gamma TEXT,
        state TEXT NOT NULL
            CHECK (state IN ('opening', 'open', 'in_chunk', 'closed', 'failed')),
        chunks BIGINT NOT NULL DEFAULT 0,
        queries BIGINT NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX streams_task_state ON streams (task_id, state)",
    """CREATE TABLE plans (
        plan_id TEXT COLLATE "C" PRIMARY KEY,
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        book TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('active', 'ended', 'failed'))
    )""",
    """CREATE TABLE spends (
        seq BIGSERIAL PRIMARY KEY,
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        epsilon TEXT NOT NULL, delta TEXT NOT NULL,
        epsilon_spent TEXT NOT NULL, delta_spent TEXT NOT NULL,
        at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    """CREATE FUNCTION svtagg_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME;
    END $$""",
    """CREATE TRIGGER spends_append_only BEFORE UPDATE OR DELETE ON spends
        FOR EACH ROW EXECUTE FUNCTION svtagg_append_only()""",
    """CREATE TRIGGER spends_no_truncate BEFORE TRUNCATE ON spends
        FOR EACH STATEMENT EXECUTE FUNCTION svtagg_append_only()""",
    *_final_states("streams", "stream", "stream_id", ("closed", "failed")),
)

#: Version 2: the embedding the task's clients use ("" = not recorded).
_V2: tuple[str, ...] = ("ALTER TABLE tasks ADD COLUMN embedding TEXT NOT NULL DEFAULT ''",)

#: Version 3: leased comparison work (`servers/work.py`) and the helper's
#: robust-aggregate shares staged between the close's passes and MarkAgreed
#: (in the database, so that any process of the server may run a pass).
_V3: tuple[str, ...] = (
    """CREATE TABLE work (
        job_id BIGSERIAL PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('ask', 'compare', 'robust', 'validate')),
        stream_id TEXT COLLATE "C",
        payload BYTEA NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'leased', 'done', 'failed')),
        owner TEXT,
        lease_until TIMESTAMPTZ,
        result BYTEA,
        error BYTEA,
        created TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    # At most one chunk of a stream queued or running, whichever front end took it.
    """CREATE UNIQUE INDEX work_one_per_stream ON work (stream_id)
        WHERE state IN ('pending', 'leased')""",
    "CREATE INDEX work_pending ON work (job_id) WHERE state = 'pending'",
    *_final_states("work", "job", "job_id", ("done", "failed")),
    "CREATE TABLE workers (owner TEXT PRIMARY KEY, role TEXT NOT NULL, seen TIMESTAMPTZ NOT NULL)",
    """CREATE TABLE robust_staged (
        task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id),
        digest BYTEA NOT NULL,
        lo INTEGER NOT NULL CHECK (lo >= 0),
        hi INTEGER NOT NULL CHECK (hi > lo),
        shares BYTEA NOT NULL,
        PRIMARY KEY (task_id, lo)
    )""",
)

#: Version 4: "every report belongs to a task" checked once per statement, not
#: once per row.  The foreign key reports.task_id -> tasks ran one SPI query per
#: inserted report (about a third of the database's CPU per upload batch); it
#: is replaced by triggers that enforce the same rule:
#: - after each INSERT statement on `reports`, the distinct task ids of the new
#:   rows are locked FOR KEY SHARE in `tasks` (as the foreign key locks them)
#:   and a missing one fails the statement with foreign_key_violation;
#: - an UPDATE of `reports.task_id` is checked row by row in the same way (no
#:   code path does it; `mark_agreed`'s UPDATE of `share` does not fire it);
#: - a DELETE of a task, or a change of its task_id, that still has reports
#:   fails with foreign_key_violation (NO ACTION, as the foreign key did).
#: Self-contained: it drops only the constraint V1 created and adds only
#: objects named svtagg_reports_* / reports_task_*.
_V4: tuple[str, ...] = (
    "ALTER TABLE reports DROP CONSTRAINT reports_task_id_fkey",
    """CREATE FUNCTION svtagg_reports_task_exists() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        wanted BIGINT;
        locked BIGINT;
    BEGIN
        SELECT count(DISTINCT task_id) INTO wanted FROM added;
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM tasks t WHERE t.task_id IN (SELECT task_id FROM added)
            FOR KEY SHARE OF t
        ) present;
        IF locked <> wanted THEN
            RAISE EXCEPTION 'reports of a task that does not exist'
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reports_task_inserted AFTER INSERT ON reports
        REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION svtagg_reports_task_exists()""",
    """CREATE FUNCTION svtagg_reports_task_moved() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM tasks t WHERE t.task_id = NEW.task_id FOR KEY SHARE OF t;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'report moved to task %, which does not exist', NEW.task_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reports_task_updated AFTER UPDATE OF task_id ON reports
        FOR EACH ROW WHEN (OLD.task_id IS DISTINCT FROM NEW.task_id)
        EXECUTE FUNCTION svtagg_reports_task_moved()""",
    """CREATE FUNCTION svtagg_reports_task_kept() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM reports r WHERE r.task_id = OLD.task_id) THEN
            RAISE EXCEPTION 'task % still has reports', OLD.task_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reports_task_deleted AFTER DELETE ON tasks
        FOR EACH ROW EXECUTE FUNCTION svtagg_reports_task_kept()""",
    """CREATE TRIGGER reports_task_renamed AFTER UPDATE OF task_id ON tasks
        FOR EACH ROW WHEN (OLD.task_id IS DISTINCT FROM NEW.task_id)
        EXECUTE FUNCTION svtagg_reports_task_kept()""",
)

#: Version 5: the plan group a stream was charged to (reconciliation replays it
#: there; NULL: the task's ledger), and the robust-aggregate pass each staged
#: share belongs to (a late chunk of an abandoned pass stages apart and is never
#: taken by a newer pass).  Shares staged before carry no pass: they are dropped,
#: and a close that was in progress runs its pass again.
_V5: tuple[str, ...] = (
    'ALTER TABLE streams ADD COLUMN plan_id TEXT COLLATE "C"',
    "ALTER TABLE streams ADD COLUMN plan_group INTEGER CHECK (plan_group >= 0)",
    "DELETE FROM robust_staged",
    "ALTER TABLE robust_staged ADD COLUMN pass_id BYTEA NOT NULL",
    "ALTER TABLE robust_staged DROP CONSTRAINT robust_staged_pkey",
    "ALTER TABLE robust_staged ADD PRIMARY KEY (task_id, pass_id, lo)",
)

#: `_MIGRATIONS[v]` brings a store at version v to v + 1.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2, _V3, _V4, _V5)


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
    """Python strings as PostgreSQL text; a NUL character (which text cannot
    hold, and no stored id has) is the caller's invalid argument, not a
    database error."""

    def dump(self, obj: str) -> Buffer | None:
        if "\x00" in obj:
            raise InvalidArgument("ids and values cannot contain NUL characters")
        return super().dump(obj)


class _Connection:
    """A psycopg connection that speaks the SQLite store's dialect: `?`
    placeholders, `execute` returning a cursor, `executemany`, `in_transaction`."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._queries: dict[str, str] = {}

    def _pg(self, query: str) -> str:
        out = self._queries.get(query)
        if out is None:
            out = self._queries[query] = query.replace("%", "%%").replace("?", "%s")
        return out

    def execute(self, query: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self.conn.execute(self._pg(query), params)  # type: ignore[arg-type]

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(self._pg(query), rows)  # type: ignore[arg-type]

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status != TransactionStatus.IDLE


class _PgTransaction(_Transaction):
    """BEGIN, the store's lock, ... COMMIT (ROLLBACK on any exception); re-entrant.
    `durable=False` commits without waiting for the WAL flush."""

    def __init__(self, db: _Connection, durable: bool = True) -> None:
        self._pg = db
        self._outer = False
        self._durable = durable

    def __enter__(self) -> None:
        if self._pg.in_transaction:
            return
        self._pg.execute("BEGIN")
        self._outer = True
        try:
            self._pg.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()))")
            if not self._durable:
                self._pg.execute("SET LOCAL synchronous_commit = off")
        except BaseException:
            self._pg.execute("ROLLBACK")
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        self._pg.execute("COMMIT" if exc_type is None else "ROLLBACK")


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


class PgStore(Store):
    """PostgreSQL store of one server (same interface and promises as `Store`).

    `schema` (optional) keeps the store in that schema of the database (created
    if missing); otherwise the connection's search_path decides (`public`
    unless the URL says otherwise, e.g. `?options=-csearch_path%3Dleader`)."""

    #: Schema version this code writes (the `svtagg_schema` table; not SQLite's numbering).
    SCHEMA_VERSION = len(_MIGRATIONS)

    def __init__(self, url: str, schema: str | None = None, recover: bool = True) -> None:
        """`recover=False`: an ingest replica, which must not fail the streams
        the server's main process has in flight."""
        self.path = redact(url)
        conn = connect(url)
        conn.adapters.register_dumper(str, _TextDumper)
        self._conn = conn
        self._url = url  # kept for the work queue's own connections (never logged)
        self._db = _Connection(conn)  # type: ignore[assignment]
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
            self.schema: str = str(row[0]) if row else "public"
            self.recovered_failed: list[tuple[str, str]] = []
            self.recovered_plans: list[tuple[str, str]] = []
            self.failed_on_recovery = self._recover() if recover else 0
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        self._conn.close()

    def _tx(self, durable: bool = True) -> _PgTransaction:
        return _PgTransaction(self._db, durable)  # type: ignore[arg-type]

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
            for step in _MIGRATIONS[version:]:
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

    # ------------------------------------------------------------ uploads
    def add_reports(
        self, task_id: str, report_ids: list[bytes], shares: list[bytes], share_sum: U64
    ) -> int:
        with self._tx():
            row = self._conn.execute(
                "SELECT n, n_max, collection_open, sums, digest, d FROM tasks"
                " WHERE task_id=%s FOR UPDATE",
                (task_id,),
            ).fetchone()
            n, sums_blob, digest, d = self._admit_batch(task_id, row, len(report_ids), share_sum)
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
            self._within_capacity(task_id, row, len(report_ids))
            crash_point("upload.mid_store")
            sums = np.frombuffer(sums_blob, dtype=np.uint64) + share_sum
            new_digest = _xor(bytes(digest), report_digest(report_ids))
            self._conn.execute(
                "UPDATE tasks SET n=%s, sums=%s, digest=%s WHERE task_id=%s",
                (n + len(report_ids), sums.tobytes(), new_digest, task_id),
            )
        return int(n + len(report_ids))

    def _stored_shares(self, task_id: str, report_ids: list[bytes]) -> dict[bytes, bytes | None]:
        rows = self._conn.execute(
            "SELECT report_id, share FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
            (task_id, report_ids),
        ).fetchall()
        return {bytes(r[0]): None if r[1] is None else bytes(r[1]) for r in rows}

    def shares(self, task_id: str, report_ids: list[bytes]) -> list[bytes]:
        """This server's stored share of each report (until the agreement)."""
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

    def remove_reports(
        self, task_id: str, report_ids: list[bytes], share_sum: Callable[[list[bytes]], U64]
    ) -> TaskState:
        with self._tx():
            task = self.task(task_id)
            if task.collection_open:
                raise FailedPrecondition("reports are reconciled only after the close")
            if task.agreed:
                raise FailedPrecondition("the report set is already agreed; nothing to remove")
            if not report_ids:
                return task
            stored = self._stored_shares(task_id, report_ids)
            present = [rid for rid in report_ids if rid in stored]
            if present:
                shares = [stored[rid] or b"" for rid in present]
                sums = self.sums(task_id) - share_sum(shares)
                self._conn.execute(
                    "DELETE FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
                    (task_id, present),
                )
                self._conn.execute(
                    "UPDATE tasks SET n=n-%s, sums=%s, digest=%s WHERE task_id=%s",
                    (
                        len(present),
                        sums.tobytes(),
                        _xor(task.digest, report_digest(present)),
                        task_id,
                    ),
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
    def _write_spent(self, task_id: str, ledger: Ledger) -> None:
        """Write the new totals and append the change to the `spends` journal
        (inside the caller's transaction)."""
        before = self._conn.execute(
            "SELECT epsilon_spent, delta_spent FROM tasks WHERE task_id=%s", (task_id,)
        ).fetchone()
        if before is None:
            raise NotFound(f"unknown task {task_id!r}")
        super()._write_spent(task_id, ledger)
        after = ledger.budget()
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
    def confirm_stream(self, stream_id: str) -> None:
        with self._tx(durable=False):
            cur = self._conn.execute(
                "UPDATE streams SET state=%s WHERE stream_id=%s AND state=%s AND gamma IS NOT NULL",
                (OPEN, stream_id, OPENING),
            )
            if cur.rowcount != 1:
                raise FailedPrecondition(f"stream {stream_id!r} is not being opened")

    def end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        with self._tx(durable=False):
            self._end_chunk(stream_id, answered, close)

    def stream_ids(self, task_id: str, state: str) -> list[str]:
        rows = self._conn.execute(
            "SELECT stream_id FROM streams WHERE task_id=%s AND state=%s ORDER BY seq",
            (task_id, state),
        ).fetchall()
        return [r[0] for r in rows]

    def fail_stream(self, stream_id: str) -> None:
        with self._tx():
            self._conn.execute(
                "UPDATE streams SET state=%s WHERE stream_id=%s AND state NOT IN (%s, %s)",
                (FAILED, stream_id, CLOSED, FAILED),
            )

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
        return _assemble(d, [(int(lo), np.frombuffer(b, np.uint64)) for lo, _, b in rows])

    def clear_staged(self, task_id: str) -> None:
        with self._tx(durable=False):
            self._conn.execute("DELETE FROM robust_staged WHERE task_id=%s", (task_id,))
