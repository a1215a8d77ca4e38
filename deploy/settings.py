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

The settings apply to the analyst, client and Python front-door commands, never
to `svtagg server` or `svtagg certs`: a server's own address, peer and keys are
always explicit on its command line.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path

#: Option dest → environment variable.
ENV = {"leader": "SVTAGG_LEADER", "helper": "SVTAGG_HELPER", "certs": "SVTAGG_CERTS"}
#: Subcommands whose options are never filled from settings.
EXPLICIT_ONLY = frozenset({"server", "certs"})


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
    unknown = sorted(set(data) - set(ENV))
    if unknown:
        raise ValueError(
            f"config file {path}: unknown keys {', '.join(unknown)} (known: {', '.join(ENV)})"
        )
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"config file {path}: {key} must be a non-empty string")
    return dict(data)


def resolve() -> dict[str, tuple[str, str]]:
    """dest → (value, where it came from) from the environment and the config file."""
    found: dict[str, tuple[str, str]] = {}
    path = config_path()
    for key, value in load_config(path).items():
        found[key] = (value, f"config file {path}")
    for key, var in ENV.items():
        env = os.environ.get(var)
        if env:
            found[key] = (env, f"environment {var}")
    return found


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
                action.default = value
                action.required = False
                action.help = f"{action.help or ''} [{where}: {value}]".strip()
        stack.extend(sub for _, sub in _subparsers(p))
