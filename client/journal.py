"""The local journal of one `svtagg client upload`: the upload's secret key
(its report ids and share seeds derive from it and the row number), what the
rows were made from, and how many rows each server has acknowledged.  It makes
a rerun of the same upload a refusal instead of a second count, and lets
`--resume` continue where an interrupted upload stopped: a batch sent again is
the same batch, which a server that holds it refuses as already held.

Default place: next to the input, `<input>.upload-<task>.json` (`--journal`
names another).  Written 0600 (the key, with the leader's shares, would
reconstruct the values) and replaced atomically."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from svtagg.client.records import InputError
from svtagg.client.upload import UploadKey

VERSION = 1


def default_path(input_path: str | Path, task_id: str) -> Path:
    p = Path(input_path)
    return p.with_name(f"{p.name}.upload-{task_id}.json")


def fingerprint(input_path: str | Path) -> tuple[int, str]:
    """(size, SHA-256) of the input: a resume must read the same rows."""
    with open(input_path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        return f.tell(), digest


@dataclass
class UploadJournal:
    task: str
    input: str
    size: int
    sha256: str
    #: Everything that turns the file's rows into reports and batches (d,
    #: embedding, format, parameters, clipping, header, delimiter, batch size).
    options: dict[str, Any]
    rows: int
    key: str = field(default_factory=lambda: UploadKey.new().secret.hex(), repr=False)
    leader_rows: int = 0
    helper_rows: int = 0

    @property
    def upload_key(self) -> UploadKey:
        return UploadKey(bytes.fromhex(self.key))

    @property
    def done(self) -> bool:
        return min(self.leader_rows, self.helper_rows) >= self.rows

    def held(self) -> str:
        """What each server holds, in words (for messages)."""
        return (
            f"the leader holds {self.leader_rows:,} and the helper {self.helper_rows:,} "
            f"of this upload's {self.rows:,} rows"
        )

    def create(self, path: Path) -> None:
        """Write a new journal, durably, before the first report is sent;
        FileExistsError if one appeared meanwhile (another run)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._write(fd)
        _sync_dir(path)

    def save(self, path: Path) -> None:
        """Record progress (atomic replace, written through before it replaces the
        old journal: a power loss leaves the old or the new one, never an empty
        file and a lost key; losing the last update only means a batch is sent
        again and refused as already held)."""
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        self._write(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.replace(tmp, path)
        _sync_dir(path)

    def _write(self, fd: int) -> None:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": VERSION, **asdict(self)}, f)
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def load(cls, path: Path) -> UploadJournal:
        """The journal at `path`; InputError (one line naming the file and how to
        start over) if it is not one this client wrote: truncated, not JSON,
        fields missing, of the wrong type or out of range (a negative count)."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            journal = cls(**_fields(raw))
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(
                f"upload journal {path} is unreadable or damaged ({why}): it cannot be resumed; "
                "to start over, delete it (or pass another --journal); rows an earlier run "
                "sent would then count again"
            ) from None
        return journal

    def start_over(self, path: Path) -> str:
        """How to start this upload over, and what that costs (for messages):
        rows both servers hold count twice under a new key; a row one server
        alone holds is taken out at the close."""
        both = min(self.leader_rows, self.helper_rows)
        if both == 0:
            return (
                f"to start over, delete {path} (no row of it is held by both servers, "
                "so none would count twice)"
            )
        return (
            f"to start over anyway, delete {path}: the {both:,} rows both servers hold "
            "would then count twice"
        )

    def differs(self, other: UploadJournal) -> str | None:
        """Why `other` (this run's view of the upload) is not the upload this
        journal records, or None.  A resume must rebuild the very same reports:
        a row's seed reused with another value would give the leader the
        difference of the two values."""
        if (self.size, self.sha256) != (other.size, other.sha256):
            return f"{other.input} changed since the upload began (its size or content differ)"
        if self.task != other.task:
            return f"the journal is of task {self.task!r}, not {other.task!r}"
        if self.rows != other.rows:
            return f"the journal records {self.rows:,} rows, the input has {other.rows:,}"
        changed = sorted(k for k in self.options if self.options[k] != other.options.get(k))
        if changed:
            was = ", ".join(f"{k}={self.options[k]!r}" for k in changed)
            return f"options differ from the upload's ({was})"
        return None


def _sync_dir(path: Path) -> None:
    """Make a created or replaced directory entry durable (POSIX)."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fields(raw: object) -> dict[str, Any]:
    """A journal's fields, checked: the right names, types and ranges (a
    journal is a file anyone may edit, and its counts choose the rows sent)."""
    if not isinstance(raw, dict):
        raise ValueError(f"not a JSON object but {type(raw).__name__}")
    if raw.get("version") != VERSION:
        raise ValueError(f"version {raw.get('version')!r}, this client writes {VERSION}")
    out = {k: v for k, v in raw.items() if k != "version"}
    names = {f.name for f in fields(UploadJournal)}
    if set(out) != names:
        missing, unknown = sorted(names - set(out)), sorted(set(out) - names)
        raise ValueError(f"fields missing: {missing}, unknown: {unknown}")
    for name in ("task", "input", "sha256", "key"):
        if not isinstance(out[name], str):
            raise ValueError(f"{name} is not a string")
    for name, hex_chars in (("sha256", 64), ("key", 64)):
        if len(out[name]) != hex_chars or not _is_hex(out[name]):
            raise ValueError(f"{name} is not {hex_chars} hex digits")
    if not isinstance(out["options"], dict):
        raise ValueError("options is not an object")
    counts = {k: out[k] for k in ("size", "rows", "leader_rows", "helper_rows")}
    if "batch" in out["options"]:
        counts["options.batch"] = out["options"]["batch"]
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} is {value!r}, not a count")
    if out["rows"] < 1 or counts.get("options.batch", 1) < 1:
        raise ValueError("rows and the batch size must be at least 1")
    for name in ("leader_rows", "helper_rows"):
        if out[name] > out["rows"]:
            raise ValueError(f"{name} {out[name]:,} exceeds the upload's {out['rows']:,} rows")
    return out


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text.lower())
