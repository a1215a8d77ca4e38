"""The `svtagg` command line: one entry point with a subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import version

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svtagg",
        description="Sparse Vector Technique over two-server secure aggregation.",
    )
    parser.add_argument("--version", action="version", version=f"svtagg {version('svtagg')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _registrars():
        register(sub)
    return parser


def _registrars() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Subcommand modules; each adds its parsers and sets `handler`."""
    from svtagg.analyst.experiments import register as experiment_register
    from svtagg.client.cli import register as client_register
    from svtagg.deploy.jobs import register as jobs_register
    from svtagg.servers.cli import register as server_register

    return [server_register, client_register, jobs_register, experiment_register]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
