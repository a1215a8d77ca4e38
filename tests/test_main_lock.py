"""One main process per store: a second leader or helper main process on the
same SQLite file or PostgreSQL schema is refused in one line naming the store
and the process holding it; ingest replicas and workers (PostgreSQL) are not
main processes and start beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Deployment

from svtagg.proto.tls import Identity
from svtagg.proto.vocab import Role
from svtagg.servers.service import ProcessKind, ServerConfig, SvtaggServer


def _config(role: str, db: str, certs: Path, kind: ProcessKind = ProcessKind.MAIN) -> ServerConfig:
    return ServerConfig(
        Role(role),
        db,
        Identity.load(certs, role),
        "127.0.0.1:0",
        helper_address="127.0.0.1:1" if role == "leader" else None,
        data_port=None,
        kind=kind,
    )


async def test_a_second_main_process_on_a_sqlite_store_is_refused(
    deployment: Deployment, certs: Path
):
    db = str(deployment.root / "helper.sqlite")
    with pytest.raises(OSError, match=rf"store {db} is in use by another helper main process") as e:
        SvtaggServer(_config("helper", db, certs))
    assert f"pid {os.getpid()}" in str(e.value)
    # the same file named through a symbolic link is the same store
    link = deployment.root / "link.sqlite"
    link.symlink_to(db)
    with pytest.raises(OSError, match="is in use by another helper main process"):
        SvtaggServer(_config("helper", str(link), certs))
    # the refusal changed nothing: the first server serves on, and once it
    # stops, the store can be opened again
    await deployment.stop()
    again = SvtaggServer(_config("helper", db, certs))
    await again.start()
    await again.stop(0.1)


def test_the_command_line_refuses_in_one_line_with_exit_3(certs: Path, tmp_path: Path):
    from svtagg.servers.store.mainlock import hold_main_lock

    db = tmp_path / "leader.sqlite"
    lock = hold_main_lock(str(db), "leader")
    try:
        env = {**os.environ, "SVTAGG_CONFIG": ""}
        run = subprocess.run(
            [sys.executable, "-m", "svtagg.deploy.cli", "server", "--role", "leader",
             "--db", str(db), "--certs", str(certs), "--helper", "127.0.0.1:1",
             "--listen", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    finally:
        lock.release()
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 3, run.stderr
    assert len(lines) == 1 and "in use by another leader main process" in lines[0], run.stderr


async def test_a_second_main_process_on_a_postgres_store_is_refused(
    pg_url: tuple[str, str], certs: Path, monkeypatch: pytest.MonkeyPatch
):
    from svtagg.servers.store import mainlock

    monkeypatch.setattr(mainlock, "PG_LOCK_WAIT", 0.5)
    url, tag = pg_url
    monkeypatch.setenv("PGOPTIONS", f"-csearch_path=main_{tag}")
    first = SvtaggServer(_config("helper", url, certs))
    await first.start()
    try:
        with pytest.raises(OSError, match=rf"schema main_{tag}.* is in use by another") as e:
            SvtaggServer(_config("helper", url, certs))
        assert f"pid {os.getpid()}" in str(e.value)
        # an ingest replica is not a main process
        replica = SvtaggServer(_config("helper", url, certs, ProcessKind.INGEST_REPLICA))
        await replica.start()
        await replica.stop(0.1)
        # another schema is another store
        monkeypatch.setenv("PGOPTIONS", f"-csearch_path=other_{tag}")
        other = SvtaggServer(_config("helper", url, certs))
        await other.start()
        await other.stop(0.1)
        monkeypatch.setenv("PGOPTIONS", f"-csearch_path=main_{tag}")
    finally:
        await first.stop(0.1)
    again = SvtaggServer(_config("helper", url, certs))
    await again.start()
    await again.stop(0.1)
