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
from dataclasses import asdict, dataclass, field
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
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.pop("version") != VERSION:
                raise ValueError("unknown version")
            journal = cls(**raw)
            journal.upload_key  # noqa: B018 - the key must parse
            return journal
        except (OSError, ValueError, TypeError, KeyError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise InputError(f"upload journal {path} is unreadable ({e})") from None

    def differs(self, other: UploadJournal) -> str | None:
        """Why `other` (this run's view of the upload) is not the upload this
        journal records, or None.  A resume must rebuild the very same reports:
        a row's seed reused with another value would give the leader the
        difference of the two values."""
        if (self.size, self.sha256) != (other.size, other.sha256):
            return f"{other.input} changed since the upload began (its size or content differ)"
        if self.task != other.task:
            return f"the journal is of task {self.task!r}, not {other.task!r}"
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
