"""Bounded load (issue 6) through `svtagg.benchmarks.bench_load`: concurrent
uploader processes, then concurrent analyst streams on different tasks, on two
server processes.  Nothing may be lost (n on both servers == acknowledged
uploads; S_L + S_H == the plaintext encoded sum, read from the stores) and no
stream may answer wrong under the deterministic query design.  The default run
is a smoke (4 uploaders); `pytest -m heavy` holds 32 uploaders and 256 streams
and prints the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from svtagg.benchmarks.bench_load import run_load, summary
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment


def _check(tmp_path: Path, **kw: int) -> None:
    with LocalDeployment(tmp_path, server_args=UNCAPPED_SERVER_ARGS) as dep:
        r = run_load(dep, **kw)
    print("\n" + summary(r))
    assert not r.lost(), summary(r)
    assert r.wrong_answers == 0 and r.stream_errors == 0, summary(r)


def test_load_smoke(tmp_path: Path):
    _check(tmp_path, uploaders=4, reports=100, batch=25, d=8, streams=8, stream_workers=4, tasks=2)


@pytest.mark.heavy
def test_load_heavy(tmp_path: Path):
    _check(
        tmp_path,
        uploaders=32,
        reports=1000,
        batch=50,
        d=32,
        streams=256,
        stream_workers=32,
        tasks=16,
    )
