"""The `svtagg` command line: one entry point with a subcommand per job.

Every expected failure ends as one line on stderr and one of these exit codes
(docs/services.md, "Exit codes"):

====  =====================================================================
0     success
1     refused by a server (unknown task, budget, state, permission, ...)
2     bad invocation or bad input (argument, file contents, value ranges)
3     local environment: a missing or unreadable file or directory, a bad
      certificate, a port in use, a store that cannot be opened
4     a server could not be reached (down, wrong address, TLS handshake
      refused, e.g. a certificate of another CA, or a call timed out)
130   interrupted (Ctrl-C)
141   stdout closed early (e.g. `svtagg ... | head -1`); nothing printed
====  =====================================================================

`--leader`, `--helper` and `--certs` may come from the environment or a config
file instead of the command line; see `svtagg.deploy.settings`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from svtagg.deploy.failures import (  # noqa: F401 - the command line's exit codes
    EXIT_BROKEN_PIPE,
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    _one_line,
    describe_failure,
    explain_connect,
    explain_tls,
    explain_unreachable,
)
from svtagg.deploy.settings import (
    apply_server_config,
    apply_settings,
    check_option_types,
    check_settings,
)

Handler = Callable[[argparse.Namespace], int]


class _Formatter(argparse.HelpFormatter):
    """Every option with a default shows it, whether or not it has help text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            default in (None, False, argparse.SUPPRESS)
            or default == []
            or not action.option_strings
            or "default" in text.lower()
        ):
            return text
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is one `--help` away) and every
    option's default shown in its help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if not action.help and action.option_strings and action.required is False:
            if action.default not in (None, False, argparse.SUPPRESS, []):
                action.help = "(default: %(default)s)"
        return action

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


class _Version(argparse.Action):
    """`--version`: the version and the comparison engine in use (loaded only
    when asked, so other commands do not pay for it)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("nargs", 0)
        kwargs.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from svtagg import __version__
        from svtagg.deploy.doctor import engine_line

        print(f"svtagg {__version__}; comparison engine: {engine_line()}")
        parser.exit(0)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `svtagg` parser; `argv` only for `svtagg server --config FILE`, whose
    file sets that command's defaults before the arguments are parsed."""

    parser = Parser(
        prog="svtagg",
        description="Sparse Vector Technique over two-server secure aggregation.",
    )
    parser.add_argument(
        "--version", action=_Version, help="print the version and the comparison engine"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _registrars():
        register(sub)
    check_option_types(parser)
    apply_settings(parser)
    apply_server_config(parser, argv)
    return parser


def _registrars() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Subcommand modules; each adds its parsers and sets `handler`."""
    from svtagg.client.cli import register as client_register
    from svtagg.deploy.admin import register as admin_register
    from svtagg.deploy.doctor import register as doctor_register
    from svtagg.deploy.jobs import register as jobs_register
    from svtagg.experiments.cli import register as experiment_register
    from svtagg.servers.cli import register as server_register

    return [
        server_register,
        client_register,
        jobs_register,
        admin_register,
        experiment_register,
        doctor_register,
    ]


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final
    flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `svtagg` command; returns its exit code (see the module docstring)."""
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        check_settings(args)
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return EXIT_OK if args.command is None else EXIT_USAGE
        return handler(args)
    except KeyboardInterrupt as exc:
        print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # noqa: BLE001 - expected failures become one line
        found = describe_failure(exc)
        if found is None:
            raise
        rc, message = found
        print(f"svtagg: {message}", file=sys.stderr)
        return rc


def _core_verbosity(argv: Sequence[str]) -> str:
    """GRPC_VERBOSITY for gRPC's C core: NONE, unless `--grpc-log-level` asks for
    more (the C core reads it once, before the arguments are parsed)."""
    levels = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "ERROR", "ERROR": "ERROR"}
    for i, arg in enumerate(argv):
        value = None
        if arg == "--grpc-log-level" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--grpc-log-level="):
            value = arg.partition("=")[2]
        if value is not None:
            return levels.get(value.upper(), "NONE")
    return "NONE"


def entry() -> None:
    """The console script: `main` with its return value as the exit status.

    gRPC's C core writes its own error lines to stderr (e.g. a second line for a
    port in use); the command line reports those failures itself, so the core is
    quiet unless GRPC_VERBOSITY is set (e.g. GRPC_VERBOSITY=ERROR or DEBUG)."""
    os.environ.setdefault("GRPC_VERBOSITY", _core_verbosity(sys.argv[1:]))
    rc = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        rc = EXIT_BROKEN_PIPE
    if rc == EXIT_INTERRUPTED:
        # After Ctrl-C a gRPC call the interrupt cut short can hold the
        # interpreter's shutdown: finalizing its channel waits on it
        # (grpc/grpc#19973 and kin; an interrupted upload keeps its channels
        # referenced for this reason).  Everything the command owns was closed
        # or recorded on the way here (its finally blocks, an upload's journal,
        # written through), so the process ends now.
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
