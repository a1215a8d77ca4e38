"""Strings as a crawl task's clients upload them (validity ``crawl:B``): each
user holds one string, sent as the keys of an incremental verifiable DPF
(`vdaf.crawl`) that the prefix crawl walks (`analyst.crawl`).

A string is a B-bit integer: UTF-8, padded with zero bytes to B/8 bytes, most
significant byte first, so that a prefix of the integer is a prefix of the
string (`encode_string`, `decode_string`).  A string longer than B/8 bytes, or
holding a NUL byte (which the padding could not tell apart), is refused, and
so is a B that is not a whole number of bytes.

`read_strings` reads a text file of one string per line (UTF-8; the line
ending, \\n or \\r\\n, is not part of the string) in blocks, as
`client.records` reads other input: memory holds one block and one line, a
line is never read past the longest string the task takes, and a line that
cannot be uploaded (blank, too long, not UTF-8, holding NUL) is refused with
its number before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from svtagg.client.records import InputError, ReadStats
from svtagg.dp.errors import InvalidArgument
from svtagg.proto import svtagg_pb2 as pb
from svtagg.vdaf.validity import ValidityError, parse_validity

#: What `svtagg client upload --format strings` and the front door call the format.
STRINGS_FORMAT = "strings"


def encode_string(s: str, bits: int) -> int:
    """The B-bit integer of a string (UTF-8, zero-padded to B/8 bytes)."""
    if bits % 8:
        raise InvalidArgument(f"string tasks take whole bytes: {bits} bits is not a multiple of 8")
    raw = s.encode("utf-8")
    if len(raw) > bits // 8:
        raise InvalidArgument(
            f"{s[:40]!r} is {len(raw)} bytes in UTF-8; this task takes strings of at most "
            f"{bits // 8} bytes"
        )
    if b"\0" in raw:
        raise InvalidArgument(f"{s[:40]!r} holds a NUL character, which the padding uses")
    return int.from_bytes(raw.ljust(bits // 8, b"\0"), "big")


def decode_string(x: int, bits: int) -> str:
    """The string of a B-bit integer (undecodable bytes shown as U+FFFD)."""
    return x.to_bytes(bits // 8, "big").rstrip(b"\0").decode("utf-8", errors="replace")


def check_string_bits(bits: int, task_id: str = "") -> None:
    """Refuse (InputError) a crawl task whose strings are not whole bytes."""
    if bits % 8:
        task = f"task {task_id!r}" if task_id else "the task"
        raise InputError(
            f"{task} takes strings of {bits} bits, not a whole number of bytes: no string "
            "can be uploaded to it (crawl:B with B a multiple of 8 takes strings of B/8 bytes)"
        )


def check_strings_upload(
    spec: pb.TaskSpec, fmt: str | None, embedding: str | None, unused: Sequence[str] = ()
) -> int:
    """B of a crawl task taking an upload of strings, refusing (InputError, one
    line) strings for another task and, for a crawl task, another format, an
    embedding other than strings, or the options named in `unused` (given,
    and meaningless for strings)."""
    task = f"task {spec.task_id!r}"
    try:
        validity = parse_validity(spec.validity, spec.d, spec.frac_bits, spec.embedding)
    except ValidityError as exc:
        raise InputError(f"{task}: {exc} (a newer server? upgrade svtagg)") from None
    if validity is None or not validity.crawl:
        takes = f"validity {spec.validity}" if spec.validity else "plain shares"
        raise InputError(
            f"format strings is for a crawl task (created with validity crawl:B); {task} "
            f"takes rows of d={spec.d} values ({takes})"
        )
    if fmt not in (None, STRINGS_FORMAT):
        raise InputError(
            f"{task} is a crawl task (validity {spec.validity}): its clients upload strings "
            f"(format strings, one string per user), not format {fmt}"
        )
    if embedding not in (None, "", STRINGS_FORMAT):
        raise InputError(
            f"{task} is a crawl task (validity {spec.validity}): its clients upload strings, "
            f"not embedding {embedding}"
        )
    if unused:
        raise InputError(f"{', '.join(unused)}: does not apply to strings")
    check_string_bits(validity.bits, spec.task_id)
    return validity.bits


def encode_strings(strings: Iterable[object], bits: int, first_row: int = 1) -> list[int]:
    """Every string as its B-bit integer, refusing (InputError naming the row,
    1-based from `first_row`) the first that is not a str or that the task
    cannot hold."""
    check_string_bits(bits)
    out = []
    for row, s in enumerate(strings, first_row):
        if not isinstance(s, str):
            raise InputError(f"row {row}: {type(s).__name__} {s!r:.40} is not a string")
        out.append(_checked(s, f"row {row}", bits))
    return out


def _checked(text: str, where: str, bits: int) -> int:
    """The one rule for a user's string, from a file's line or a Python value:
    not blank, and one the task holds (`encode_string`); InputError naming
    `where` (the line or the row) otherwise."""
    if not text.strip():
        raise InputError(f"{where} is blank: one string per user, and a blank one is no user's")
    try:
        return encode_string(text, bits)
    except InvalidArgument as exc:
        raise InputError(f"{where}: {exc}") from None


def read_strings(
    path: str | Path,
    bits: int,
    *,
    batch: int = 1000,
    header: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[list[int]]:
    """Blocks of at most `batch` strings (as B-bit integers) from a text file
    of one string per line; `header` skips the first line.  Lines count from 1,
    the skipped header included."""
    check_string_bits(bits)
    if batch < 1:
        raise InputError(f"batch must be >= 1, got {batch}")
    stats = stats if stats is not None else ReadStats()
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(2, "no such input file", str(p))
    most = bits // 8
    limit = most + 2  # the longest string and a \r\n
    block: list[int] = []
    with open(p, "rb") as f:
        line = 0
        if header:  # skipped whatever its length
            line = 1
            while (raw := f.readline(1 << 16)) and not raw.endswith(b"\n"):
                pass
        while True:
            bom = 3 if line == 0 else 0  # a byte order mark before the first string
            raw = f.readline(limit + bom)
            if not raw:
                break
            line += 1
            if len(raw) == limit + bom and not raw.endswith(b"\n"):
                raise InputError(
                    f"line {line} is longer than {most} bytes: this task takes strings of at "
                    f"most {most} bytes in UTF-8 (crawl:{bits})"
                )
            block.append(_string_of(raw, line, bits))
            if len(block) == batch:
                stats.rows += len(block)
                yield block
                block = []
    if block:
        stats.rows += len(block)
        yield block
    if stats.rows == 0:
        raise InputError(f"{path}: no strings to upload")


def _string_of(raw: bytes, line: int, bits: int) -> int:
    """One line's string as its integer, or InputError naming the line."""
    body = raw[:-1] if raw.endswith(b"\n") else raw
    body = body[:-1] if body.endswith(b"\r") else body
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"line {line} is not UTF-8 text ({exc.reason} at byte {exc.start + 1})"
        ) from None
    if line == 1:
        text = text.removeprefix("\ufeff")  # a byte order mark is no part of the string
    return _checked(text, f"line {line}", bits)
