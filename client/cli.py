"""`svtagg client upload`: read per-user records, embed, share and upload."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from svtagg.client.journal import UploadJournal
    from svtagg.client.records import ReadStats
    from svtagg.client.upload import Uploader
    from svtagg.proto import svtagg_pb2 as pb


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
    u.add_argument(
        "--input",
        "--file",
        dest="input",
        required=True,
        help=".npy or delimited text, one user per row; for a crawl task (validity crawl:B) "
        "a UTF-8 text file of one string per line",
    )
    u.add_argument(
        "--embedding",
        choices=["heavy_hitters", "sparse_mean", "marginals", "fp_loss"],
        help="map raw records to [0,1]^d. Default: the embedding the task records "
        "(none recorded: the rows already are vectors in [0,1]^d)",
    )
    u.add_argument(
        "--format",
        choices=["matrix", "categories", "records", "strings"],
        help="matrix: d values per row; categories: category ids per row (heavy_hitters); "
        "records: raw records of the embedding; strings: one string per line (UTF-8, at most "
        "B/8 bytes, no blank line), the only format of a crawl task (validity crawl:B). "
        "Default: the embedding's only format (heavy_hitters must choose; a crawl task's "
        "strings, except for a .npy, .csv or .tsv input)",
    )
    u.add_argument(
        "--header",
        action="store_true",
        help="skip the first line of a text file (refused if that line is all numbers)",
    )
    u.add_argument(
        "--delimiter",
        default=",",
        help="field separator of a text file: one character, or '\\t' for a tab",
    )
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
        "--batch",
        type=int,
        default=1000,
        help="reports per batch, lowered (with a notice) to what one batch of the task may "
        "hold, fewer for a large d with proofs (a resume keeps the journal's)",
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
    u.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object. reports: sent by this run; rows: of the "
        "input; batch: reports per batch; leader_rows/helper_rows: rows of this upload each "
        "server has acknowledged holding (they replace leader_n/helper_n: servers do not tell "
        "clients a task's n); leader_stored/helper_stored: of those, stored by this run (the "
        "rest were already held); rejected: reports refused for a failed proof, by reason",
    )
    u.add_argument("--quiet", action="store_true", help="no progress or notices on stderr")
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
    from svtagg.client.records import InputError, ReadStats
    from svtagg.client.upload import Resumable, Uploader, UploadError, UploadStats, task_circuit
    from svtagg.proto.tls import load_identity

    if args.batch < 1:
        raise InputError(f"--batch must be >= 1, got {args.batch}")
    delimiter = "\t" if args.delimiter == "\\t" else args.delimiter
    if len(delimiter) != 1:
        raise InputError(
            f"--delimiter must be one character ('\\t' for a tab), got {args.delimiter!r}"
        )
    params = _params(args.param)
    journal_path = Path(args.journal) if args.journal else default_path(args.input, args.task)
    recorded = _recorded(args, journal_path)
    if args.no_client_cert:
        ca, cert, key = (Path(args.certs) / "ca.pem").read_bytes(), None, None
    else:
        ident = load_identity(args.certs, "client")
        ca, cert, key = ident.ca, ident.cert, ident.key

    with Uploader(args.leader, args.helper, ca, cert, key, retries=args.retries) as up:
        info = up.task(args.task)
        validity = task_circuit(info.spec)
        if args.format == "strings" or (validity is not None and validity.crawl):
            source = _strings_source(args, info.spec, delimiter, params)
        else:
            source = _records_source(args, up, info, delimiter, params)
        fmt, embedding, d = source.fmt, source.embedding, source.d
        batch = _batch_size(args, info.spec, recorded, journal_path)

        def blocks(stats: ReadStats) -> Any:
            return source.read(batch, stats)

        # The progress line redraws itself, so only on a terminal (no \r in logs).
        live = not args.quiet and sys.stderr.isatty()
        # Pass 1: check every row (memory: one batch) before the journal is
        # written, so a bad row uploads nothing and leaves nothing behind.
        checked = ReadStats()
        for _ in blocks(checked):
            pass
        total = checked.rows
        size, digest = fingerprint(args.input)
        options = {**source.options, "batch": batch}
        journal = UploadJournal(
            args.task, str(Path(args.input).resolve()), size, digest, options, total
        )
        if recorded is not None:
            why = recorded.differs(journal)
            if why is not None:
                raise InputError(
                    f"cannot resume from journal {journal_path}: {why}; {recorded.held()}. "
                    "To finish that upload, --resume with its input and options as they were; "
                    f"{recorded.start_over(journal_path)}"
                )
            journal = recorded
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

        stats = UploadStats(held=[journal.leader_rows, journal.helper_rows])
        try:
            if not journal.done:
                up.upload_blocks(
                    args.task,
                    _skip_rows(blocks(ReadStats()), start),
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
            hint = (
                f": --resume continues (journal {journal_path})"
                if exc.unreachable
                else "; --resume continues once the refusal's cause is gone; "
                + journal.start_over(journal_path)
            )
            raise UploadError(
                f"{exc}; {journal.held()}{hint}",
                unreachable=exc.unreachable,
            ) from None
    if live and stats.reports:
        print(file=sys.stderr)
    out = {
        "task": args.task,
        "reports": stats.reports,
        "resumed_at_row": start if recorded is not None else None,
        "rows": total,
        "batch": batch,
        "batches": stats.batches,
        "retries": stats.retries,
        "seconds": round(stats.seconds, 3),
        "clipped_values": checked.clipped,
        "clipped_by_column": {str(k): v for k, v in sorted(checked.by_column.items())},
        # What the client knows: the rows of this upload each server has
        # acknowledged (not the task's n, which servers do not tell clients).
        "leader_rows": stats.held[0],
        "helper_rows": stats.held[1],
        "leader_stored": stats.stored[0],
        "helper_stored": stats.stored[1],
        "proofs": info.spec.validity or None,
        "rejected": stats.rejected,
        "format": fmt,
        "embedding": embedding,
        "d": d,
        "journal": str(journal_path),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(_summary(out, journal.held(), checked))
    return 0


@dataclass(frozen=True)
class _Source:
    """What an upload reads and how: the format, the embedding, the task's d,
    what turns the file's lines into reports (the journal's options, without
    the batch size), and `read(batch, stats)`, the file's blocks, checked."""

    fmt: str
    embedding: str | None
    d: int
    options: dict[str, Any]
    read: Callable[[int, ReadStats], Iterator[Any]]


def _records_source(
    args: argparse.Namespace,
    up: Uploader,
    info: pb.TaskInfo,
    delimiter: str,
    params: dict[str, Any],
) -> _Source:
    """Rows of numbers or category ids (`client.records`), for a task of
    vectors: the embedding the task records unless one is given (which must
    agree), the format it implies unless given, each row checked against the
    task's validity circuit."""
    from svtagg.client.records import InputError, Spec, default_format, read_input
    from svtagg.client.upload import task_circuit

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
    # Every row must also fit the task's validity circuit: checked in pass 1.
    spec = Spec(d, fmt, embedding, params, clip=args.clip, validity=task_circuit(info.spec))

    def read(batch: int, stats: ReadStats) -> Iterator[Any]:
        return read_input(
            args.input, spec, batch=batch, header=args.header, delimiter=delimiter, stats=stats
        )

    options = {
        "d": d,
        "embedding": embedding,
        "format": fmt,
        "params": params,
        "clip": args.clip,
        "header": args.header,
        "delimiter": delimiter,
    }
    return _Source(fmt, embedding, d, options, read)


#: Input a crawl task does not take unless --format strings says it is strings.
_NOT_STRINGS = (".npy", ".csv", ".tsv")


def _strings_source(
    args: argparse.Namespace, spec: pb.TaskSpec, delimiter: str, params: dict[str, Any]
) -> _Source:
    """One string per line (`client.strings.read_strings`), for a crawl task
    (validity crawl:B): refused, in one line, for another task, with another
    --format or --embedding, with options that do not apply to strings, and
    — without --format strings — for a .npy, .csv or .tsv input."""
    from pathlib import Path

    from svtagg.client.records import InputError
    from svtagg.client.strings import STRINGS_FORMAT, check_strings_upload, read_strings

    bits = check_strings_upload(spec, args.format, args.embedding)
    suffix = Path(args.input).suffix.lower()
    if args.format is None and suffix in _NOT_STRINGS:
        raise InputError(
            f"task {args.task!r} is a crawl task (validity {spec.validity}): it takes a text "
            f"file of strings, one per line, not {suffix} input (--format strings reads "
            f"{args.input} as one string per line)"
        )
    unused = ["--clip"] * args.clip + ["--delimiter"] * (delimiter != ",")
    unused += [f"--param {k}" for k in params]
    if unused:
        raise InputError(f"{', '.join(unused)}: does not apply to strings (one per line)")

    def read(batch: int, stats: ReadStats) -> Iterator[Any]:
        return read_strings(args.input, bits, batch=batch, header=args.header, stats=stats)

    options = {
        "d": int(spec.d),
        "embedding": STRINGS_FORMAT,
        "format": STRINGS_FORMAT,
        "bits": bits,
        "header": args.header,
    }
    return _Source(STRINGS_FORMAT, STRINGS_FORMAT, int(spec.d), options, read)


def _recorded(args: argparse.Namespace, journal_path: Path) -> UploadJournal | None:
    """The journal of this upload if one exists (an `UploadJournal`), refusing a
    run it blocks: a rerun without --resume, or a --resume without one."""
    from svtagg.client.journal import UploadJournal
    from svtagg.client.records import InputError

    if not journal_path.exists():
        if args.resume:
            raise InputError(
                f"no upload journal {journal_path} to resume "
                "(an upload without --resume starts one)"
            )
        return None
    recorded = UploadJournal.load(journal_path)
    if args.resume:
        return recorded
    if recorded.done:
        raise InputError(
            f"{args.input} was already uploaded to task {recorded.task!r} "
            f"({recorded.rows:,} rows; journal {journal_path}): nothing sent. "
            "To upload these users again as new users, delete the journal"
        )
    raise InputError(
        f"an upload of {args.input} to task {recorded.task!r} was interrupted "
        f"({recorded.held()}; journal {journal_path}): --resume continues it; "
        f"{recorded.start_over(journal_path)}"
    )


def _batch_size(
    args: argparse.Namespace,
    spec: pb.TaskSpec,
    recorded: UploadJournal | None,
    journal_path: Path,
) -> int:
    """Reports per batch: --batch, lowered to what one batch of the task may hold
    (`client.upload.batch_bound`, saying so on stderr), or on a resume the
    journal's, which must still fit (a resume sends the very same batches)."""
    from svtagg.client.records import InputError
    from svtagg.client.upload import batch_bound

    most = batch_bound(spec)
    if recorded is not None:
        batch = int(recorded.options.get("batch", min(args.batch, most)))
        if batch > most and not recorded.done:
            raise InputError(
                f"cannot resume from journal {journal_path}: it records batches of {batch:,} "
                f"reports, more than one batch of task {args.task!r} may hold ({most:,}), and "
                f"a resume must send the very same batches; {recorded.held()}; "
                f"{recorded.start_over(journal_path)}"
            )
        return batch
    if args.batch > most and not args.quiet:
        proofs = f" with {spec.validity} proofs" if spec.validity else ""
        print(
            f"--batch {args.batch:,} is more than one batch of task {args.task!r} may hold "
            f"({most:,} reports of d={spec.d:,}{proofs}): sending batches of {most:,}",
            file=sys.stderr,
        )
    return min(args.batch, most)


def _summary(out: dict[str, Any], held: str, checked: ReadStats) -> str:
    """The one-line result of an upload: what was sent and what each server now
    holds of it (`held`: the journal's words when not both hold every row)."""
    total = out["rows"]
    held_by = (out["leader_rows"], out["helper_rows"])
    stored = (out["leader_stored"], out["helper_stored"])
    if stored == (0, 0) and min(held_by) >= total:
        return (
            f"nothing left to send: all {total:,} rows were already held by both servers "
            f"(journal {out['journal']})"
        )
    rate = out["reports"] / out["seconds"] if out["seconds"] else 0.0
    resumed = "" if out["resumed_at_row"] is None else f" from row {out['resumed_at_row'] + 1} on"
    line = (
        f"uploaded {out['reports']:,} reports{resumed} in {out['batches']} batches of at most "
        f"{out['batch']:,} ({out['retries']} retries) in {out['seconds']:.2f}s "
        f"({rate:,.0f} reports/s); "
    )
    line += f"both servers hold all {total:,} rows" if min(held_by) >= total else held
    if stored != (out["reports"], out["reports"]):
        line += (
            f"; of the {out['reports']:,} reports the leader stored {stored[0]:,} anew and "
            f"the helper {stored[1]:,} (the rest they already held)"
        )
    if out["proofs"]:
        # The helper counts a report once the leader has verified it with it.
        refused = ", ".join(f"{k} {v}" for k, v in sorted(out["rejected"].items()))
        what = (
            f"{out['proofs']} strings' first level"
            if out["format"] == "strings"
            else f"{out['proofs']} proofs"
        )
        line += (
            f"; {what} checked by both servers, "
            f"{sum(out['rejected'].values())} refused{f' ({refused})' if refused else ''}"
        )
    if checked.clipped:
        assert checked.first_clipped is not None
        row, col = checked.first_clipped
        line += f"; clipped {checked.clipped} values (first at row {row}, column {col})"
    return line


def _skip_rows(blocks: Any, rows: int) -> Any:
    """The blocks after the first `rows` rows (a whole number of blocks)."""
    for block in blocks:
        if rows > 0:
            rows -= len(block)
            continue
        yield block
