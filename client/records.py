"""Strict, streaming reading of client input files.

A file is read in blocks of at most `batch` rows, so memory is bounded by the
batch and one line, not by the file; a line longer than `max_line` bytes is
refused instead of being read whole.  Nothing is guessed: the input format is
explicit, and every value that cannot be uploaded as given is refused with its
row and column (1-based, rows counted in the file including a header line),
except where clipping is the embedding's documented contribution bound and the
caller asked for it (`clip=True`): then it is clipped and counted.  For a task
with a validity circuit (`Spec.validity`), a row the circuit would refuse (two
categories under `onehot`, more than r under `multihot:r`) is refused here too,
with its row, before anything is sent.

Formats (`FORMATS`):

* `matrix` — one user per row, the d coordinates of the user's vector, each in
  [0, 1] (with the `heavy_hitters` embedding: 0 or 1).
* `categories` — one user per row, the distinct category ids the user holds,
  each an integer in [0, d) (`heavy_hitters` only; rows may differ in length).
* `records` — one user per row, the raw record an embedding maps to [0, 1]^d:
  `sparse_mean` (d reals in [−B, B], B = the `clip` parameter), `marginals`
  (binary attributes, 0 or 1), `fp_loss` (residuals with |v| ≤ `bound`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from svtagg.client.embeddings import (
    fp_loss_embedding,
    heavy_hitters_embedding,
    marginals_embedding,
    sparse_mean_embedding,
)
from svtagg.dp.errors import InvalidArgument
from svtagg.mpc.ring import encode
from svtagg.vdaf.circuits import MeasurementError
from svtagg.vdaf.validity import Validity

Array = npt.NDArray[np.float64]

FORMATS = ("matrix", "categories", "records")
#: The input formats each embedding accepts (None: no embedding, vectors as given).
FORMATS_OF: dict[str | None, tuple[str, ...]] = {
    None: ("matrix",),
    "heavy_hitters": ("categories", "matrix"),
    "sparse_mean": ("records",),
    "marginals": ("records",),
    "fp_loss": ("records",),
}
#: Characters allowed per value on a line before the line counts as too long.
CHARS_PER_VALUE = 64


class InputError(InvalidArgument):
    """Client input that cannot be uploaded as given (names the row and column).
    An InvalidArgument (so a ValueError too): the front door's one family."""


def default_format(embedding: str | None) -> str | None:
    """The format an embedding implies, or None when the caller must choose."""
    formats = FORMATS_OF.get(embedding)
    if formats is None:
        raise InputError(f"unknown embedding {embedding!r}; known: {', '.join(_names())}")
    return formats[0] if len(formats) == 1 else None


def _names() -> list[str]:
    return [e for e in FORMATS_OF if e is not None]


@dataclass
class ReadStats:
    """What reading did: rows read and values clipped (only with clip=True)."""

    rows: int = 0
    clipped: int = 0
    first_clipped: tuple[int, int] | None = None
    by_column: dict[int, int] = field(default_factory=dict)


@dataclass
class Spec:
    """How to turn rows of a file into [0, 1]^d vectors for a task of dimension d
    (`validity`: the circuit the task's reports prove, which every row must fit)."""

    d: int
    fmt: str
    embedding: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    clip: bool = False
    validity: Validity | None = None

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise InputError(f"unknown format {self.fmt!r}; known: {', '.join(FORMATS)}")
        allowed = FORMATS_OF.get(self.embedding)
        if allowed is None:
            raise InputError(f"unknown embedding {self.embedding!r}; known: {', '.join(_names())}")
        if self.fmt not in allowed:
            what = f"embedding {self.embedding}" if self.embedding else "no embedding"
            raise InputError(f"format {self.fmt} does not fit {what}; use {' or '.join(allowed)}")
        if self.d < 1:
            raise InputError(f"d must be >= 1, got {self.d}")
        need = {"sparse_mean": ("clip",), "fp_loss": ("bound", "p")}.get(self.embedding or "", ())
        missing = [k for k in need if k not in self.params]
        if missing:
            raise InputError(
                f"embedding {self.embedding} needs --param {', '.join(f'{k}=...' for k in missing)}"
            )

    @property
    def width(self) -> int | None:
        """Values per input row (None: any, for category lists)."""
        if self.fmt == "categories":
            return None
        if self.embedding == "marginals":
            attributes = _attributes_for_pairs(self.d)
            if attributes is None:
                raise InputError(
                    f"marginals: the task's d={self.d} is not a pair count a(a-1)/2 of any a"
                )
            return attributes
        return self.d


def _attributes_for_pairs(d: int) -> int | None:
    a = int((1 + math.isqrt(1 + 8 * d)) // 2)
    return a if a * (a - 1) // 2 == d else None


# ------------------------------------------------------------------ checking
def _bad(rows: npt.NDArray[np.bool_], first_row: int) -> tuple[int, int]:
    r, c = np.argwhere(rows)[0]
    return first_row + int(r), int(c) + 1


def check_range(
    block: Array, lo: float, hi: float, first_row: int, what: str, clip: bool, stats: ReadStats
) -> Array:
    """Refuse NaN/inf always and values outside [lo, hi] unless `clip`; returns the
    (possibly clipped) block and counts clipped values in `stats`."""
    finite = np.isfinite(block)
    if not finite.all():
        row, col = _bad(~finite, first_row)
        value = block[row - first_row, col - 1]
        raise InputError(f"row {row}, column {col}: {value} is not a finite number")
    outside = (block < lo) | (block > hi)
    if outside.any():
        if not clip:
            row, col = _bad(outside, first_row)
            value = block[row - first_row, col - 1]
            raise InputError(
                f"row {row}, column {col}: {value:g} is outside [{lo:g}, {hi:g}] ({what})"
            )
        count = int(outside.sum())
        if stats.first_clipped is None:
            stats.first_clipped = _bad(outside, first_row)
        stats.clipped += count
        for c in np.nonzero(outside.any(axis=0))[0]:
            stats.by_column[int(c) + 1] = stats.by_column.get(int(c) + 1, 0) + int(
                outside[:, c].sum()
            )
        block = np.clip(block, lo, hi)
    return block


def check_circuit(block: Array, validity: Validity, first_row: int) -> None:
    """Refuse (InputError naming the row) the first row of an m × d block in
    [0, 1] that the task's validity circuit does not take: a report whose proof
    the client could not make."""
    check_grid(encode(np.atleast_2d(block), validity.frac_bits), validity, first_row)


def check_grid(grid: npt.NDArray[np.uint64], validity: Validity, first_row: int) -> None:
    """`check_circuit` of rows already on the task's grid.  The 0/1 and one-hot
    rules are the circuit's own (`Validity.measurements`); the bound on a row's
    ones (multihot:r) or nonzero values (sparse-range:r) is `max_items`."""
    circuit = validity.label
    try:
        measurements = validity.measurements(grid)
    except MeasurementError:
        for i, row in enumerate(grid):
            try:
                validity.measurement([int(v) for v in row])
            except MeasurementError as exc:
                raise InputError(
                    f"row {first_row + i}: {exc} (the task's reports prove {circuit}: "
                    f"{validity.describe()})"
                ) from None
        raise
    if validity.max_items:
        counts = np.count_nonzero(np.asarray(measurements), axis=1)
        over = np.flatnonzero(counts > validity.max_items)
        if over.size:
            i = int(over[0])
            what = "categories (ones)" if validity.multihot else "nonzero values"
            raise InputError(
                f"row {first_row + i} holds {int(counts[i])} {what}; the task's reports "
                f"prove {circuit}: at most {validity.max_items} per row"
            )


def embed_block(spec: Spec, rows: Any, first_row: int, stats: ReadStats) -> Array:
    """One block of parsed rows → an m × d block of values in [0, 1], each row
    one the task's validity circuit takes (`spec.validity`)."""
    block = _embed(spec, rows, first_row, stats)
    if spec.validity is not None:
        check_circuit(block, spec.validity, first_row)
    return block


def _embed(spec: Spec, rows: Any, first_row: int, stats: ReadStats) -> Array:
    if spec.fmt == "categories":
        lists: list[list[int]] = []
        for i, cats in enumerate(rows):
            row = first_row + i
            ids = []
            for c, v in enumerate(cats, 1):
                try:
                    whole = not isinstance(v, bool | np.bool_) and int(v) == v
                except (TypeError, ValueError, OverflowError):  # NaN, inf, text
                    whole = False
                if not whole:
                    raise InputError(f"row {row}, column {c}: {v!r} is not a category id")
                if not 0 <= int(v) < spec.d:
                    raise InputError(
                        f"row {row}, column {c}: category {v} is outside [0, {spec.d})"
                    )
                ids.append(int(v))
            if len(set(ids)) != len(ids):
                raise InputError(f"row {row}: a category repeats (a 0/1 matrix? use format matrix)")
            lists.append(ids)
        return heavy_hitters_embedding(lists, spec.d)
    block = np.asarray(rows, dtype=np.float64)
    if block.ndim != 2:
        raise InputError(f"expected one row per user, got an array of shape {block.shape}")
    emb = spec.embedding
    if emb is None:
        return check_range(
            block, 0.0, 1.0, first_row, "values must lie in [0, 1]", spec.clip, stats
        )
    if emb == "heavy_hitters":
        _check_binary(block, first_row)
        return heavy_hitters_embedding(block, spec.d)
    if emb == "marginals":
        _check_binary(block, first_row)
        return marginals_embedding(block)
    if emb == "sparse_mean":
        b = float(spec.params["clip"])
        block = check_range(
            block, -b, b, first_row, f"the clip B={b:g}; --clip clips", spec.clip, stats
        )
        return sparse_mean_embedding(block, b)
    if emb == "fp_loss":
        bound = float(spec.params["bound"])
        block = check_range(
            block, -bound, bound, first_row, f"the residual bound b={bound:g}; --clip clips",
            spec.clip, stats,
        )  # fmt: skip
        return fp_loss_embedding(block, bound, float(spec.params["p"]))
    raise InputError(f"unknown embedding {emb!r}")


def _check_binary(block: Array, first_row: int) -> None:
    bad = ~((block == 0) | (block == 1))
    if bad.any():
        row, col = _bad(bad, first_row)
        raise InputError(
            f"row {row}, column {col}: {block[row - first_row, col - 1]} is not 0 or 1"
        )


# ------------------------------------------------------------------ reading
def _hint(text: str, row: int) -> str:
    """Why a field may not parse: tabs in it (a TSV file read with another
    delimiter), numbers separated by another character than the delimiter,
    or a header line."""
    if "\t" in text:
        return " (the line holds tabs: a TSV file? use --delimiter '\\t')"
    if split := _split_hint(text):
        return f" ({split})"
    return " (a header line? use --header)" if row == 1 else ""


def _split_hint(text: str) -> str:
    """'numbers separated by …: use --delimiter …' when `text` is numbers
    separated by spaces, ',', ';' or '|' (read with another delimiter), else ''."""
    for sep in (None, ",", ";", "|"):  # None: runs of whitespace
        parts = text.split(sep)
        if len(parts) > 1 and all(_is_number(x) for x in parts):
            shown, flag = ("spaces", "' '") if sep is None else (repr(sep), repr(sep))
            return f"numbers separated by {shown}: use --delimiter {flag}"
    return ""


def _parse_float(text: str, row: int, col: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(
            f"row {row}, column {col}: {text.strip()!r} is not a number{_hint(text, row)}"
        ) from None


def _parse_category(text: str, row: int, col: int, d: int) -> int:
    try:
        value = int(text)
    except ValueError:
        hint = _hint(text, row)
        raise InputError(
            f"row {row}, column {col}: {text.strip()!r} is not a category id{hint}"
        ) from None
    if not 0 <= value < d:
        raise InputError(f"row {row}, column {col}: category {value} is outside [0, {d})")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _lines(
    f: TextIO, max_line: int, skip_header: bool, delimiter: str = ","
) -> Iterator[tuple[int, str]]:
    row = 0
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        row += 1
        if len(line) > max_line and not line.endswith("\n"):
            raise InputError(
                f"row {row} is longer than {max_line:,} characters (for this task's d); "
                "refusing to read it whole"
            )
        if row == 1 and skip_header:
            # A line of numbers is a user: skipping it would upload everyone but him.
            fields = line.rstrip("\r\n").split(delimiter)
            if line.strip() and all(_is_number(x) for x in fields):
                raise InputError(
                    "row 1 holds only numbers, so it is a user, not a header line; "
                    "drop --header (or give the columns names)"
                )
            continue
        yield row, line


def _numbers(spec: Spec, rows: list[Any], first: int, delimiter: str) -> Any:
    """Category rows as they are; numeric lines (each already of the right
    length) parsed in one call, or line by line to name a bad field."""
    if spec.fmt == "categories":
        return rows
    try:
        return np.loadtxt(rows, delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None)
    except ValueError as exc:
        for i, text in enumerate(rows):
            for c, x in enumerate(text.split(delimiter), 1):
                _parse_float(x, first + i, c)
        # Every field parses on its own (e.g. "1_000", which float() takes and
        # numpy does not): still a clear refusal, not a traceback.
        where = f"row {first}" if len(rows) == 1 else f"rows {first}–{first + len(rows) - 1}"
        detail = str(exc).splitlines()[0] if str(exc) else "ValueError"
        raise InputError(
            f"{where}: a field numpy cannot read as a number ({detail}); write plain decimals"
        ) from None


def read_csv(
    path: str | Path,
    spec: Spec,
    *,
    batch: int = 1000,
    header: bool = False,
    delimiter: str = ",",
    stats: ReadStats | None = None,
) -> Iterator[Array]:
    """Blocks of at most `batch` embedded rows from a delimited text file."""
    stats = stats if stats is not None else ReadStats()
    width = spec.width
    max_line = CHARS_PER_VALUE * (width or spec.d) + 1024
    if batch < 1:
        raise InputError(f"batch must be >= 1, got {batch}")
    with open(path, encoding="utf-8", newline="") as f:
        rows: list[Any] = []
        first = 0
        for row, line in _lines(f, max_line, header, delimiter):
            text = line.rstrip("\r\n")
            if not text.strip():
                raise InputError(f"row {row} is empty")
            if spec.fmt == "categories":
                fields = text.split(delimiter)
                cats = [_parse_category(x, row, c, spec.d) for c, x in enumerate(fields, 1)]
                if len(set(cats)) != len(cats):
                    raise InputError(
                        f"row {row}: a category repeats (a 0/1 matrix? use --format matrix)"
                    )
                rows.append(cats)
            else:
                count = text.count(delimiter) + 1
                if count != width:
                    hint = f"; delimiter is {delimiter!r}" if count == 1 else ""
                    tsv = "\t" in text or Path(path).suffix.lower() == ".tsv"
                    if hint and tsv and delimiter != "\t":
                        hint += ": a TSV file? use --delimiter '\\t'"
                    elif hint and (split := _split_hint(text)):
                        hint += f": {split}"
                    raise InputError(
                        f"row {row} has {count} values, expected {width} "
                        f"(the task's d={spec.d}{' as attribute count' if width != spec.d else ''})"
                        f"{hint}"
                    )
                rows.append(text)
            if not first:
                first = row
            if len(rows) == batch:
                yield embed_block(spec, _numbers(spec, rows, first, delimiter), first, stats)
                stats.rows += len(rows)
                rows, first = [], 0
        if rows:
            yield embed_block(spec, _numbers(spec, rows, first, delimiter), first, stats)
            stats.rows += len(rows)
    if stats.rows == 0:
        raise InputError(f"{path}: no rows to upload")


def read_npy(
    path: str | Path, spec: Spec, *, batch: int = 1000, stats: ReadStats | None = None
) -> Iterator[Array]:
    """Blocks of at most `batch` embedded rows from a 2-d .npy file (memory-mapped)."""
    stats = stats if stats is not None else ReadStats()
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
    if arr.ndim != 2:
        raise InputError(f"{path}: expected a 2-d array (one row per user), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise InputError(f"{path}: no rows to upload")
    if spec.fmt != "categories" and arr.shape[1] != spec.width:
        raise InputError(
            f"{path}: rows have {arr.shape[1]} values, "
            f"expected {spec.width} (the task's d={spec.d})"
        )
    for start in range(0, arr.shape[0], batch):
        block = np.asarray(arr[start : start + batch])
        if spec.fmt == "categories":
            if not np.issubdtype(block.dtype, np.integer):
                raise InputError(f"{path}: category ids must be integers, got {block.dtype}")
            bad = (block < 0) | (block >= spec.d)
            if bad.any():
                row, col = _bad(bad, start + 1)
                raise InputError(f"row {row}, column {col}: category outside [0, {spec.d})")
            rows: Any = block.tolist()
        else:
            rows = block.astype(np.float64)
        yield embed_block(spec, rows, start + 1, stats)
        stats.rows += block.shape[0]


def read_input(
    path: str | Path,
    spec: Spec,
    *,
    batch: int = 1000,
    header: bool = False,
    delimiter: str = ",",
    stats: ReadStats | None = None,
) -> Iterator[Array]:
    """Blocks from .npy (by suffix) or delimited text (anything else)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(2, "no such input file", str(p))
    if p.suffix == ".npy":
        return read_npy(p, spec, batch=batch, stats=stats)
    return read_csv(p, spec, batch=batch, header=header, delimiter=delimiter, stats=stats)
