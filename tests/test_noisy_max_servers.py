"""Report-noisy-max through the real servers: the one-process reference pair
(a leader and a helper driver on their own stores, the real garbled
tournament).  An NMAX stream is charged on both ledgers when it opens, one
NoisyMax chunk answers it (each server's own noise on its share, only the
argmax revealed) and closes it; refusals before the chunk's mark leave the
stream usable, a failure after it fails the stream on both servers; and the
servers' answers follow the mechanism's exact output law."""

from __future__ import annotations

from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import DriverPair, failing_helper_pair

from svtagg.analyst.audit import fit_test
from svtagg.dp.errors import (
    ChunkTooLarge,
    InvalidArgument,
    PeerUnavailable,
    StreamClosed,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.noisy_max import noise_scale, output_law
from svtagg.dp.queries import MAX_CHUNK
from svtagg.dp.task import TaskSpec
from svtagg.servers.exchange.values import (
    Ask,
    ChunkKind,
    NoisyMax,
    OpenStream,
    PlanGroup,
    PlanRequest,
    Queries,
    StreamChunk,
)
from svtagg.servers.store.rules import FAILED

F = 16
D = 40
N = 200


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[DriverPair]:
    async with failing_helper_pair(tmp_path, "noisy_max") as p:
        yield p


def spec(task_id: str, d: int = D, frac_bits: int = F, eps_total: str = "10") -> TaskSpec:
    return TaskSpec(
        task_id=task_id,
        d=d,
        frac_bits=frac_bits,
        n_max=10 * N,
        min_batch=1,
        epsilon_total=eps_total,
        delta_total="1/100",
        epsilon_min="1/4",
    )


def separated(n: int, best: int) -> np.ndarray:
    """Coordinate j's count is about n·j/(2d) (users drawn at random), except
    `best`, which every user holds: its count n beats the next by ≈ n/2 score
    units, far beyond the noise at ε = 1 (2/ε per party, tail e^−50 at 100)."""
    rng = np.random.default_rng(best)
    v = (rng.random((n, D)) < np.arange(D) / (2 * D)).astype(np.float64)
    v[:, best] = 1.0
    return v


async def closed_task(pair: DriverPair, task_id: str = "t", best: int = 23) -> None:
    await pair.leader.create_task(spec(task_id))
    pair.upload(task_id, separated(N, best))
    assert (await pair.leader.close_collection(task_id)).agreed


async def open_nmax(pair: DriverPair, task_id: str = "t", eps: str = "1") -> str:
    info = await pair.leader.open_stream(OpenStream(task_id, StreamKind.NMAX, eps))
    assert info.kind == StreamKind.NMAX and not info.closed
    return info.stream_id


def spent(pair: DriverPair, task_id: str = "t") -> tuple[Fraction, Fraction]:
    return (
        pair.leader.core.store.task(task_id).budget.epsilon_spent,
        pair.helper.core.store.task(task_id).budget.epsilon_spent,
    )


# ---------------------------------------------------------------- the mechanism end to end
async def test_the_argmax_of_separated_counts_is_found(pair: DriverPair) -> None:
    await closed_task(pair, best=23)
    assert spent(pair) == (0, 0)
    sid = await open_nmax(pair, eps="1")
    assert spent(pair) == (1, 1)  # charged on both ledgers before any noise
    every = Queries(tuple(range(D)))
    ans = await pair.leader.noisy_max(NoisyMax(sid, every))
    assert ans.index == 23 and ans.closed and ans.peer_bytes > 0
    await pair.helper.settled()  # the helper records the result it was sent one way
    for core in (pair.leader.core, pair.helper.core):
        s = core.store.stream(sid)
        assert s.closed and s.queries == D and s.chunks == 1
    with pytest.raises(StreamClosed):  # one selection per stream and charge
        await pair.leader.noisy_max(NoisyMax(sid, every))
    assert spent(pair) == (1, 1)


async def test_candidates_are_positions_with_complements(pair: DriverPair) -> None:
    """The answer is a position among the candidates, which may take
    complements (n − S_j): coordinate 0 is held by nobody, so its complement
    (n) beats the plain counts of 5, 7 and 30 (about 12, 17 and 75)."""
    await closed_task(pair, best=23)
    order = (5, 7, 0, 30)
    sid = await open_nmax(pair)
    ans = await pair.leader.noisy_max(NoisyMax(sid, Queries(order)))
    assert ans.index == 3
    sid = await open_nmax(pair)
    flips = (False, False, True, False)
    ans = await pair.leader.noisy_max(NoisyMax(sid, Queries(order, flips)))
    assert ans.index == 2
    assert spent(pair) == (2, 2)


# ---------------------------------------------------------------- refusals
async def test_refusals_leave_the_stream_usable(pair: DriverPair) -> None:
    await closed_task(pair, best=3)
    sid = await open_nmax(pair)
    with pytest.raises(InvalidArgument, match="at least one"):
        await pair.leader.noisy_max(NoisyMax(sid, Queries(())))
    with pytest.raises(ChunkTooLarge):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0,) * (MAX_CHUNK + 1))))
    with pytest.raises(InvalidArgument, match="out of range"):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0, D))))
    with pytest.raises(InvalidArgument, match="complement flags"):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1), (True,))))
    with pytest.raises(InvalidArgument, match="answers NoisyMax, not Ask"):
        await pair.leader.ask(Ask(sid, Queries((3,)), (0,)))
    # None of these ran a chunk: the stream still answers, once.
    ans = await pair.leader.noisy_max(NoisyMax(sid, Queries((1, 3, 2))))
    assert ans.index == 1 and ans.closed
    assert spent(pair) == (1, 1)


async def test_wrong_kinds_are_refused(pair: DriverPair) -> None:
    await closed_task(pair)
    lap = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "1"))).stream_id
    with pytest.raises(InvalidArgument, match="answers Ask, not NoisyMax"):
        await pair.leader.noisy_max(NoisyMax(lap, Queries((0, 1))))
    ctt = OpenStream("t", StreamKind.CTT, "1/2", "1/1000")
    ctt_id = (await pair.leader.open_stream(ctt)).stream_id
    with pytest.raises(InvalidArgument, match="answers Compare, not NoisyMax"):
        await pair.leader.noisy_max(NoisyMax(ctt_id, Queries((0, 1))))
    # The helper checks the header's kind against its own copy of the stream.
    with pytest.raises(InvalidArgument, match="does not match"):
        await pair.helper._accept(StreamChunk(ChunkKind.NMAX, lap, 1, Queries((0,))))
    nmax = await open_nmax(pair)
    with pytest.raises(InvalidArgument, match="does not match"):
        await pair.helper._accept(StreamChunk(ChunkKind.ASK, nmax, 1, Queries((0,))))
    # A report-noisy-max is pure ε-DP: a δ is refused before any charge.
    before = spent(pair)
    with pytest.raises(InvalidArgument, match="pure"):
        await pair.leader.open_stream(OpenStream("t", StreamKind.NMAX, "1", "1/1000"))
    assert spent(pair) == before


async def test_a_failed_tournament_fails_the_stream_on_both_servers(pair: DriverPair) -> None:
    await closed_task(pair)
    sid = await open_nmax(pair)
    pair.crash_helper[0] = True
    with pytest.raises(PeerUnavailable):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1, 2))))
    for core in (pair.leader.core, pair.helper.core):
        assert core.store.stream(sid).state == FAILED
    assert spent(pair) == (1, 1)  # never refunded
    pair.crash_helper[0] = False
    with pytest.raises(StreamClosed):
        await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1, 2))))
    sid = await open_nmax(pair)  # a fresh stream on a fresh session works
    assert (await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 23))))).index == 1


async def test_a_plan_group_pays_for_it(pair: DriverPair) -> None:
    await closed_task(pair)
    plan = await pair.leader.reserve_plan(PlanRequest("t", (PlanGroup("3/2"),)))
    assert spent(pair) == (Fraction(3, 2), Fraction(3, 2))
    for _ in range(3):
        req = OpenStream("t", StreamKind.NMAX, "1/2", plan=(plan.plan_id, 0))
        sid = (await pair.leader.open_stream(req)).stream_id
        assert (await pair.leader.noisy_max(NoisyMax(sid, Queries((23, 0))))).index == 0
    fourth = OpenStream("t", StreamKind.NMAX, "1/2", plan=(plan.plan_id, 0))
    with pytest.raises(InvalidArgument, match="plan group 0 holds"):  # used up
        await pair.leader.open_stream(fourth)
    assert spent(pair) == (Fraction(3, 2), Fraction(3, 2))


# ---------------------------------------------------------------- the output law
#: Three candidates at F = 1, ε = 1 (scale 4 per party): the scores where one
#: party's noise and two parties' differ most (KL 0.047 per answer, from
#: `output_law`: at 1,000 answers the expected G against the one-party law is
#: 94, against a critical value of 13.8), so the counts tell the two apart.
LAW_SCORES = (0, 8, 1)
LAW_STREAMS = 1000


async def test_the_servers_follow_the_exact_output_law(pair: DriverPair) -> None:
    """Every server adds its own full-scale noise: the answers of LAW_STREAMS
    streams fit the exact two-party law (`fit_test`: a G-test with a Monte
    Carlo p-value), and the
    same counts reject the law of one party's noise only (what a server that
    forgot its noise would give) and of two parties at a quarter of the scale."""
    await pair.leader.create_task(spec("law", d=3, frac_bits=1, eps_total="1000"))
    pair.frac_bits = 1
    rows = [[0, 1, 0.5]] + [[0, 1, 0]] * 3  # S = (0, 8, 1) grid units at F = 1
    pair.upload("law", np.array(rows, dtype=np.float64))
    await pair.leader.close_collection("law")
    counts = np.zeros(3, dtype=np.int64)
    for _ in range(LAW_STREAMS):
        sid = await open_nmax(pair, "law")
        counts[(await pair.leader.noisy_max(NoisyMax(sid, Queries((0, 1, 2))))).index] += 1
    outputs = [j for j, c in enumerate(counts.tolist()) for _ in range(c)]
    scale = noise_scale(Fraction(1), 1)
    rng = np.random.default_rng(1)

    def p_value(law: np.ndarray) -> float:  # no None outcome: its cell has mass 0
        return fit_test("servers", outputs, np.append(law, 0.0), rng).p_value

    assert p_value(output_law(LAW_SCORES, scale, parties=2)) > 1e-3, counts
    for wrong in (output_law(LAW_SCORES, scale, 1), output_law(LAW_SCORES, scale / 4, 2)):
        assert p_value(wrong) < 1e-3, (counts, wrong)
