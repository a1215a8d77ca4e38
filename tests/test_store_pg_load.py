"""The load smoke (tests/test_load.py, `svtagg.benchmarks.bench_load`) with both
server processes on PostgreSQL stores: concurrent uploader processes, then
concurrent analyst streams; nothing lost (n on both servers == acknowledged
uploads, S_L + S_H == the plaintext sum, read from the PostgreSQL stores) and
no wrong answer.  Skips without a reachable server (SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import pg_tagged
from test_store_pg_reliability import pg_store_view

from svtagg.benchmarks import bench_load
from svtagg.benchmarks.storeview import StoreView
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment


class PgLocalDeployment(LocalDeployment):
    """LocalDeployment whose servers keep their stores in PostgreSQL schemas
    (`schemas` is set before `start`)."""

    schemas: dict[str, str]

    def start_role(
        self, role: str, timeout: float = 30.0, env: dict[str, str] | None = None
    ) -> None:
        env = {**(env or {}), "PGOPTIONS": f"-csearch_path={self.schemas[role]}"}
        super().start_role(role, timeout, env)


def test_load_smoke_on_postgres(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(
        tmp_path,
        monkeypatch,
        uploaders=4,
        reports=100,
        batch=25,
        d=8,
        streams=8,
        stream_workers=4,
        tasks=2,
    )


@pytest.mark.heavy
def test_load_heavy_on_postgres(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(
        tmp_path,
        monkeypatch,
        uploaders=32,
        reports=1000,
        batch=50,
        d=32,
        streams=256,
        stream_workers=32,
        tasks=16,
    )


def _check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: int) -> None:
    with pg_tagged() as (url, tag):
        _check_on(url, tag, tmp_path, monkeypatch, **kw)


def _check_on(
    url: str, tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: int
) -> None:
    schemas = {r: f"{r}_{tag}" for r in ("leader", "helper")}

    def view(path: str | Path, task_id: str) -> StoreView:
        return pg_store_view(url, schemas[Path(path).stem], task_id)

    monkeypatch.setattr(bench_load, "store_view", view)
    dep = PgLocalDeployment(tmp_path, server_args=[*UNCAPPED_SERVER_ARGS, "--db", url])
    dep.schemas = schemas
    with dep:
        r: Any = bench_load.run_load(dep, **kw)
    print("\n" + bench_load.summary(r))
    assert not r.lost(), bench_load.summary(r)
    assert r.wrong_answers == 0 and r.stream_errors == 0, bench_load.summary(r)
    assert not list(tmp_path.glob("*.sqlite*"))  # the stores were PostgreSQL's
