"""`svtagg client upload`: read per-user records, embed, share and upload."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("client", help="client jobs (upload)")
    csub = p.add_subparsers(dest="client_command", metavar="CLIENT_COMMAND")
    u = csub.add_parser(
        "upload",
        help="upload per-user data from CSV or .npy to both servers",
        description="Read the input in batches, check every value, then share and upload. "
        "The whole file is checked before the first report is sent, so a bad row "
        "uploads nothing. A journal (the upload's key and progress) makes a rerun a "
        "refusal and lets --resume continue an interrupted upload: nobody counts twice.",
    )
    u.add_argument("--leader", required=True, help="leader host:port")
    u.add_argument("--helper", required=True, help="helper host:port")
    u.add_argument("--certs", required=True, help="directory with ca.pem and client.pem/.key")
    u.add_argument(
        "--no-client-cert",
        action="store_true",
        help="connect with server-only TLS (servers' --ingest-listen ports)",
    )
    u.add_argument("--task", required=True)
    u.add_argument("--input", required=True, help=".npy or delimited text, one user per row")
    u.add_argument(
        "--embedding",
        choices=["heavy_hitters", "sparse_mean", "marginals", "fp_loss"],
        help="map raw records to [0,1]^d. Default: the embedding the task records "
        "(none recorded: the rows already are vectors in [0,1]^d)",
    )
    u.add_argument(
        "--format",
        choices=["matrix", "categories", "records"],
        help="matrix: d values per row; categories: category ids per row (heavy_hitters); "
        "records: raw records of the embedding. Default: the embedding's only format "
        "(heavy_hitters must choose)",
    )
    u.add_argument(
        "--header",
        action="store_true",
        help="skip the first line of a text file (refused if that line is all numbers)",
    )
    u.add_argument("--delimiter", default=",", help="field separator of a text file")
    u.add_argument(
        "--clip",
        action="store_true",
        help="clip values outside the range to it and count them (else they are refused); "
        "for sparse_mean and fp_loss this is the embedding's contribution bound",
    )
    u.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="embedding parameter, e.g. clip=3.5, bound=1, p=2 (repeatable)",
    )
    u.add_argument(
        "--batch", type=int, default=1000, help="reports per batch (a resume keeps the journal's)"
    )
    u.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted upload of this input that the journal records; "
        "rows a server already holds are not counted again",
    )
    u.add_argument(
        "--journal",
        metavar="PATH",
        help="the upload's journal (its secret key and progress). "
        "Default: next to the input, INPUT.upload-TASK.json",
    )
    u.add_argument("--retries", type=int, default=5, help="retries per batch when unreachable")
    u.add_argument(
        "--require-validation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="refuse to upload to a task whose reports carry no validity proof; "
        "--no-require-validation uploads plain shares to such a task (default: refuse)",
    )
    u.add_argument("--json", action="store_true", help="print the result as one JSON object")
    u.add_argument("--quiet", action="store_true", help="no progress on stderr")
    u.set_defaults(handler=run_upload)
    p.set_defaults(handler=lambda a: (p.print_help(), 2)[1])


def parse_number(text: str, what: str) -> int | float:
    """An int if the text is one, else a finite float; ValueError naming `what`."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{what}: {text!r} is not a finite number")
    return value


def _params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param wants KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_number(value, f"--param {key}")
    return out


def run_upload(args: argparse.Namespace) -> int:
    from pathlib import Path

    from svtagg.client.journal import UploadJournal, default_path, fingerprint
    from svtagg.client.records import InputError, ReadStats, Spec, default_format, read_input
    from svtagg.client.upload import Resumable, Uploader, UploadError, UploadStats
    from svtagg.proto.tls import load_identity
    from svtagg.proto.vocab import MAX_BATCH_VALUES

    if args.batch < 1:
        raise InputError(f"--batch must be >= 1, got {args.batch}")
    if len(args.delimiter) != 1:
        raise InputError(f"--delimiter must be one character, got {args.delimiter!r}")
    params = _params(args.param)
    journal_path = Path(args.journal) if args.journal else default_path(args.input, args.task)
    recorded: UploadJournal | None = None
    if journal_path.exists():
        recorded = UploadJournal.load(journal_path)
        if not args.resume:
            if recorded.done:
                raise InputError(
                    f"{args.input} was already uploaded to task {recorded.task!r} "
                    f"({recorded.rows:,} rows; journal {journal_path}): nothing sent. "
                    "To upload these users again as new users, delete the journal"
                )
            raise InputError(
                f"an upload of {args.input} to task {recorded.task!r} was interrupted "
                f"({recorded.held()}; journal {journal_path}): --resume continues it"
            )
    elif args.resume:
        raise InputError(
            f"no upload journal {journal_path} to resume (an upload without --resume starts one)"
        )
    if args.no_client_cert:
        ca, cert, key = (Path(args.certs) / "ca.pem").read_bytes(), None, None
    else:
        ident = load_identity(args.certs, "client")
        ca, cert, key = ident.ca, ident.cert, ident.key

    with Uploader(args.leader, args.helper, ca, cert, key, retries=args.retries) as up:
        info = up.task(args.task)
        # The task's recorded embedding unless one is given (which must agree).
        embedding = args.embedding
        if embedding is None and info.spec.embedding not in ("", "vectors"):
            embedding = info.spec.embedding
        try:
            up.checked_task(args.task, args.require_validation, embedding or "vectors", info=info)
        except ValueError as exc:
            if isinstance(exc, InputError) or not args.require_validation:
                raise
            raise ValueError(
                f"{exc} (--no-require-validation uploads plain shares, which only the "
                "servers' robust aggregates bound)"
            ) from None
        fmt = args.format or default_format(embedding)
        if fmt is None:
            source = "" if args.embedding else f" (the embedding task {args.task!r} records)"
            raise InputError(
                f"embedding {embedding}{source} needs --format categories (category ids per "
                "row) or --format matrix (a 0/1 row of d values)"
            )
        d = int(info.spec.d)
        if "d" in params and int(params.pop("d")) != d:
            raise InputError(f"--param d disagrees with the task's d={d}")
        spec = Spec(d, fmt, embedding, params, clip=args.clip)
        batch = max(1, min(args.batch, MAX_BATCH_VALUES // d))
        if recorded is not None:
            batch = int(recorded.options.get("batch", batch))  # the same batches again

        def blocks(stats: ReadStats) -> Any:
            return read_input(
                args.input,
                spec,
                batch=batch,
                header=args.header,
                delimiter=args.delimiter,
                stats=stats,
            )

        # The progress line redraws itself, so only on a terminal (no \r in logs).
        live = not args.quiet and sys.stderr.isatty()
        # Pass 1: check every row (memory: one batch) so a bad row uploads nothing.
        checked = ReadStats()
        for _ in blocks(checked):
            pass
        total = checked.rows
        size, digest = fingerprint(args.input)
        options = {
            "d": d,
            "embedding": embedding,
            "format": fmt,
            "params": params,
            "clip": args.clip,
            "header": args.header,
            "delimiter": args.delimiter,
            "batch": batch,
        }
        journal = UploadJournal(
            args.task, str(Path(args.input).resolve()), size, digest, options, total
        )
        if recorded is not None:
            why = recorded.differs(journal)
            if why is not None:
                raise InputError(f"cannot resume from journal {journal_path}: {why}")
            journal = recorded
            if journal.done:
                print(
                    f"nothing to resume: {journal.held()} (journal {journal_path})",
                    file=sys.stderr,
                )
        else:
            journal.create(journal_path)  # the key is on disk before any report leaves
        # Both servers hold every row before this one; batches after it may be
        # held by one of them, which then refuses them as already held.
        start = min(journal.leader_rows, journal.helper_rows) // batch * batch

        def progress(done: int, _total: int) -> None:
            if live:
                print(
                    f"\ruploaded {start + done}/{total} reports",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )

        def record(stats: UploadStats) -> None:
            journal.leader_rows, journal.helper_rows = stats.held
            journal.save(journal_path)

        read = ReadStats()
        stats = UploadStats(held=[journal.leader_rows, journal.helper_rows])
        try:
            if not journal.done:
                up.upload_blocks(
                    args.task,
                    _skip_rows(blocks(read), start),
                    total=total,
                    progress=progress,
                    info=info,
                    resume=Resumable(journal.upload_key, start, record),
                    stats=stats,
                )
        except KeyboardInterrupt:
            record(stats)
            raise KeyboardInterrupt(
                f"{journal.held()} (acknowledged; none counted twice): --resume continues "
                f"(journal {journal_path})"
            ) from None
        except UploadError as exc:
            record(stats)
            hint = ": --resume continues" if exc.unreachable else ""
            raise UploadError(
                f"{exc}; {journal.held()}{hint} (journal {journal_path})",
                unreachable=exc.unreachable,
            ) from None
    if live and stats.reports:
        print(file=sys.stderr)
    rate = stats.reports / stats.seconds if stats.seconds else 0.0
    if args.json:
        print(
            json.dumps(
                {
                    "task": args.task,
                    "reports": stats.reports,
                    "resumed_at_row": start if recorded is not None else None,
                    "rows": total,
                    "batches": stats.batches,
                    "retries": stats.retries,
                    "seconds": round(stats.seconds, 3),
                    "clipped_values": read.clipped,
                    "clipped_by_column": {str(k): v for k, v in sorted(read.by_column.items())},
                    "leader_n": stats.n_leader,
                    "helper_n": stats.n_helper,
                    "proofs": info.spec.validity or None,
                    "rejected": stats.rejected,
                    "format": fmt,
                    "embedding": embedding,
                    "d": d,
                    "journal": str(journal_path),
                }
            )
        )
        return 0
    clipped = ""
    if read.clipped:
        assert read.first_clipped is not None
        row, col = read.first_clipped
        clipped = f"; clipped {read.clipped} values (first at row {row}, column {col})"
    resumed = f" from row {start + 1} on" if recorded is not None else ""
    if info.spec.validity:
        # The helper counts a report once the leader has verified it with it.
        refused = ", ".join(f"{k} {v}" for k, v in sorted(stats.rejected.items()))
        counts = (
            f"{info.spec.validity} proofs checked by both servers, "
            f"{sum(stats.rejected.values())} refused{f' ({refused})' if refused else ''}; "
            f"n={stats.n_leader}"
        )
    else:
        counts = f"leader n={stats.n_leader}, helper n={stats.n_helper}"
    print(
        f"uploaded {stats.reports} reports{resumed} in {stats.batches} batches "
        f"({stats.retries} retries) in {stats.seconds:.2f}s ({rate:,.0f} reports/s); "
        f"{counts}{clipped}"
    )
    return 0


def _skip_rows(blocks: Any, rows: int) -> Any:
    """The blocks after the first `rows` rows (a whole number of blocks)."""
    for block in blocks:
        if rows > 0:
            rows -= len(block)
            continue
        yield block
