"""The leader ↔ helper protocol end to end with both servers on PostgreSQL
stores (in-memory port, the real garbled-circuit engine): uploads, the close
with reconciliation and robust aggregates, a stream that answers, and a restart
that fails an interrupted stream closed.  Skips without a reachable server
(SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from conftest import DriverPair
from test_drivers import F, N, data, spec

from svtagg.dp.errors import StreamClosed
from svtagg.proto.vocab import Role
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange.party import garbled_circuit_party
from svtagg.servers.exchange.values import Ask, Queries
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.memory import MemoryHelperPort
from svtagg.servers.store.rules import FAILED


def make_pair(url: str, tag: str) -> DriverPair:
    from svtagg.servers.store.postgres import PgStore

    helper = HelperDriver(
        ServerCore(Role.HELPER, PgStore(url, schema=f"h_{tag}")), garbled_circuit_party
    )
    port = MemoryHelperPort(helper)
    leader = LeaderDriver(
        ServerCore(Role.LEADER, PgStore(url, schema=f"l_{tag}")), port, garbled_circuit_party
    )
    return DriverPair(leader, helper, port, F)


async def stop(pair: DriverPair) -> None:
    await pair.leader.pool.close()
    await pair.port.close()
    pair.leader.core.store.close()
    pair.helper.core.store.close()


async def test_a_task_end_to_end_on_postgres(pg_url: tuple[str, str]) -> None:
    pair = make_pair(*pg_url)
    try:
        await pair.leader.create_task(spec("t"))
        pair.upload("t", data(N))
        pair.upload("t", data(4), leader_only=True)  # reports the helper never got
        info = await pair.leader.close_collection("t")
        assert info.agreed and info.n == N and info.dropped_reports == 4
        assert pair.helper.core.store.task("t").n == N
        sid = await pair.open("t")
        unit = 1 << F
        q = Queries((1, 0))
        ans = await pair.leader.ask(Ask(sid, q, (N // 2 * unit, N // 2 * unit)))
        assert ans.yes and ans.index == 1 and ans.closed
        await pair.helper.settled()  # the helper records the result it was sent one way
        for core in (pair.leader.core, pair.helper.core):
            s = core.store.stream(sid)
            assert s.closed and s.queries == 2
            assert core.store.task("t").budget.epsilon_spent == 1
        with pytest.raises(StreamClosed):
            await pair.leader.ask(Ask(sid, q, (0, 0)))
        other = await pair.open("t")
        pair.leader.core.store.begin_chunk(other)  # as if killed mid-chunk
    finally:
        await stop(pair)
    again = make_pair(*pg_url)
    try:
        assert again.leader.core.store.stream(other).state == FAILED
        assert again.leader.core.store.task("t").budget.epsilon_spent == Fraction(2)
    finally:
        await stop(again)
