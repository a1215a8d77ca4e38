"""One server's durable state in PostgreSQL: the PostgreSQL dialect of
`sql.SqlStore` (which writes every operation once; `rules.Store` names them
and their promises), for deployments that keep each server's state in a
database server.

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

The schema is versioned in `svtagg_schema`: PostgreSQL's frozen ladder
(`postgres_schema.MIGRATIONS`, 1–11), then the history both dialects share
(`servers/store/migrations.py`); a store written by a newer version is refused.

One server process per store, as with SQLite: at start the store fails closed
every stream that was `opening` or `in_chunk`, which would be wrong for a
second live process sharing it (ingest replicas and workers open it with
`recover=False`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.pq import TransactionStatus
from psycopg.types.string import StrDumperUnknown

from svtagg.dp.errors import AlreadyExists, InvalidArgument
from svtagg.dp.queries import Budget
from svtagg.servers.store.postgres_schema import MIGRATIONS
from svtagg.servers.store.rules import within_capacity
from svtagg.servers.store.sql import SqlStore


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


class PgStore(SqlStore):
    """PostgreSQL store of one server (`rules.Store`).

    `schema` (optional) keeps the store in that schema of the database (created
    if missing); otherwise the connection's search_path decides (`public`
    unless the URL says otherwise, e.g. `?options=-csearch_path%3Dleader`)."""

    FOR_UPDATE = " FOR UPDATE"
    STREAM_ORDER = "seq"

    DIALECT = "postgres"

    def __init__(self, url: str, schema: str | None = None, recover: bool = True) -> None:
        """`recover=False`: an ingest replica or a worker, which must not fail
        the streams the server's main process has in flight."""
        self._start_records()
        self.path = redact(url)
        conn = connect(url)
        conn.adapters.register_dumper(str, _TextDumper)
        self._conn = conn
        self._statements: dict[str, bytes] = {}
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
        try:
            self._stop_records()
        finally:
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

    def _migrate(self) -> None:
        """PostgreSQL's frozen ladder (`postgres_schema.MIGRATIONS`, versions
        1–11), then the shared history (`servers/store/migrations.py`), in one
        transaction."""
        with self._tx():
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS svtagg_schema ("
                " one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)"
            )
            version = self.schema_version()
            if version < len(MIGRATIONS):
                for step in MIGRATIONS[version:]:
                    for statement in step:
                        self._conn.execute(statement.encode())
                version = len(MIGRATIONS)
            self._migrate_shared(version)

    def _has_version_table(self) -> bool:
        return True  # `_migrate` makes it first

    # ------------------------------------------------------------ the dialect seam
    def _statement(self, statement: str) -> bytes:
        """The statement with psycopg's placeholders (cached: the hot path runs
        the same few statements over and over)."""
        held = self._statements.get(statement)
        if held is None:
            held = self._statements[statement] = statement.replace("?", "%s").encode()
        return held

    def _run(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(self._statement(statement), params)

    def _run_many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(self._statement(statement), rows)

    def _tx(self, durable: bool = True) -> _Transaction:
        return _Transaction(self._conn, durable)

    def _write_alone(self, statement: str, params: Sequence[Any], durable: bool = True) -> Any:
        # under the store's lock, as every write transaction (see the module's doc)
        with self._tx(durable):
            return self._run(statement, params)

    def _in(self, ids: Sequence[bytes]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        yield "= ANY(?)", (list(ids),)

    def _insert_reports(
        self, task_id: str, report_ids: list[bytes], shares: list[bytes], room: tuple[int, int]
    ) -> None:
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
        within_capacity(task_id, *room, len(report_ids))

    def _stored_shares(self, task_id: str, report_ids: list[bytes]) -> dict[bytes, bytes | None]:
        rows = self._conn.execute(
            "SELECT report_id, share FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
            (task_id, report_ids),
        ).fetchall()
        return {bytes(r[0]): None if r[1] is None else bytes(r[1]) for r in rows}

    def _drop_shares(self, task_id: str) -> None:
        self._conn.execute(
            "UPDATE reports SET share=NULL WHERE task_id=%s AND share IS NOT NULL", (task_id,)
        )

    def _after_agreed(self, task_id: str) -> None:
        """The shares were dropped inside the agreement's transaction."""

    def _journal(self, task_id: str, change: tuple[Fraction, Fraction], after: Budget) -> None:
        self._conn.execute(
            "INSERT INTO spends (task_id, epsilon, delta, epsilon_spent, delta_spent)"
            " VALUES (%s, %s, %s, %s, %s)",
            (
                task_id,
                str(change[0]),
                str(change[1]),
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
