"""A chunk's store statements (read the stream, mark it in a chunk, mark it
open) hand-written on sqlite3, against SQLAlchemy Core (`text()`, and Table
expressions), on one SQLite file each, alternated in rounds: the CPU each
way costs per chunk.  What decided the store's dialect seam (docs/services.md,
"One store, two dialects").  SQLAlchemy is not a dependency:

    pip install sqlalchemy && python -m svtagg.benchmarks.bench_sqlalchemy
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

try:
    import sqlalchemy as sa  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - the benchmark says what it needs
    sa = None


COLUMNS = (
    "stream_id, task_id, kind, epsilon, delta, gamma, state, chunks, queries, plan_id, plan_group"
)
SEL = f"SELECT {COLUMNS} FROM streams WHERE stream_id=?"
BEGIN = "UPDATE streams SET state=?, chunks=chunks+1 WHERE stream_id=? AND state=? AND chunks=?"
END = "UPDATE streams SET state=?, queries=queries+? WHERE stream_id=? AND state=?"


def setup(path: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE streams (stream_id TEXT PRIMARY KEY, task_id TEXT, kind TEXT,"
        " epsilon TEXT, delta TEXT, gamma TEXT, state TEXT, chunks INTEGER DEFAULT 0,"
        " queries INTEGER DEFAULT 0, plan_id TEXT, plan_group INTEGER)"
    )
    db.execute(
        "INSERT INTO streams (stream_id, task_id, kind, epsilon, delta, state)"
        " VALUES ('s', 't', 'lap24', '1', '0', 'open')"
    )
    db.close()


def hand(path: str, n: int) -> float:
    """CPU seconds per chunk, sqlite3 directly (as servers/store/sqlite.py)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")  # CPU only: no fsync in either way
    t = time.process_time()
    for c in range(n):
        db.execute(SEL, ("s",)).fetchone()
        db.execute(BEGIN, ("in_chunk", "s", "open", c))
        db.execute(END, ("open", 1, "s", "in_chunk"))
    return (time.process_time() - t) / n


def _alchemy(path: str, n: int, statements: tuple[Any, Any, Any]) -> float:
    sel, beg, end = statements
    eng = sa.create_engine(f"sqlite:///{path}", isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.exec_driver_sql("PRAGMA synchronous=OFF")
        t = time.process_time()
        for c in range(n):
            conn.execute(sel, {"s": "s"}).fetchone()
            conn.execute(beg, {"st": "in_chunk", "s": "s", "o": "open", "c": c})
            conn.execute(end, {"st": "open", "a": 1, "s": "s", "o": "in_chunk"})
        return (time.process_time() - t) / n


def alchemy_text(path: str, n: int) -> float:
    """The same statements as `text()` constructs."""
    return _alchemy(
        path,
        n,
        (
            sa.text(SEL.replace("stream_id=?", "stream_id=:s")),
            sa.text(
                "UPDATE streams SET state=:st, chunks=chunks+1"
                " WHERE stream_id=:s AND state=:o AND chunks=:c"
            ),
            sa.text(
                "UPDATE streams SET state=:st, queries=queries+:a WHERE stream_id=:s AND state=:o"
            ),
        ),
    )


def alchemy_core(path: str, n: int) -> float:
    """The same statements as Core expressions on a reflected Table."""
    st = sa.Table("streams", sa.MetaData(), autoload_with=sa.create_engine(f"sqlite:///{path}"))
    bind = sa.bindparam
    return _alchemy(
        path,
        n,
        (
            sa.select(st).where(st.c.stream_id == bind("s")),
            st.update()
            .where(st.c.stream_id == bind("s"), st.c.state == bind("o"), st.c.chunks == bind("c"))
            .values(state=bind("st"), chunks=st.c.chunks + 1),
            st.update()
            .where(st.c.stream_id == bind("s"), st.c.state == bind("o"))
            .values(state=bind("st"), queries=st.c.queries + bind("a")),
        ),
    )


def main() -> int:
    if sa is None:
        print("bench_sqlalchemy needs SQLAlchemy: pip install sqlalchemy", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        res: dict[str, list[float]] = {k: [] for k in ("sqlite3", "sa.text", "sa.core")}
        ways = (("sqlite3", hand), ("sa.text", alchemy_text), ("sa.core", alchemy_core))
        for r in range(5):
            for name, f in ways:
                p = os.path.join(d, f"{name}{r}.db")
                setup(p)
                res[name].append(1e6 * f(p, 3000))
        base = statistics.median(res["sqlite3"])
        for k, v in res.items():
            m = statistics.median(v)
            print(
                f"{k:8s} {m:6.1f} µs per chunk's three statements "
                f"(min {min(v):.1f}, max {max(v):.1f}); {m / base:.2f}× hand-written"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
