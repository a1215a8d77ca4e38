"""Which store a `--db` value names, and opening it: SQLite
(`store_sqlite.SqliteStore`) for a file path or `sqlite:///path`, PostgreSQL
(`store_pg.PgStore`) for a `postgresql://` URL.  The one place that knows both
stores; everything else sees `store.Store`."""

from __future__ import annotations

from pathlib import Path

from svtagg.dp.errors import InvalidArgument
from svtagg.servers.store.rules import Store
from svtagg.servers.store.sqlite import SqliteStore

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
        return SqliteStore(path)
    try:
        from svtagg.servers.store.postgres import PgStore
    except ImportError as e:
        raise RuntimeError(
            'a postgresql:// store needs psycopg: pip install "svtagg[postgres]"'
        ) from e
    return PgStore(str(db), recover=recover)
