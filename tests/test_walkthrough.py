"""docs/walkthrough.md runs as written, on the deployment docs/services.md tells a
user to start: that page's `svtagg certs` and `svtagg server` commands, run by the
installed `svtagg` script with their flags as written (only the addresses become
free local ports), then the walkthrough's shell block in bash and its Python
blocks, in order, in one Python process that cannot import what the package's
extras install (pandas and the rest) unless the walkthrough installs them.
Also the front door's own checks: certificates, settings, bad input."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

import svtagg
from svtagg.client.records import InputError
from svtagg.deploy.launch import LocalDeployment, wait_serving
from svtagg.dp.errors import NotFound
from svtagg.proto.tls import CertificateError, Identity

DOCS = Path(__file__).resolve().parents[1] / "docs"
WALKTHROUGH = DOCS / "walkthrough.md"
SERVICES = DOCS / "services.md"
DEPLOYMENT_SECTION = "A deployment step by step"
#: host:port in a documented command (the port decides which local server it is).
ADDRESS = re.compile(r"\b[\w.-]+:(\d{2,5})\b")

#: Runs in the walkthrough's Python: hides the modules in argv[2] (comma-separated)
#: from import, checks they are hidden, then runs argv[1]'s ```python blocks in
#: order in one namespace.
RUNNER = r"""
import importlib.abc, re, sys, traceback

hidden = {m for m in sys.argv[2].split(",") if m}


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
for name in sorted(hidden):
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    sys.exit(f"{name} could not be hidden")
text = open(sys.argv[1], encoding="utf-8").read()
blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
namespace = {"__name__": "__main__"}
for i, block in enumerate(blocks):
    try:
        exec(compile(block, f"walkthrough.md[python block {i}]", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"walkthrough python block {i} failed:\n{block}")
print(f"ran {len(blocks)} python blocks")
"""


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


def section(text: str, title: str) -> str:
    """The body of the `## title` section (up to the next `## ` heading)."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.DOTALL)
    assert found, f"no section {title!r}"
    return found.group(1)


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block as argv lists: continuation lines joined,
    comments dropped."""
    joined = block.replace("\\\n", " ")
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def deployment_commands() -> tuple[list[str], list[list[str]]]:
    """services.md's `svtagg certs` command and its `svtagg server` commands, in
    the order the page gives them."""
    (block,) = fenced(section(SERVICES.read_text(), DEPLOYMENT_SECTION), "sh")
    commands = [c for c in shell_commands(block) if c[0] == "svtagg"]
    certs = [c for c in commands if c[1] == "certs"]
    servers = [c for c in commands if c[1] == "server"]
    assert len(certs) == 1, f"{DEPLOYMENT_SECTION}: expected one `svtagg certs`, got {certs}"
    roles = [c[c.index("--role") + 1] for c in servers]
    assert roles == ["helper", "leader"], f"{DEPLOYMENT_SECTION}: server roles {roles}"
    return certs[0], servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def localize(text: str, ports: dict[str, str]) -> str:
    """Every documented host:port of a server, as that server's local address."""

    def local(m: re.Match[str]) -> str:
        assert m.group(1) in ports, f"{m.group(0)} is no server of {DEPLOYMENT_SECTION}"
        return f"127.0.0.1:{ports[m.group(1)]}"

    return ADDRESS.sub(local, text)


def svtagg_script() -> str:
    script = Path(sys.executable).with_name("svtagg")
    assert script.exists(), f"no installed svtagg script next to {sys.executable}"
    return str(script)


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_modules(installed_extras: set[str]) -> set[str]:
    """Top-level modules of the distributions only the package's extras bring
    (not those the walkthrough installs, not a base dependency's)."""
    base, extra = set(), set()
    for req in importlib.metadata.requires("svtagg") or []:
        name = _dist(re.match(r"[A-Za-z0-9._-]+", req).group(0))  # type: ignore[union-attr]
        marker = re.search(r"""extra\s*==\s*["']([^"']+)""", req)
        if marker is None:
            base.add(name)
        elif marker.group(1) not in installed_extras:
            extra.add(name)
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if {_dist(d) for d in dists} & (extra - base) and module.isidentifier()
    }


def walkthrough_shell(text: str) -> tuple[str, set[str]]:
    """The walkthrough's shell blocks as one script, without its `pip install`
    lines (this environment has every extra installed), and the extras those
    lines install."""
    lines, extras = [], set()
    for block in fenced(text, "sh"):
        for line in block.splitlines():
            if re.search(r"\bpip3? install\b", line):
                for group in re.findall(r"\[([\w,-]+)\]", line):
                    extras |= set(group.split(","))
                continue
            lines.append(line)
    return "\n".join(lines), extras


@pytest.fixture
def documented_deployment(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The servers of services.md's step-by-step deployment, run in `tmp_path`;
    yields that folder and the map from each documented port to its local port."""
    certs_cmd, servers = deployment_commands()
    doc_ports = [ADDRESS.search(c[c.index("--listen") + 1]).group(1) for c in servers]  # type: ignore[union-attr]
    ports = {p: str(free_port()) for p in doc_ports}
    script = svtagg_script()
    run = subprocess.run(
        [script, *certs_cmd[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, f"{shlex.join(certs_cmd)}: {run.stderr}"
    analyst = Identity.load(tmp_path / "certs", "analyst")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in servers:
            argv = [script, *(localize(arg, ports) for arg in cmd[1:])]
            role = cmd[cmd.index("--role") + 1]
            log = tmp_path / f"{role}.log"
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen(argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
                )
            address = localize(cmd[cmd.index("--listen") + 1], ports)
            _wait(procs[-1], address, analyst, role, log)
        yield tmp_path, ports
    finally:
        for proc in reversed(procs):  # the leader first
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(proc: subprocess.Popen[bytes], address: str, ident: Identity, role: str, log: Path):
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the {role} exited ({proc.returncode}):\n{log.read_text()}")
        try:
            wait_serving(address, ident, role, timeout=0.5)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                pytest.fail(f"the {role} did not serve within 30 s:\n{log.read_text()}")


def test_walkthrough_runs_on_the_documented_deployment(
    documented_deployment: tuple[Path, dict[str, str]],
):
    folder, ports = documented_deployment
    text = WALKTHROUGH.read_text()
    blocks = fenced(text, "python")
    assert len(blocks) >= 8, "the walkthrough lost its code blocks"
    shell, installed = walkthrough_shell(text)
    hidden = extras_modules(installed)
    assert "pandas" in hidden or "pandas" in installed, hidden
    # A fresh user: no svtagg settings, config file or upload journals but the
    # walkthrough's own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SVTAGG_", "XDG_"))}
    env["HOME"] = str(folder / "home")
    script = f'set -e\n{localize(shell, ports)}\nexec "$0" -c "$1" "$2" "$3"\n'
    run = subprocess.run(
        ["bash", "-c", script, sys.executable, RUNNER, str(WALKTHROUGH), ",".join(hidden)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert f"ran {len(blocks)} python blocks" in run.stdout


def test_front_door_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SVTAGG_CONFIG", "")
    for var in ("SVTAGG_LEADER", "SVTAGG_HELPER", "SVTAGG_CERTS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="no leader address"):
        svtagg.connect()
    with pytest.raises(CertificateError, match="no such certificate directory"):
        svtagg.connect("127.0.0.1:1", certs=tmp_path / "none")
    assert isinstance(svtagg.__version__, str) and svtagg.__version__[0].isdigit()
    with LocalDeployment(tmp_path / "dep") as dep:
        with svtagg.connect(
            dep.address("leader"), certs=dep.certs, helper=dep.address("helper")
        ) as conn:
            conn.create_task("t", d=3, epsilon=1, min_batch=1)
            bad = np.array([[0.0, 0.5, 1.0], [0.0, 1.5, 0.0]])
            with pytest.raises(InputError, match="row 2, column 2"):
                conn.upload("t", bad)
            with pytest.raises(InputError, match="not a finite"):
                conn.upload("t", [[0.0, float("nan"), 0.0]])
            stats = conn.upload("t", [[0.0, 0.5, 1.0]])
            assert stats.reports == 1
            with pytest.raises(InputError, match="row 2, column 2: category 3 is outside"):
                conn.upload("t", [[0], [1, 3]], embedding="heavy_hitters", fmt="categories")
            with pytest.raises(InputError, match="row 1: a category repeats"):
                conn.upload("t", [[1, 1]], embedding="heavy_hitters", fmt="categories")
            stats = conn.upload("t", [[0, 2], [1]], embedding="heavy_hitters", fmt="categories")
            assert stats.reports == 2
            assert conn.task("t").state().n == 3
            with pytest.raises(NotFound, match="nosuch"):
                conn.task("nosuch")
