"""Idempotent uploads: report ids and share seeds derive from a per-upload key
kept in a local journal and the row number, so a rerun of the same upload is
refused, a resume after an interrupt sends only what may be missing, and a
batch one server already holds is refused there as already held: every user
counts once on both servers, and S_L + S_H stays the plaintext sum."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from conftest import Deployment, encoded_sum, make_task, off_loop, store_view

from svtagg.client.upload import Uploader, UploadKey, make_batch
from svtagg.deploy.cli import main
from svtagg.mpc.sharing import expand_seed
from svtagg.proto import svtagg_pb2 as pb

ROWS, D, BATCH = 30, 3, 8


def _data(tmp_path: Path) -> tuple[Path, np.ndarray]:
    values = np.random.default_rng(5).random((ROWS, D))
    path = tmp_path / "users.csv"
    path.write_text("".join(",".join(repr(float(v)) for v in row) + "\n" for row in values))
    return path, values


def _upload(dep: Deployment, path: Path, *extra: str) -> int:
    return main(
        ["client", "upload", "--leader", dep.leader_addr, "--helper", dep.helper_addr,
         "--certs", str(dep.certs), "--task", "t", "--input", str(path),
         "--batch", str(BATCH), "--quiet", "--no-require-validation", *extra]
    )  # fmt: skip


def _held(dep: Deployment) -> tuple[int, int, np.ndarray]:
    lead, help_ = (store_view(dep.root / f"{r}.sqlite", "t") for r in ("leader", "helper"))
    return lead.n, help_.n, lead.sums + help_.sums


def test_keyed_batches_are_reproducible_and_reconstruct():
    values = np.random.default_rng(1).random((4, D))
    key = UploadKey.new()
    a, b = make_batch("t", values, 16, key, 10), make_batch("t", values, 16, key, 10)
    assert [r.report_id for r in a.leader.reports] == [r.report_id for r in b.leader.reports]
    assert [r.seed for r in a.helper.reports] == [r.seed for r in b.helper.reports]
    assert a.leader.reports[0].explicit_share == b.leader.reports[0].explicit_share
    # row numbers, not positions in the batch, name the reports
    c = make_batch("t", values[1:], 16, key, 11)
    assert c.leader.reports[0].report_id == a.leader.reports[1].report_id
    other = make_batch("t", values, 16, UploadKey.new(), 10)
    assert not {r.report_id for r in other.leader.reports} & {r.report_id for r in a.leader.reports}
    ids = [r.report_id for r in a.leader.reports]
    seeds = [r.seed for r in a.helper.reports]
    assert len(set(ids)) == 4 and not set(ids) & set(seeds)
    for lr, hr, row in zip(a.leader.reports, a.helper.reports, values, strict=True):
        total = np.frombuffer(lr.explicit_share, "<u8") + expand_seed(hr.seed, D)
        assert np.array_equal(total, encoded_sum(row, 16))


def test_a_row_sent_again_with_another_value_gets_another_seed():
    """Same key, same row number, another value (an input rewritten under a
    resume): the id stays (the batch reads as held), the seed does not, so the
    leader's two explicit shares are masked by independent pads."""
    values = np.random.default_rng(2).random((3, D))
    changed = values.copy()
    changed[1, 0] = 1.0 - changed[1, 0]
    key = UploadKey.new()
    a, b = make_batch("t", values, 16, key, 0), make_batch("t", changed, 16, key, 0)
    assert [r.report_id for r in a.leader.reports] == [r.report_id for r in b.leader.reports]
    seeds_a = [r.seed for r in a.helper.reports]
    seeds_b = [r.seed for r in b.helper.reports]
    assert seeds_a[0] == seeds_b[0] and seeds_a[2] == seeds_b[2]
    assert seeds_a[1] != seeds_b[1]
    # one seed under two values would leave exactly the values' difference
    pads_differ = np.frombuffer(a.leader.reports[1].explicit_share, "<u8") - np.frombuffer(
        b.leader.reports[1].explicit_share, "<u8"
    )
    assert not np.array_equal(pads_differ, encoded_sum(values[1], 16) - encoded_sum(changed[1], 16))


async def test_a_rerun_of_the_same_upload_counts_nobody_twice(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, values = _data(tmp_path)

    def run() -> tuple[int, int, int]:
        make_task(deployment.analyst_stub(), "t", d=D)
        first = _upload(deployment, path)
        second = _upload(deployment, path)
        resumed = _upload(deployment, path, "--resume")
        return first, second, resumed

    assert await off_loop(run) == (0, 2, 0)
    err = capsys.readouterr().err
    assert "already uploaded to task 't'" in err and "nothing sent" in err
    n_l, n_h, sums = _held(deployment)
    assert (n_l, n_h) == (ROWS, ROWS)
    assert np.array_equal(sums, encoded_sum(values, 16))
    journal = next(tmp_path.glob("users.csv.*.json"))
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600  # it holds the upload's key
    assert json.loads(journal.read_text())["leader_rows"] == ROWS


class _InterruptedAnswer:
    """A server's stub whose `stop_at`-th answer never comes: waiting for it is
    interrupted (Ctrl-C).  `delivered`: the server stored that batch first (its
    answer was lost), else the batch never reached it."""

    def __init__(self, real: Any, stop_at: int, delivered: bool) -> None:
        self.real, self.calls, self.stop_at, self.delivered = real, 0, stop_at, delivered

    def future(self, msg: Any, timeout: float) -> Any:
        self.calls += 1
        if self.calls == self.stop_at:
            if self.delivered:
                self.real.future(msg, timeout=timeout).result()

            def interrupt() -> None:
                raise KeyboardInterrupt

            return SimpleNamespace(result=interrupt)
        return self.real.future(msg, timeout=timeout)


@pytest.mark.parametrize(
    ("server", "held"),
    [
        # the helper never got batch 3: the leader acknowledged 3 batches, the helper 2
        ("helper", "the leader holds 24 and the helper 16"),
        # the leader stored batch 3 but its answer was lost: the resume sends it
        # again and the leader refuses it as already held
        ("leader", "the leader holds 16 and the helper 16"),
    ],
)
async def test_an_interrupted_upload_says_what_is_held_and_resumes(
    server: str,
    held: str,
    deployment: Deployment,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    path, values = _data(tmp_path)
    real_init = Uploader.__init__

    def interrupting_init(self: Uploader, *a: Any, **kw: Any) -> None:
        real_init(self, *a, **kw)
        i = 0 if server == "leader" else 1
        real = self._stubs[i]
        self._stubs[i] = SimpleNamespace(
            Upload=_InterruptedAnswer(real.Upload, 3, i == 0), GetTask=real.GetTask
        )

    def run() -> tuple[int, int, int]:
        make_task(deployment.analyst_stub(), "t", d=D)
        with monkeypatch.context() as m:
            m.setattr(Uploader, "__init__", interrupting_init)
            interrupted = _upload(deployment, path)
        return interrupted, _upload(deployment, path), _upload(deployment, path, "--resume")

    interrupted = await off_loop(run)
    err = capsys.readouterr().err
    assert interrupted == (130, 2, 0), err
    line = next(x for x in err.splitlines() if x.startswith("interrupted: "))
    assert f"{held} of this upload's 30 rows" in line, line
    assert "--resume" in line
    # A rerun without --resume is refused, saying both ways on and what each costs.
    rerun = next(x for x in err.splitlines() if "was interrupted" in x)
    assert "--resume continues it" in rerun, rerun
    journal = tmp_path / "users.csv.upload-t.json"
    assert f"delete {journal}: the 16 rows both servers hold would then count twice" in rerun
    n_l, n_h, sums = _held(deployment)
    assert (n_l, n_h) == (ROWS, ROWS)
    assert np.array_equal(sums, encoded_sum(values, 16))

    def close() -> int:
        stub = deployment.analyst_stub()
        stub.CloseCollection(pb.TaskRef(task_id="t"), timeout=10)
        return int(stub.DescribeTask(pb.TaskRef(task_id="t"), timeout=10).n)

    assert await off_loop(close) == ROWS  # the servers agree: nothing dropped


async def test_resume_refuses_a_changed_input_and_a_missing_journal(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, _ = _data(tmp_path)

    def run() -> tuple[int, int]:
        make_task(deployment.analyst_stub(), "t", d=D)
        missing = _upload(deployment, path, "--resume")
        journal = tmp_path / "j.json"
        assert _upload(deployment, path, "--journal", str(journal)) == 0
        path.write_text(path.read_text().replace("0.", "0.0", 1))
        return missing, _upload(deployment, path, "--journal", str(journal), "--resume")

    assert await off_loop(run) == (2, 2)
    err = capsys.readouterr().err
    assert "no upload journal" in err and "changed since" in err
    # ... and how to start over, at what cost: the rows of the old file count already
    changed = next(line for line in err.splitlines() if "changed since" in line)
    assert f"delete {tmp_path / 'j.json'}" in changed, changed
    assert f"the {ROWS} rows both servers hold would then count twice" in changed, changed
    assert _held(deployment)[:2] == (ROWS, ROWS)


async def test_the_task_s_embedding_is_used_when_none_is_given(
    deployment: Deployment, tmp_path: Path
):
    cats = tmp_path / "cats.csv"
    cats.write_text("".join(f"{i % 4}\n" for i in range(ROWS)))
    sm = tmp_path / "sm.csv"
    sm.write_text("".join(f"{(i % 5) - 2},0.5,-1\n" for i in range(ROWS)))

    def run() -> tuple[int, int, int]:
        stub = deployment.analyst_stub()
        for task, d, emb in (("hh", 4, "heavy_hitters"), ("sm", 3, "sparse_mean")):
            spec = pb.TaskSpec(
                task_id=task, d=d, frac_bits=16, n_max=1000, min_batch=1, epsilon_total="1",
                delta_total="1/1000", epsilon_min="1/100", embedding=emb,
            )  # fmt: skip
            stub.CreateTask(spec, timeout=10)
        common = ["client", "upload", "--leader", deployment.leader_addr, "--helper",
                  deployment.helper_addr, "--certs", str(deployment.certs), "--quiet",
                  "--no-require-validation"]  # fmt: skip
        hh = main([*common, "--task", "hh", "--input", str(cats), "--format", "categories"])
        smr = main([*common, "--task", "sm", "--input", str(sm), "--param", "clip=2"])
        # heavy_hitters has two formats: one must still be chosen
        hh_no_format = main([*common, "--task", "hh", "--input", str(cats), "--journal",
                             str(tmp_path / "other.json")])  # fmt: skip
        return hh, smr, hh_no_format

    assert await off_loop(run) == (0, 0, 2)
    assert store_view(deployment.root / "helper.sqlite", "hh").n == ROWS
    assert store_view(deployment.root / "helper.sqlite", "sm").n == ROWS


async def test_ctrl_c_in_a_real_upload_then_resume(deployment: Deployment, tmp_path: Path):
    """SIGINT to a `svtagg client upload` process mid-upload: exit 130 with what
    each server holds; the resume completes it, every row counted once."""
    import asyncio
    import os
    import signal
    import sys
    import time

    rows = 20_000  # long enough that the signal lands mid-upload on a loaded machine
    values = np.random.default_rng(9).random((rows, 2)).round(3)
    path = tmp_path / "big.csv"
    np.savetxt(path, values, delimiter=",", fmt="%.3f")
    journal = tmp_path / "big.csv.upload-t.json"
    await off_loop(make_task, deployment.analyst_stub(), "t", 2)
    args = [sys.executable, "-m", "svtagg.deploy.cli", "client", "upload",
            "--leader", deployment.leader_addr, "--helper", deployment.helper_addr,
            "--certs", str(deployment.certs), "--task", "t", "--input", str(path),
            "--batch", "50", "--quiet", "--no-require-validation"]  # fmt: skip
    # PYTHONFAULTHANDLER: a client that hangs is made to say where (SIGABRT below).
    env = {**os.environ, "SVTAGG_CONFIG": "", "PYTHONFAULTHANDLER": "1"}
    # As a terminal's Ctrl-C finds it: SIGINT handled, even when this test runs
    # under a shell that ignores it (a job started with `&` in a script does, and
    # a process keeps an ignored SIGINT ignored across exec).
    proc = await asyncio.create_subprocess_exec(
        *args,
        env=env,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen, started = 0, time.monotonic()
    for _ in range(600):  # until a few batches are held
        await asyncio.sleep(0.05)
        if journal.exists():
            seen = json.loads(journal.read_text() or "{}").get("leader_rows", 0)
            if seen:
                break
    signalled = f"SIGINT after {time.monotonic() - started:.1f} s, the journal then at {seen} rows"
    if proc.returncode is not None:  # it ended before the signal: say how, not ProcessLookupError
        _, err = await proc.communicate()
        raise AssertionError(
            f"the upload exited ({proc.returncode}) before the SIGINT ({signalled}):\n"
            + err.decode()
        )
    proc.send_signal(signal.SIGINT)
    try:  # an interrupted client must end promptly, never hang in its cleanup
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 10)
        except TimeoutError:
            proc.kill()
            err = b""
        raise AssertionError(
            "the interrupted upload did not exit within 60 s; its threads:\n" + err.decode()
        ) from None
    text = err.decode()
    assert proc.returncode == 130, (signalled, text)
    assert "interrupted: the leader holds" in text and "--resume" in text, text
    held = json.loads(journal.read_text())
    assert 0 < held["leader_rows"] < rows, held
    resumed = await asyncio.create_subprocess_exec(
        *args, "--resume", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(resumed.communicate(), 120)
    assert resumed.returncode == 0, err.decode()
    n_l, n_h, sums = _held(deployment)
    assert (n_l, n_h) == (rows, rows)
    assert np.array_equal(sums, encoded_sum(values, 16))


def _journal_cases(good: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, journal text): journals this client never writes."""

    def edited(**fields: Any) -> str:
        return json.dumps({**good, **fields})

    text = json.dumps(good)
    return [
        ("negative counts", edited(leader_rows=-5, helper_rows=-5)),
        ("a count as text", edited(rows=str(ROWS))),
        ("a count as a bool", edited(helper_rows=True)),
        ("more held than rows", edited(leader_rows=ROWS + 8)),
        ("a batch of 0", edited(options={**good["options"], "batch": 0})),
        ("a key that is not hex", edited(key="zz" * 32)),
        ("options not an object", edited(options=[])),
        ("a field missing", json.dumps({k: v for k, v in good.items() if k != "rows"})),
        ("truncated", text[: len(text) // 2]),
        ("not an object", "[1, 2]"),
        ("empty", ""),
    ]


async def test_a_damaged_journal_is_one_line_naming_it_and_how_to_start_over(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A journal edited or cut short (negative or mistyped counts, truncated
    JSON): with or without --resume, exit 2 and one line naming the journal and
    how to start over, never a traceback; nothing is sent."""
    path, _ = _data(tmp_path)
    journal = tmp_path / "users.csv.upload-t.json"

    def run() -> list[tuple[str, int, int]]:
        make_task(deployment.analyst_stub(), "t", d=D)
        assert _upload(deployment, path) == 0
        capsys.readouterr()
        good = json.loads(journal.read_text())
        out = []
        for name, text in _journal_cases(good):
            journal.write_text(text)
            out.append((name, _upload(deployment, path), _upload(deployment, path, "--resume")))
        return out

    results = await off_loop(run)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert [(name, 2, 2) for name, *_ in results] == results, err
    assert len(lines) == 2 * len(results), err  # one line per run
    for line in lines:
        assert f"upload journal {journal} is unreadable or damaged" in line, line
        assert "delete it (or pass another --journal)" in line, line
    assert _held(deployment)[:2] == (ROWS, ROWS)  # nothing sent again


async def test_a_resume_that_finds_everything_held_says_so(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Every batch already held (the answers were lost, so the journal never
    heard): the resume says that nothing was left to send, not "uploaded 30
    reports", and prints no n of the servers' answers (which withhold the
    task's count from clients).  --json gives the rows each server
    acknowledged and how many of them this run stored (none)."""
    from svtagg.client.journal import UploadJournal

    path, values = _data(tmp_path)
    journal = tmp_path / "users.csv.upload-t.json"

    def forget_acknowledgements() -> None:
        recorded = UploadJournal.load(journal)
        recorded.leader_rows = recorded.helper_rows = 0
        recorded.save(journal)

    def run() -> tuple[int, ...]:
        make_task(deployment.analyst_stub(), "t", d=D)
        first = _upload(deployment, path)
        capsys.readouterr()
        forget_acknowledgements()
        text = _upload(deployment, path, "--resume")
        forget_acknowledgements()
        as_json = _upload(deployment, path, "--resume", "--json")
        finished = _upload(deployment, path, "--resume")  # the journal says: all held
        return first, text, as_json, finished

    assert await off_loop(run) == (0, 0, 0, 0)
    out = capsys.readouterr().out.splitlines()
    nothing = f"nothing left to send: all {ROWS} rows were already held by both servers"
    assert out[0].startswith(nothing) and out[2].startswith(nothing), out
    assert not any("n=" in line for line in out), out
    result = json.loads(out[1])
    assert "leader_n" not in result and "helper_n" not in result, result
    assert (result["leader_rows"], result["helper_rows"]) == (ROWS, ROWS), result
    assert (result["leader_stored"], result["helper_stored"]) == (0, 0), result
    n_l, n_h, sums = _held(deployment)
    assert (n_l, n_h) == (ROWS, ROWS)
    assert np.array_equal(sums, encoded_sum(values, 16))


async def test_a_bad_row_is_named_and_leaves_no_journal(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A row of 4 categories for a multihot:3 task, after four good batches:
    refused with its line number (the header counts) before the journal is
    written and before any report is sent; once the file is fixed the upload
    just runs."""
    rows = ["0,1"] * 9
    rows[5] = "0,1,2,3"  # line 7 of the file, after the header
    path = tmp_path / "items.csv"
    path.write_text("items\n" + "\n".join(rows) + "\n")
    argv = ["client", "upload", "--leader", deployment.leader_addr, "--helper",
            deployment.helper_addr, "--certs", str(deployment.certs), "--task", "mh",
            "--input", str(path), "--embedding", "heavy_hitters", "--format", "categories",
            "--header", "--batch", "2", "--quiet"]  # fmt: skip

    def held() -> tuple[int, int]:
        lead, help_ = (
            store_view(deployment.root / f"{r}.sqlite", "mh") for r in ("leader", "helper")
        )
        return lead.n, help_.n

    def run() -> tuple[int, tuple[int, int], bool, int]:
        spec = pb.TaskSpec(
            task_id="mh", d=4, frac_bits=16, n_max=1000, min_batch=1, epsilon_total="1",
            delta_total="0", epsilon_min="1/100", validity="multihot:3",
        )  # fmt: skip
        deployment.analyst_stub().CreateTask(spec, timeout=10)
        refused = main(argv)
        before = held()
        journal = any(tmp_path.glob("items.csv.upload-*"))
        rows[5] = "0,1,2"
        path.write_text("items\n" + "\n".join(rows) + "\n")
        return refused, before, journal, main(argv)

    refused, before, journal, fixed = await off_loop(run)
    err = capsys.readouterr().err
    assert (refused, before, journal, fixed) == (2, (0, 0), False, 0), err
    line = next(x for x in err.splitlines() if x.startswith("svtagg: bad input"))
    assert "row 7 holds 4 categories" in line and "multihot:3" in line, line
    assert held() == (9, 9)


async def test_a_resume_with_batches_above_the_task_s_limit_says_how_to_start_over(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A journal of an earlier client that recorded batches of 1,000 reports for
    a range task of d = 1,000 (one message each: refused by the transport, so no
    row is held): a resume cannot cut the rows otherwise, so it is refused in one
    line saying which file to delete; after that the upload runs."""
    from svtagg.client.journal import UploadJournal, fingerprint
    from svtagg.proto.vocab import MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
    from svtagg.vdaf.validity import parse_validity

    d, rows = 1000, 240
    limit = parse_validity("range", d, 16).batch_limit(
        MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
    )
    path = tmp_path / "wide.csv"
    np.savetxt(path, np.random.default_rng(4).random((rows, d)), delimiter=",", fmt="%.3f")
    journal = tmp_path / "wide.csv.upload-w.json"
    options = {"d": d, "embedding": None, "format": "matrix", "params": {}, "clip": False,
               "header": False, "delimiter": ",", "batch": 1000}  # fmt: skip
    UploadJournal("w", str(path), *fingerprint(path), options, rows).create(journal)
    argv = ["client", "upload", "--leader", deployment.leader_addr, "--helper",
            deployment.helper_addr, "--certs", str(deployment.certs), "--task", "w",
            "--input", str(path), "--quiet"]  # fmt: skip

    def run() -> tuple[int, int]:
        spec = pb.TaskSpec(
            task_id="w", d=d, frac_bits=16, n_max=1000, min_batch=1, epsilon_total="1",
            delta_total="0", epsilon_min="1/100", validity="range",
        )  # fmt: skip
        deployment.analyst_stub().CreateTask(spec, timeout=10)
        resumed = main([*argv, "--resume"])
        journal.unlink()  # as the message says
        return resumed, main(argv)

    assert await off_loop(run) == (2, 0)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert (
        f"records batches of 1,000 reports, more than one batch of task 'w' may hold ({limit})"
        in lines[0]
    )
    assert f"to start over, delete {journal} (no row of it is held by both servers" in lines[0]
    assert json.loads(journal.read_text())["options"]["batch"] == limit
    held = [store_view(deployment.root / f"{r}.sqlite", "w").n for r in ("leader", "helper")]
    assert held == [rows, rows]
