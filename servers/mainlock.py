"""One main process per store.  A leader's or helper's main process owns its
store's in-flight streams (it fails them at its start) and its ledger, so a
second main process on the same store would undo the first one's work: the
main process holds an exclusive lock for its lifetime, taken before the store
is opened, and a second one is refused in one line naming the holder.

SQLite: an flock on `<db>.lock` (the file stays; the kernel drops the lock when
the process ends, however it ends).  PostgreSQL: a session-level advisory lock
keyed by the store's schema, held by a session of its own (the server drops it
when the process's connection ends).  Ingest replicas and workers share a
PostgreSQL store with the main process by design and take no lock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import time
from typing import IO, Any

from svtagg.servers.store_open import sqlite_file

#: PostgreSQL keeps application names to 63 bytes.
_APP_NAME_BYTES = 63
#: How long a main process on PostgreSQL waits for the lock before refusing:
#: the database ends the session of a killed process only once it sees the
#: connection close, so a restart right after a crash may find it still held.
PG_LOCK_WAIT = 3.0


class StoreInUse(OSError):
    """Another main process holds the store (a local-environment failure)."""


def _holder(role: str) -> str:
    return f"{role} main process (pid {os.getpid()} on {socket.gethostname()})"


class MainLock:
    """The held lock; `release()` when the server has closed its store."""

    def __init__(self, file: IO[str] | None = None, session: Any = None) -> None:
        self._file, self._session = file, session

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor drops the flock
            self._file = None
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.close()
            self._session = None


def hold_main_lock(store_path: str, role: str) -> MainLock:
    """Take the main-process lock of the store `--db` names, or raise StoreInUse."""
    path = sqlite_file(store_path)
    if path is None:
        return _hold_postgres(store_path, role)
    if path == ":memory:":
        return MainLock()
    # One lock file per store file, however `--db` names it (a symlink, ../).
    path = os.path.realpath(path)
    f = open(f"{path}.lock", "a+", encoding="utf-8")  # noqa: SIM115 - held for the lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "main process"
        f.close()
        raise StoreInUse(
            f"store {path} is in use by another {holder}; one main process per store"
        ) from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(_holder(role) + "\n")
    f.flush()
    return MainLock(file=f)


def _hold_postgres(url: str, role: str) -> MainLock:
    from svtagg.servers.store_pg import connect, missing_path_schema, redact

    name = f"svtagg {_holder(role)}".encode()[:_APP_NAME_BYTES].decode(errors="ignore")
    session = connect(url, application_name=name)
    try:
        schema = missing_path_schema(session)
        if schema is None:
            row = session.execute("SELECT current_schema()").fetchone()
            schema = str(row[0]) if row and row[0] is not None else "public"
        digest = hashlib.sha256(f"svtagg main process of store schema {schema}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        deadline = time.monotonic() + PG_LOCK_WAIT
        while not session.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,):
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise StoreInUse(
                f"store {redact(url)} (schema {schema}) is in use by another "
                f"{_pg_holder(session, key)}; one main process per store"
            )
    except BaseException:
        session.close()
        raise
    return MainLock(session=session)


def _pg_holder(session: Any, key: int) -> str:
    """Who holds the advisory lock `key`, as far as this session may see."""
    unsigned = key & (2**64 - 1)
    row = session.execute(
        "SELECT a.application_name, a.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        " AND l.classid::bigint = %s AND l.objid::bigint = %s"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (unsigned >> 32, unsigned & 0xFFFFFFFF),
    ).fetchone()
    if row is None:
        return "main process"
    app, pid = row
    prefix = "svtagg "
    if app and str(app).startswith(prefix):
        return str(app)[len(prefix) :]
    return f"main process (database session pid {pid})"
