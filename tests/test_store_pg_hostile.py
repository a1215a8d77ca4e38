"""The hostile-input suite (tests/test_hostile.py) with both server processes on
PostgreSQL stores: the same properties, each call refused clearly with the
servers up and both stores unchanged (their PostgreSQL state compared before
and after every refused call).  Skips without a reachable server
(SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import pg_tagged
from test_hostile import (  # noqa: F401 - collected here with this module's `env`
    TRIED,
    Env,
    test_ask,
    test_compare,
    test_create_task,
    test_get_task,
    test_open_stream,
    test_oversized_request_is_refused,
    test_peer_reconciliation_and_streams,
    test_task_refs,
    test_undecodable_and_random_bytes,
    test_upload,
)
from test_store_pg_reliability import PgProcessDeployment


class PgEnv(Env):
    """Env whose store snapshots read the servers' PostgreSQL schemas."""

    def __init__(self, pd: PgProcessDeployment) -> None:
        import psycopg

        self._conn = psycopg.connect(pd.url, autocommit=True)
        super().__init__(pd)

    def state(self) -> tuple[Any, ...]:
        pd: PgProcessDeployment = self.pd  # type: ignore[assignment]
        out = []
        for role in ("leader", "helper"):
            schema = pd.schemas[role]
            self._conn.execute(f'SET search_path TO "{schema}"')
            out.append(
                (
                    self._conn.execute("SELECT * FROM tasks ORDER BY task_id").fetchall(),
                    self._conn.execute("SELECT * FROM streams ORDER BY stream_id").fetchall(),
                    self._conn.execute("SELECT COUNT(*) FROM reports").fetchone(),
                    self._conn.execute("SELECT COUNT(*) FROM spends").fetchone(),
                    self._conn.execute("SELECT * FROM plans ORDER BY plan_id").fetchall(),
                )
            )
        return tuple(out)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with pg_tagged() as (url, tag):
        pd = PgProcessDeployment(tmp_path_factory.mktemp("hostile_pg"), url, tag).start()
        e: PgEnv | None = None
        try:
            e = PgEnv(pd)
            yield e
        finally:
            pd.stop()
            if e is not None:
                e._conn.close()
