"""The clamped-noise δ of a stream is stated, not charged (docs/privacy.md), and
the statement holds because a stream answers at most MAX_STREAM_CHUNKS chunks of
at most MAX_CHUNK queries: the bound is checked exactly here, and both servers
and the local oracle refuse the chunk after the last one."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from conftest import DriverPair, driver_pair
from test_drivers import F, N, spec

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.dp.errors import ResourceExhausted
from svtagg.dp.kinds import TAIL_SCALES
from svtagg.dp.queries import MAX_CHUNK, MAX_STREAM_CHUNKS, Query
from svtagg.servers.exchange.values import Ask, Queries


def test_clamping_delta_of_the_largest_stream():
    """δ_c ≤ 2(K + 1)·e^−4096 < 2^−5800 for K = MAX_STREAM_CHUNKS · MAX_CHUNK,
    in integers: e > 2.718281828, so e^−4096 < (10^9 / 2718281828)^4096."""
    k = MAX_STREAM_CHUNKS * MAX_CHUNK
    assert TAIL_SCALES == 4096
    assert 2 * (k + 1) * 10 ** (9 * 4096) * 2**5800 < 2_718_281_828**4096


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[DriverPair]:
    async with driver_pair(tmp_path) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.ones((N, 3)))
        await p.leader.close_collection("t")
        yield p


def set_chunks(db: Path, stream_id: str, chunks: int) -> None:
    """What 2^40 answered chunks leave in a store, without running them."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE streams SET chunks=? WHERE stream_id=?", (chunks, stream_id))


def ask(stream_id: str) -> Ask:
    # τ far above every score: NO, the stream stays open.
    return Ask(stream_id, Queries((0,)), (4 * N << F,))


async def test_leader_refuses_the_chunk_after_the_last(pair: DriverPair, tmp_path: Path):
    sid = await pair.open("t")
    for db in ("l.sqlite", "h.sqlite"):
        set_chunks(tmp_path / db, sid, MAX_STREAM_CHUNKS - 1)
    answer = await pair.leader.ask(ask(sid))  # the last chunk a stream may answer
    assert not answer.yes and not answer.closed
    await pair.helper.settled()  # the helper records the result it was sent one way
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.stream(sid).chunks == MAX_STREAM_CHUNKS
    with pytest.raises(ResourceExhausted, match="2\\^40 chunks"):
        await pair.leader.ask(ask(sid))
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.stream(sid).chunks == MAX_STREAM_CHUNKS  # nothing ran


async def test_helper_refuses_the_chunk_after_the_last(pair: DriverPair, tmp_path: Path):
    """The helper counts for itself: a leader that would go on is refused there."""
    sid = await pair.open("t")
    set_chunks(tmp_path / "h.sqlite", sid, MAX_STREAM_CHUNKS)
    with pytest.raises(ResourceExhausted, match="2\\^40 chunks"):
        await pair.leader.ask(ask(sid))
    assert pair.helper.core.store.stream(sid).chunks == MAX_STREAM_CHUNKS


def test_local_oracle_refuses_the_chunk_after_the_last(monkeypatch: pytest.MonkeyPatch):
    """The reference oracle keeps the same rule (its counter, lowered to 3 here)."""
    import svtagg.dp.queries as queries

    monkeypatch.setattr(queries, "MAX_STREAM_CHUNKS", 3)
    # Scores 0, τ = 30, noise of scales 1/4 and 1/2: a YES has probability < e^-50.
    stream = LocalOracle(np.zeros((10, 2)), 10, seed=1).open_stream(8)
    for _ in range(3):
        assert stream.ask([(Query(0), 30)]) is None
    with pytest.raises(ResourceExhausted, match="at most 3 chunks"):
        stream.ask([(Query(0), 30)])
