"""Upload batches the servers take: a task's batch holds at most what its
reports' size allows (`Validity.batch_limit`, the servers' own rule), so a
`range` task of large d is sent in smaller batches instead of one message the
transport refuses; a task whose single report does not fit is refused in one
line before anything is read or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Deployment, off_loop, store_view

from svtagg.client.upload import Uploader
from svtagg.deploy.cli import main
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
from svtagg.vdaf.validity import parse_validity

#: The issue's task: range proofs at d = 1,000, where one report's leader share
#: is ~285 kB, so the default --batch 1000 made one ~285 MB message.
D, ROWS = 1000, 240
LIMIT = parse_validity("range", D, 16).batch_limit(
    MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
)


def _range_task(dep: Deployment, task: str, d: int = D) -> None:
    spec = pb.TaskSpec(
        task_id=task, d=d, frac_bits=16, n_max=100_000, min_batch=1, epsilon_total="1",
        delta_total="0", epsilon_min="1/100", validity="range",
    )  # fmt: skip
    dep.analyst_stub().CreateTask(spec, timeout=10)


def _values() -> np.ndarray:
    return np.random.default_rng(11).random((ROWS, D)).round(3)


def _held(dep: Deployment, task: str) -> tuple[int, int]:
    return tuple(store_view(dep.root / f"{r}.sqlite", task).n for r in ("leader", "helper"))  # type: ignore[return-value]


def test_the_default_batch_is_above_the_limit_at_d_1000():
    # The tests below are about something only if the default batch is too big.
    assert 0 < LIMIT < ROWS < 1000


async def test_cli_sends_a_large_range_task_in_batches_it_takes(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """`svtagg client upload` with the default --batch to a range task of
    d = 1,000: batches of at most the task's limit (said once on stderr), every
    row held by both servers, instead of 'Sent message larger than max'."""
    import json

    path = tmp_path / "wide.csv"
    np.savetxt(path, _values(), delimiter=",", fmt="%.3f")

    def run() -> int:
        _range_task(deployment, "wide")
        return main(
            ["client", "upload", "--leader", deployment.leader_addr, "--helper",
             deployment.helper_addr, "--certs", str(deployment.certs), "--task", "wide",
             "--input", str(path), "--json"]
        )  # fmt: skip

    rc = await off_loop(run)
    out, err = capsys.readouterr()
    assert rc == 0, err
    result = json.loads(out)
    assert (result["batch"], result["batches"]) == (LIMIT, -(-ROWS // LIMIT)), result
    assert (result["leader_rows"], result["helper_rows"]) == (ROWS, ROWS)
    notices = [line for line in err.splitlines() if "--batch 1,000" in line]
    assert len(notices) == 1 and f"sending batches of {LIMIT}" in notices[0], err
    assert _held(deployment, "wide") == (ROWS, ROWS)


async def test_the_sdk_sizes_batches_from_the_circuit(deployment: Deployment):
    """`Uploader.upload` with batch_size=1000 (and `upload_blocks` with one
    block of every row) to the same kind of task: no batch above the limit."""
    values = _values()
    sizes: list[int] = []

    def run() -> tuple[int, int]:
        _range_task(deployment, "sdk")
        with deployment.uploader() as up:
            real = up._submit

            def spy(batch: Any, which: tuple[int, ...] = (0, 1)) -> Any:
                sizes.append(len(batch))
                return real(batch, which)

            up._submit = spy  # type: ignore[method-assign]
            first = up.upload("sdk", values, batch_size=1000, require_validation=True)
            second = up.upload_blocks("sdk", [values[:ROWS]])
        return first.reports, second.reports

    assert await off_loop(run) == (ROWS, ROWS)
    assert sizes and max(sizes) <= LIMIT, sizes
    assert _held(deployment, "sdk") == (2 * ROWS, 2 * ROWS)


def test_a_task_whose_one_report_does_not_fit_is_refused_in_one_line(
    certs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    """Range proofs at d = 10^6: one report is larger than a message.  (Servers
    refuse to create such a task, so the leader's answer is played here.)  The
    upload says so in one line, exit 2, before reading the input or writing a
    journal."""
    spec = pb.TaskSpec(task_id="huge", d=1_000_000, frac_bits=16, validity="range")
    monkeypatch.setattr(Uploader, "task", lambda self, task_id: pb.TaskInfo(spec=spec))
    path = tmp_path / "huge.csv"
    path.write_text("0.5\n")
    rc = main(
        ["client", "upload", "--leader", "127.0.0.1:1", "--helper", "127.0.0.1:2",
         "--certs", str(certs), "--task", "huge", "--input", str(path)]
    )  # fmt: skip
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "one report of d=1,000,000 with range proofs" in lines[0], err
    assert "no client can upload to it" in lines[0], err
    assert not list(tmp_path.glob("*.json")), "a journal was written"
