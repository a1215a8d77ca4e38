"""`svtagg client upload`: read per-user records, embed, share and upload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("client", help="client jobs (upload)")
    csub = p.add_subparsers(dest="client_command", metavar="CLIENT_COMMAND")
    u = csub.add_parser("upload", help="upload per-user data from CSV or .npy to both servers")
    u.add_argument("--leader", required=True, help="leader host:port")
    u.add_argument("--helper", required=True, help="helper host:port")
    u.add_argument("--certs", required=True, help="directory with ca.pem and client.pem/.key")
    u.add_argument(
        "--no-client-cert",
        action="store_true",
        help="connect with server-only TLS (servers' --ingest-listen ports)",
    )
    u.add_argument("--task", required=True)
    u.add_argument("--input", required=True, help=".npy or .csv, one user per row")
    u.add_argument("--embedding", help="heavy_hitters | sparse_mean | marginals | fp_loss")
    u.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="embedding parameter, e.g. d=1000 or clip=3.5 (repeatable)",
    )
    u.add_argument("--batch", type=int, default=1000, help="reports per batch")
    u.add_argument("--retries", type=int, default=5)
    u.add_argument(
        "--require-validation",
        action="store_true",
        help="refuse tasks that do not range-check reports (validate_reports)",
    )
    u.set_defaults(handler=run_upload)
    p.set_defaults(handler=lambda a: (p.print_help(), 2)[1])


def _params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--param wants KEY=VALUE, got {item!r}")
        try:
            out[key] = int(value)
        except ValueError:
            out[key] = float(value)
    return out


def run_upload(args: argparse.Namespace) -> int:
    from svtagg.client.upload import Uploader, UploadError, embed, load_records

    certs = Path(args.certs)
    ca = (certs / "ca.pem").read_bytes()
    cert = key = None
    if not args.no_client_cert:
        cert, key = (certs / "client.pem").read_bytes(), (certs / "client.key").read_bytes()
    values = embed(load_records(args.input), args.embedding, **_params(args.param))

    def progress(done: int, total: int) -> None:
        print(f"\ruploaded {done}/{total} reports", end="", file=sys.stderr, flush=True)

    with Uploader(args.leader, args.helper, ca, cert, key, retries=args.retries) as up:
        try:
            stats = up.upload(
                args.task,
                values,
                batch_size=args.batch,
                progress=progress,
                require_validation=args.require_validation,
            )
        except UploadError as exc:
            print(f"\nupload failed: {exc}", file=sys.stderr)
            return 1
    print(file=sys.stderr)
    rate = stats.reports / stats.seconds if stats.seconds else float("inf")
    print(
        f"uploaded {stats.reports} reports in {stats.batches} batches "
        f"({stats.retries} retries) in {stats.seconds:.2f}s ({rate:,.0f} reports/s); "
        f"leader n={stats.n_leader}, helper n={stats.n_helper}"
    )
    return 0
