"""Per-query noise drawn ahead (`ServerCore._draw_ahead`): the helper draws a
stream's next chunk's noise after a chunk that leaves it open, while it waits
for the next header, the leader during the chunk, while it waits for the
garbled tables; the next chunk uses exactly those draws first, each once,
then fresh ones; a chunk that closes the stream drops them.
The law of the draws is the sampler's either way (the statistical audits run
streams of several chunks through the servers: tests/test_remote_audit.py)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.dp.kinds import StreamKind
from svtagg.dp.task import TaskSpec
from svtagg.servers.exchange.values import Ask, OpenStream, Queries
from svtagg.servers.reference import reference_pair

F, N = 6, 40
UNIT = 1 << F


async def test_each_server_uses_its_noise_drawn_ahead_once_then_fresh(tmp_path: Path) -> None:
    spec = TaskSpec("t", 4, F, 10 * N, 1, "40", "0", "1/4")  # d, F, n_max, min batch, ε, δ, ε_min
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(spec)
        pair.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await pair.leader.close_collection("t")
        cores = (pair.leader.core, pair.helper.core)
        used: dict[int, list[Any]] = {0: [], 1: []}
        for i, core in enumerate(cores):

            def spy(stream: Any, task: Any, k: int, i: int = i, noise: Any = core._noise) -> Any:
                out = noise(stream, task, k)
                used[i].append(out.copy())
                return out

            core._noise = spy  # type: ignore[method-assign]
        sid = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
        tau = (N // 2) * UNIT
        assert not (await pair.leader.ask(Ask(sid, Queries((0, 1, 3) * 10), (tau,) * 30))).yes
        await pair.helper.settled()
        ahead = [core._ahead[sid].copy() for core in cores]
        assert all(a.shape == (30,) for a in ahead)
        assert not np.array_equal(ahead[0], ahead[1])  # each server its own draws
        # A smaller chunk takes the first 12; the 18 left cover a chunk of its size.
        assert not (await pair.leader.ask(Ask(sid, Queries((0, 1, 3) * 4), (tau,) * 12))).yes
        await pair.helper.settled()
        for i, core in enumerate(cores):
            assert np.array_equal(used[i][1], ahead[i][:12])
            assert np.array_equal(core._ahead[sid], ahead[i][12:])
        # A larger chunk takes those 18, then 22 fresh ones; its YES closes the
        # stream, and what either server drew for a next chunk is dropped.
        yes = await pair.leader.ask(Ask(sid, Queries((0, 1, 3) * 13 + (2,)), (tau,) * 40))
        await pair.helper.settled()
        assert yes.yes and yes.index == 39 and yes.closed
        for i, core in enumerate(cores):
            assert np.array_equal(used[i][2][:18], ahead[i][12:]) and used[i][2].shape == (40,)
            assert not np.array_equal(used[i][2][18:36], ahead[i][12:])  # fresh ones
            assert sid not in core._ahead
        # A failed stream drops what a server drew ahead for it.
        other = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
        assert not (await pair.leader.ask(Ask(other, Queries((0,)), (tau,)))).yes
        await pair.helper.settled()
        assert all(other in core._ahead for core in cores)
        for core in cores:
            core.fail_stream(other)
            assert other not in core._ahead
        # A draw ahead that fails (here: the leader's, inside its chunk) is
        # dropped; the chunk answers, and the next one draws its own noise.
        third = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "4"))).stream_id
        draw = cores[0]._draw

        def fails_ahead(stream: Any, task: Any, k: int) -> Any:
            if any(f.function == "_draw_ahead" for f in inspect.stack()[1:3]):
                raise MemoryError("no room")
            return draw(stream, task, k)

        cores[0]._draw = fails_ahead  # type: ignore[method-assign]
        assert not (await pair.leader.ask(Ask(third, Queries((0, 1)), (tau,) * 2))).yes
        assert third not in cores[0]._ahead
        assert not (await pair.leader.ask(Ask(third, Queries((0, 1)), (tau,) * 2))).yes
        cores[0]._draw = draw  # type: ignore[method-assign]
