"""What the command line and the servers print: a close names the reports it
dropped, progress lines redraw only on a terminal, a server says which store it
opened and reads its options from a config file, and the help describes the
demo that runs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli_errors import svtagg

from svtagg.deploy.launch import LocalDeployment
from svtagg.proto.tls import write_deployment

USAGE, ENVIRONMENT = 2, 3


def _task(dep: LocalDeployment, task: str, d: int) -> list[str]:
    """Create `task` of dimension d; the analyst's options naming it."""
    common = ["--leader", dep.address("leader"), "--certs", str(dep.certs), "--task", task]
    r = svtagg(
        "analyst", "create-task", *common, "--d", str(d), "--min-batch", "1", "--validity", "none"
    )
    assert r.returncode == 0, r.stderr
    return common


def _upload(dep: LocalDeployment, task: str, rows: Path) -> list[str]:
    return ["client", "upload", "--leader", dep.address("leader"), "--helper",
            dep.address("helper"), "--certs", str(dep.certs), "--task", task,
            "--input", str(rows), "--no-require-validation"]  # fmt: skip


def test_close_reports_the_reports_it_dropped(tmp_path: Path):
    import grpc

    from svtagg.proto import svtagg_pb2 as pb
    from svtagg.proto import svtagg_pb2_grpc as pb_grpc
    from svtagg.proto.tls import Identity, tls_target

    with LocalDeployment(tmp_path / "dep") as dep:
        common = _task(dep, "t", 3)
        rows = tmp_path / "rows.csv"
        rows.write_text("0,1,0\n1,1,0\n0,0,1\n")
        r = svtagg(*_upload(dep, "t", rows), "--quiet")
        assert r.returncode == 0, r.stderr
        # Two reports the leader holds and the helper never saw (a client that
        # died between its two sends): the close must take them out and say so.
        c = Identity.load(dep.certs, "client")
        creds = grpc.ssl_channel_credentials(c.ca, c.key, c.cert)
        with grpc.secure_channel(dep.address("leader"), creds, tls_target("leader")) as ch:
            batch = pb.UploadBatch(task_id="t")
            for _ in range(2):
                batch.reports.add(report_id=os.urandom(16), explicit_share=bytes(8 * 3))
            pb_grpc.IngestStub(ch).Upload(batch, timeout=30)
        r = svtagg("analyst", "close", *common, "--json")
        assert r.returncode == 0, r.stderr
        closed = json.loads(r.stdout)
        assert (closed["n"], closed["dropped_reports"]) == (3, 2), closed
        r = svtagg("analyst", "describe", *common, "--json")
        assert json.loads(r.stdout)["n"] == 3


def test_closing_text_names_dropped_reports():
    from svtagg.deploy.connection import TaskView
    from svtagg.proto import svtagg_pb2 as pb

    info = pb.TaskInfo(spec=pb.TaskSpec(task_id="t", d=3), n=3, dropped_reports=2)
    text = str(TaskView.from_pb(info))
    assert "dropped 2 reports" in text, text
    assert "dropped" not in str(TaskView.from_pb(pb.TaskInfo(spec=info.spec, n=3)))


def test_progress_redraws_only_on_a_terminal():
    from svtagg.experiments.common import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped = io.StringIO()
    bar = Progress(3, "reps", stream=piped)
    for _ in range(3):
        bar.tick("x")
    assert "\r" not in piped.getvalue() and piped.getvalue().count("\n") == 3
    term = Terminal()
    bar = Progress(3, "reps", stream=term)
    for _ in range(3):
        bar.tick()
    assert term.getvalue().count("\r") == 3 and term.getvalue().endswith("\n")


def test_upload_progress_is_not_written_to_a_pipe(tmp_path: Path):
    with LocalDeployment(tmp_path / "dep") as dep:
        _task(dep, "p", 2)
        rows = tmp_path / "rows.csv"
        rows.write_text("0,1\n1,0\n" * 20)
        # Bytes, not text: universal newlines would turn a \r into \n.
        r = subprocess.run(
            [sys.executable, "-m", "svtagg.deploy.cli", *_upload(dep, "p", rows), "--batch", "10"],
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert b"\r" not in r.stderr and b"\r" not in r.stdout, repr(r.stderr)
        assert b"uploaded 40 reports" in r.stdout


def _serve(argv: list[str], cwd: Path, port_file: Path) -> tuple[subprocess.Popen[str], str]:
    """Start `svtagg server argv` in `cwd`; (process, its log so far) once it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "svtagg.deploy.cli", "server", *argv],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start: {proc.communicate()[1]}")
        time.sleep(0.1)
    proc.terminate()
    _, log = proc.communicate(timeout=30)
    return proc, log


def test_server_reads_its_config_file(tmp_path: Path):
    """`svtagg server --config`: options from the [server] table, paths relative to
    the file, the command line winning; the log names the store it opened."""
    folder = tmp_path / "etc"
    write_deployment(folder / "keys")
    cfg = folder / "svtagg.toml"
    cfg.write_text(
        'leader = "localhost:7001"\n'  # an analyst's key in the same file is ignored
        "[server]\n"
        'role = "helper"\n'
        'db = "helper.sqlite"\n'
        'certs = "keys"\n'
        'listen = "127.0.0.1:0"\n'
        'port-file = "helper.port"\n'
        'data-port = "off"\n'
        "rate_limit = 50\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    proc, log = _serve(["--config", str(cfg)], work, folder / "helper.port")
    assert proc.returncode == 0, log
    assert f"helper store: SQLite {folder / 'helper.sqlite'}" in log, log
    assert (folder / "helper.sqlite").exists() and not (work / "helper.sqlite").exists()
    # The command line wins over the file.
    (folder / "helper.port").unlink()
    proc, log = _serve(["--config", str(cfg), "--db", "mine.sqlite"], work,
                       folder / "helper.port")  # fmt: skip
    assert f"helper store: SQLite {work / 'mine.sqlite'}" in log, log


@pytest.mark.parametrize(
    ("table", "rc", "says"),
    [
        ('role = "helper"\ndb = "h.sqlite"\ncerts = "nokeys"\n', ENVIRONMENT,
         "certs from config file"),
        ('role = "helper"\ndb = "h.sqlite"\ncerts = "keys"\nlisten = "notaport"\n', USAGE,
         "listen: expected host:port"),
        ('role = "helper"\nfrobnicate = 1\n', USAGE, "unknown keys frobnicate"),
        ('role = "helper"\nrequire-validation = "yes"\n', USAGE, "true or false"),
        ('role = "scribe"\n', USAGE, "role must be one of leader, helper"),
    ],
)  # fmt: skip
def test_server_config_mistakes(tmp_path: Path, table: str, rc: int, says: str):
    write_deployment(tmp_path / "keys")
    cfg = tmp_path / "svtagg.toml"
    cfg.write_text("[server]\n" + table)
    r = svtagg("server", "--config", str(cfg))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == rc and len(lines) == 1, r.stderr
    assert says in lines[0] and str(cfg) in lines[0], lines[0]
    assert not (tmp_path / "h.sqlite").exists()


def test_help_describes_the_default_demo():
    top = svtagg("--help").stdout
    demo = svtagg("demo", "--help").stdout
    for text in (top, demo):
        assert "about a minute" not in text and "top-5" not in text
    assert "model selection" in top
    assert "model-selection" in demo


def test_services_quick_start_describes_the_default_demo():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "services.md").read_text()
    quick = docs.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    default = quick.split("svtagg demo ", 1)[1].split("svtagg demo --scenario", 1)[0]
    assert "model selection" in default and "top-5" not in default, default
    assert "scan (" in docs.split("#    algorithms:", 1)[1].split("```", 1)[0]


def test_store_named_without_its_password():
    pytest.importorskip("psycopg")
    from svtagg.servers.cli import describe_store

    text = describe_store("postgresql://svtagg:s3cret@db.example:5432/leader")
    assert text == "PostgreSQL postgresql://svtagg:***@db.example:5432/leader"
    assert describe_store("rel/leader.sqlite") == f"SQLite {Path('rel/leader.sqlite').resolve()}"
