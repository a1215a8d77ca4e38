"""The close's robust-aggregate pass across failures, on SQLite and PostgreSQL
stores (in-memory port, the real garbled-circuit engine): a chunk of an
abandoned pass that reaches the helper late, after a newer pass staged its
shares, is never part of the agreed g(S) — the two servers' stored shares add
up to g(S) exactly, not to g(S) plus the difference of two passes' masks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DriverPair, driver_pair, encoded_sum, pg_tagged
from test_drivers import F, N, data, spec

from svtagg.dp.errors import PeerUnavailable
from svtagg.servers.edge.wire import job_inputs
from svtagg.servers.exchange.values import Agreement, Ask, ChunkKind, Queries, RobustChunk, TaskInfo
from svtagg.servers.work import Job


@pytest.fixture(params=["sqlite", "postgres"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[DriverPair]:
    if request.param == "sqlite":
        async with driver_pair(tmp_path, frac_bits=F) as p:
            yield p
        return
    from test_store_pg_protocol import make_pair, stop

    with pg_tagged() as (url, tag):
        p = make_pair(url, tag)
        try:
            yield p
        finally:
            await stop(p)


class InlineWork:
    """A stand-in for the work queue: each leased job runs at once through the
    leader's `run_job`, as a worker process would run it (the payload is all a
    worker gets)."""

    def __init__(self, pair: DriverPair) -> None:
        self.pair = pair
        self.payloads: list[bytes] = []

    async def run(self, kind: str, payload: bytes, *_: Any, **__: Any) -> bytes:
        self.payloads.append(payload)
        return await self.pair.leader.run_job(Job(len(self.payloads), kind, None, payload))


@pytest.mark.parametrize("leased", [False, True], ids=["in_process", "leased"])
async def test_a_late_chunk_of_an_abandoned_pass_never_mixes_in(
    pair: DriverPair, leased: bool
) -> None:
    """Pass A runs, its MarkAgreed never reaches the helper (the close fails);
    the retried close runs pass B; just before B's MarkAgreed, a chunk of pass A
    stages on the helper (a stalled helper process finishing an old job).  The
    agreement must keep B's shares only."""
    if leased:
        pair.leader.work = InlineWork(pair)  # type: ignore[assignment]
    await pair.leader.create_task(spec("t"))
    values = data(N)
    pair.upload("t", values)
    headers: list[RobustChunk] = []
    real_chunk = pair.leader.robust_chunk

    async def recording(task: Any, h: RobustChunk, sums: Any = None) -> bytes:
        headers.append(h)
        return await real_chunk(task, h, sums)

    pair.leader.robust_chunk = recording  # type: ignore[method-assign]
    real_mark = pair.port.mark_agreed
    agreements: list[int] = []

    async def interleaving(agreement: Agreement, timeout: float | None = None) -> TaskInfo:
        agreements.append(len(headers))
        if len(agreements) == 1:
            raise PeerUnavailable("helper: UNAVAILABLE (pass A is abandoned)")
        # Pass B has staged all its chunks; pass A's first chunk stages late.
        await real_chunk(pair.leader.core.store.task("t"), headers[0])
        return await real_mark(agreement, timeout)

    pair.port.mark_agreed = interleaving  # type: ignore[method-assign]
    with pytest.raises(PeerUnavailable):
        await pair.leader.close_collection("t")
    info = await pair.leader.close_collection("t")
    assert info.agreed and info.n == N and agreements == [1, 2]
    lead = pair.leader.core.store.robust_sums("t")
    helper = pair.helper.core.store.robust_sums("t")
    assert lead is not None and helper is not None
    # Honest reports in [0, 1]: g(S) = S, the plaintext encoded sum.
    assert np.array_equal(lead + helper, encoded_sum(values, F))
    # Every chunk named its pass, and the two passes had different ids.
    assert len({h.pass_id for h in headers}) == 2 and all(len(h.pass_id) == 16 for h in headers)
    if leased:
        payloads = pair.leader.work.payloads  # type: ignore[union-attr]
        assert [job_inputs(ChunkKind.ROBUST, p) for p in payloads] == headers
    # And the stored shares answer as they should: coordinate 0 sums to N.
    pair.leader.work = None  # (InlineWork would run the chunk through this same driver)
    sid = await pair.open("t")
    ans = await pair.leader.ask(Ask(sid, Queries((1, 0)), (N // 2 << F,) * 2))
    assert ans.yes and ans.index == 1
