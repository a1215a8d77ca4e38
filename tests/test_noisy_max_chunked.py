"""Chunked report-noisy-max through the real servers (the one-process
reference pair): a stream's candidates in several NoisyMax chunks, each but
the last with `more`, make one tournament — charged once at the open, no
index before the last chunk, the winner carried secret-shared (each server
stores its own share, durably, per chunk) — whose answer is the argmax over
every chunk.  A failure in any chunk fails the stream closed on both servers
and nothing restarts it; a lost carry is refused the same way; and the
answers of two-chunk streams follow the exact one-tournament law, while a
broken variant that reveals each chunk's winner and redraws its noise in the
next chunk is rejected by the same test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DriverPair, failing_helper_pair
from test_noisy_max_servers import (
    LAW_SCORES,
    closed_task,
    open_nmax,
    spec,
    spent,
)

from svtagg.analyst.audit import fit_test
from svtagg.dp.errors import InvalidArgument, PeerUnavailable, StreamClosed
from svtagg.dp.noisy_max import noise_scale, output_law
from svtagg.dp.queries import MAX_TOURNAMENT
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.core import Chunk, ServerCore
from svtagg.servers.edge import wire
from svtagg.servers.exchange.values import ChunkKind, NoisyMax, NoisyMaxAnswer, Queries, StreamChunk
from svtagg.servers.store.rules import FAILED

D = 40


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[DriverPair]:
    async with failing_helper_pair(tmp_path, "noisy_max_carry") as p:
        yield p


async def run_in_chunks(pair: DriverPair, sid: str, order: list[int], size: int) -> int:
    """Send `order`'s candidates in chunks of `size`; the final index."""
    answer = None
    for lo in range(0, len(order), size):
        part = Queries(tuple(order[lo : lo + size]))
        more = lo + size < len(order)
        answer = await pair.leader.noisy_max(NoisyMax(sid, part, more))
        assert answer.closed != more and (answer.index is None) == more
    assert answer is not None and answer.index is not None
    return answer.index


# ---------------------------------------------------------------- the mechanism end to end
@pytest.mark.parametrize(("best", "size"), [(23, 7), (2, 7), (39, 7), (38, 13), (5, 1)])
async def test_a_stream_in_chunks_finds_the_argmax(pair: DriverPair, best: int, size: int) -> None:
    """The best coordinate in the first, a middle or the last chunk (and
    chunks of one candidate): found, ε charged once, the stream open until
    the last chunk and closed by it; each server holds its own share of the
    last carried winner, and the two differ (the evaluator's, the leader's, is
    masked)."""
    await closed_task(pair, best=best)
    sid = await open_nmax(pair, eps="1")
    assert spent(pair) == (1, 1)
    assert await run_in_chunks(pair, sid, list(range(D)), size) == best
    chunks = -(-D // size)
    await pair.helper.settled()  # the helper records the result it was sent one way
    for core in (pair.leader.core, pair.helper.core):
        s = core.store.stream(sid)
        assert s.closed and s.queries == D and s.chunks == chunks
    assert spent(pair) == (1, 1)  # one ε for the whole tournament
    carried = [c.store.noisy_max_carry(sid) for c in (pair.leader.core, pair.helper.core)]
    assert carried[0] is not None and carried[1] is not None
    assert carried[0][0] == carried[1][0] == chunks - 1
    assert carried[0][1] != carried[1][1]
    with pytest.raises(StreamClosed):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0,))))


async def test_the_index_counts_every_chunk(pair: DriverPair) -> None:
    """The answer is a position among all the stream's candidates, complements
    included: the complement of coordinate 0 (held by nobody) is largest."""
    await closed_task(pair, best=23)
    sid = await open_nmax(pair)
    first = await pair.leader.noisy_max(NoisyMax(sid, Queries((5, 7)), more=True))
    assert (first.index, first.closed) == (None, False)
    last = await pair.leader.noisy_max(NoisyMax(sid, Queries((30, 0), (False, True))))
    assert (last.index, last.closed) == (3, True)


# ---------------------------------------------------------------- failures fail closed
async def test_a_failed_middle_chunk_fails_the_stream_closed(pair: DriverPair) -> None:
    await closed_task(pair)
    sid = await open_nmax(pair)
    await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1, 2)), more=True))
    pair.crash_helper[0] = True
    with pytest.raises(PeerUnavailable):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((3, 4)), more=True))
    for core in (pair.leader.core, pair.helper.core):
        s = core.store.stream(sid)
        assert s.state == FAILED and s.chunks == 2 and s.queries == 3
        stored = core.store.noisy_max_carry(sid)
        assert stored is not None and stored[0] == 1  # chunk 2 stored nothing
    assert spent(pair) == (1, 1)  # never refunded
    pair.crash_helper[0] = False
    for more in (True, False):  # nothing continues or restarts the tournament
        with pytest.raises(StreamClosed):
            await pair.leader.noisy_max(NoisyMax(sid, Queries((5, 23)), more))
    sid = await open_nmax(pair)  # a fresh stream, fresh noise, a fresh charge
    assert await run_in_chunks(pair, sid, [0, 23, 5], 2) == 1
    assert spent(pair) == (2, 2)


async def test_a_failed_last_chunk_fails_the_stream_closed(tmp_path: Path) -> None:
    async with failing_helper_pair(tmp_path, "noisy_max") as pair:
        await closed_task(pair)
        sid = await open_nmax(pair)
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1)), more=True))
        pair.crash_helper[0] = True
        with pytest.raises(PeerUnavailable):
            await pair.leader.noisy_max(NoisyMax(sid, Queries((23,))))
        for core in (pair.leader.core, pair.helper.core):
            assert core.store.stream(sid).state == FAILED
        pair.crash_helper[0] = False
        with pytest.raises(StreamClosed):
            await pair.leader.noisy_max(NoisyMax(sid, Queries((23,))))


async def test_a_lost_carry_fails_the_stream_closed(
    pair: DriverPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that cannot read the winner its last chunk stored (lost, or
    stored under another chunk) refuses to go on: the chunk fails, and with
    it the stream on both servers; no tournament restarts with fresh noise."""
    await closed_task(pair)
    for lost in (None, (7, b"\x00" * 16)):
        sid = await open_nmax(pair)
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1)), more=True))
        monkeypatch.setattr(pair.helper.core.store, "noisy_max_carry", lambda s, v=lost: v)
        with pytest.raises(PeerUnavailable):
            await pair.leader.noisy_max(NoisyMax(sid, Queries((23,))))
        monkeypatch.undo()
        for core in (pair.leader.core, pair.helper.core):
            assert core.store.stream(sid).state == FAILED


async def test_a_stream_holds_fewer_than_2_to_the_32_candidates(pair: DriverPair) -> None:
    """Checked before the chunk is marked (both servers check their own copy)."""
    await closed_task(pair)
    sid = await open_nmax(pair)
    stream = pair.leader.core.store.stream(sid)
    three = Chunk(np.arange(3, dtype=np.int64), np.zeros(3, dtype=bool), more=True)
    core = pair.leader.core
    core.check_queries(replace(stream, queries=MAX_TOURNAMENT - 3), three)
    with pytest.raises(InvalidArgument, match="at most 4,294,967,295 candidates"):
        core.check_queries(replace(stream, queries=MAX_TOURNAMENT - 2), three)
    assert MAX_TOURNAMENT == 2**32 - 1


def test_more_travels_on_the_wire() -> None:
    """NoisyMax.more and ChunkHeader.noisy_max_more round-trip; a chunk with
    more to follow answers no index; only a noisy-max chunk may have more."""
    req = NoisyMax("s", Queries((1, 2)), more=True)
    assert wire.NOISY_MAX.decode(wire.NOISY_MAX.encode(req)) == req
    assert wire.NOISY_MAX.from_pb(pb.NoisyMaxRequest(stream_id="s")).more is False
    for ans in (NoisyMaxAnswer(None, False, 9), NoisyMaxAnswer(7, True, 9)):
        assert wire.NOISY_MAX_ANSWER.decode(wire.NOISY_MAX_ANSWER.encode(ans)) == ans
    header = StreamChunk(ChunkKind.NMAX, "s", 3, Queries((4,)), more=True)
    assert wire.CHUNK_HEADER.decode(wire.CHUNK_HEADER.encode(header)) == header
    with pytest.raises(InvalidArgument, match="only a noisy_max chunk"):
        wire.CHUNK_HEADER.from_pb(pb.ChunkHeader(stream_id="s", chunk_no=1, noisy_max_more=True))
    with pytest.raises(ValueError, match="only a report-noisy-max chunk"):
        StreamChunk(ChunkKind.ASK, "s", 1, Queries((4,)), more=True)


# ---------------------------------------------------------------- the output law
#: Two-chunk streams over LAW_SCORES = (0, 8, 1) at F = 1, ε = 1 (scale 4 per
#: party): chunk 1 holds candidates 0 and 1, chunk 2 candidate 2.  The law of
#: the answer must be the one tournament's.  Redrawing the first chunk's
#: winner's noise in the second (what revealing per-chunk winners and running
#: a fresh tournament per chunk gives) changes it: KL 0.035 per answer, so at
#: 1,000 answers the expected G against the redraw law is ≈ 71 and at 600 ≈
#: 42, against a critical value of 13.8 (p = 10^−3, two degrees of freedom).
LAW_STREAMS = 1000
BROKEN_STREAMS = 600


def redraw_law(scores: tuple[int, ...], split: int, scale: Fraction) -> np.ndarray:
    """The answer's law when chunk 1 (scores[:split]) runs its own tournament,
    and its winner meets the rest with fresh noise (ties to the earlier)."""
    first = output_law(scores[:split], scale, 2)
    law = np.zeros(len(scores))
    for i in range(split):
        meet = output_law((scores[i], *scores[split:]), scale, 2)
        law[i] += first[i] * meet[0]
        law[split:] += first[i] * meet[1:]
    return law


async def law_task(pair: DriverPair) -> None:
    await pair.leader.create_task(spec("law", d=3, frac_bits=1, eps_total="10000"))
    pair.frac_bits = 1
    rows = [[0, 1, 0.5]] + [[0, 1, 0]] * 3  # S = (0, 8, 1) grid units at F = 1
    pair.upload("law", np.array(rows, dtype=np.float64))
    await pair.leader.close_collection("law")


async def two_chunk_answers(pair: DriverPair, streams: int) -> list[int]:
    out = []
    for _ in range(streams):
        sid = await open_nmax(pair, "law")
        first = await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1)), more=True))
        assert first.index is None
        last = await pair.leader.noisy_max(NoisyMax(sid, Queries((2,))))
        assert last.index is not None
        out.append(last.index)
    return out


def p_value(outputs: list[int], law: np.ndarray) -> float:
    rng = np.random.default_rng(1)  # no None outcome: its cell has mass 0
    return fit_test("servers", outputs, np.append(law, 0.0), rng).p_value


async def test_two_chunks_follow_the_one_tournament_law(pair: DriverPair) -> None:
    """The answers of LAW_STREAMS two-chunk streams fit the exact law of one
    tournament over the three candidates (false failure ≤ 10^−3: the G-test's
    Monte Carlo p-value), and the same counts reject the redraw law."""
    await law_task(pair)
    outputs = await two_chunk_answers(pair, LAW_STREAMS)
    scale = noise_scale(Fraction(1), 1)
    counts = np.bincount(outputs, minlength=3)
    assert p_value(outputs, output_law(LAW_SCORES, scale, parties=2)) > 1e-3, counts
    assert p_value(outputs, redraw_law(LAW_SCORES, 2, scale)) < 1e-3, counts


async def test_a_carry_that_redraws_noise_is_caught(
    pair: DriverPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken on purpose, on both servers: each chunk runs a tournament of its
    own whose winner is revealed (to both servers) and re-enters the next chunk
    as a candidate with fresh noise.  Its answers fit the redraw law and are
    rejected by the test above (p < 10^−3)."""
    revealed: dict[tuple[int, str], tuple[int, bool, int]] = {}

    async def broken(
        self: ServerCore, party: Any, stream: Any, task: Any, chunk: Chunk, width: int
    ) -> int | None:
        prev = revealed.get((id(self), stream.stream_id))
        if prev is not None:  # the winner so far, as a fresh candidate
            chunk = Chunk(
                np.concatenate([[prev[0]], chunk.index]),
                np.concatenate([[prev[1]], chunk.complement]),
                chunk.more,
            )
        j = await party.noisy_max(self.noisy_max_inputs(stream, task, chunk), width)
        at = stream.queries + j - (prev is not None)
        index = prev[2] if prev is not None and j == 0 else at
        if chunk.more:
            revealed[(id(self), stream.stream_id)] = (
                int(chunk.index[j]),
                bool(chunk.complement[j]),
                index,
            )
            return None
        return index

    monkeypatch.setattr(ServerCore, "noisy_max", broken)
    await law_task(pair)
    outputs = await two_chunk_answers(pair, BROKEN_STREAMS)
    scale = noise_scale(Fraction(1), 1)
    counts = np.bincount(outputs, minlength=3)
    assert p_value(outputs, output_law(LAW_SCORES, scale, parties=2)) < 1e-3, counts
    assert p_value(outputs, redraw_law(LAW_SCORES, 2, scale)) > 1e-3, counts


def test_the_one_process_reference_follows_the_same_law() -> None:
    """`dp.noisy_max.chunked_noisy_argmax` (what the local oracle runs over
    several chunks): 5,000 two-chunk draws (fixed seed) fit the one-tournament
    law and reject the redraw law (expected G ≈ 350 against it); a split
    that does not cover the candidates in order is refused."""
    from svtagg.dp.noise import RandomSource
    from svtagg.dp.noisy_max import chunked_noisy_argmax

    rng = RandomSource(b"chunked reference")
    scores = list(LAW_SCORES)  # grid units at F = 1
    outputs = [chunked_noisy_argmax(scores, 1, 1, rng, 2, [(0, 2), (2, 3)]) for _ in range(5000)]
    scale = noise_scale(Fraction(1), 1)
    assert p_value(outputs, output_law(scores, scale, parties=2)) > 1e-3
    assert p_value(outputs, redraw_law(tuple(scores), 2, scale)) < 1e-3
    for bad in ([(0, 2)], [(0, 1), (2, 3)], [(0, 0), (0, 3)]):
        with pytest.raises(ValueError):
            chunked_noisy_argmax(scores, 1, 1, rng, 2, bad)
