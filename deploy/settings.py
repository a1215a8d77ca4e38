"""Where `--leader`, `--helper` and `--certs` come from when not on the command line.

Precedence, highest first (docs/services.md, "Settings"):

1. the command line (`--leader host:port`, ...);
2. environment variables `SVTAGG_LEADER`, `SVTAGG_HELPER`, `SVTAGG_CERTS`;
3. a TOML config file: the file named by `SVTAGG_CONFIG`, else
   `$XDG_CONFIG_HOME/svtagg/config.toml` (`~/.config/svtagg/config.toml`), with
   the keys `leader`, `helper` and `certs`, e.g.::

       leader = "leader.example.org:7443"
       helper = "helper.example.org:7443"
       certs = "/etc/svtagg/analyst"

A relative `certs` in the config file is relative to the file's own folder
(so a config file and its certificates can move together); in the environment,
to the working directory.  A value that comes from a setting and is wrong says
where it came from.

The settings apply to the analyst, client and Python front-door commands, never
to `svtagg server` or `svtagg certs`: a server reads only the file named by its
own `--config` (see `apply_server_config`).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

#: Option dest → environment variable.
ENV = {"leader": "SVTAGG_LEADER", "helper": "SVTAGG_HELPER", "certs": "SVTAGG_CERTS"}
#: Subcommands whose options are never filled from settings.
EXPLICIT_ONLY = frozenset({"server", "certs"})
#: The config file's table of `svtagg server` options.
SERVER_TABLE = "server"
#: Server options that name files: relative values are relative to the config file.
SERVER_PATHS = frozenset({"certs", "db", "port_file"})


def config_path() -> Path | None:
    """The config file in effect (it may not exist), or None when SVTAGG_CONFIG is ''."""
    named = os.environ.get("SVTAGG_CONFIG")
    if named is not None:
        return Path(named).expanduser() if named else None
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "svtagg" / "config.toml"


def load_config(path: Path | None = None) -> dict[str, str]:
    """The `leader`/`helper`/`certs` keys of the config file ({} when absent).
    ValueError for a file that is not TOML or holds unknown keys or non-strings."""
    path = config_path() if path is None else path
    if path is None or not path.is_file():
        if path is not None and "SVTAGG_CONFIG" in os.environ and not path.exists():
            raise FileNotFoundError(2, "config file (SVTAGG_CONFIG) not found", str(path))
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path}: {exc}") from None
    # One file may serve an analyst and a server: `svtagg server --config` reads
    # the [server] table, which the analyst and client commands skip.
    data.pop(SERVER_TABLE, None)
    unknown = sorted(set(data) - set(ENV))
    if unknown:
        raise ValueError(
            f"config file {path}: unknown keys {', '.join(unknown)} "
            f"(known: {', '.join(ENV)}, and a [{SERVER_TABLE}] table)"
        )
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"config file {path}: {key} must be a non-empty string")
    return dict(data)


class Setting(str):
    """A value taken from the environment or the config file, which remembers
    where it came from (argparse keeps the object as the option's value)."""

    source: str

    def __new__(cls, value: str, source: str) -> Setting:
        out = super().__new__(cls, value)
        out.source = source
        return out


def resolve() -> dict[str, tuple[str, str]]:
    """dest → (value, where it came from) from the environment and the config file.
    ValueError (naming the source) for an address that is not host:port."""
    found: dict[str, tuple[str, str]] = {}
    path = config_path()
    for key, value in load_config(path).items():
        if key == "certs" and path is not None:
            value = str(path.parent / Path(value).expanduser())
        found[key] = (value, f"config file {path}")
    for key, var in ENV.items():
        env = os.environ.get(var)
        if env:
            found[key] = (env, f"environment {var}")
    from svtagg.proto.vocab import check_address  # gRPC loads only after GRPC_VERBOSITY is set

    for key in ("leader", "helper"):
        if key in found:
            value, where = found[key]
            check_address(value, f"{key} (from {where})")
    return found


def check_settings(args: argparse.Namespace) -> None:
    """After parsing: a certificate directory that came from a setting must
    exist; the error names the setting, not only the path."""
    certs = getattr(args, "certs", None)
    if isinstance(certs, Setting) and not Path(certs).is_dir():
        raise FileNotFoundError(
            2, f"no such certificate directory (certs from {certs.source})", str(certs)
        )


def address_type(what: str, *, listen: bool = False) -> Callable[[str], str]:
    """An argparse type: `check_address`, with the usage error argparse reports."""

    def parse(value: str) -> str:
        from svtagg.proto.vocab import check_address

        try:
            check_address(value, what, listen=listen)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{what}: ")) from None
        return value

    return parse


#: Address options (dest → whether a server listens on it) checked as host:port.
ADDRESS_OPTIONS = {
    "leader": False,
    "helper": False,
    "listen": True,
    "ingest_listen": True,
    "metrics_listen": True,
}


def task_id_type(value: str) -> str:
    """An argparse type for `--task`: the servers' rule for task ids."""
    from svtagg.dp.task import TASK_ID_RE

    if not TASK_ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"task ids are 1-64 letters, digits, '.', '_' or '-'; got {value!r}"
        )
    return value


def check_option_types(parser: argparse.ArgumentParser) -> None:
    """Give every address option below `parser` the host:port type and every
    `--task` the task-id type, so a malformed value is a usage error (exit 2)
    before anything is dialled."""
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if not action.option_strings or action.type is not None:
                continue
            listen = ADDRESS_OPTIONS.get(action.dest)
            if listen is not None:
                action.type = address_type(action.option_strings[-1], listen=listen)
            elif action.dest == "task":
                action.type = task_id_type
        stack.extend(sub for _, sub in _subparsers(p))


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.extend(action.choices.items())
    return out


def apply_settings(
    parser: argparse.ArgumentParser, found: dict[str, tuple[str, str]] | None = None
) -> None:
    """Make every `--leader/--helper/--certs` option below `parser` default to its
    setting (and no longer required on the command line)."""
    found = resolve() if found is None else found
    if not found:
        return
    stack = [p for name, p in _subparsers(parser) if name not in EXPLICIT_ONLY]
    while stack:
        p = stack.pop()
        for action in p._actions:
            setting = found.get(action.dest)
            if setting is not None and action.option_strings:
                value, where = setting
                action.default = Setting(value, where)
                action.required = False
                action.help = f"{action.help or ''} [{where}: {value}]".strip()
        stack.extend(sub for _, sub in _subparsers(p))


def _option_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return None


def _relative_to(folder: Path, dest: str, value: str) -> str:
    """A path option of the config file, relative to the file's folder (a
    PostgreSQL URL or an absolute path is left as it is)."""
    if dest == "db" and "://" in value:
        if not value.startswith("sqlite:///"):
            return value
        return "sqlite:///" + str(folder / Path(value[len("sqlite:///") :]).expanduser())
    return str(folder / Path(value).expanduser())


def apply_server_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """`svtagg server --config FILE`: the [server] table of FILE gives defaults
    for the server's options (keys are the option names, e.g. `role`, `db`,
    `listen`, `max-epsilon-total`; flags take true/false).  The command line
    wins over the file; nothing else (no environment, no analyst setting) is read.
    ValueError (naming the file) for unknown keys or values of the wrong type."""
    if not argv or argv[0] != "server":
        return
    named = _option_value(argv, "--config")
    if named is None:
        return
    path = Path(named).expanduser()
    if not path.is_file():
        raise FileNotFoundError(2, "config file (--config) not found", str(path))
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path}: {exc}") from None
    table = data.get(SERVER_TABLE)
    if not isinstance(table, dict):
        raise ValueError(f"config file {path}: no [{SERVER_TABLE}] table")
    server = dict(_subparsers(parser))[SERVER_TABLE]
    actions = {
        a.dest: a for a in server._actions if a.option_strings and a.dest not in ("help", "config")
    }
    unknown = sorted(k for k in table if k.replace("-", "_") not in actions)
    if unknown:
        raise ValueError(
            f"config file {path}: [{SERVER_TABLE}] has unknown keys {', '.join(unknown)} "
            "(keys are `svtagg server` option names, e.g. role, db, certs, listen)"
        )
    where = f"config file {path}"
    for key, value in table.items():
        action = actions[key.replace("-", "_")]
        flag = action.nargs == 0
        if flag != isinstance(value, bool) or not isinstance(value, str | int | float | bool):
            kind = "true or false" if flag else "a string or a number"
            raise ValueError(f"{where}: [{SERVER_TABLE}] {key} must be {kind}")
        if flag:
            action.default = value
            continue
        text = str(value)
        if action.dest in SERVER_PATHS:
            text = _relative_to(path.parent, action.dest, text)
        try:
            converted = action.type(text) if callable(action.type) else text
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ValueError(f"{where}: [{SERVER_TABLE}] {key}: {exc}") from None
        if action.choices is not None and converted not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise ValueError(f"{where}: [{SERVER_TABLE}] {key} must be one of {choices}")
        action.default = Setting(text, where)
        action.required = False
