"""PostgreSQL drivers side by side on the store's write shapes: psycopg 3
(synchronous, as `servers/store/postgres.py` uses it) against asyncpg.

    SVTAGG_TEST_POSTGRES=postgresql://... python -m svtagg.benchmarks.bench_pg_drivers \
        [--repeat 7] [--batches 5]

Two shapes, on the store's own tables (its migrations, so the database does
what it does for the store) in a throwaway schema (dropped at the end):
- the upload batch (`PgStore.add_reports`): BEGIN; transaction advisory lock;
  SELECT the task row FOR UPDATE; COPY (binary) of 1,000 (task id, 16-byte
  report id, 800-byte share) rows, i.e. d = 100 shares of 8 bytes; UPDATE the
  task's n, sums blob and digest; COMMIT — with one writer process and with two
  writer processes on the same task row (as a main process and an ingest
  replica);
- the point transaction (the ledger charge): BEGIN; lock; SELECT one row;
  UPDATE it; INSERT a journal row; COMMIT.

Every commit is durable (synchronous_commit = on, as the store's).  Each
repetition runs every variant once, in turn, on an emptied table; the table
gives medians (min-max) over the repetitions, of the wall time per batch or
transaction and of the writer processes' own CPU time, and the ratio to
psycopg.  Each writer's first batch or transaction (connection warm-up:
asyncpg's statement preparation and column-type lookup, psycopg's first
execution) is not timed.  asyncpg is optional: `pip install -e ".[bench-pg]"`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from svtagg.benchmarks.pg import server_url
from svtagg.servers.store.postgres import _copy_rows
from svtagg.servers.store.postgres_schema import MIGRATIONS

TASK = "bench"
REPORT_ID_BYTES = 16

try:
    import asyncpg
except ImportError:  # pragma: no cover - depends on the environment
    asyncpg = None


def _schema_sql(schema: str) -> list[str | bytes]:
    """The store's own tables (its migrations), in a schema of their own."""
    return [
        f'CREATE SCHEMA "{schema}"',
        f'SET search_path TO "{schema}"',
        *(statement.encode() for step in MIGRATIONS for statement in step),
    ]


def _batches(count: int, size: int, d: int, seed: int) -> list[tuple[list[bytes], list[bytes]]]:
    """`count` batches of `size` fresh report ids with one d-word share each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = [os.urandom(REPORT_ID_BYTES) for _ in range(size)]
        block = rng.integers(0, 2**63, size=(size, d), dtype=np.uint64).tobytes()
        width = 8 * d
        out.append((ids, [block[i * width : (i + 1) * width] for i in range(size)]))
    return out


def _new_state(sums: bytes, digest: bytes, shares: list[bytes], d: int) -> tuple[bytes, bytes]:
    """The application's work between the SELECT and the UPDATE (same for both
    drivers): add the batch's share sum to the running sums."""
    total = np.frombuffer(b"".join(shares), dtype="<u8").reshape(len(shares), d).sum(axis=0)
    new = np.frombuffer(sums, dtype=np.uint64) + total
    return new.tobytes(), bytes(digest)


_LOCK = "SELECT pg_advisory_xact_lock(hashtext(current_schema()))"


# ---------------------------------------------------------------- psycopg 3
@contextlib.contextmanager
def _session(url: str, schema: str) -> Iterator[Any]:
    """A psycopg connection as the store opens it: autocommit, durable commits,
    the benchmark's schema."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute(f'SET search_path TO "{schema}"')
        yield conn


def _psycopg_upload(url: str, schema: str, batches: list[Any], d: int, variant: str) -> None:
    with _session(url, schema) as conn:
        for i, (ids, shares) in enumerate(batches):
            if i == 1:
                _ready()
            conn.execute("BEGIN")
            conn.execute(_LOCK)
            row = conn.execute(
                "SELECT n, sums, digest FROM tasks WHERE task_id=%s FOR UPDATE", (TASK,)
            ).fetchone()
            assert row is not None
            with (
                conn.cursor() as cur,
                cur.copy(
                    "COPY reports (task_id, report_id, share) FROM STDIN (FORMAT BINARY)"
                ) as cp,
            ):
                cp.write(_copy_rows(TASK, ids, shares))
            sums, digest = _new_state(row[1], row[2], shares, d)
            conn.execute(
                "UPDATE tasks SET n=%s, sums=%s, digest=%s WHERE task_id=%s",
                (row[0] + len(ids), sums, digest, TASK),
            )
            conn.execute("COMMIT")


def _psycopg_point(url: str, schema: str, count: int) -> None:
    with _session(url, schema) as conn:
        for i in range(count + 1):
            if i == 1:
                _ready()
            conn.execute("BEGIN")
            conn.execute(_LOCK)
            row = conn.execute(
                "SELECT epsilon_spent, delta_spent FROM tasks WHERE task_id=%s", (TASK,)
            ).fetchone()
            assert row is not None
            eps = str(int(row[0]) + 1)
            conn.execute("UPDATE tasks SET epsilon_spent=%s WHERE task_id=%s", (eps, TASK))
            conn.execute(
                "INSERT INTO spends (task_id, epsilon, delta, epsilon_spent, delta_spent)"
                " VALUES (%s, %s, %s, %s, %s)",
                (TASK, "1", "0", eps, row[1]),
            )
            conn.execute("COMMIT")


# ---------------------------------------------------------------- asyncpg
async def _asyncpg_connect(url: str, schema: str) -> Any:
    conn = await asyncpg.connect(url)
    await conn.execute("SET synchronous_commit = on")
    await conn.execute(f'SET search_path TO "{schema}"')
    return conn


async def _asyncpg_upload_async(
    url: str, schema: str, batches: list[Any], d: int, variant: str
) -> None:
    conn = await _asyncpg_connect(url, schema)
    try:
        for i, (ids, shares) in enumerate(batches):
            if i == 1:
                _ready()
            async with conn.transaction():
                await conn.execute(_LOCK)
                row = await conn.fetchrow(
                    "SELECT n, sums, digest FROM tasks WHERE task_id=$1 FOR UPDATE", TASK
                )
                if variant == "records":
                    await conn.copy_records_to_table(
                        "reports",
                        records=[(TASK, rid, sh) for rid, sh in zip(ids, shares, strict=True)],
                        columns=("task_id", "report_id", "share"),
                    )
                else:  # the store's own binary COPY stream, through asyncpg
                    await conn.copy_to_table(
                        "reports",
                        source=io.BytesIO(_copy_rows(TASK, ids, shares)),
                        columns=("task_id", "report_id", "share"),
                        format="binary",
                    )
                sums, digest = _new_state(row["sums"], row["digest"], shares, d)
                await conn.execute(
                    "UPDATE tasks SET n=$1, sums=$2, digest=$3 WHERE task_id=$4",
                    row["n"] + len(ids),
                    sums,
                    digest,
                    TASK,
                )
    finally:
        await conn.close()


def _asyncpg_upload(url: str, schema: str, batches: list[Any], d: int, variant: str) -> None:
    asyncio.run(_asyncpg_upload_async(url, schema, batches, d, variant))


async def _asyncpg_point_async(url: str, schema: str, count: int) -> None:
    conn = await _asyncpg_connect(url, schema)
    try:
        for i in range(count + 1):
            if i == 1:
                _ready()
            async with conn.transaction():
                await conn.execute(_LOCK)
                row = await conn.fetchrow(
                    "SELECT epsilon_spent, delta_spent FROM tasks WHERE task_id=$1", TASK
                )
                eps = str(int(row["epsilon_spent"]) + 1)
                await conn.execute("UPDATE tasks SET epsilon_spent=$1 WHERE task_id=$2", eps, TASK)
                await conn.execute(
                    "INSERT INTO spends (task_id, epsilon, delta, epsilon_spent, delta_spent)"
                    " VALUES ($1, $2, $3, $4, $5)",
                    TASK,
                    "1",
                    "0",
                    eps,
                    row["delta_spent"],
                )
    finally:
        await conn.close()


def _asyncpg_point(url: str, schema: str, count: int) -> None:
    asyncio.run(_asyncpg_point_async(url, schema, count))


# ---------------------------------------------------------------- harness
_BARRIER: Any = None
_T0: list[float] = []


def _ready() -> None:
    """Connected and prepared: wait for the other writers, then start the clocks."""
    if _BARRIER is not None:
        _BARRIER.wait()
    _T0[:] = [time.perf_counter(), time.process_time()]


def _writer(barrier: Any, out: Any, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    global _BARRIER
    _BARRIER = barrier
    fn(*args)
    out.put((_T0[0], time.perf_counter(), time.process_time() - _T0[1]))


def _run(writers: list[tuple[Callable[..., None], tuple[Any, ...]]]) -> tuple[float, float]:
    """Run the writers as processes started together: (wall seconds from the
    first start to the last end, the writers' CPU seconds)."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(writers))
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(barrier, out, fn, a)) for fn, a in writers]
    for p in procs:
        p.start()
    spans: list[tuple[float, float, float]] = []
    deadline = time.monotonic() + 600
    while len(spans) < len(procs):
        try:
            spans.append(out.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError("a writer failed (see its traceback above)") from None
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a writer failed (exit code {p.exitcode})")
    return max(e for _, e, _ in spans) - min(s for s, _, _ in spans), sum(c for *_, c in spans)


def _reset(conn: Any, schema: str, d: int) -> None:
    """An empty `reports` table and the task's row as created (`spends` is
    append-only: it keeps growing, by a few hundred rows per run)."""
    conn.execute(f'TRUNCATE "{schema}".reports')
    if conn.execute(f'SELECT 1 FROM "{schema}".tasks').fetchone() is None:
        conn.execute(
            f'INSERT INTO "{schema}".tasks (task_id, d, frac_bits, n_max, min_batch,'
            " epsilon_total, delta_total, epsilon_min, digest, sums)"
            " VALUES (%s, %s, 16, %s, 1, '1000000', '0', '1', %s, %s)",
            (TASK, d, 10**15, bytes(16), bytes(8 * d)),
        )
    conn.execute(
        f'UPDATE "{schema}".tasks SET n = 0, sums = %s, digest = %s, epsilon_spent = %s',
        (bytes(8 * d), bytes(16), "0"),
    )
    conn.execute(f'VACUUM ANALYZE "{schema}".tasks, "{schema}".reports')


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="repetitions (medians over them)")
    ap.add_argument(
        "--batches", type=int, default=10, help="timed upload batches per writer and run"
    )
    ap.add_argument("--batch-size", type=int, default=1000, help="reports per batch")
    ap.add_argument("--d", type=int, default=100, help="8-byte shares per report")
    ap.add_argument("--points", type=int, default=200, help="point transactions per run")
    args = ap.parse_args(argv)
    url = server_url()
    import psycopg

    if asyncpg is None:
        print(
            "asyncpg is NOT installed: only psycopg 3 is measured "
            '(pip install -e ".[bench-pg]" for the comparison)',
            file=sys.stderr,
        )
    schema = f"svtagg_drivers_{uuid.uuid4().hex[:10]}"
    d, size = args.d, args.batch_size
    uploads: dict[str, tuple[Callable[..., None], str, int]] = {
        "psycopg 3, 1 writer": (_psycopg_upload, "", 1),
        "psycopg 3, 2 writers": (_psycopg_upload, "", 2),
    }
    points: dict[str, Callable[..., None]] = {"psycopg 3": _psycopg_point}
    if asyncpg is not None:
        uploads = {
            "psycopg 3, 1 writer": uploads["psycopg 3, 1 writer"],
            "asyncpg records, 1 writer": (_asyncpg_upload, "records", 1),
            "asyncpg binary, 1 writer": (_asyncpg_upload, "binary", 1),
            "psycopg 3, 2 writers": uploads["psycopg 3, 2 writers"],
            "asyncpg records, 2 writers": (_asyncpg_upload, "records", 2),
        }
        points["asyncpg"] = _asyncpg_point
    wall: dict[str, list[float]] = {k: [] for k in [*uploads, *points]}
    cpu: dict[str, list[float]] = {k: [] for k in [*uploads, *points]}
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _schema_sql(schema):
            conn.execute(statement)
        try:
            for rep in range(args.repeat):
                for name, (fn, variant, nw) in uploads.items():
                    _reset(conn, schema, d)
                    writers = [
                        (
                            fn,
                            (
                                url,
                                schema,
                                _batches(args.batches + 1, size, d, 1000 * rep + w),
                                d,
                                variant,
                            ),
                        )
                        for w in range(nw)
                    ]
                    seconds, used = _run(writers)
                    total = nw * args.batches
                    wall[name].append(1000 * seconds / total)
                    cpu[name].append(1000 * used / total)
                for name, fn in points.items():
                    _reset(conn, schema, d)
                    seconds, used = _run([(fn, (url, schema, args.points))])
                    wall[name].append(1000 * seconds / args.points)
                    cpu[name].append(1000 * used / args.points)
        finally:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def table(names: list[str], unit: str, base: str) -> None:
        print(
            f"{'':28s} {'wall ms/' + unit + ' median (min-max)':>30s} {'vs psycopg':>10s}"
            f" {'driver CPU ms/' + unit:>26s}"
        )
        for name in names:
            ratio = statistics.median(wall[name]) / statistics.median(wall[base])
            print(f"{name:28s} {_fmt(wall[name]):>30s} {ratio:9.2f}x {_fmt(cpu[name]):>26s}")

    print(
        f"\nupload batch: {size:,} reports, d = {d} ({8 * d}-byte shares), "
        f"{args.batches} batches per writer, {args.repeat} repetitions"
    )
    two = [k for k in uploads if "2 writers" in k]
    table([k for k in uploads if k not in two], "batch", "psycopg 3, 1 writer")
    table(two, "batch", "psycopg 3, 2 writers")
    print(f"  (2 writers: wall time of both writers' {2 * args.batches} batches / batch count)")
    for name in uploads:
        rate = 1000 * size / statistics.median(wall[name])
        print(f"  {name:28s} {rate:9,.0f} reports/s")
    print(f"\npoint transaction (ledger-charge shape), {args.points} per run")
    table(list(points), "tx", "psycopg 3")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
