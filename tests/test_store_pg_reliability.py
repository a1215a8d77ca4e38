"""The crash-safety suite (tests/test_reliability.py) with both server processes
on PostgreSQL stores: each server is started with `--db postgresql://...` and
its own schema (PGOPTIONS search_path), killed with SIGKILL at the crash points
and restarted; the same invariants are checked (every acknowledged report
counted once on both servers, S_L + S_H the plaintext sum, ledgers that agree
and never shrink, interrupted streams that never answer).  Also: several
connections writing one PostgreSQL store concurrently lose no update.  Skips
without a reachable server (SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import ProcessDeployment
from test_reliability import (
    Collection,
    check_reports,
    closed_task,
    crash_loop,
    create_task,
    stream_through_kill,
    upload_through_kill,
)
from test_store_contract import batch, share_sum

from svtagg.benchmarks.storeview import StoreView
from svtagg.dp.task import TaskParams


class PgProcessDeployment(ProcessDeployment):
    """ProcessDeployment whose servers keep their stores in PostgreSQL schemas."""

    def __init__(self, root: Path, url: str, tag: str) -> None:
        # a later --db wins over the SQLite path the launcher passes
        super().__init__(root, server_args=["--db", url])
        self.url = url
        self.schemas = {r: f"{r}_{tag}" for r in ("leader", "helper")}

    def start_role(self, role: str) -> None:
        self.control[role].write_text("")
        self.dep.start_role(
            role,
            env={
                **self.env,
                "SVTAGG_CRASH_CONTROL": str(self.control[role]),
                "PGOPTIONS": f"-csearch_path={self.schemas[role]}",
            },
        )

    def store_view(self, role: str, task_id: str) -> StoreView:
        return pg_store_view(self.url, self.schemas[role], task_id)


def pg_store_view(url: str, schema: str, task_id: str) -> StoreView:
    """A snapshot of one task in a PostgreSQL store (what `store_view` reads from SQLite)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        row = conn.execute(
            "SELECT n, sums, epsilon_spent, delta_spent FROM tasks WHERE task_id=%s",
            (task_id,),
        ).fetchone()
        assert row is not None
        ids = {
            bytes(r[0])
            for r in conn.execute(
                "SELECT report_id FROM reports WHERE task_id=%s", (task_id,)
            ).fetchall()
        }
        streams = dict(
            conn.execute(
                "SELECT stream_id, state FROM streams WHERE task_id=%s", (task_id,)
            ).fetchall()
        )
    return StoreView(
        int(row[0]),
        np.frombuffer(row[1], dtype=np.uint64).copy(),
        ids,
        Fraction(row[2]),
        Fraction(row[3]),
        streams,
    )


def test_crash_points_on_postgres(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    """One SIGKILL at each point, both servers on PostgreSQL; the invariants hold."""
    pd = PgProcessDeployment(tmp_path, *pg_url).start()
    try:
        col = Collection("up")
        create_task(pd, "up")
        upload_through_kill(pd, col, "leader", "upload.mid_store")
        upload_through_kill(pd, col, "helper", "upload.mid_store")
        upload_through_kill(pd, col, "helper", "upload.after_store")
        upload_through_kill(pd, col, "leader", "upload.after_store", give_up=True)
        check_reports(pd, col)
        closed_task(pd, "s")
        for point, role in [
            ("open.before_helper", "leader"),
            ("plan.before_helper", "leader"),
            ("open.after_charge", "leader"),
            ("open.after_charge", "helper"),
            ("chunk.after_mark", "leader"),
            ("chunk.after_mark", "helper"),
            ("chunk.after_result", "helper"),
            ("chunk.after_result", "leader"),
        ]:
            stream_through_kill(pd, "s", role, point)
        assert sum(pd.kills.values()) == 12
        assert not list(tmp_path.glob("*.sqlite*"))  # no SQLite store was used
    finally:
        pd.stop()


@pytest.mark.heavy
def test_crash_points_heavy_on_postgres(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    """Every (point, role) pair KILLS_HEAVY times on PostgreSQL stores, plus
    abandoned uploads (the heavy run of tests/test_reliability.py)."""
    crash_loop(PgProcessDeployment(tmp_path, *pg_url).start(), "crash safety (PostgreSQL)")


def test_concurrent_writers_lose_no_update(pg_url: tuple[str, str]) -> None:
    """Four connections upload into one store at once: n, the sums and the digest
    are those of every batch (the store's lock serialises read-modify-write)."""
    from svtagg.servers.store.postgres import PgStore
    from svtagg.servers.store.rules import report_digest

    url, tag = pg_url
    schema = f"c_{tag}"
    first = PgStore(url, schema=schema)
    first.create_task(TaskParams("t", 4, 16, 10**6, 1, Fraction(1), Fraction(0), Fraction(1)))
    work = [batch(4, 50, tag=bytes([w, k])) for w in range(4) for k in range(10)]
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        store = PgStore(url, schema=schema)
        try:
            for ids, shares, total in work[w * 10 : (w + 1) * 10]:
                store.add_reports("t", ids, shares, total)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            store.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    all_ids = [rid for ids, _, _ in work for rid in ids]
    st = first.task("t")
    assert st.n == len(all_ids) == 2000 and st.digest == report_digest(all_ids)
    expected = share_sum([s for _, shares, _ in work for s in shares])
    assert (first.sums("t") == expected).all()
    first.close()
