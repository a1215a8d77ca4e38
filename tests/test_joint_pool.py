"""Joint noise generated ahead of time (servers/exchange/joint.py, servers/store/jointpool.py),
on the one-process reference pair: pooled ν still fit the sampler's exact pmf;
no sample is used twice, by either server, across chunks, a failed chunk, a
replayed header and a restart of either server; both servers use the same
samples for the same lane (every reconstructed ν lies in the sampler's
support, which a mismatched pair — a uniform ring element — misses with
probability ≈ 2^−50);
a chunk the pool cannot cover draws the rest in the chunk; the colluding-server
control is still caught; answers stay correct.

The shares come from the test-only hook `ServerCore.joint_noise_log`: each
chunk's record names the pool's sequence numbers it consumed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import joint_guess_bound, joint_sum, joint_z, spy_joint_sampler
from test_joint_servers import UNIT, N, _chi_square_pvalue, binned_law, spec

from svtagg.dp.errors import FailedPrecondition, Refusal
from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.proto.vocab import Role
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange.joint import JointDraw, PoolPolicy
from svtagg.servers.exchange.party import garbled_circuit_party
from svtagg.servers.exchange.values import Ask, OpenStream, PoolDraw, Queries
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.reference import ReferencePair, reference_pair
from svtagg.servers.store.rules import FAILED
from svtagg.servers.store.sqlite import SqliteStore

F = 6
NO = 4 * N * UNIT  # a τ no score reaches: every answer NO


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[ReferencePair]:
    """The closed joint-noise task of tests/test_joint_servers.py (coordinate 2
    holds N score units, the others 0), with no background filling: each test
    fills the pool itself, or sets a policy."""
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("t")
        p.leader.noise_pool = None
        for core in (p.leader.core, p.helper.core):
            core.joint_noise_log = []
        yield p


def _logs(p: ReferencePair) -> tuple[list[JointDraw], list[JointDraw]]:
    a, b = p.leader.core.joint_noise_log, p.helper.core.joint_noise_log
    assert a is not None and b is not None
    return a, b


def _check_pairs(p: ReferencePair, kind: StreamKind = StreamKind.LAP24, eps: int = 1) -> None:
    """Both servers' records name the same samples per chunk, no sequence number
    twice, and every reconstructed γ and ν lies in its sampler's support."""
    leader, helper = _logs(p)
    assert len(leader) == len(helper) > 0
    seen: set[tuple[str, int]] = set()
    noise = joint_stream_noise(kind, Fraction(eps), F)
    # 2^F·Z + dither, Z in [−2^K, 2^K), the dither in [−2^(F−1), 3·2^(F−1))
    nu_bound = (1 << len(noise.query_constants)) + 2 << F
    gamma_bound = (1 << len(noise.threshold_constants)) + 2 << F
    for a, b in zip(leader, helper, strict=True):
        assert (a.stream_id, a.chunk, a.pool_lo, a.pooled, a.gamma_pooled) == (
            b.stream_id,
            b.chunk,
            b.pool_lo,
            b.pooled,
            b.gamma_pooled,
        )
        used = {(a.stream_id, a.pool_lo + i) for i in range(a.pooled)}
        assert not used & seen, "a pooled sample was used twice"
        seen |= used
        nu = joint_sum(p, a.stream_id, a.nu, b.nu)
        assert ((-nu_bound <= nu) & (nu < nu_bound)).all(), "mismatched shares"
        gamma = int(joint_sum(p, a.stream_id, a.gamma, b.gamma)[0])
        assert -gamma_bound <= gamma < gamma_bound


async def _open(p: ReferencePair, eps: str = "1", kind: StreamKind = StreamKind.LAP24) -> str:
    return (await p.leader.open_stream(OpenStream("t", kind, eps))).stream_id


async def _ask_no(p: ReferencePair, sid: str, size: int) -> None:
    index = tuple(i % 4 for i in range(size))
    answer = await p.leader.ask(Ask(sid, Queries(index), (NO,) * size))
    assert not answer.yes and not answer.closed
    await p.helper.settled()  # the helper records the result it was sent one way


@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3])
async def test_pooled_noise_follows_the_exact_law(pair: ReferencePair, kind: StreamKind) -> None:
    """20,000 pooled ν (γ pooled too; four batches, four chunks that draw
    nothing in the chunk) fit the exact pmf of the stream's query sampler, for
    every kind whose noise is pooled (ctt and nmax draw in their chunks)."""
    sid = await _open(pair, "1", kind)
    assert await pair.leader.fill_pool(sid, 5000, gamma=True)
    for _ in range(3):
        assert await pair.leader.fill_pool(sid, 5000)
    for _ in range(4):
        await _ask_no(pair, sid, 5000)
    leader, _ = _logs(pair)
    assert [(d.pool_lo, d.pooled) for d in leader] == [(5000 * i, 5000) for i in range(4)]
    assert [d.gamma_pooled for d in leader] == [True, False, False, False]
    _check_pairs(pair, kind)
    samples = np.concatenate(
        [joint_sum(pair, a.stream_id, a.nu, b.nu) for a, b in zip(*_logs(pair), strict=True)]
    )
    noise = joint_stream_noise(kind, Fraction(1), F)
    lo, grid = noise.grid_pmf("query")
    assert lo <= samples.min() and samples.max() < lo + grid.size
    # False failure probability 1e-3 (the samples are os.urandom's: no seed).
    assert _chi_square_pvalue(samples >> F, binned_law(lo, grid, F)) > 1e-3
    for core in (pair.leader.core, pair.helper.core):
        pool = core.store.joint_pool(sid)
        assert (pool.used, pool.runs) == (20_000, ())


async def test_background_filling_serves_chunks_from_the_pool(pair: ReferencePair) -> None:
    """The leader's default behaviour, smaller batches: γ and the first batch
    are generated after the open and the first chunk waits for them; each chunk
    refills; chunks of changing sizes use each sample once on both servers, the
    YES is found, and the closed stream's leftovers are discarded."""
    pair.leader.noise_pool = PoolPolicy(batch=150, reserve=150)
    sid = await _open(pair, "4")
    for size in (120, 40, 150, 90, 150, 7):
        await _ask_no(pair, sid, size)
    yes = await pair.leader.ask(Ask(sid, Queries((0, 1, 2, 3)), ((N // 2) * UNIT,) * 4))
    assert yes.index == 2 and yes.closed
    leader, _ = _logs(pair)
    assert leader[0].gamma_pooled and leader[0].pooled == 120
    assert sum(d.pooled for d in leader) > 0.5 * sum(len(d.nu) for d in leader)
    _check_pairs(pair, eps=4)
    await pair.leader.stop_noise_fills()
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.joint_pool(sid).runs == ()


async def test_a_chunk_the_pool_cannot_cover_draws_the_rest(pair: ReferencePair) -> None:
    """The fallback: 30 pooled samples, no pooled γ — the first chunk of 50
    draws γ and 20 ν in the chunk; with the pool empty, the next chunk draws
    all of them; answers are still right."""
    sid = await _open(pair, "4")
    assert await pair.leader.fill_pool(sid, 30)
    await _ask_no(pair, sid, 50)
    await _ask_no(pair, sid, 50)
    yes = await pair.leader.ask(Ask(sid, Queries((3, 2)), ((N // 2) * UNIT,) * 2))
    assert yes.index == 1
    leader, _ = _logs(pair)
    assert [(d.pooled, len(d.nu), d.gamma_pooled) for d in leader] == [
        (30, 50, False),
        (0, 50, False),
        (0, 2, False),
    ]
    _check_pairs(pair, eps=4)


async def test_a_failed_chunk_consumes_its_samples(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk that fails after its mark has consumed its samples on both
    servers (and the failed stream's leftovers are discarded); a leader header
    that names consumed samples is refused by the helper, failing the stream."""
    sid = await _open(pair)
    assert await pair.leader.fill_pool(sid, 100, gamma=True)
    await _ask_no(pair, sid, 30)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the helper's chunk breaks")

    monkeypatch.setattr(pair.helper.core, "ask_inputs", broken)
    with pytest.raises(Refusal):
        await _ask_no(pair, sid, 30)
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.stream(sid).state == FAILED
        pool = core.store.joint_pool(sid)
        assert (pool.used, pool.runs) == (60, ())

    # A second stream: the helper refuses a header naming samples it consumed.
    monkeypatch.undo()
    other = await _open(pair)
    assert await pair.leader.fill_pool(other, 40, gamma=True)
    await _ask_no(pair, other, 20)
    helper = pair.helper.core
    stream, task = helper.stream_and_task(other)
    with pytest.raises(FailedPrecondition, match="already consumed"):
        helper.begin_pooled(stream, task, 2, PoolDraw(10, 20), 20)
    assert helper.store.stream(other).state == FAILED
    _check_pairs(pair)


async def test_the_helper_refuses_headers_no_honest_leader_sends(pair: ReferencePair) -> None:
    """More pooled samples than the chunk has queries, a pooled γ the helper
    never stored, a batch numbered past the pool's range: refused, and a
    refused chunk fails its stream (its samples are never used)."""
    helper = pair.helper.core
    for draw, k, why in (
        (PoolDraw(0, 21), 20, "one each"),
        (PoolDraw(0, 0, gamma=True), 5, "no pooled γ"),
    ):
        sid = await _open(pair)
        if draw.count:
            assert await pair.leader.fill_pool(sid, 30)
        stream, task = helper.stream_and_task(sid)
        with pytest.raises(Refusal, match=why):
            helper.begin_pooled(stream, task, 1, draw, k)
        assert helper.store.stream(sid).state == FAILED
    sid = await _open(pair)
    with pytest.raises(FailedPrecondition, match="below"):
        helper.reserve_noise_batch(sid, 10, False, lo=(1 << 62) - 5)


async def test_a_restarted_helper_keeps_its_pool_and_never_reuses(
    pair: ReferencePair, tmp_path: Path
) -> None:
    """The helper's pool is in its store: after a restart (store reopened, new
    core and driver, every session new) the stream goes on with the samples
    generated before, both servers still pairing them, and neither a consumed
    range nor a batch's numbers are handed out again."""
    sid = await _open(pair)
    assert await pair.leader.fill_pool(sid, 200, gamma=True)
    await _ask_no(pair, sid, 50)

    await pair.leader.pool.close()
    old_log = pair.helper.core.joint_noise_log
    pair.helper.core.store.close()
    store = SqliteStore(tmp_path / "h.sqlite")
    core = ServerCore(Role.HELPER, store)
    core.joint_noise_log = old_log
    pair.helper = pair.port.helper = HelperDriver(core, garbled_circuit_party)
    try:
        assert store.stream(sid).state != FAILED  # it was between chunks
        assert store.joint_pool(sid).used == 50
        await _ask_no(pair, sid, 100)
        leader, _ = _logs(pair)
        assert [(d.pool_lo, d.pooled) for d in leader] == [(0, 50), (50, 100)]
        _check_pairs(pair)
        with pytest.raises(FailedPrecondition, match="reserved before"):
            core.reserve_noise_batch(sid, 10, False, lo=100)
        stream, task = core.stream_and_task(sid)
        with pytest.raises(FailedPrecondition, match="already consumed"):
            core.begin_pooled(stream, task, 3, PoolDraw(100, 10), 10)
    finally:
        store.close()


async def test_a_restarted_leader_goes_on_with_its_pool(
    pair: ReferencePair, tmp_path: Path
) -> None:
    """The leader's pool is in its store too: after a restart it names the
    next unused samples, and its next batch takes fresh numbers (the helper
    would refuse reused ones)."""
    sid = await _open(pair)
    assert await pair.leader.fill_pool(sid, 60, gamma=True)
    await _ask_no(pair, sid, 40)

    old = pair.leader
    await old.pool.close()
    old.core.store.close()
    store = SqliteStore(tmp_path / "l.sqlite")
    core = ServerCore(Role.LEADER, store)
    core.joint_noise_log = old.core.joint_noise_log
    pair.leader = LeaderDriver(core, pair.port, garbled_circuit_party)
    pair.leader.noise_pool = None
    try:
        assert await pair.leader.fill_pool(sid, 30)  # numbers 60..90
        await _ask_no(pair, sid, 50)  # 40..90: the rest of the first batch, then the second
        leader, _ = _logs(pair)
        assert [(d.pool_lo, d.pooled) for d in leader] == [(0, 40), (40, 50)]
        _check_pairs(pair)
    finally:
        await pair.leader.pool.close()
        store.close()


async def _predicted_by_garbler(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch, evaluator_bits: str
) -> float:
    """How often the garbling server (the helper), from its own random words of
    a pooled batch, names the ν a chunk then used.  evaluator_bits "random" (the
    servers' code) or "zero" (the control: only the garbler's bits enter the
    sampler)."""
    guesses = spy_joint_sampler(monkeypatch, garbler_only=evaluator_bits == "zero")
    for c in (pair.leader.core, pair.helper.core):
        c.joint_noise_log = []
    sid = await _open(pair)
    assert await pair.leader.fill_pool(sid, 2000, gamma=True)
    await _ask_no(pair, sid, 2000)
    (a,), (b,) = _logs(pair)
    assert a.pooled == 2000 and len(guesses) == 2  # γ's draw, then the batch
    return float(np.mean(joint_z(joint_sum(pair, a.stream_id, a.nu, b.nu), F) == guesses[1]))


async def test_one_server_cannot_predict_pooled_noise(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tests/test_joint_servers.py's check, on noise from the pool: the
    garbling server's guess from its own bits is right about as often as two
    independent draws coincide; the control (the evaluator's bits zero) is
    caught."""
    bound = joint_guess_bound(F)
    honest = await _predicted_by_garbler(pair, monkeypatch, "random")
    assert honest < bound
    control = await _predicted_by_garbler(pair, monkeypatch, "zero")
    assert control == 1.0
    assert not control < bound


async def test_streams_filled_side_by_side_keep_their_own_samples(pair: ReferencePair) -> None:
    """Two streams whose pools fill in the background at once (one batch at a
    time per leader), their chunks interleaved: each chunk's samples are its
    own stream's, on both servers, and both streams find their YES."""
    pair.leader.noise_pool = PoolPolicy(batch=100, reserve=100, first=20)
    sids = [await _open(pair, "4") for _ in range(2)]
    for _ in range(3):
        for sid in sids:
            await _ask_no(pair, sid, 60)
    for sid in sids:
        yes = await pair.leader.ask(Ask(sid, Queries((2, 0)), ((N // 2) * UNIT,) * 2))
        assert yes.index == 0 and yes.closed
    leader, _ = _logs(pair)
    assert {d.stream_id for d in leader} == set(sids)
    assert any(d.pooled for d in leader)
    _check_pairs(pair, eps=4)
