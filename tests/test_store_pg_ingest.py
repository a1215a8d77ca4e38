"""The PostgreSQL store's upload path after schema version 3: the rule "every
report belongs to a task", which a per-row foreign key enforced until version
2, is enforced by statement-level triggers; a store at version 2 migrates with
its reports intact.  Skips without a reachable server (SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_store_contract import batch, params, share_sum

from svtagg.dp.errors import NotFound
from svtagg.servers.store.rules import report_digest


@pytest.fixture
def pg(pg_url: tuple[str, str]) -> tuple[str, str]:
    """(url, schema): a fresh schema, dropped afterwards."""
    return pg_url[0], f"t_{pg_url[1]}"


def _raw(url: str, schema: str) -> Any:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


def test_reports_of_a_missing_task_are_refused(pg: tuple[str, str]) -> None:
    import psycopg

    from svtagg.servers.store.postgres import PgStore, _copy_rows

    store = PgStore(pg[0], schema=pg[1])
    try:
        store.create_task(params("t"))
        ids, shares, _ = batch(3, 4)
        store.add_reports("t", ids[:2], shares[:2], share_sum(shares[:2]))
        with pytest.raises(NotFound):
            store.add_reports("nope", ids[2:], shares[2:], share_sum(shares[2:]))
        conn = _raw(*pg)
        with conn:
            # bypassing the store: a plain INSERT, a COPY, a moved report, a
            # deleted or renamed task — each refused by the database itself
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute(
                    "INSERT INTO reports (task_id, report_id) VALUES ('t', %s), ('nope', %s)",
                    (ids[2], ids[3]),
                )
            with (
                pytest.raises(psycopg.errors.ForeignKeyViolation),
                conn.cursor() as cur,
                cur.copy(
                    "COPY reports (task_id, report_id, share) FROM STDIN (FORMAT BINARY)"
                ) as cp,
            ):
                cp.write(_copy_rows("nope", ids[2:], shares[2:]))
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("UPDATE reports SET task_id = 'nope' WHERE report_id = %s", (ids[0],))
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("DELETE FROM tasks WHERE task_id = 't'")
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("UPDATE tasks SET task_id = 'u' WHERE task_id = 't'")
            # what the rule allows still works: a new task's reports, and a
            # task with no reports left can go
            store.create_task(params("u"))
            conn.execute("INSERT INTO reports (task_id, report_id) VALUES ('u', %s)", (ids[2],))
            conn.execute("UPDATE reports SET share = NULL WHERE task_id = 'u'")
            conn.execute("DELETE FROM reports WHERE task_id = 'u'")
            conn.execute("DELETE FROM tasks WHERE task_id = 'u'")
            assert conn.execute("SELECT task_id, COUNT(*) FROM reports GROUP BY 1").fetchall() == [
                ("t", 2)
            ]
        assert store.task("t").n == 2
        assert store.shares("t", ids[:2]) == shares[:2]
    finally:
        store.close()


def test_a_version_2_store_migrates_with_its_reports(
    pg: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from svtagg.servers.store import postgres as store_pg
    from svtagg.servers.store.postgres import PgStore

    url, schema = pg
    fkeys = (
        "SELECT COUNT(*) FROM pg_constraint WHERE conrelid = 'reports'::regclass AND contype = 'f'"
    )
    ids, shares, _ = batch(3, 6)
    with monkeypatch.context() as m:  # the code of schema version 2
        m.setattr(store_pg, "MIGRATIONS", store_pg.MIGRATIONS[:2])
        m.setattr(PgStore, "SCHEMA_VERSION", 2)
        old = PgStore(url, schema=schema)
        # What version-2 code wrote: a task and three reports with their shares
        # (the rows by hand: today's methods write the columns of today's schema).
        old._conn.execute(
            "INSERT INTO tasks (task_id, d, frac_bits, n_max, min_batch, epsilon_total,"
            " delta_total, epsilon_min, digest, sums, n) VALUES"
            " ('t', 3, 16, 100, 1, '1', '1/1000000', '1/10', %s, %s, 3)",
            (report_digest(ids[:3]), share_sum(shares[:3]).tobytes()),
        )
        for rid, sh in zip(ids[:3], shares[:3], strict=True):
            old._conn.execute(
                "INSERT INTO reports (task_id, report_id, share) VALUES ('t', %s, %s)", (rid, sh)
            )
        old._conn.commit()
        assert old.schema_version() == 2
        assert old._conn.execute(fkeys).fetchone() == (1,)
        old.close()
    store = PgStore(url, schema=schema)
    try:
        assert store.schema_version() == PgStore.SCHEMA_VERSION >= 3
        assert store._conn.execute(fkeys).fetchone() == (0,)
        assert store.shares("t", ids[:3]) == shares[:3]
        store.add_reports("t", ids[3:], shares[3:], share_sum(shares[3:]))
        store.close()
        store = PgStore(url, schema=schema)  # reopening migrates nothing twice
        assert store.task("t").n == 6
        assert np.array_equal(store.sums("t"), share_sum(shares))
        assert store.shares("t", ids) == shares
    finally:
        store.close()
