"""Bad invocations of the real `svtagg` command line (a subprocess, as an operator
runs it) against a running two-server deployment: each must end with its
documented exit code, exactly one line on stderr, no traceback, and nothing
created or uploaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from svtagg.deploy.launch import LocalDeployment
from svtagg.proto.tls import write_deployment

REFUSED, USAGE, ENVIRONMENT, UNREACHABLE = 1, 2, 3, 4


def svtagg(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `svtagg` command line in a subprocess, as an operator runs it."""
    import os

    return subprocess.run(
        [sys.executable, "-m", "svtagg.deploy.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


@dataclass
class Env:
    dep: LocalDeployment
    root: Path

    @property
    def leader(self) -> str:
        return self.dep.address("leader")

    @property
    def helper(self) -> str:
        return self.dep.address("helper")

    @property
    def certs(self) -> str:
        return str(self.dep.certs)

    def analyst(self, command: str, *argv: str) -> list[str]:
        return ["analyst", command, "--leader", self.leader, "--certs", self.certs, *argv]

    def upload(self, task: str, path: Path, *argv: str, certs: str | None = None) -> list[str]:
        return [
            "client",
            "upload",
            "--leader",
            self.leader,
            "--helper",
            self.helper,
            "--certs",
            certs or self.certs,
            "--task",
            task,
            "--input",
            str(path),
            "--quiet",
            "--no-require-validation",  # these tasks take plain shares
            *argv,
        ]

    def n(self, task: str) -> int:
        out = svtagg(*self.analyst("describe", "--task", task, "--json"))
        assert out.returncode == 0, out.stderr
        return int(json.loads(out.stdout)["n"])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("cli")
    with LocalDeployment(root / "dep") as dep:
        e = Env(dep, root)
        for task, d in (("m", 5), ("hh", 5), ("sm", 3)):
            r = svtagg(*e.analyst("create-task", "--task", task, "--d", str(d), "--min-batch", "1"))
            assert r.returncode == 0, r.stderr
        # A task that records its clients' embedding.
        r = svtagg(
            *e.analyst(
                "create-task",
                "--task",
                "hhe",
                "--d",
                "5",
                "--min-batch",
                "1",
                "--embedding",
                "heavy_hitters",
            )
        )
        assert r.returncode == 0, r.stderr
        yield e


def _check(r: subprocess.CompletedProcess[str], rc: int, pattern: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == rc, f"rc {r.returncode} != {rc}; stderr: {r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}: {r.stderr}"
    assert pattern.lower() in lines[0].lower(), f"{pattern!r} not in {lines[0]!r}"


# --------------------------------------------------------------- operator mistakes
def _server_cases(e: Env) -> list[tuple[str, list[str], int, str, list[Path]]]:
    r = e.root
    foreign = r / "foreign"
    if not foreign.exists():
        write_deployment(foreign)
    swapped = r / "swapped"  # a helper directory holding the leader's certificate
    if not swapped.exists():
        shutil.copytree(e.certs, swapped)
        for ext in ("pem", "key"):
            shutil.copy(swapped / f"leader.{ext}", swapped / f"helper.{ext}")
    mixed = r / "mixed"  # the client's certificate, another CA's ca.pem
    if not mixed.exists():
        shutil.copytree(e.certs, mixed)
        shutil.copy(foreign / "ca.pem", mixed / "ca.pem")
    db = r / "new.sqlite"
    port = e.leader.rsplit(":", 1)[1]
    return [
        (
            "certs dir missing (leader)",
            ["server", "--role", "leader", "--db", str(db), "--certs", str(r / "nosuchdir"),
             "--helper", e.helper],
            ENVIRONMENT, "no such certificate directory", [db],
        ),
        (
            "certs dir missing (helper)",
            ["server", "--role", "helper", "--db", str(db), "--certs", str(r / "nosuchdir")],
            ENVIRONMENT, "no such certificate directory", [db],
        ),
        (
            "helper started with the leader's certificate",
            ["server", "--role", "helper", "--db", str(db), "--certs", str(swapped)],
            ENVIRONMENT, "role leader, not helper", [db],
        ),
        (
            "certificate of another CA",
            ["server", "--role", "helper", "--db", str(db), "--certs", str(mixed)],
            ENVIRONMENT, "not issued by", [db],
        ),
        (
            "leader without --helper",
            ["server", "--role", "leader", "--db", str(db), "--certs", e.certs],
            USAGE, "--helper", [db],
        ),
        (
            "store directory missing",
            ["server", "--role", "helper", "--db", str(r / "nodir" / "x.sqlite"), "--certs",
             e.certs],
            ENVIRONMENT, "no such directory", [r / "nodir"],
        ),
        (
            "port in use",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--listen",
             f"127.0.0.1:{port}"],
            ENVIRONMENT, "cannot listen", [db],
        ),
        (
            "--listen not host:port",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--listen",
             "notaport"],
            USAGE, "--listen: expected host:port", [db],
        ),
        (
            "leader's --helper without a port",
            ["server", "--role", "leader", "--db", str(db), "--certs", e.certs, "--helper",
             "localhost"],
            USAGE, "--helper: expected host:port", [db],
        ),
        (
            "data port in use",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--data-port",
             str(port)],
            ENVIRONMENT, "--data-port", [db],
        ),
        (
            "data port not a port",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--data-port",
             "lots"],
            USAGE, "--data-port", [db],
        ),
        (
            "ingest replica on SQLite",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--ingest-only"],
            USAGE, "--ingest-only", [db],
        ),
        (
            "worker on SQLite",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--worker"],
            USAGE, "--worker needs the PostgreSQL store", [db],
        ),
        (
            "leased work on SQLite",
            ["server", "--role", "leader", "--db", str(db), "--certs", e.certs, "--helper",
             "127.0.0.1:1", "--lease-work"],
            USAGE, "--lease-work needs the PostgreSQL store", [db],
        ),
        (
            "leased work on the helper",
            ["server", "--role", "helper", "--db", "postgresql://x@127.0.0.1:1/x", "--certs",
             e.certs, "--lease-work"],
            USAGE, "--lease-work is for the leader only", [],
        ),
        (
            "a worker that is also a replica",
            ["server", "--role", "helper", "--db", "postgresql://x@127.0.0.1:1/x", "--certs",
             e.certs, "--worker", "--ingest-only"],
            USAGE, "cannot be combined", [],
        ),
        (
            "lease without a leader worker",
            ["server", "--role", "helper", "--db", "postgresql://x@127.0.0.1:1/x", "--certs",
             e.certs, "--worker", "--lease", "5"],
            USAGE, "--lease is for a leader --worker only", [],
        ),
        (
            "lease out of range",
            ["server", "--role", "leader", "--db", "postgresql://x@127.0.0.1:1/x", "--certs",
             e.certs, "--helper", "127.0.0.1:1", "--worker", "--lease", "0.1"],
            USAGE, "--lease must be in", [],
        ),
        (
            "threads out of range",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--threads",
             "0"],
            USAGE, "--threads", [db],
        ),
        (
            "log level not a level",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs, "--log-level",
             "LOUD"],
            USAGE, "--log-level", [db],
        ),
        (
            "bad budget cap",
            ["server", "--role", "helper", "--db", str(db), "--certs", e.certs,
             "--max-epsilon-total", "lots"],
            USAGE, "--max-epsilon-total", [db],
        ),
        (
            "certs over an existing deployment",
            ["certs", "--out", e.certs],
            ENVIRONMENT, "--force", [],
        ),
    ]  # fmt: skip


def test_server_and_certs_failures(env: Env):
    before = {p.name: p.read_bytes() for p in Path(env.certs).iterdir()}
    for name, argv, rc, pattern, absent in _server_cases(env):
        r = svtagg(*argv)
        try:
            _check(r, rc, pattern)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        for path in absent:
            assert not path.exists(), f"{name}: {path} was created"
    after = {p.name: p.read_bytes() for p in Path(env.certs).iterdir()}
    assert after == before, "certs without --force changed the deployment's files"


def test_analyst_failures(env: Env):
    foreign = env.root / "foreign-analyst"
    write_deployment(foreign)
    cases: list[tuple[str, list[str], int, str]] = [
        ("unknown task", env.analyst("describe", "--task", "nosuch"), REFUSED, "nosuch"),
        ("negative d", env.analyst("create-task", "--task", "x", "--d", "-5"), USAGE, "--d"),
        (
            "ε over the server's cap",
            env.analyst("create-task", "--task", "x", "--d", "5", "--epsilon", "50"),
            REFUSED,
            "cap",
        ),
        (
            "ε not a number",
            env.analyst("create-task", "--task", "x", "--d", "5", "--epsilon", "ten"),
            USAGE,
            "--epsilon",
        ),  # fmt: skip
        (
            "certs dir missing",
            ["analyst", "list", "--leader", env.leader, "--certs", str(env.root / "none")],
            ENVIRONMENT,
            "no such certificate directory",
        ),
        (
            "leader down / wrong address",
            ["analyst", "list", "--leader", "127.0.0.1:1", "--certs", env.certs],
            UNREACHABLE,
            "unreachable",
        ),
        (
            "selection against a leader that is down",
            ["analyst", "run", "--leader", "127.0.0.1:1", "--certs", env.certs, "--task", "t"],
            UNREACHABLE,
            "unreachable",
        ),
        (
            "analyst certificate from another CA",
            ["analyst", "list", "--leader", env.leader, "--certs", str(foreign)],
            UNREACHABLE,
            "unreachable",
        ),
        ("unknown subcommand", ["analyst", "frobnicate"], USAGE, "invalid choice"),
        ("missing --task", env.analyst("budget"), USAGE, "--task"),
        (
            "--leader without a port (gRPC would dial 443)",
            ["analyst", "list", "--leader", "localhost", "--certs", env.certs],
            USAGE,
            "--leader: expected host:port",
        ),
        (
            "create-task: δ of 2",
            env.analyst("create-task", "--task", "x", "--d", "5", "--delta", "2"),
            USAGE,
            "--delta: δ must be in [0, 1)",
        ),
        (
            "run: δ of 2",
            env.analyst("run", "--task", "m", "--algorithm", "mwem", "--delta", "2"),
            USAGE,
            "--delta: δ must be in [0, 1)",
        ),
        (
            "create-task: a task id with a space and a slash",
            env.analyst("create-task", "--task", "a b/c", "--d", "5"),
            USAGE,
            "--task: task ids are",
        ),
        (
            "run: δ not a number",
            env.analyst("run", "--task", "m", "--delta", "x"),
            USAGE,
            "--delta",
        ),  # fmt: skip
    ]
    for name, argv, rc, pattern in cases:
        r = svtagg(*argv)
        try:
            _check(r, rc, pattern)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    listing = json.loads(svtagg(*env.analyst("list", "--json")).stdout)
    assert "x" not in {t["task"] for t in listing["tasks"]}


def test_tls_failures_are_explained(env: Env):
    """A handshake that fails says why in one line, not in OpenSSL's words."""
    foreign = env.root / "foreign-tls"
    if not foreign.exists():
        write_deployment(foreign)
    cases = [
        (
            "the server's certificate is of another CA",
            ["analyst", "list", "--leader", env.leader, "--certs", str(foreign)],
            "not issued by the CA in your certificate directory's ca.pem",
        ),
        (
            "the helper's address given as the leader's",
            ["analyst", "list", "--leader", env.helper, "--certs", env.certs],
            "not for the role dialled",
        ),
    ]
    for name, argv, pattern in cases:
        r = svtagg(*argv)
        try:
            _check(r, UNREACHABLE, pattern)
            for raw in ("SSL_ERROR", "OPENSSL", "BAD_SIGNATURE", "Hostname Verification"):
                assert raw not in r.stderr, f"raw TLS text {raw!r} in {r.stderr!r}"
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


def test_config_certs_relative_to_the_config_file(env: Env, tmp_path: Path):
    """A relative `certs` in the config file is found next to the file, whatever
    the working directory; a wrong one names the config file."""
    folder = tmp_path / "conf"
    folder.mkdir()
    shutil.copytree(env.certs, folder / "keys")
    cfg = _write(folder / "config.toml", f'leader = "{env.leader}"\ncerts = "keys"\n')
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    r = svtagg("analyst", "list", "--json", env={"SVTAGG_CONFIG": str(cfg)}, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    bad = _write(folder / "bad.toml", f'leader = "{env.leader}"\ncerts = "nokeys"\n')
    r = svtagg("analyst", "list", env={"SVTAGG_CONFIG": str(bad)})
    _check(r, ENVIRONMENT, f"certs from config file {bad}")
    assert str(folder / "nokeys") in r.stderr
    noport = _write(folder / "noport.toml", f'leader = "localhost"\ncerts = "{env.certs}"\n')
    r = svtagg("analyst", "list", env={"SVTAGG_CONFIG": str(noport)})
    _check(r, USAGE, f"leader (from config file {noport}): expected host:port")


def test_broken_pipe_is_quiet(env: Env):
    cmd = [sys.executable, "-m", "svtagg.deploy.cli", *env.analyst("describe", "--task", "m")]
    # The reader is gone before describe prints anything (as `| head -0` would
    # be): its output must hit the closed pipe, and it must end quietly with 141.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 141 and err == "", (rc, err)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _input_cases(e: Env) -> list[tuple[str, str, list[str], str, str]]:
    """(name, task, file text, extra args, expected message); all exit 2."""
    ok5 = "0,1,0,0,1\n"
    return [
        ("51 columns for d=5 (0/1 matrix)", "m", ok5 + "0,1,0,0,1,1\n", [], "row 2 has 6 values"),
        ("4 columns", "m", "0,1,0,1\n", [], "row 1 has 4 values"),
        ("value 5", "m", ok5 * 3 + "0,1,5,0,1\n", [], "row 4, column 3"),
        # Batches of two: rows 1-4 would go out in two uploads before row 5 is
        # read by a one-pass reader; the whole file is checked first.
        ("bad row after two batches", "m", ok5 * 4 + "0,1,9,0,1\n", ["--batch", "2"], "row 5"),
        ("value -2", "m", "0,-2,0,0,1\n", [], "outside [0, 1]"),
        ("inf", "m", "0,1,0,inf,1\n", [], "row 1, column 4: inf is not a finite"),
        ("nan", "m", "nan,1,0,0,1\n", [], "not a finite"),
        ("empty file", "m", "", [], "no rows"),
        ("header line", "m", "a,b,c,d,e\n" + ok5, [], "use --header"),
        ("';' delimiter", "m", "0;1;0;0;1\n", [], "numbers separated by ';': use --delimiter ';'"),
        (
            "',' read with --delimiter ';'",
            "m",
            "0,1,0,0,1\n",
            ["--delimiter", ";"],
            "numbers separated by ',': use --delimiter ','",
        ),
        (
            "category ids separated by spaces",
            "hhe",
            "0 1 3\n",
            ["--format", "categories"],
            "'0 1 3' is not a category id (numbers separated by spaces: use --delimiter ' ')",
        ),
        ("ragged row", "m", ok5 + "0,1\n", [], "row 2 has 2 values"),
        ("blank row", "m", ok5 + "\n" + ok5, [], "row 2 is empty"),
        ("words", "m", "0,1,zero,0,1\n", [], "row 1, column 3: 'zero' is not a number"),
        (
            "0/1 matrix read as categories",
            "hh",
            "0,1,0,0,1\n",
            ["--embedding", "heavy_hitters", "--format", "categories"],
            "a category repeats",
        ),
        (
            # the task's embedding is taken, and heavy_hitters has two formats
            "no --embedding for a task of category counts",
            "hhe",
            "0,1,0,0,1\n",
            [],
            "embedding heavy_hitters (the embedding task 'hhe' records) needs --format",
        ),
        (
            "another embedding than the task's",
            "hhe",
            "0,1,0,0,1\n",
            ["--embedding", "sparse_mean", "--param", "clip=1"],
            "records embedding heavy_hitters",
        ),
        (
            "another embedding than the task records",
            "hhe",
            "1\n",
            ["--embedding", "sparse_mean", "--format", "records"],
            "records embedding heavy_hitters; this upload is sparse_mean",
        ),
        (
            "category out of range",
            "hh",
            "1,7\n",
            ["--embedding", "heavy_hitters", "--format", "categories"],
            "category 7 is outside [0, 5)",
        ),
        (
            "heavy_hitters without --format",
            "hh",
            "1\n",
            ["--embedding", "heavy_hitters"],
            "--format",
        ),  # fmt: skip
        (
            "heavy_hitters matrix not 0/1",
            "hh",
            "0,1,0,0.5,1\n",
            ["--embedding", "heavy_hitters", "--format", "matrix"],
            "not 0 or 1",
        ),
        ("sparse_mean without clip", "sm", "0,1,2\n", ["--embedding", "sparse_mean"], "clip="),
        (
            "sparse_mean value beyond B",
            "sm",
            "0,1,2\n0,9,0\n",
            ["--embedding", "sparse_mean", "--param", "clip=3"],
            "row 2, column 2: 9 is outside [-3, 3]",
        ),
        ("--param d disagrees", "m", ok5, ["--param", "d=6"], "d=5"),
        ("format for another embedding", "m", ok5, ["--format", "records"], "does not fit"),
    ]


def test_client_input_refused_before_upload(env: Env):
    cases = _input_cases(env)
    before = {task: env.n(task) for task in {c[1] for c in cases}}
    for i, (name, task, text, extra, pattern) in enumerate(cases):
        path = _write(env.root / f"in{i}.csv", text)
        r = svtagg(*env.upload(task, path, *extra))
        try:
            _check(r, USAGE, pattern)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    # Every file above has a bad row; the good rows before it were not sent either.
    assert {task: env.n(task) for task in before} == before, "reports were uploaded"


def test_client_other_failures(env: Env):
    good = _write(env.root / "good.csv", "0,1,0,0,1\n")
    foreign = env.root / "foreign-client"
    write_deployment(foreign)
    cases: list[tuple[str, list[str], int, str]] = [
        ("unknown task", env.upload("nosuch", good), REFUSED, "nosuch"),
        ("input missing", env.upload("m", env.root / "none.csv"), ENVIRONMENT, "none.csv"),
        (
            "client certificate of another CA",
            env.upload("m", good, certs=str(foreign)),
            UNREACHABLE,
            "unreachable",
        ),  # fmt: skip
        ("--batch 0", env.upload("m", good, "--batch", "0"), USAGE, "--batch"),
    ]
    for name, argv, rc, pattern in cases:
        r = svtagg(*argv)
        try:
            _check(r, rc, pattern)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


# --------------------------------------------------------------- what works
def test_upload_header_clip_and_json(env: Env):
    before = env.n("sm")
    rows = "a,b,c\n0,1,2\n0,9,-7\n1,1,1\n"
    path = _write(env.root / "sm.csv", rows)
    r = svtagg(
        *env.upload(
            "sm", path, "--header", "--embedding", "sparse_mean", "--param", "clip=3", "--clip",
            "--json",
        )
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["reports"] == 3 and out["clipped_values"] == 2
    assert out["clipped_by_column"] == {"2": 1, "3": 1}
    assert env.n("sm") == before + 3


def test_npy_and_semicolons(env: Env):
    before = env.n("m")
    npy = env.root / "m.npy"
    np.save(npy, np.eye(5))
    r = svtagg(*env.upload("m", npy))
    assert r.returncode == 0, r.stderr
    semi = _write(env.root / "semi.csv", "0;1;0;0;1\n1;1;1;1;1\n")
    r = svtagg(*env.upload("m", semi, "--delimiter", ";"))
    assert r.returncode == 0, r.stderr
    assert env.n("m") == before + 7


def test_settings_from_environment_and_config(env: Env):
    cfg = _write(env.root / "svtagg.toml", f'leader = "{env.leader}"\ncerts = "{env.certs}"\n')
    r = svtagg("analyst", "list", "--json", env={"SVTAGG_CONFIG": str(cfg)})
    assert r.returncode == 0, r.stderr
    assert {"m", "hh", "sm"} <= {t["task"] for t in json.loads(r.stdout)["tasks"]}
    # The environment beats the config file; the command line beats both.
    r = svtagg("analyst", "list", env={"SVTAGG_CONFIG": str(cfg), "SVTAGG_LEADER": "127.0.0.1:1"})
    _check(r, UNREACHABLE, "127.0.0.1:1")
    r = svtagg(
        "analyst",
        "list",
        "--leader",
        env.leader,
        env={"SVTAGG_CONFIG": str(cfg), "SVTAGG_LEADER": "127.0.0.1:1"},
    )
    assert r.returncode == 0, r.stderr
    bad = _write(env.root / "bad.toml", "leader = [1\n")
    _check(svtagg("analyst", "list", env={"SVTAGG_CONFIG": str(bad)}), USAGE, "config file")
    _check(
        svtagg("analyst", "list", env={"SVTAGG_CONFIG": str(env.root / "nofile.toml")}),
        ENVIRONMENT,
        "nofile.toml",
    )


def test_version_and_help_show_defaults():
    from svtagg import __version__

    r = svtagg("--version")
    assert r.returncode == 0
    assert r.stdout.startswith(f"svtagg {__version__}; comparison engine: ")
    r = svtagg("analyst", "create-task", "--help")
    assert r.returncode == 0
    assert "(default: 10)" in r.stdout and "(default: 1000000)" in r.stdout


def test_a_recorded_embedding_is_shown_and_accepted(env: Env):
    """The task records its embedding: describe shows it, the matching upload
    goes in (the mismatching ones are refused in the input table)."""
    r = svtagg(*env.analyst("describe", "--task", "hhe", "--json"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["embedding"] == "heavy_hitters"
    path = _write(env.root / "cats.csv", "1\n3\n1\n")
    before = env.n("hhe")
    r = svtagg(*env.upload("hhe", path, "--embedding", "heavy_hitters", "--format", "categories"))
    assert r.returncode == 0, r.stderr
    assert env.n("hhe") == before + 3


def test_connect_refuses_an_address_without_a_port(tmp_path: Path):
    import svtagg

    write_deployment(tmp_path / "certs")
    with pytest.raises(ValueError, match="leader: expected host:port"):
        svtagg.connect("localhost", certs=tmp_path / "certs")
