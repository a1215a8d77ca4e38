"""The documented commands and figures still match the code: the README's test
command is what CI runs; every `svtagg ...` command line of the README, the
walkthrough and docs/services.md's "Quick start" and "A deployment step by
step" parses with the real parser (flags named in their comments and in the
README's inline commands exist); paths, modules and links the README names
exist; and the figures these pages quote that the code can recompute cheaply
(the joint sampler's gates and bytes, a comparison's bytes, upload sizes,
default caps, ε_min) are the code's."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import re
import shlex
import tomllib
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from svtagg.deploy.cli import build_parser
from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.dp.task import safe_epsilon_min
from svtagg.mpc.jointnoise import and_gates_per_sample, evaluate_joint_noise, garble_joint_noise
from svtagg.mpc.protocol import connected_pair
from svtagg.servers.exchange.joint import shapes
from svtagg.vdaf.validity import parse_validity

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WALKTHROUGH = ROOT / "docs" / "walkthrough.md"
SERVICES = ROOT / "docs" / "services.md"
SCALING = ROOT / "docs" / "scaling.md"
#: services.md's sections whose commands a user runs as written.
SERVICES_SECTIONS = ("Quick start", "A deployment step by step")
#: Tokens of a documented command that stand for "the other options".
PLACEHOLDERS = {"..."}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse as a user with no settings: every required option must be given."""
    monkeypatch.setenv("SVTAGG_CONFIG", "")
    for var in ("SVTAGG_LEADER", "SVTAGG_HELPER", "SVTAGG_CERTS"):
        monkeypatch.delenv(var, raising=False)


# ------------------------------------------------------------------ reading docs


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.DOTALL)


def shell_blocks(text: str) -> list[str]:
    return [body for lang, body in fenced_blocks(text) if lang in ("", "sh", "bash")]


def section(text: str, title: str) -> str:
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.DOTALL)
    assert found, f"no section {title!r}"
    return found.group(1)


def prose(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.DOTALL)


def inline_code(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def command_lines(block: str) -> Iterator[tuple[list[str], str]]:
    """(argv, comment) per line of a shell block, continuation lines joined;
    argv is empty for a comment line."""
    for line in block.replace("\\\n", " ").splitlines():
        comment = re.search(r"(?:^|\s)#(.*)$", line)  # a word that starts with '#'
        yield shlex.split(line, comments=True), comment.group(1) if comment else ""


def svtagg_commands(argv: list[str]) -> Iterator[list[str]]:
    """The `svtagg` invocations in one command line (`a && b`, `a; b`, `a | b`)."""
    segment: list[str] = []
    for token in [*argv, "&&"]:
        if token in ("&&", "||", ";", "|"):
            if segment and Path(segment[0]).name == "svtagg":
                yield [t for t in segment[1:] if t not in PLACEHOLDERS]
            segment = []
        else:
            segment.append(token)


def documented_shell() -> dict[str, str]:
    """name → shell block, for every block whose commands a user runs."""
    blocks = {}
    for i, body in enumerate(shell_blocks(README.read_text())):
        blocks[f"README.md block {i}"] = body
    for i, body in enumerate(shell_blocks(WALKTHROUGH.read_text())):
        blocks[f"walkthrough.md block {i}"] = body
    services = SERVICES.read_text()
    for title in SERVICES_SECTIONS:
        for i, body in enumerate(shell_blocks(section(services, title))):
            blocks[f"services.md {title!r} block {i}"] = body
    return blocks


# ------------------------------------------------------------------ the parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def every_parser(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for sub in subparsers(parser).values():
        yield from every_parser(sub)


ROOT_PARSER = build_parser()
ALL_FLAGS = {flag for _, p in every_parser(ROOT_PARSER) for flag in options(p)}
BY_NAME = {prog.split()[-1]: p for prog, p in every_parser(ROOT_PARSER)}


def parses(argv: list[str]) -> str | None:
    """None if `svtagg argv` parses (or prints its help), else argparse's error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        if exc.code != 0:
            return err.getvalue().strip() or f"exit {exc.code}"
    return None


def check_names(tokens: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with a partial command `tokens` under `parser`: unknown
    subcommands and options, and option values outside their choices."""
    problems = []
    while tokens and tokens[0] in subparsers(parser):
        parser = subparsers(parser)[tokens.pop(0)]
    if tokens and not tokens[0].startswith("-") and subparsers(parser):
        problems.append(f"{parser.prog} has no subcommand {tokens[0]!r}")
    known = options(parser)
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        flag, _, value = token.partition("=")
        if flag not in known:
            problems.append(f"{parser.prog} has no option {flag}")
            continue
        if not value and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            value = tokens[i + 1]
        choices = known[flag].choices
        if choices is not None and value and known[flag].nargs != 0 and value not in choices:
            problems.append(f"{parser.prog} {flag}: {value!r} is not one of {list(choices)}")
    return problems


# ------------------------------------------------------------------ (a) the test command


def test_readme_test_command_is_what_ci_runs():
    (first, *_) = shell_blocks(README.read_text())
    lines = [line for line in first.splitlines() if line.strip()]
    labels = [i for i, line in enumerate(lines) if line.startswith("# tests:")]
    assert len(labels) == 1, "the README's first block has no '# tests:' command"
    readme_command = lines[labels[0] + 1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_commands = [line for line in ci if "pytest" in line and not line.startswith("#")]
    assert ci_commands == [readme_command], (
        f".ci/run runs {ci_commands}, the README says {readme_command!r}"
    )


def test_readme_first_commands_install_what_they_name():
    """Both first commands: the extras they install exist, the scripts they run
    exist, and their `svtagg` parses."""
    (first, *_) = shell_blocks(README.read_text())
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    commands = [argv for argv, _ in command_lines(first) if argv]
    assert len(commands) == 2, commands
    for argv in commands:
        for token in argv:
            for group in re.findall(r"^\.\[([\w,-]+)\]$", token):
                assert set(group.split(",")) <= extras, f"no extra {group} in pyproject.toml"
            if token.endswith(".sh"):
                assert (ROOT / token).is_file(), token
        for invocation in svtagg_commands(argv):
            assert parses(invocation) is None, (invocation, parses(invocation))
    assert any(list(svtagg_commands(a)) for a in commands), "no svtagg in the first block"


def test_documented_extras_exist():
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    install = re.compile(r"pip install[^\n`]*?(?:\.|svtagg)\[([\w,-]+)\]")
    named = {
        extra
        for doc in (README, WALKTHROUGH)
        for group in install.findall(doc.read_text())
        for extra in group.split(",")
    }
    assert {"test", "pandas", "experiments", "postgres"} <= named, named
    assert named <= extras, f"the docs name extras pyproject.toml lacks: {named - extras}"


def test_readme_pytest_options_are_the_default_suite():
    found = re.search(r"the default pytest suite \(`([^`]+)`", README.read_text())
    assert found, "the README no longer names the default suite's pytest options"
    assert found.group(1) == PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"]


# ------------------------------------------------------------------ (b) commands parse


def test_documented_svtagg_commands_parse():
    checked, problems = 0, []
    for name, block in documented_shell().items():
        for argv, comment in command_lines(block):
            for invocation in svtagg_commands(argv):
                checked += 1
                error = parses(invocation)
                if error:
                    problems.append(f"{name}: svtagg {shlex.join(invocation)}: {error}")
            for flag in FLAG.findall(comment):
                if flag not in ALL_FLAGS:
                    problems.append(f"{name}: comment names {flag}, no svtagg option")
    assert not problems, "\n".join(problems)
    assert checked >= 20, f"only {checked} svtagg commands found in the documented blocks"


def test_walkthrough_names_only_real_commands():
    text = WALKTHROUGH.read_text()
    spans = [s for s in inline_code(text) if s.startswith("svtagg ")]
    assert spans, "the walkthrough names no svtagg command"
    problems = [p for s in spans for p in check_names(shlex.split(s)[1:], ROOT_PARSER)]
    assert not problems, problems


def _module_flags(paragraph: str) -> set[str]:
    """Options defined by the `python -m svtagg.…` modules a paragraph names."""
    flags = set()
    for module in re.findall(r"python -m (svtagg\.[\w.]+)", paragraph):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"no module {module}"
        flags |= set(re.findall(r"""["'](--[a-z][a-z0-9-]*)["']""", Path(spec.origin).read_text()))
    return flags


def test_readme_inline_commands_name_real_options_paths_and_modules():
    problems = []
    text = README.read_text()
    for paragraph in re.split(r"\n\s*\n|\n(?=- )", prose(text)):
        local_flags = _module_flags(paragraph)
        for span in inline_code(paragraph):
            try:
                tokens = [t for t in shlex.split(span) if t not in PLACEHOLDERS]
            except ValueError:
                continue
            if not tokens:
                continue
            head = tokens[0]
            if head == "svtagg":
                problems += check_names(tokens[1:], ROOT_PARSER)
            elif head in BY_NAME and len(tokens) > 1 and "/" not in head:
                problems += check_names(tokens[1:], BY_NAME[head])
            elif head.startswith("--"):
                if head.partition("=")[0] not in ALL_FLAGS | local_flags:
                    problems.append(f"{span}: no such option")
            elif head == "bash" and len(tokens) > 1:
                if not (ROOT / tokens[1]).is_file():
                    problems.append(f"{span}: no file {tokens[1]}")
            elif re.fullmatch(r"\.?[\w-]+(/[\w.*-]+)*/?", head) and "/" in head:
                if not (list(ROOT.glob(head.rstrip("/"))) or list(ROOT.glob(f"*/{head}"))):
                    problems.append(f"{span}: no such path")
    assert not problems, "\n".join(problems)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_and_walkthrough_links_resolve():
    problems = []
    for doc in (README, WALKTHROUGH):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                problems.append(f"{doc.name}: {target}: no file")
                continue
            headings = re.findall(r"^#+ (.+)$", prose(file.read_text()), flags=re.M)
            if anchor and anchor not in {_slug(h) for h in headings}:
                problems.append(f"{doc.name}: {target}: no such heading")
    assert not problems, problems


def test_the_checks_catch_what_they_claim_to():
    """Negative controls: a wrong command, flag, choice and slug are caught."""
    assert parses(["analyst", "run", "--task", "t"]) is not None  # --leader missing
    assert parses(["analyst", "nosuch"]) is not None
    assert parses(["server", "--no-such-flag"]) is not None
    assert parses(["demo", "--help"]) is None
    assert check_names(["analyst", "create-task", "--noise", "shared"], ROOT_PARSER)
    assert check_names(["client", "upload", "--resum"], ROOT_PARSER)
    assert not check_names(["client", "upload", "--resume"], ROOT_PARSER)
    assert _slug("Joint noise (task option `noise = joint`)") == (
        "joint-noise-task-option-noise--joint"
    )


# ------------------------------------------------------------------ (c) figures


def _joint_sample_bytes(ot: str | None, n: int = 64) -> float:
    """Bytes both parties send per lap24 ν sample (ε = 1, F = 16), in process."""
    _, nu = shapes(joint_stream_noise(StreamKind("lap24"), Fraction(1), 16))

    async def run() -> float:
        g, e = await connected_pair(ot=ot)
        before = g.channel.bytes_sent + e.channel.bytes_sent
        await asyncio.gather(garble_joint_noise(g, n, nu), evaluate_joint_noise(e, n, nu))
        return (g.channel.bytes_sent + e.channel.bytes_sent - before) / n

    return asyncio.run(run())


def _comparison_bytes(width: int, n: int = 1000) -> float:
    """Bytes both parties send per first-YES comparison at `width`, default OT."""

    async def run() -> float:
        g, e = await connected_pair()
        before = g.channel.bytes_sent + e.channel.bytes_sent
        z = np.full(n, -5, dtype=np.int64).view(np.uint64)
        await asyncio.gather(g.first_yes(z, width), e.first_yes(np.zeros(n, np.uint64), width))
        return (g.channel.bytes_sent + e.channel.bytes_sent - before) / n

    return asyncio.run(run())


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_readme_joint_noise_figures():
    text = " ".join(README.read_text().split())
    found = re.search(
        r"([\d,]+) AND gates and ([\d,]+) bytes between the servers per query's noise "
        r"\(lap24, ε = 1, F = 16, SoftSpoken OT; ([\d,]+) with IKNP\), about (\d+) times "
        r"a comparison's bytes",
        text,
    )
    assert found, "the README no longer states the joint sampler's cost in the checked words"
    ands, softspoken, iknp, times = (_number(g) for g in found.groups())
    _, nu = shapes(joint_stream_noise(StreamKind("lap24"), Fraction(1), 16))
    assert and_gates_per_sample(nu) == ands
    assert _joint_sample_bytes(None) == softspoken
    assert _joint_sample_bytes("iknp") == iknp
    assert round(softspoken / _comparison_bytes(40)) == times


def test_scaling_bytes_per_comparison():
    text = " ".join(SCALING.read_text().split())
    found = re.search(
        r"\(32 \+ 16/k\)·w − 16 with SoftSpoken OT \(default k = 4\): ([\d,]+) at w = 34 "
        r"\(n_max = 10\^4, ε = 1\), ([\d,]+) at w = 40, ([\d,]+) at w = 48",
        text,
    )
    assert found, "docs/scaling.md no longer states the bytes per comparison"
    for width, quoted in zip((34, 40, 48), found.groups(), strict=True):
        measured = _comparison_bytes(width)
        # A chunk's result message (a few hundred bytes) spreads over its lanes.
        assert _number(quoted) == (32 + 16 // 4) * width - 16 == int(measured), width


def test_scaling_upload_sizes():
    text = " ".join(SCALING.read_text().split())
    found = re.search(
        r"range d = 100: ([\d,]+) B; onehot d = 10\^3: ([\d,]+) B; range d = 10\^3: "
        r"([\d,]+) B\. At d = 10\^4: range ([\d,]+) B \(F = 16\), ([\d,]+) \(F = 8\), "
        r"([\d,]+) \(F = 4\); onehot ([\d,]+); multihot:10 ([\d,]+)",
        text,
    )
    assert found, "docs/scaling.md no longer states the upload sizes per report"
    cases = [
        ("range", 100, 16), ("onehot", 1000, 16), ("range", 1000, 16), ("range", 10**4, 16),
        ("range", 10**4, 8), ("range", 10**4, 4), ("onehot", 10**4, 16),
        ("multihot:10", 10**4, 16),
    ]  # fmt: skip
    for (name, d, frac_bits), quoted in zip(cases, found.groups(), strict=True):
        embedding = "" if name == "range" else "heavy_hitters"
        circuit = parse_validity(name, d, frac_bits, embedding)
        assert circuit is not None
        # The leader's upload: its input share, the public share, a 16-byte id.
        size = circuit.input_share_bytes(0) + circuit.public_share_bytes() + 16
        assert size == _number(quoted), (name, d, frac_bits)
    onehot = parse_validity("onehot", 10**4, 16, "heavy_hitters")
    assert onehot is not None and round(onehot.input_share_bytes(0) / 1000) == 167


def test_readme_default_budget_caps():
    found = re.search(
        r"`--max-epsilon-total` / `--max-delta-total` \(default (\d+) and 10\^(-\d+)",
        " ".join(README.read_text().split()),
    )
    assert found, "the README no longer states the servers' default caps"
    server = BY_NAME["server"]
    defaults = options(server)
    assert Fraction(defaults["--max-epsilon-total"].default) == int(found.group(1))
    assert Fraction(defaults["--max-delta-total"].default) == Fraction(10) ** int(found.group(2))


def test_deployment_epsilon_min_figure():
    block = section(SERVICES.read_text(), "A deployment step by step")
    found = re.search(r"\(2\^(-\d+) ≈ ([\d.]+e-\d+) at F = (\d+)\)", block)
    assert found, "the deployment steps no longer state epsilon_min's default"
    create = next(
        argv
        for argv, _ in command_lines(shell_blocks(block)[0])
        if argv[:3] == ["svtagg", "analyst", "create-task"]
    )
    n_max = int(create[create.index("--n-max") + 1])
    auto = safe_epsilon_min(n_max, int(found.group(3)))
    assert auto == Fraction(2) ** int(found.group(1))
    assert f"{float(auto):.1e}" == found.group(2)
