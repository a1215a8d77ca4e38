"""One main process per store.  A leader's or helper's main process owns its
store's in-flight streams (it fails them at its start) and its ledger, so a
second main process on the same store would undo the first one's work: the
main process holds an exclusive lock for its lifetime, taken before the store
is opened, and a second one is refused in one line naming the holder.

SQLite: an flock on the store file itself, i.e. on its inode, whatever name
reaches it (the kernel drops the lock when the process ends, however it ends);
`<db>.lock` only names the holder, and is never followed through a link.
PostgreSQL: a session-level advisory lock keyed by the store's schema, held
by a session of its own (the server drops it when the process's connection
ends).  Ingest replicas and workers share a
PostgreSQL store with the main process by design and take no lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import stat
import time
from typing import IO, Any

from svtagg.servers.store.opener import sqlite_file

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

    def __init__(self, file: IO[str] | None = None, session: Any = None, fd: int = -1) -> None:
        self._file, self._session, self._fd = file, session, fd

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1
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
    path = os.path.realpath(path)
    # The lock is the store file's own inode (an flock, which SQLite's POSIX
    # record locks do not touch), so every name of the store — a symlink, ../,
    # a hard link — meets the same lock.  The descriptor stays open until
    # `release`, after the store is closed (closing a descriptor of the file
    # would drop SQLite's record locks of this process).
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(
            f"store {path} is in use by another {_read_holder(path)}; one main process per store"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        note = _holder_file(f"{path}.lock")
    except BaseException:
        os.close(fd)
        raise
    note.write(_holder(role) + "\n")
    note.flush()
    return MainLock(file=note, fd=fd)


def _holder_file(name: str) -> IO[str]:
    """`<db>.lock`, where the holder writes its name for a second process's
    refusal: opened without following a link, and refused unless it is a
    regular file of one name (truncating a planted link would overwrite its
    target)."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreInUse(
                f"{name} is a symbolic link; remove it (the server writes there)"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise StoreInUse(f"{name} is not a plain file of its own; remove it")
    os.ftruncate(fd, 0)
    return os.fdopen(fd, "w", encoding="utf-8")


def _read_holder(path: str) -> str:
    """The holder's name from `<db>.lock` (never following a link)."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "main process"
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return f.read(200).strip() or "main process"


def _hold_postgres(url: str, role: str) -> MainLock:
    from svtagg.servers.store.postgres import connect, missing_path_schema, redact

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
