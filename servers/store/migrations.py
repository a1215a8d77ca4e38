"""One migration history, run by both dialects.

Until version 12 each dialect kept its own ladder: SQLite's steps 1–9 in
`sqlite.SqliteStore._migrate` (numbered in `PRAGMA user_version`), and
PostgreSQL's 1–11 in `postgres_schema.MIGRATIONS` (numbered in the
`svtagg_schema` table).  They are frozen: a store written by older code climbs
its own ladder to its end, and there the two meet.  From version 12 on there is
one history, `HISTORY`, numbered in the `svtagg_schema` table on both
databases; each step is written once, with a dialect's own spelling only where
the SQL truly differs (`Migration.postgres`).  `SqlStore._migrate_shared` runs
it, inside the dialect's migration transaction.

Adding a step: append a `Migration` with the next version and write the
statements both databases run; the store contract tests then open a store of
the previous version on both (tests/test_store_contract.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    """A store at `version - 1` → `version`."""

    version: int
    #: What the step changes, for the reader of this history.
    what: str
    #: The statements, for both dialects.
    statements: tuple[str, ...]
    #: PostgreSQL's statements instead, where they must differ (None: the same).
    postgres: tuple[str, ...] | None = None

    def for_dialect(self, dialect: str) -> tuple[str, ...]:
        if dialect == "postgres" and self.postgres is not None:
            return self.postgres
        return self.statements


#: Where each dialect's frozen ladder ends (its last version before the shared
#: history).
LEGACY = {"sqlite": 9, "postgres": 11}

#: The shared history: `HISTORY[i]` brings a store at its version - 1 to it.
HISTORY: tuple[Migration, ...] = (
    Migration(
        12,
        "the ladders meet: both databases number the schema in the svtagg_schema"
        " table (PostgreSQL has it already; SQLite's user_version stays at 9)",
        (
            "CREATE TABLE IF NOT EXISTS svtagg_schema ("
            " one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)",
        ),
    ),
    Migration(
        13,
        "the prefix crawl's walks: each level this server completed (its parents,"
        " bits and the reports its check refused), so a restarted server rebuilds"
        " a walk from its record (servers/crawl.py)",
        (
            "CREATE TABLE IF NOT EXISTS crawl_levels ("
            " walk_id TEXT NOT NULL, level INTEGER NOT NULL, task_id TEXT NOT NULL,"
            " depth INTEGER NOT NULL, steps INTEGER NOT NULL,"
            " parents BLOB NOT NULL, refused BLOB NOT NULL,"
            " PRIMARY KEY (walk_id, level))",
        ),
        (
            "CREATE TABLE IF NOT EXISTS crawl_levels ("
            " walk_id TEXT NOT NULL, level INTEGER NOT NULL, task_id TEXT NOT NULL,"
            " depth INTEGER NOT NULL, steps INTEGER NOT NULL,"
            " parents BYTEA NOT NULL, refused BYTEA NOT NULL,"
            " PRIMARY KEY (walk_id, level))",
        ),
    ),
)

#: The version this code writes, on both databases.
VERSION = HISTORY[-1].version
