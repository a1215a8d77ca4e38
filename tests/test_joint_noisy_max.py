"""Report-noisy-max on a joint-noise task (dp/jointsvt.py, "Report-noisy-max
with joint noise"): each candidate's noise is ONE draw of the garbled sampler's
one-sided law at Exp(2Δ/ε)'s scale, made inside the servers' chunk.

- The accounting: the exact output law of the tournament (the sampler's pmf,
  enumerated) on every pair of neighbouring score vectors of a small grid
  keeps P(i | s) ≤ e^ε·P(i | s') + k·P(G ≥ 2^K − 2); the control — the sampler
  of 2ε charged as ε — breaks that bound, and the same check catches it.
- Through the servers: a stream answers the right index and both ledgers hold
  (ε, δ_charge); 800 streams' answers fit the exact law of one joint draw per
  candidate and reject the law of two independent draws; the garbling server
  names a candidate's draw from its own bits no more often than chance (the
  control with the other server's bits zeroed names every one); the candidate
  limit of a joint tournament.
- The local oracle draws the same law and charges the same δ."""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_joint_servers import spec as joint_spec

from svtagg.analyst.audit import fit_test
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.dp.errors import InvalidArgument
from svtagg.dp.joint import one_sided_ratio, tail_mass
from svtagg.dp.jointsvt import (
    JOINT_DELTA_CAP,
    JOINT_MAX_TOURNAMENT,
    JointStreamNoise,
    _within,
    joint_stream_noise,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.noisy_max import joint_output_law, noise_scale, output_law
from svtagg.dp.queries import Query
from svtagg.dp.task import TaskSpec
from svtagg.servers.core import Chunk
from svtagg.servers.exchange.values import NoisyMax, OpenStream, Queries
from svtagg.servers.reference import ReferencePair, reference_pair

F = 6
UNIT = 1 << F
N = 40
#: Column sums of the audit's data (score units): close enough for the noise
#: at ε = 1 to spread the winner over all four.
SUMS = (36, 37, 40, 38)


def spec(task_id: str, streams: int = 40) -> TaskSpec:
    """tests/test_joint_servers.py's joint task, with budget for `streams` streams of ε = 1."""
    return replace(joint_spec(task_id), epsilon_total=str(streams))


def data() -> np.ndarray:
    """N users whose column sums are SUMS."""
    rows = np.zeros((N, 4))
    for j, s in enumerate(SUMS):
        rows[:s, j] = 1.0
    return rows


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[ReferencePair]:
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", data())
        await p.leader.close_collection("t")
        for core in (p.leader.core, p.helper.core):
            core.joint_noise_log = []
        yield p


# ---------------------------------------------------------------- the accounting
def _worst_excess(noise: JointStreamNoise, epsilon: Fraction) -> float:
    """max over neighbouring score vectors s, s' of a 3-candidate grid (each
    score in 0..3 sensitivities, in grid units, each moving by at most one
    sensitivity, 2^F grid units, so half-sensitivity moves and odd scores
    meet the dither too) and outputs i of P(i | s) − e^ε·P(i | s') −
    3·P(G ≥ 2^K − 2), the tournament's exact law."""
    k = len(noise.query_constants)
    delta = 3 * float(tail_mass(noise.query_constants, noise.query_widths, (1 << k) - 2))
    bound = math.exp(epsilon)
    worst = -1.0
    laws: dict[tuple[int, ...], np.ndarray] = {}

    def law(s: tuple[int, ...]) -> np.ndarray:
        if s not in laws:
            laws[s] = joint_output_law(list(s), noise)
        return laws[s]

    unit = 1 << noise.shift
    for s in itertools.product(range(3 * unit + 1), repeat=3):
        for move in itertools.product(range(-unit, unit + 1), repeat=3):
            t = tuple(a + b for a, b in zip(s, move, strict=True))
            if min(t) < 0:
                continue
            worst = max(worst, float(np.max(law(s) - bound * law(t))) - delta)
    return worst


@pytest.mark.parametrize("epsilon", ["1/2", "1", "2"])
def test_the_exact_tournament_loss_is_within_the_charge(epsilon: str) -> None:
    """R = max P(G = g)/P(G = g + 2) ≤ e^ε (checked in integers), δ within the
    cap for JOINT_MAX_TOURNAMENT candidates, and the exact output law on every
    neighbouring pair of the grid within (e^ε, 3·tail) — the dither included
    (F = 1: one sensitivity is two grid units)."""
    eps = Fraction(epsilon)
    noise = joint_stream_noise(StreamKind.NMAX, eps, 1)
    assert not noise.signed and noise.threshold_constants == ()
    assert _within(one_sided_ratio(noise.query_constants, noise.query_widths, 2), eps)
    assert noise.delta <= noise.delta_charge <= JOINT_DELTA_CAP
    assert _worst_excess(noise, eps) <= 1e-12


def test_the_sampler_of_twice_epsilon_breaks_the_bound() -> None:
    """Negative control: half the noise (the sampler built for 2ε) claimed as
    ε — some neighbouring pair's output probability exceeds e^ε times the
    other's by far more than the δ term."""
    eps = Fraction(1)
    broken = joint_stream_noise(StreamKind.NMAX, 2 * eps, 1)
    assert _worst_excess(broken, eps) > 0.01


def test_alpha_of_a_joint_tournament_bounds_its_noise() -> None:
    """α (no γ): k·P(draw > α − 1 grid units) ≤ β on the exact law, and it is
    below the independent tournament's (one draw, not two)."""
    from svtagg.dp import accuracy

    eps, k, beta = Fraction(1), 50, 0.05
    noise = joint_stream_noise(StreamKind.NMAX, eps, F)
    a = accuracy.joint_alpha_grid(StreamKind.NMAX, eps, k, beta, F)
    assert k * noise.grid_upper("query", a - 1) <= beta
    assert a < accuracy.alpha_grid(StreamKind.NMAX, eps, k, beta, 2, F)


# ---------------------------------------------------------------- the servers
async def test_a_joint_tournament_answers_and_charges(pair: ReferencePair) -> None:
    """ε = 8 (a scale of ¼ score unit against gaps of 2): the index of the
    largest sum; both ledgers hold (ε, δ_charge); the draws the pair made
    (both shares added) are one-sided and inside the sampler's support."""
    from conftest import joint_sum

    info = await pair.leader.open_stream(OpenStream("t", StreamKind.NMAX, "8"))
    answer = await pair.leader.noisy_max(NoisyMax(info.stream_id, Queries((0, 1, 2, 3))))
    assert answer.index == 2 and answer.closed
    noise = joint_stream_noise(StreamKind.NMAX, Fraction(8), F)
    for core in (pair.leader.core, pair.helper.core):
        budget = core.task("t").budget
        assert (budget.epsilon_spent, budget.delta_spent) == (8, noise.delta_charge)
    logs = pair.leader.core.joint_noise_log, pair.helper.core.joint_noise_log
    assert logs[0] is not None and logs[1] is not None and len(logs[0]) == len(logs[1]) == 1
    nu = joint_sum(pair, info.stream_id, logs[0][0].nu, logs[1][0].nu)
    k = len(noise.query_constants)
    assert len(nu) == 4 and nu.min() >= 0 and nu.max() < (1 << k) + 2 << F


async def test_a_joint_tournament_holds_at_most_2_to_the_20_candidates(
    pair: ReferencePair,
) -> None:
    info = await pair.leader.open_stream(OpenStream("t", StreamKind.NMAX, "1"))
    stream = pair.leader.core.store.stream(info.stream_id)
    three = Chunk(np.arange(3, dtype=np.int64), np.zeros(3, dtype=bool), more=True)
    core = pair.leader.core
    core.check_queries(replace(stream, queries=JOINT_MAX_TOURNAMENT - 3), three)
    with pytest.raises(InvalidArgument, match="at most 1,048,576 candidates on a task with joint"):
        core.check_queries(replace(stream, queries=JOINT_MAX_TOURNAMENT - 2), three)


async def test_joint_tournament_answers_follow_the_exact_law(tmp_path: Path) -> None:
    """800 fresh nmax streams at ε = 1 over the four coordinates (sums 36, 37,
    40, 38 score units): the winners fit the exact law of one joint draw per
    candidate (`joint_output_law`), and the same G-test rejects the law of two
    servers' independent draws at Exp(2Δ/ε) each.  The two laws differ by
    KL ≈ 0.039 per stream: at 800 streams the G statistic against the wrong law
    has non-centrality ≈ 63 and falls below the 10^-3 critical value with
    probability far below 10^-6."""
    streams, eps = 800, Fraction(1)
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("a", streams))
        p.upload("a", data())
        await p.leader.close_collection("a")
        outputs = []
        for _ in range(streams):
            sid = (await p.leader.open_stream(OpenStream("a", StreamKind.NMAX, "1"))).stream_id
            outputs.append((await p.leader.noisy_max(NoisyMax(sid, Queries((0, 1, 2, 3))))).index)
    scores = [s * UNIT for s in SUMS]
    rng = np.random.default_rng(12)
    joint = np.append(joint_output_law(scores, joint_stream_noise(StreamKind.NMAX, eps, F)), 0.0)
    fit = fit_test("joint", outputs, joint, rng)
    assert fit.p_value > 1e-3, f"{fit} (false failure 10^-3)"
    two = np.append(output_law(scores, noise_scale(eps, F), parties=2), 0.0)
    wrong = fit_test("two draws", outputs, two, rng)
    assert wrong.p_value < 1e-3, f"{wrong} (false failure below 10^-6)"


async def _tournament_guess_rate(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch, garbler_only: bool
) -> float:
    """How often the garbling server (the helper), from its own random words
    alone, names the draw the pair made for a candidate, over a 2,000-candidate
    tournament at ε = ¼ (garbler_only: the control, the evaluator's words zero)."""
    from conftest import joint_sum, joint_z, spy_joint_sampler

    guesses = spy_joint_sampler(monkeypatch, garbler_only)
    for core in (pair.leader.core, pair.helper.core):
        core.joint_noise_log = []
    sid = (await pair.leader.open_stream(OpenStream("t", StreamKind.NMAX, "1/4"))).stream_id
    await pair.leader.noisy_max(NoisyMax(sid, Queries(tuple(i % 4 for i in range(2000)))))
    logs = pair.leader.core.joint_noise_log, pair.helper.core.joint_noise_log
    assert logs[0] is not None and logs[1] is not None
    drawn = joint_z(joint_sum(pair, sid, logs[0][0].nu, logs[1][0].nu), F)
    monkeypatch.undo()
    return float(np.mean(drawn == guesses[0]))


async def test_one_server_cannot_predict_the_tournament_noise(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With both servers' bits the garbling server's best guess of each
    candidate's draw is right about as often as two independent draws
    coincide; the control (the evaluating server's bits zero) lets it name
    every draw, and the same bound catches it."""
    from conftest import joint_guess_bound

    bound = joint_guess_bound(F, "nmax", "1/4")
    honest = await _tournament_guess_rate(pair, monkeypatch, garbler_only=False)
    assert honest < bound
    control = await _tournament_guess_rate(pair, monkeypatch, garbler_only=True)
    assert control == 1.0 and not control < bound


# ---------------------------------------------------------------- the local oracle
def test_the_local_oracle_runs_a_joint_tournament_as_the_servers() -> None:
    """One draw per candidate from the same law (the winners' frequencies match
    the exact law), the same δ charged, the same candidate limit."""
    o = LocalOracle(data(), 400, "1/1000", frac_bits=F, noise="joint", seed=4)
    noise = joint_stream_noise(StreamKind.NMAX, Fraction(1), F)
    wins = [o.noisy_max([Query(j) for j in range(4)], "1") for _ in range(400)]
    budget = o.budget()
    assert budget.epsilon_spent == 400 and budget.delta_spent == 400 * noise.delta_charge
    law = np.append(joint_output_law([s * UNIT for s in SUMS], noise), 0.0)
    assert fit_test("local", wins, law, np.random.default_rng(5)).p_value > 1e-3
    with pytest.raises(ValueError, match="1,048,576 candidates"):
        o.noisy_max([Query(0)] * (JOINT_MAX_TOURNAMENT + 1), "1")
    assert o.budget().epsilon_spent == 400
