"""Prepared joint noise (servers/exchange/prepared.py), on the one-process
reference pair: what a joint-noise stream consumed is made again once the pair
is idle; the next stream of the same shape takes its chunks' ν out of the
prepared pool (moved, not generated: the sampler runs for its γ only), the
moved ν fit the sampler's exact law and both servers hold the same sample per
lane; a move the helper cannot serve (its pool lost, a range given out
before, another generation) is refused without failing the stream, whose
chunk then draws in the chunk; the pool's bound and generations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import joint_sum
from test_joint_servers import UNIT, N, _chi_square_pvalue, binned_law, spec

from svtagg.dp.errors import FailedPrecondition, ResourceExhausted
from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.servers.exchange.joint import PreparePolicy
from svtagg.servers.exchange.prepared import PreparedNoise, shape_key
from svtagg.servers.exchange.values import Ask, OpenStream, PreparedRef, Queries
from svtagg.servers.reference import ReferencePair, reference_pair
from svtagg.servers.store.rules import OPEN

F = 6
NO = 4 * N * UNIT  # a τ no score reaches: every answer NO
SHAPE = shape_key(StreamKind.LAP24, Fraction(1))


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[ReferencePair]:
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("t")
        p.leader.prepare = PreparePolicy(batch=1000, idle=0.5)  # not between chunks
        for core in (p.leader.core, p.helper.core):
            core.joint_noise_log = []
        yield p


async def _stream(p: ReferencePair, chunks: int, size: int, drawn: list[int] | None = None) -> str:
    """A lap24 stream of `chunks` chunks of `size` NO answers; `drawn` gets each
    answer's count of queries whose ν was drawn in the chunk."""
    sid = (await p.leader.open_stream(OpenStream("t", StreamKind.LAP24, "1"))).stream_id
    index = tuple(i % 4 for i in range(size))
    for _ in range(chunks):
        answer = await p.leader.ask(Ask(sid, Queries(index), (NO,) * size))
        assert not answer.yes
        if drawn is not None:
            drawn.append(answer.noise_drawn)
    return sid


async def _prepared(p: ReferencePair, at_least: int) -> None:
    """Wait for the leader's preparer to reach `at_least` samples and stop."""
    for _ in range(600):
        task = p.leader._preparer
        if p.leader.core.prepared.held("t", SHAPE) >= at_least and (task is None or task.done()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the preparer did not fill the pool")


def _count_generated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Hook the servers' joint sampler: the leader's side appends how many
    samples each run of it makes (a move runs no sampler)."""
    from svtagg.mpc.protocol import ComparisonEvaluator
    from svtagg.servers.exchange import joint

    made: list[int] = []
    real = joint.joint_shares

    async def counted(party, n, shape):  # type: ignore[no-untyped-def]
        if isinstance(party, ComparisonEvaluator):
            made.append(n)
        return await real(party, n, shape)

    monkeypatch.setattr(joint, "joint_shares", counted)
    return made


async def test_the_next_stream_takes_prepared_noise(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream asks 3 × 1,000; once idle the leader prepares 3,750 of its shape
    (both servers hold them); a second stream's 3 × 1,000 queries take every ν
    from them — pooled in each chunk, nothing drawn in the chunk, no more
    moved than the chunks lacked — and its ν
    fit the exact law; every reconstructed ν lies in the sampler's support
    (a mismatched pair would be a uniform ring element)."""
    await _stream(pair, 3, 1000)
    await _prepared(pair, 3750)  # what it consumed and a quarter more (`PreparePolicy.margin`)
    held = pair.leader.core.prepared.held("t", SHAPE)
    assert held == 3750 == pair.helper.core.prepared.held("t", SHAPE)
    before = len(pair.leader.core.joint_noise_log or [])
    drawn: list[int] = []
    pair.leader.prepare = PreparePolicy(batch=1000, idle=60.0)  # none made during it
    made = _count_generated(monkeypatch)
    sid = await _stream(pair, 3, 1000, drawn)
    assert drawn == [0, 0, 0]  # what the analyst is told: every ν was ready
    # The sampler ran only for the stream's first batch (γ and 32 ν): the rest moved.
    assert made == [1, 32]
    for core in (pair.leader.core, pair.helper.core):  # exactly what the chunks lacked moved
        assert core.prepared.held("t", SHAPE) == held - (3000 - 32)
    leader, helper = pair.leader.core.joint_noise_log, pair.helper.core.joint_noise_log
    assert leader is not None and helper is not None
    drawn = list(zip(leader[before:], helper[before:], strict=True))
    assert [a.pooled for a, _ in drawn] == [1000, 1000, 1000]  # no ν drawn in a chunk
    nu = np.concatenate([joint_sum(pair, sid, a.nu, b.nu) for a, b in drawn])
    noise = joint_stream_noise(StreamKind.LAP24, Fraction(1), F)
    lo, grid = noise.grid_pmf("query")
    assert lo <= nu.min() and nu.max() < lo + grid.size
    assert _chi_square_pvalue(nu >> F, binned_law(lo, grid, F)) > 1e-3
    # what the second stream consumed is prepared again, alike on both servers
    pair.leader.prepare = PreparePolicy(batch=1000, idle=0.5)
    pair.leader._want_prepared("t", SHAPE, 0)  # wake the preparer
    await _prepared(pair, 3000)
    assert pair.helper.core.prepared.held("t", SHAPE) == pair.leader.core.prepared.held("t", SHAPE)


async def test_a_move_the_helper_cannot_serve_is_refused_and_the_stream_goes_on(
    pair: ReferencePair,
) -> None:
    """The helper's prepared pool lost (a restart): the move is refused, the
    leader drops its own pool, the chunk draws its ν in the chunk and answers,
    and the stream stays open."""
    await _stream(pair, 1, 1000)
    await _prepared(pair, 1000)
    pair.helper.core.prepared.drop_task("t")
    sid = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "1"))).stream_id
    answer = await pair.leader.ask(Ask(sid, Queries((0, 1, 2, 3) * 100), (NO,) * 400))
    assert not answer.yes and answer.noise_drawn > 0  # told: drawn at the sampler's pace
    assert pair.leader.core.prepared.ref("t", SHAPE) is None  # dropped after the refusal
    assert pair.leader.core.stream(sid).state == OPEN
    log = pair.leader.core.joint_noise_log
    assert log is not None and log[-1].pooled < 400  # drawn in the chunk


async def test_a_move_from_another_shapes_pool_is_refused_by_the_helper(
    pair: ReferencePair,
) -> None:
    """The leader's move names a prepared pool of another ε than the stream's:
    the helper refuses it in its check (nothing kept), the stream stays open
    and its next chunk answers."""
    other = shape_key(StreamKind.LAP24, Fraction(1, 2))
    task = pair.leader.core.task("t")
    assert await pair.leader.fill_prepared(task, other, 50) is not None
    assert pair.helper.core.prepared.held("t", other) == 50
    sid = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "1"))).stream_id
    stream = pair.leader.core.stream(sid)
    wrong = replace(stream, epsilon=Fraction(1, 2))  # the leader's view, made to lie
    async with pair.leader._fill_slot:
        assert await pair.leader._try_move(wrong, "t", 20) == 0
    assert pair.helper.core.prepared.held("t", other) == 50  # the helper took nothing
    assert pair.leader.core.prepared.ref("t", other) is None  # the leader let it go
    assert pair.leader.core.stream(sid).state == OPEN
    assert not (await pair.leader.ask(Ask(sid, Queries((0, 1)), (NO, NO)))).yes


async def test_the_helper_refuses_prepared_samples_given_out_before(pair: ReferencePair) -> None:
    """A move naming a prepared range the helper has already moved, or another
    generation of the pool, is refused before anything is kept."""
    await _stream(pair, 1, 1000)
    await _prepared(pair, 1000)
    ref = pair.leader.core.prepared.ref("t", SHAPE)
    assert ref is not None
    helper = pair.helper.core.prepared
    helper.take(ref, 0, 10)
    with pytest.raises(FailedPrecondition, match="already consumed"):
        helper.take(ref, 0, 10)
    with pytest.raises(FailedPrecondition, match="generation"):
        helper.take(PreparedRef("t", SHAPE, bytes(16)), 10, 10)


def test_the_pool_rules() -> None:
    """Reservations past the bound are refused; a new generation replaces the
    helper's pool; a batch for a dropped or replaced pool is not kept."""
    leader, helper = PreparedNoise(cap=100), PreparedNoise(cap=100)
    ref = leader.start("t", SHAPE)
    lo = leader.reserve(ref, 60)
    assert helper.reserve(ref, 60, lo) == 0
    with pytest.raises(ResourceExhausted, match="100 prepared noise samples"):
        leader.reserve(ref, 41)
    shares = np.arange(60, dtype=np.uint64)
    assert helper.add(ref, 0, shares) and leader.add(ref, 0, shares)
    assert helper.first_run("t", SHAPE) == (0, 60)
    assert list(helper.take(ref, 5, 10)) == list(range(5, 15))  # 0..4 dropped, 15.. kept
    assert helper.held("t", SHAPE) == 45
    newer = PreparedRef("t", SHAPE, b"\x01" * 16)
    assert helper.reserve(newer, 10, 0) == 0  # the leader restarted: a new generation
    assert helper.held("t") == 0 and not helper.add(ref, 60, shares[:1])
    with pytest.raises(FailedPrecondition, match="generation"):
        leader.take(newer, 0, 1)


async def test_noise_prepared_on_request_while_the_collection_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analyst's PrepareNoise (`LeaderDriver.prepare_noise`): on a task still
    collecting, 2,500 samples of lap24 at ε = 1 are asked for (a level: asking
    again adds nothing) and made on both servers; after the close, the first
    stream of that shape takes its 2 × 1,000 queries' ν from them (nothing drawn
    in its chunks: the sampler runs for its γ and first 32 ν only).  Refused
    with nothing made: a task without joint noise, a kind whose noise is not
    prepared, an ε below the task's floor, a count above the bound, and a
    process that does not prepare."""
    from svtagg.dp.errors import InvalidArgument

    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        await p.leader.create_task(spec("plain", noise="independent"))
        p.leader.prepare = PreparePolicy(batch=1000, idle=0.5)
        lap24 = StreamKind.LAP24
        with pytest.raises(InvalidArgument, match="draws no joint noise"):
            p.leader.prepare_noise("plain", lap24, "1", 10)
        with pytest.raises(InvalidArgument, match="not ctt"):
            p.leader.prepare_noise("t", StreamKind.CTT, "1/2", 10)
        with pytest.raises(InvalidArgument, match="takes ε in"):
            p.leader.prepare_noise("t", lap24, "1/8", 10)
        with pytest.raises(InvalidArgument, match="count must be in"):
            p.leader.prepare_noise("t", lap24, "1", 10**6)
        status = p.leader.prepare_noise("t", lap24, "1", 2500)
        assert (status.held, status.pending) == (0, 2500)
        assert p.leader.prepare_noise("t", lap24, "1", 2500).pending == 2500  # a level
        await _prepared(p, 2500)
        status = p.leader.prepare_noise("t", lap24, "1", 0)
        assert (status.held, status.pending, status.task_held) == (2500, 0, 2500)
        assert p.helper.core.prepared.held("t", SHAPE) == 2500

        p.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("t")
        p.leader.prepare = PreparePolicy(batch=1000, idle=60.0)  # none made during it
        made = _count_generated(monkeypatch)
        drawn: list[int] = []
        await _stream(p, 2, 1000, drawn)
        assert drawn == [0, 0] and made == [1, 32]
        p.leader.prepare = None
        with pytest.raises(FailedPrecondition, match="does not prepare"):
            p.leader.prepare_noise("t", lap24, "1", 10)
