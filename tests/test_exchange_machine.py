"""The chunk exchange's state machine (servers/exchange/machine.py) and its
durability rule, tested once: over every path of its tables (D1–D4), against
the stores' commits (which steps reach the disk), and against the drivers (the
steps a real stream chunk, noise batch and robust chunk take on each server,
through the one-process reference pair)."""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PG_ENV, postgres_unavailable
from test_joint_servers import UNIT, N, spec

from svtagg.dp.errors import AlreadyExists, PeerUnavailable
from svtagg.dp.kinds import StreamKind
from svtagg.servers.exchange.machine import (
    DURABLE,
    Exchange,
    Flow,
    Msg,
    OutOfOrder,
    State,
    Step,
    table,
)
from svtagg.servers.exchange.values import Ask, OpenStream, Queries
from svtagg.servers.reference import ReferencePair, reference_pair
from svtagg.servers.store.rules import FAILED, IN_CHUNK, OPEN
from svtagg.servers.store.sqlite import SqliteStore

F = 6
NO = 4 * N * UNIT  # a τ no score reaches


def paths(leader: bool, flow: Flow) -> list[list[Step]]:
    """Every complete path of one side's table (it is acyclic)."""
    t = table(leader, flow)
    out: list[list[Step]] = []

    def walk(state: State, taken: list[Step]) -> None:
        nexts = [(step, nxt) for (s, step), nxt in t.items() if s is state]
        if not nexts:
            out.append(taken)
        for step, nxt in nexts:
            walk(nxt, [*taken, step])

    walk(State.READY, [])
    return out


SIDES = [(leader, flow) for leader in (True, False) for flow in Flow]


def _before(path: list[Step], first: Step, then: Step) -> bool:
    """`first` is taken before `then` on `path`, if `then` is taken at all."""
    return then not in path or (first in path and path.index(first) < path.index(then))


@pytest.mark.parametrize(("leader", "flow"), SIDES)
def test_d1_the_mark_precedes_the_verdict_and_the_run(leader: bool, flow: Flow) -> None:
    """D1 on every path: a flow that marks does so before the verdict moves
    (helper: before it sends its go; leader: before it reads it) and so before
    the protocol runs; the leader marks a batch before its header leaves."""
    verdict = Step.READ_VERDICT if leader else Step.SEND_VERDICT
    marks = (flow, Step.MARK) in DURABLE
    for path in paths(leader, flow):
        assert (Step.MARK in path) == (marks and Step.REFUSE not in path), path
        if marks:
            assert _before(path, Step.MARK, verdict), path
            assert _before(path, Step.MARK, Step.RUN), path
        if leader and flow is Flow.BATCH:
            assert _before(path, Step.MARK, Step.SEND_HEADER), path


@pytest.mark.parametrize(("leader", "flow"), SIDES)
def test_d3_close_time_flows_keep_before_the_closing_status(leader: bool, flow: Flow) -> None:
    """D3: the helper records before its CLOSING leaves, the leader after it
    read it; a stream chunk has no CLOSING; every complete path records."""
    for path in paths(leader, flow):
        if Step.REFUSE in path:
            continue
        assert path[-1] in (Step.RECORD, Step.SEND_CLOSING), path
        assert _before(path, Step.RUN, Step.RECORD), path
        closing = Step.READ_CLOSING if leader else Step.SEND_CLOSING
        assert (closing in path) == flow.close_time, path
        if flow.close_time and leader:
            assert _before(path, Step.READ_CLOSING, Step.RECORD), path
        if flow.close_time and not leader:
            assert _before(path, Step.RECORD, Step.SEND_CLOSING), path


def _messages(path: list[Step], leader: bool) -> list[tuple[str, Msg]]:
    """The messages a path moves, as (sender, message)."""
    me, other = ("leader", "helper") if leader else ("helper", "leader")
    return [(me if s.sends else other, s.msg) for s in path if s.msg is not None]


@pytest.mark.parametrize("flow", list(Flow))
def test_both_sides_agree_on_the_messages(flow: Flow) -> None:
    """Each complete leader path moves the messages, in the order, of a
    complete helper path that did not refuse, and the other way round: what
    one side sends is what the other reads next."""
    lead = {tuple(_messages(p, True)) for p in paths(True, flow)}
    help_ = {tuple(_messages(p, False)) for p in paths(False, flow) if Step.REFUSE not in p}
    assert lead == help_
    assert all(m[0] == ("leader", Msg.HEADER) for m in lead)


@pytest.mark.parametrize(("leader", "flow"), SIDES)
def test_every_other_step_is_out_of_order(leader: bool, flow: Flow) -> None:
    """The table is the whole machine: any (state, step) pair it lacks raises
    OutOfOrder and leaves the state as it was (FAIL is always allowed)."""
    t = table(leader, flow)
    for state, step in itertools.product(State, Step):
        if step is Step.FAIL:
            continue
        x = Exchange(leader, flow, state)
        if (state, step) in t:
            x.take(step)
            assert x.state is t[(state, step)]
        else:
            with pytest.raises(OutOfOrder):
                x.take(step)
            assert x.state is state


def test_broken_orders_are_caught() -> None:
    """Negative controls: a helper that sends its go before its mark, a leader
    that runs before it read the go, or a helper that confirms a batch before
    keeping it, is refused by the machine."""
    helper = Exchange(False, Flow.STREAM)
    helper.take(Step.READ_HEADER)
    with pytest.raises(OutOfOrder):
        helper.take(Step.SEND_VERDICT)
    leader = Exchange(True, Flow.STREAM)
    leader.take(Step.SEND_HEADER)
    with pytest.raises(OutOfOrder):
        leader.take(Step.RUN)
    batch = Exchange(False, Flow.BATCH)
    for step in (Step.READ_HEADER, Step.MARK, Step.SEND_VERDICT, Step.RUN):
        batch.take(step)
    with pytest.raises(OutOfOrder):
        batch.take(Step.SEND_CLOSING)


def test_d4_committed_from_the_header_or_the_mark() -> None:
    """D4: a stream chunk commits its stream once the leader's header is out
    or the helper has marked it, until its protocol has run; close-time flows
    never commit a stream."""
    leader = Exchange(True, Flow.STREAM)
    assert not leader.committed
    leader.take(Step.SEND_HEADER)
    assert leader.committed
    helper = Exchange(False, Flow.STREAM)
    helper.take(Step.READ_HEADER)
    assert not helper.committed  # a refusal here fails nothing
    helper.take(Step.MARK)
    assert helper.committed
    helper.take(Step.SEND_VERDICT)
    assert helper.committed
    helper.take(Step.RUN)
    assert not helper.committed  # a record lost from here is D2's case
    helper.take(Step.RECORD)
    assert not helper.committed and helper.state is State.DONE
    batch = Exchange(True, Flow.BATCH)
    batch.take(Step.MARK)
    batch.take(Step.SEND_HEADER)
    assert not batch.committed


# ------------------------------------------------------------------ the drivers
@pytest.fixture
async def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A closed joint-noise task on the reference pair, and the steps every
    exchange takes (on either server), in order."""
    taken: dict[int, tuple[bool, Flow, list[Step]]] = {}
    real = Exchange.take

    def take(self: Exchange, step: Step) -> None:
        real(self, step)
        taken.setdefault(id(self), (self.leader, self.flow, []))[2].append(step)

    monkeypatch.setattr(Exchange, "take", take)
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("t")  # robust chunks
        p.leader.noise_pool = None
        yield p, taken


def _sequences(taken: dict[int, tuple[bool, Flow, list[Step]]]) -> set[tuple[Any, ...]]:
    return {(leader, flow, tuple(steps)) for leader, flow, steps in taken.values()}


async def test_the_drivers_take_the_machines_steps(traced: Any) -> None:
    """A robust pass at the close, a noise batch, a pooled and an unpooled
    stream chunk: each server takes exactly these steps for each exchange."""
    p, taken = traced
    p: ReferencePair
    S = Step
    robust = _sequences(taken)
    assert robust == {
        (True, Flow.ROBUST, (S.SEND_HEADER, S.READ_VERDICT, S.RUN, S.READ_CLOSING, S.RECORD)),
        (False, Flow.ROBUST, (S.READ_HEADER, S.SEND_VERDICT, S.RUN, S.RECORD, S.SEND_CLOSING)),
    }
    taken.clear()
    sid = (await p.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
    assert await p.leader.fill_pool(sid, 10, gamma=True)
    assert _sequences(taken) == {
        (
            True,
            Flow.BATCH,
            (S.MARK, S.SEND_HEADER, S.READ_VERDICT, S.RUN, S.READ_CLOSING, S.RECORD),
        ),
        (
            False,
            Flow.BATCH,
            (S.READ_HEADER, S.MARK, S.SEND_VERDICT, S.RUN, S.RECORD, S.SEND_CLOSING),
        ),
    }
    stream = {
        (True, Flow.STREAM, (S.SEND_HEADER, S.MARK, S.READ_VERDICT, S.RUN, S.RECORD)),
        (False, Flow.STREAM, (S.READ_HEADER, S.MARK, S.SEND_VERDICT, S.RUN, S.RECORD)),
    }
    for size in (10, 100):  # pooled (the leader marks before its first message), then not
        taken.clear()
        answer = await p.leader.ask(
            Ask(sid, Queries(tuple(i % 4 for i in range(size))), (NO,) * size)
        )
        await p.helper.settled()
        assert not answer.yes
        assert _sequences(taken) == stream


async def test_a_refused_chunk_fails_its_stream_on_both_servers(traced: Any) -> None:
    """D4 through the drivers: the helper refuses a chunk after the leader's
    header left (its stream is failed on the helper): the leader fails it too,
    and neither side took a step past the refusal."""
    p, taken = traced
    sid = (await p.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
    p.helper.core.fail_stream(sid)  # the helper will refuse the next chunk
    taken.clear()
    with pytest.raises(Exception, match="helper"):
        await p.leader.ask(Ask(sid, Queries((0,)), (NO,)))
    assert _sequences(taken) == {
        (True, Flow.STREAM, (Step.SEND_HEADER, Step.MARK, Step.FAIL)),
        (False, Flow.STREAM, (Step.READ_HEADER, Step.REFUSE)),
    }
    assert p.leader.core.stream(sid).state == "failed"


# ------------------------------------------------------------------ the stores
#: The store method that takes each durable-table step.
STORE_STEPS = {
    "begin_chunk": (Flow.STREAM, Step.MARK),
    "begin_pooled_chunk": (Flow.STREAM, Step.MARK),
    "end_chunk": (Flow.STREAM, Step.RECORD),
    "reserve_joint_batch": (Flow.BATCH, Step.MARK),
    "add_joint_batch": (Flow.BATCH, Step.RECORD),
    "stage_robust": (Flow.ROBUST, Step.RECORD),
}


@pytest.fixture(params=["sqlite", "postgres"])
def dialect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """(store class, whether a store is inside a transaction, the two stores
    for the reference pair or None for its SQLite files)."""
    if request.param == "sqlite":
        yield SqliteStore, lambda s: s._db.in_transaction, None
        return
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    import psycopg

    from svtagg.servers.store.postgres import PgStore

    url, tag = os.environ[PG_ENV], uuid.uuid4().hex[:12]
    schemas = (f"l_{tag}", f"h_{tag}")
    stores = tuple(PgStore(url, schema=s) for s in schemas)

    def busy(s: Any) -> bool:
        return bool(s._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)

    yield PgStore, busy, stores
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_the_stores_commit_what_the_rule_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dialect: Any
) -> None:
    """Each store method that takes a MARK or a RECORD commits durably exactly
    when `DURABLE` says so, on both dialects (a method that writes nothing at
    all, e.g. a record kept in memory, counts as not durable)."""
    cls, busy, stores = dialect
    commits: dict[str, list[bool]] = {name: [] for name in STORE_STEPS}
    current: list[str] = []
    real_tx, real_alone = cls._tx, cls._write_alone

    def tx(self: Any, durable: bool = True) -> AbstractContextManager[None]:
        if current and not busy(self):
            commits[current[0]].append(durable)
        return real_tx(self, durable)  # type: ignore[no-any-return]

    def alone(self: Any, statement: str, params: Any, durable: bool = True) -> Any:
        if current and not busy(self):
            commits[current[0]].append(durable)
        return real_alone(self, statement, params, durable)

    monkeypatch.setattr(cls, "_tx", tx)
    monkeypatch.setattr(cls, "_write_alone", alone)

    def watch(name: str) -> None:
        real = getattr(cls, name)

        def wrapped(self: Any, *a: Any, **k: Any) -> Any:
            with _outermost(current, name):
                return real(self, *a, **k)

        monkeypatch.setattr(cls, name, wrapped)

    for name in STORE_STEPS:
        watch(name)
    async with reference_pair(tmp_path, frac_bits=F, stores=stores) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("t")
        p.leader.noise_pool = None
        sid = (await p.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
        assert await p.leader.fill_pool(sid, 10, gamma=True)
        for size in (10, 100, 100):
            await p.leader.ask(Ask(sid, Queries(tuple(i % 4 for i in range(size))), (NO,) * size))
            await p.helper.settled()
    for key, durable in DURABLE.items():
        seen = [c for name, k in STORE_STEPS.items() if k == key for c in commits[name]]
        if durable:
            assert seen and all(seen), (key, commits)
        else:
            assert not any(seen), (key, commits)


@contextmanager
def _outermost(current: list[str], name: str) -> Iterator[None]:
    """Attribute commits to the outermost watched method (a pooled begin
    calls begin_chunk inside its own transaction)."""
    outer = not current
    if outer:
        current.append(name)
    try:
        yield
    finally:
        if outer:
            current.pop()


# ------------------------------------------------------------------ D2: records that wait
def _open_stream(store: SqliteStore, sid: str = "a") -> None:
    from test_store_contract import agreed_task

    agreed_task(store)
    store.open_stream(sid, "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    store.set_threshold_noise(sid, 1)


def _on_disk(path: Path, sid: str = "a") -> tuple[str, int, int]:
    """(state, chunks, queries) as another connection reads the file."""
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT state, chunks, queries FROM streams WHERE stream_id=?", (sid,)
        ).fetchone()
    return str(row[0]), int(row[1]), int(row[2])


async def test_a_record_waits_for_the_next_mark(tmp_path: Path) -> None:
    """On SQLite a chunk's record waits in memory (read back by `stream`), and
    the next mark writes it in its own one statement: one transaction per
    chunk; an idle stream's record is written within RECORD_WAIT."""
    path = tmp_path / "s.sqlite"
    store = SqliteStore(path)
    _open_stream(store)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    assert store.begin_chunk("a", 1) == 1
    store.end_chunk("a", 5, close=False)
    s = store.stream("a")
    assert (s.state, s.chunks, s.queries) == (OPEN, 1, 5)
    assert _on_disk(path) == (IN_CHUNK, 1, 0)
    statements.clear()
    assert store.begin_chunk("a", 2) == 2
    writes = [q for q in statements if not q.startswith("SELECT")]
    assert len(writes) == 1 and "queries=queries+" in writes[0], statements
    assert _on_disk(path) == (IN_CHUNK, 2, 5)
    store.end_chunk("a", 3, close=False)
    await asyncio.sleep(4 * SqliteStore.RECORD_WAIT)
    assert _on_disk(path) == (OPEN, 2, 8)
    store.close()


async def test_a_lost_record_fails_the_stream_closed(tmp_path: Path) -> None:
    """D2's price: a restart that finds the stream in its chunk (the record
    was still in memory) fails it closed; the record, written late by the
    store that lost it, changes nothing."""
    path = tmp_path / "s.sqlite"
    store = SqliteStore(path)
    _open_stream(store)
    store.begin_chunk("a", 1)
    store.end_chunk("a", 5, close=False)
    restarted = SqliteStore(path)  # what a restart after a kill finds
    assert restarted.recovered_failed == [("a", "t")]
    store.close()  # writes its record: guarded on in_chunk, so no change
    assert restarted.stream("a").state == FAILED
    restarted.close()


async def test_a_transaction_that_rolls_back_gives_the_record_back(tmp_path: Path) -> None:
    """Any transaction writes the waiting records first; one that rolls back
    (here a refused open) keeps them waiting, and the next one writes them."""
    path = tmp_path / "s.sqlite"
    store = SqliteStore(path)
    _open_stream(store)
    store.begin_chunk("a", 1)
    store.end_chunk("a", 5, close=False)
    with pytest.raises(AlreadyExists):
        store.open_stream("a", "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    assert _on_disk(path) == (IN_CHUNK, 1, 0)
    assert store.stream("a").state == OPEN
    store.fail_stream("a")  # a transaction: the record first, then the failure
    assert store.stream("a").queries == 5 and _on_disk(path) == (FAILED, 1, 5)
    store.close()


def test_records_wait_on_each_loop_in_turn(tmp_path: Path) -> None:
    """A store used from one event loop, then another (the first ended before
    its timer fired): the second loop's record is still written by a timer of
    its own, and after `close` a record is refused where it is made."""
    path = tmp_path / "s.sqlite"
    store = SqliteStore(path)
    _open_stream(store, "a")
    store.open_stream("b", "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    store.set_threshold_noise("b", 1)

    async def chunk(sid: str, wait: float) -> None:
        store.begin_chunk(sid, store.stream(sid).chunks + 1)
        store.end_chunk(sid, 2, close=False)
        await asyncio.sleep(wait)

    asyncio.run(chunk("a", 0))  # ends before its timer
    asyncio.run(chunk("b", 4 * SqliteStore.RECORD_WAIT))
    assert _on_disk(path, "b") == (OPEN, 1, 2)
    store.close()
    assert _on_disk(path, "a") == (OPEN, 1, 2)  # written at the close
    with pytest.raises(sqlite3.ProgrammingError):
        store.end_chunk("a", 1, close=False)


async def test_a_header_that_never_left_fails_nothing(traced: Any) -> None:
    """D4 starts when the header has left: a large chunk whose header write
    fails (the pooled session's transport gone) leaves the stream open on both
    servers, and the next chunk is answered."""
    p, taken = traced
    sid = (await p.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
    session = await p.leader.pool.acquire()
    real = session.channel.write_frame

    async def broken(frame: Any) -> None:
        raise PeerUnavailable("the session's transport is gone")

    session.channel.write_frame = broken  # type: ignore[method-assign]
    await p.leader.pool.release(session, True)
    size = 100  # above FOLD_LANES: the header is written ahead of the protocol
    with pytest.raises(PeerUnavailable, match="transport is gone"):
        await p.leader.ask(Ask(sid, Queries(tuple(i % 4 for i in range(size))), (NO,) * size))
    session.channel.write_frame = real  # type: ignore[method-assign]
    assert p.leader.core.stream(sid).state == OPEN and p.helper.core.stream(sid).state == OPEN
    answer = await p.leader.ask(Ask(sid, Queries((0, 1)), (NO,) * 2))
    assert not answer.yes
