"""In CI (`CI=true`) a PostgreSQL that cannot be had fails the run, both in
`.ci/run` and in the test suite; elsewhere its tests skip, with one line saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PG_TEST = "tests/test_store_contract.py::test_create_and_read_tasks[postgres]"


def _pytest(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SVTAGG_TEST_POSTGRES")}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PG_TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_postgres_the_suite_fails_in_ci_and_skips_elsewhere_saying_why():
    ci = _pytest({"CI": "true"})
    assert ci.returncode != 0, ci.stdout
    assert "CI=true" in ci.stdout + ci.stderr and "SVTAGG_TEST_POSTGRES is not set" in (
        ci.stdout + ci.stderr
    )
    local = _pytest({})
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 skipped" in local.stdout
    why = [line for line in local.stdout.splitlines() if line.startswith("PostgreSQL tests")]
    assert len(why) == 1 and "SVTAGG_TEST_POSTGRES is not set" in why[0], local.stdout


def test_ci_run_fails_when_postgres_cannot_be_started(tmp_path: Path):
    """`.ci/run` stops before installing anything when the server does not start."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    # start_postgres.sh's contract on failure: nothing on stdout, why on stderr, exit 0.
    (tmp_path / "scripts" / "start_postgres.sh").write_text(
        '[ "${1:-}" = --stop ] || echo "start_postgres: no initdb" >&2\n'
    )
    env = {**os.environ, "CI": "true"}
    run = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "PostgreSQL" in run.stderr and "CI=true" in run.stderr, run.stderr
    assert not (tmp_path / ".venv").exists()
