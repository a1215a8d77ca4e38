"""The store contract for chunked report-noisy-max, on both backends (the
fixtures of tests/test_store_contract.py): a chunk stores this server's share
of the carried winner while it is mid-chunk, under its number, and the next
chunk reads it back; an older SQLite store gains the columns."""

from __future__ import annotations

import sqlite3
from fractions import Fraction
from pathlib import Path

import pytest
from test_store_contract import backend, params, store  # noqa: F401 - fixtures

from svtagg.dp.errors import FailedPrecondition, NotFound
from svtagg.dp.kinds import StreamKind
from svtagg.servers.store.rules import FAILED, Store
from svtagg.servers.store.sqlite import SqliteStore


def nmax_stream(store: Store, sid: str = "s") -> None:  # noqa: F811
    store.create_task(params())
    store.close_collection("t")
    store.mark_agreed("t", None)
    store.open_stream(sid, "t", StreamKind.NMAX, Fraction(1), Fraction(0), Fraction(0))


def test_the_carry_is_stored_mid_chunk_under_its_number(store: Store) -> None:  # noqa: F811
    nmax_stream(store)
    with pytest.raises(FailedPrecondition, match="not in a chunk"):
        store.set_noisy_max_carry("s", b"x" * 16)  # still opening
    store.set_threshold_noise("s", 0)
    assert store.noisy_max_carry("s") is None
    with pytest.raises(FailedPrecondition, match="not in a chunk"):
        store.set_noisy_max_carry("s", b"x" * 16)  # open, not in a chunk
    assert store.begin_chunk("s") == 1
    first = bytes(range(16))
    store.set_noisy_max_carry("s", first)
    assert store.noisy_max_carry("s") == (1, first)
    store.end_chunk("s", 5, close=False)
    assert store.noisy_max_carry("s") == (1, first)  # what chunk 2 reads
    assert store.begin_chunk("s", 2) == 2
    second = bytes(range(100, 140))
    store.set_noisy_max_carry("s", second)  # replaces it, under chunk 2
    assert store.noisy_max_carry("s") == (2, second)
    store.end_chunk("s", 5, close=True)
    with pytest.raises(FailedPrecondition, match="not in a chunk"):
        store.set_noisy_max_carry("s", first)  # closed
    assert store.stream("s").queries == 10
    with pytest.raises(NotFound):
        store.noisy_max_carry("nope")


def test_a_failed_stream_takes_no_carry(store: Store) -> None:  # noqa: F811
    nmax_stream(store)
    store.set_threshold_noise("s", 0)
    store.begin_chunk("s")
    store.fail_stream("s")
    assert store.stream("s").state == FAILED
    with pytest.raises(FailedPrecondition, match="not in a chunk"):
        store.set_noisy_max_carry("s", b"x" * 16)
    assert store.noisy_max_carry("s") is None


def test_sqlite_schema_v6_streams_gain_the_carry(tmp_path: Path) -> None:
    """A store written before chunked tournaments (schema 6) opens: its streams
    gain the carry columns, empty."""
    path = tmp_path / "old.sqlite"
    SqliteStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE streams DROP COLUMN carry")
    raw.execute("ALTER TABLE streams DROP COLUMN carry_chunk")
    raw.execute("PRAGMA user_version = 6")
    raw.commit()
    raw.close()
    opened = SqliteStore(path)
    try:
        assert opened._db.execute("PRAGMA user_version").fetchone()[0] == 9  # v7, then v8 and v9
        names = {r[1] for r in opened._db.execute("PRAGMA table_info(streams)")}
        assert {"carry", "carry_chunk"} <= names
        nmax_stream(opened)
        assert opened.noisy_max_carry("s") is None
    finally:
        opened.close()
