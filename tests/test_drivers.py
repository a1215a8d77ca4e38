"""The leader ↔ helper protocol in one process: the leader driver talks to the
helper driver through the in-memory port (no TLS, no sockets, no subprocess),
with the real garbled-circuit engine.  Covers the close with reconciliation,
ledger synchronisation after a failed PrepareStream, stream chunks, and a chunk
that fails closed on both servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DriverPair, failing_helper_pair

from svtagg.dp.errors import PeerUnavailable, StreamClosed
from svtagg.dp.task import TaskSpec
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.exchange.values import (
    Ask,
    PrepareStream,
    Queries,
    ReportIds,
    ReportPage,
    ReportSet,
    StreamInfo,
)
from svtagg.servers.store.rules import FAILED

F = 16
N = 400  # n/2 = 200 score units: noise at ε = 1 never reaches it (tail < e^-40)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[DriverPair]:
    async with failing_helper_pair(tmp_path, "first_yes") as p:
        yield p


def spec(task_id: str) -> TaskSpec:
    return TaskSpec(
        task_id=task_id,
        d=3,
        frac_bits=F,
        n_max=10 * N,
        min_batch=1,
        epsilon_total="10",
        delta_total="0",
        epsilon_min="1/4",
    )


def data(n: int) -> np.ndarray:
    """Coordinate 0 is 1 for everyone, coordinate 1 is 0, coordinate 2 random."""
    rng = np.random.default_rng(5)
    return np.stack([np.ones(n), np.zeros(n), rng.random(n)], axis=1)


async def test_close_reconciles_and_chunks_answer(pair: DriverPair) -> None:
    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    pair.upload("t", data(3), leader_only=True)  # clients that never reached the helper
    info = await pair.leader.close_collection("t")
    assert info.agreed and info.n == N and info.dropped_reports == 3
    assert pair.helper.core.store.task("t").n == N
    assert pair.helper.core.store.task("t").agreed

    sid = await pair.open("t")
    q = Queries((1, 0))
    unit = 1 << F
    ans = await pair.leader.ask(Ask(sid, q, (N // 2 * unit, N // 2 * unit)))
    assert ans.yes and ans.index == 1 and ans.closed and ans.peer_bytes > 0
    # Both servers recorded the YES; the stream answers no more.
    await pair.helper.settled()  # the helper records the result it was sent one way
    for core in (pair.leader.core, pair.helper.core):
        s = core.store.stream(sid)
        assert s.closed and s.queries == 2
    with pytest.raises(StreamClosed):
        await pair.leader.ask(Ask(sid, q, (0, 0)))


async def test_ledger_sync_after_failed_prepare(pair: DriverPair) -> None:
    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    await pair.leader.close_collection("t")
    pair.port.available = False
    with pytest.raises(PeerUnavailable):
        await pair.open("t")
    # The leader's charge stays spent; the helper never saw the stream.
    assert pair.leader.core.store.task("t").budget.epsilon_spent == 1
    assert pair.helper.core.store.task("t").budget.epsilon_spent == 0
    pair.port.available = True
    await pair.open("t")
    # The next open replayed the failed charge on the helper first: both spent 2.
    info = await pair.leader.describe("t")
    assert Fraction(info.budget.epsilon_spent) == 2
    assert Fraction(info.helper_budget.epsilon_spent) == 2


async def test_chunk_fails_closed_on_both_servers(pair: DriverPair) -> None:
    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    await pair.leader.close_collection("t")
    sid = await pair.open("t")
    pair.crash_helper[0] = True
    req = Ask(sid, Queries((1,)), (N // 2 << F,))
    with pytest.raises(PeerUnavailable):
        await pair.leader.ask(req)
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.stream(sid).state == FAILED
        assert core.store.task("t").budget.epsilon_spent == 1  # never refunded
    pair.crash_helper[0] = False
    with pytest.raises(StreamClosed):
        await pair.leader.ask(req)
    # A fresh stream still works on a fresh session.
    sid2 = await pair.open("t")
    ans = await pair.leader.ask(Ask(sid2, Queries((0,)), (N // 2 << F,)))
    assert ans.yes and ans.index == 0


async def test_lost_prepare_reply_fails_the_helpers_copy(pair: DriverPair) -> None:
    """The helper opened and charged the stream but its reply was lost: the leader
    fails its own copy, and the next reconciliation fails the helper's OPEN copy."""
    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    await pair.leader.close_collection("t")
    real_prepare = pair.port.prepare_stream
    lost: list[str] = []

    async def lossy(request: PrepareStream, timeout: float | None = None) -> StreamInfo:
        reply = await real_prepare(request, timeout)
        if not lost:
            lost.append(request.stream_id)
            raise PeerUnavailable("helper: reply lost")
        return reply

    pair.port.prepare_stream = lossy  # type: ignore[method-assign]
    with pytest.raises(PeerUnavailable):
        await pair.open("t")
    assert pair.helper.core.store.stream(lost[0]).state == "open"  # the helper's copy
    await pair.open("t")  # reconciles first
    assert pair.helper.core.store.stream(lost[0]).state == FAILED
    assert pair.leader.core.store.stream(lost[0]).state == FAILED


async def test_reconciliation_in_bounded_pages(
    pair: DriverPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reconciliation walks both sorted id lists page by page: with pages of 7
    ids, a task of 400 shared reports, 23 only the leader holds and 11 only the
    helper holds takes many ListReports and DropReports messages, none larger
    than a page, and ends with both servers agreed on exactly the shared 400."""
    from svtagg.client.upload import make_batch
    from svtagg.servers import helper as helper_mod
    from svtagg.servers import leader as leader_mod

    page = 7
    monkeypatch.setattr(leader_mod, "REPORT_PAGE", page)
    monkeypatch.setattr(helper_mod, "REPORT_PAGE", page)
    calls: list[tuple[str, int]] = []
    real_list, real_drop = pair.port.list_reports, pair.port.drop_reports

    async def listing(page: ReportPage, timeout: float | None = None) -> ReportIds:
        reply = await real_list(page, timeout)
        calls.append(("ListReports", len(reply.ids)))
        return reply

    async def dropping(ids: ReportIds, timeout: float | None = None) -> ReportSet:
        calls.append(("DropReports", len(ids.ids)))
        return await real_drop(ids, timeout)

    monkeypatch.setattr(pair.port, "list_reports", listing)
    monkeypatch.setattr(pair.port, "drop_reports", dropping)
    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    pair.upload("t", data(23), leader_only=True)
    extra = make_batch("t", data(11), F)
    pair.helper.core.upload("t", [(r.report_id, r.seed) for r in extra.helper.reports])
    info = await pair.leader.close_collection("t")
    assert info.agreed and info.n == N and info.dropped_reports == 23 + 11
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.task("t").n == N and core.store.task("t").agreed
    lists = [n for m, n in calls if m == "ListReports"]
    drops = [n for m, n in calls if m == "DropReports"]
    assert len(lists) >= (N + 11) // page and max(lists) <= page
    assert sum(drops) == 11 and max(drops) <= page and len(drops) == 2


async def test_a_refused_replay_leaves_the_task_usable(
    pair: DriverPair, caplog: pytest.LogCaptureFixture
) -> None:
    """The helper's ledger already holds more than the leader's (as an older
    version could leave it), so it refuses to replay the charge of a stream the
    leader failed.  Reconciliation logs it and goes on: the task is described
    and answers as long as both ledgers have room, never a wedge of
    BudgetExhausted on every call."""
    from svtagg.dp.kinds import StreamKind

    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    await pair.leader.close_collection("t")
    store = pair.helper.core.store
    store.open_stream("old", "t", StreamKind.LAP24, Fraction(9), Fraction(0), Fraction(0))
    store.fail_stream("old")
    pair.port.available = False
    with pytest.raises(PeerUnavailable):
        await pair.open("t", "3/2")  # the leader charges 3/2; the helper has 1 left
    pair.port.available = True
    info = await pair.leader.describe("t")
    assert Fraction(info.budget.epsilon_spent) == Fraction(3, 2)
    assert Fraction(info.helper_budget.epsilon_spent) == 9
    assert "refused to replay" in caplog.text
    sid = await pair.open("t", "1/2")  # both ledgers still hold it
    assert pair.helper.core.store.stream(sid).state == "open"


async def test_a_chunk_whose_go_is_lost_fails_the_helpers_copy(pair: DriverPair) -> None:
    """The leader dies right after sending a chunk header: the helper marks the
    stream mid-chunk, and its go for the chunk (which leaves with its tables)
    cannot be sent.  The helper's copy is failed at once (it never answers
    again) instead of staying `in_chunk` until the helper restarts."""
    await pair.leader.create_task(spec("t"))
    pair.upload("t", data(N))
    await pair.leader.close_collection("t")
    sid = await pair.open("t")

    class Idle:
        """A garbler that sends its tables at once, with the go in their frame."""

        def __init__(self, channel: Any) -> None:
            self.channel = channel

        async def setup(self) -> None:
            return None

        async def first_yes(self, z: Any, width: int) -> None:
            await self.channel.send(b"tables")

    pair.helper.party = lambda role, channel, session: Idle(channel)  # type: ignore[assignment,return-value]
    frames = [
        pb.PeerFrame(open=pb.SessionOpen(session_id=b"s" * 16)),
        pb.PeerFrame(
            header=pb.ChunkHeader(stream_id=sid, chunk_no=1, queries=pb.Queries(index=[0]))
        ),
    ]

    async def read() -> pb.PeerFrame | None:
        return frames.pop(0) if frames else None

    async def write(frame: pb.PeerFrame) -> None:
        raise ConnectionResetError("the leader is gone")

    with pytest.raises(ConnectionResetError):
        await pair.helper.serve_session(write, read)
    helper_copy = pair.helper.core.store.stream(sid)
    assert (helper_copy.state, helper_copy.chunks) == (FAILED, 1)
