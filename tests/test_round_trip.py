"""One leader ↔ helper round trip per stream chunk (docs/mpc.md, "Per chunk"):
the flights a chunk makes on its session, the helper's record of a result it
was sent one way (and what happens when that record never comes), and a
refused chunk, whose session is discarded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from conftest import DriverPair, driver_pair

from svtagg.dp.errors import FailedPrecondition, StreamClosed
from svtagg.dp.task import TaskSpec
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers import helper as helper_module
from svtagg.servers.exchange.values import Ask, ChunkKind, Queries, StreamChunk
from svtagg.servers.store.rules import FAILED, IN_CHUNK, OPEN

F = 16
N = 200
UNIT = 1 << F
#: A threshold no score reaches (NO), one every score passes (YES at the first query).
HIGH, LOW = 10 * N * UNIT, -(N * UNIT)


class Flights:
    """The session frames the in-memory port carries, in order."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, pb.PeerFrame]] = []

    def tap(self, what: str, name: str, data: bytes) -> None:
        if name == "frame":
            self.frames.append((what, pb.PeerFrame.FromString(data)))

    def take(self) -> list[tuple[str, list[str]]]:
        """The frames since the last call as flights: (direction, frame bodies;
        a header or status carrying a fragment as "header+fragment")."""
        out: list[tuple[str, list[str]]] = []
        for what, frame in self.frames:
            body = frame.WhichOneof("body") or ""
            if frame.HasField("then_fragment"):
                body += "+fragment"
            if out and out[-1][0] == what:
                out[-1][1].append(body)
            else:
                out.append((what, [body]))
        self.frames.clear()
        return out


@pytest.fixture
async def tapped(tmp_path: Path) -> AsyncIterator[tuple[DriverPair, Flights]]:
    flights = Flights()
    async with driver_pair(tmp_path, tap=flights.tap) as pair:
        await pair.leader.create_task(
            TaskSpec(
                task_id="t",
                d=3,
                frac_bits=F,
                n_max=10 * N,
                min_batch=1,
                epsilon_total="20",
                delta_total="0",
                epsilon_min="1/4",
            )
        )
        pair.upload("t", np.ones((N, 3)))
        await pair.leader.close_collection("t")
        yield pair, flights


def directions(flights: list[tuple[str, list[str]]]) -> list[str]:
    return [what for what, _ in flights]


async def test_a_stream_chunk_is_one_round_trip(tapped: tuple[DriverPair, Flights]) -> None:
    """Header and OT message in one frame, verdict and tables in the next, the
    result one way: the leader answers without a further flight from the helper."""
    pair, flights = tapped
    sid = await pair.open("t")
    for tau in (HIGH, HIGH, LOW):  # two NOs, then the YES that closes the stream
        flights.take()
        answer = await pair.leader.ask(Ask(sid, Queries((0, 1)), (tau, tau)))
        seen = flights.take()
        assert directions(seen) == ["to_helper", "to_leader", "to_helper"], seen
        header, reply, result = (bodies for _, bodies in seen)
        assert header == ["header+fragment"], header
        assert reply == ["status+fragment"], reply
        assert result == ["fragment"]  # the decoded result, and no status after it
        assert answer.yes == (tau == LOW)
    await pair.helper.settled()
    for core in (pair.leader.core, pair.helper.core):
        s = core.store.stream(sid)
        assert s.closed and s.chunks == 3 and s.queries == 5


async def test_a_close_time_chunk_waits_for_the_helpers_record(tmp_path: Path) -> None:
    """A robust-aggregate chunk ends with the helper's closing status: its shares
    must be staged before MarkAgreed checks them."""
    flights = Flights()
    async with driver_pair(tmp_path, tap=flights.tap) as pair:
        await pair.leader.create_task(
            TaskSpec(
                task_id="r",
                d=2,
                frac_bits=F,
                n_max=1000,
                min_batch=1,
                epsilon_total="1",
                delta_total="0",
                epsilon_min="1/4",
            )
        )
        pair.upload("r", np.ones((10, 2)))
        flights.take()
        info = await pair.leader.close_collection("r")
        assert info.agreed
        seen = flights.take()
        seen = seen[next(i for i, (_, b) in enumerate(seen) if "header+fragment" in b) :]
        assert directions(seen) == ["to_helper", "to_leader", "to_helper", "to_leader"], seen
        # The session opens for this chunk: the tail of its setup (SoftSpoken's
        # message, leader → helper, one fragment) rides in the header's flight;
        # the header carries the chunk's first message.
        first = seen[0][1]
        assert first[: first.index("header+fragment")] in ([], ["fragment"]), first
        assert seen[-1][1] == ["status"]


async def test_the_next_header_waits_for_the_previous_record(
    tapped: tuple[DriverPair, Flights], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk n+1's header may reach the helper (on another session) before the
    result of chunk n: the helper waits for its record, and refuses the header
    when it never comes."""
    pair, _ = tapped
    sid = await pair.open("t")
    await pair.leader.ask(Ask(sid, Queries((0,)), (HIGH,)))
    await pair.helper.settled()
    store = pair.helper.core.store
    store.begin_chunk(sid, 2)  # chunk 2 in progress: its result not yet read

    async def record_later() -> None:
        await asyncio.sleep(0.05)
        store.end_chunk(sid, 1, False)

    t = time.monotonic()
    late = asyncio.ensure_future(record_later())
    stream, _, _, _ = await pair.helper._accept(StreamChunk(ChunkKind.ASK, sid, 3, Queries((1,))))
    await late
    assert time.monotonic() - t >= 0.05
    s = store.stream(sid)
    assert s.state == IN_CHUNK and s.chunks == 3 and s.queries == 2

    monkeypatch.setattr(helper_module, "RESULT_WAIT", 0.05)
    with pytest.raises(FailedPrecondition, match="in_chunk"):  # chunk 3 never recorded
        await pair.helper._accept(StreamChunk(ChunkKind.ASK, sid, 4, Queries((1,))))


async def test_a_result_the_helper_never_records_fails_the_stream(
    tapped: tuple[DriverPair, Flights], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper is lost between its tables and its record: the leader has
    recorded and answered, the helper's copy stays mid-chunk (failed closed at
    its restart), and the stream's next chunk is refused and fails it on both."""
    pair, _ = tapped
    sid = await pair.open("t")
    real_end = pair.helper.core.end_chunk

    def lost(stream_id: str, progress: object) -> None:
        raise ConnectionError("helper lost before its record")

    monkeypatch.setattr(pair.helper.core, "end_chunk", lost)
    answer = await pair.leader.ask(Ask(sid, Queries((0,)), (HIGH,)))
    assert not answer.yes
    await pair.helper.settled()
    assert pair.leader.core.store.stream(sid).state == OPEN
    assert pair.helper.core.store.stream(sid).state == IN_CHUNK
    monkeypatch.setattr(pair.helper.core, "end_chunk", real_end)
    monkeypatch.setattr(helper_module, "RESULT_WAIT", 0.05)
    with pytest.raises(FailedPrecondition, match="helper: .*in_chunk"):
        await pair.leader.ask(Ask(sid, Queries((0,)), (LOW,)))
    assert pair.leader.core.store.stream(sid).state == FAILED
    assert pair.helper.core.store.stream(sid).state == FAILED
    with pytest.raises(StreamClosed):
        await pair.leader.ask(Ask(sid, Queries((0,)), (LOW,)))


async def test_a_refused_chunk_discards_its_session(tapped: tuple[DriverPair, Flights]) -> None:
    """The leader's OT message went out behind the refused header, so that
    session's protocol state is spent: the helper drops what comes and the
    leader closes it; the next chunk runs on a fresh session and answers."""
    pair, _ = tapped
    sid = await pair.open("t")
    await pair.leader.ask(Ask(sid, Queries((0,)), (HIGH,)))
    await pair.helper.settled()
    sessions = list(pair.port.sessions)
    assert len(sessions) == 1 and not sessions[0].done()
    pair.helper.core.fail_stream(sid)  # the helper's copy failed, the leader's open
    with pytest.raises(FailedPrecondition, match="helper: "):
        await pair.leader.ask(Ask(sid, Queries((0,)), (LOW,)))
    assert pair.leader.core.store.stream(sid).state == FAILED
    await asyncio.wait_for(asyncio.gather(*sessions, return_exceptions=True), 5)
    fresh = await pair.open("t")
    answer = await pair.leader.ask(Ask(fresh, Queries((1, 0)), (LOW, LOW)))
    assert answer.yes and answer.index == 0
    assert len(pair.port.sessions) == 2
