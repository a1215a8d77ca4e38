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
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from svtagg.deploy.settings import (
    apply_server_config,
    apply_settings,
    check_option_types,
    check_settings,
)

Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


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


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no detail)"


#: gRPC/OpenSSL wording of a failed TLS handshake → what it means for the caller.
_TLS_FAILURES = (
    (
        ("hostname verification", "peer name", "target name"),
        "the server's certificate is not for the role dialled (is the address the "
        "leader's, not the helper's or another service's?)",
    ),
    (
        ("bad_signature", "certificate_verify_failed", "certificate verify failed",
         "unable to get local issuer", "self signed", "self-signed"),
        "the server's certificate was not issued by the CA in your certificate "
        "directory's ca.pem (certificates of another deployment?)",
    ),
    (
        ("unknown ca", "unknown_ca", "bad certificate", "bad_certificate",
         "certificate required", "alert"),
        "the server refused this certificate (not issued by its CA, or not for this role)",
    ),
)  # fmt: skip


def explain_tls(details: str) -> str | None:
    """One line for a TLS handshake failure in gRPC's `details`, else None."""
    text = details.lower()
    if not any(w in text for w in ("ssl", "tls", "handshake", "certificate", "verification")):
        return None
    for words, meaning in _TLS_FAILURES:
        if any(word in text for word in words):
            return f"TLS handshake failed: {meaning}"
    return "TLS handshake failed (run with GRPC_VERBOSITY=DEBUG for the details)"


def explain_connect(details: str) -> str | None:
    """One line for a connection nobody answered (a wrong port or host, a server
    not started) in gRPC's `details`, else None."""
    if "connection refused" not in details.lower():  # not "socket closed" after TLS
        return None
    found = re.search(r"(?:ipv4:|ipv6:|dns:)?(\[[^\]]+\]:\d+|[\w.-]+:\d+)", details)
    where = found.group(1) if found else "the address given"
    return (
        f"nothing answers at {where} (connection refused: is the address right and the "
        "server running? `svtagg doctor --leader ADDR --certs DIR` checks a deployment)"
    )


def explain_unreachable(details: str) -> str:
    """`details` of an unreachable server, explained where the cause is known."""
    return explain_tls(details) or explain_connect(details) or details


def describe_failure(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one-line message) for an expected failure; None: a bug."""
    import grpc

    from svtagg.client.upload import InputError, UploadError
    from svtagg.dp.errors import PeerUnavailable, Refusal
    from svtagg.proto.tls import CertificateError

    unreachable = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    if isinstance(exc, grpc.RpcError):
        code = exc.code()  # type: ignore[attr-defined]
        details = _one_line(exc.details())  # type: ignore[attr-defined]
        if code in unreachable:
            why = explain_tls(details) or explain_connect(details) or f"{code.name}: {details}"
            return EXIT_UNREACHABLE, f"unreachable: {why}"
        return EXIT_REFUSED, f"refused: {code.name}: {details}"
    if isinstance(exc, UploadError):
        rc = EXIT_UNREACHABLE if exc.unreachable else EXIT_REFUSED
        text = _one_line(str(exc))
        tls = explain_tls(text)
        if tls is not None:  # keep which server failed ("helper could not be reached")
            text = f"{text.split(': ', 1)[0]}: {tls}"
        return rc, f"upload failed: {text}"
    if isinstance(exc, InputError):
        return EXIT_USAGE, f"bad input: {_one_line(str(exc))}"
    if isinstance(exc, CertificateError):
        return EXIT_ENVIRONMENT, f"certificate: {_one_line(str(exc))}"
    if isinstance(exc, PeerUnavailable):
        return EXIT_UNREACHABLE, f"unreachable: {explain_unreachable(_one_line(str(exc)))}"
    if isinstance(exc, Refusal):
        return EXIT_REFUSED, f"refused: {type(exc).__name__}: {_one_line(str(exc))}"
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError):
        where = exc.filename or ""
        return EXIT_ENVIRONMENT, f"{exc.strerror or 'not found'}: {where}".rstrip(": ")
    if isinstance(exc, PermissionError):
        return EXIT_ENVIRONMENT, f"permission denied: {exc.filename or _one_line(str(exc))}"
    if isinstance(exc, FileExistsError):
        return EXIT_ENVIRONMENT, _one_line(str(exc))
    if isinstance(exc, OSError):
        return EXIT_ENVIRONMENT, _one_line(str(exc))
    if isinstance(exc, sqlite3.Error):
        return EXIT_ENVIRONMENT, f"store: {_one_line(str(exc))}"
    if isinstance(exc, ValueError):
        return EXIT_USAGE, f"error: {_one_line(str(exc))}"
    return None


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
