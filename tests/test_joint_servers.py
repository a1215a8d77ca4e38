"""Joint noise through the servers (task option noise = joint), on the
one-process reference pair: the task and its refusals, a joint-noise stream
answering AboveThreshold correctly on clearly separated data, the ledger charge
(ε unchanged, the sampler's δ), γ drawn once in the first chunk and kept, and
the noise the pair produces (both servers' shares added, through the test-only
hook `ServerCore.joint_noise_log`) against the exact pmf — with two broken
controls the tests catch: one server's random bits only (that server then
predicts every ν) and two independent draws at the central scale (the sum's law
is not the single draw's).

The tests on the `pair` fixture run the in-chunk draw (the leader fills no
pool: `noise_pool = None`), which is also what a chunk falls back to when its
stream's pool lacks samples; the first-YES law and the gRPC test run the
servers' default (noise generated ahead of time, tests/test_joint_pool.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import joint_guess_bound, joint_sum, joint_z, spy_joint_sampler

from svtagg.dp.errors import InvalidArgument
from svtagg.dp.joint import one_sided_ratio, sampler_constants, shift_ratio
from svtagg.dp.jointsvt import (
    JOINT_DELTA_CAP,
    JointStreamNoise,
    _within,
    joint_ctt_gap,
    joint_stream_noise,
)
from svtagg.dp.kinds import StreamKind, ctt_gap, noise_model
from svtagg.dp.noise import RandomSource
from svtagg.dp.queries import Outcome
from svtagg.dp.task import TaskSpec, parse_task_params
from svtagg.servers.exchange.joint import JointDraw
from svtagg.servers.exchange.values import Ask, Compare, OpenStream, Queries
from svtagg.servers.reference import ReferencePair, reference_pair

F = 6
N = 40
UNIT = 1 << F


def spec(task_id: str, noise: str = "joint", delta: str = "1/1000000") -> TaskSpec:
    return TaskSpec(
        task_id=task_id,
        d=4,
        frac_bits=F,
        n_max=10 * N,
        min_batch=1,
        epsilon_total="40",
        delta_total=delta,
        epsilon_min="1/4",
        noise=noise,
    )


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[ReferencePair]:
    """A closed joint-noise task: coordinates 0, 1, 3 are 0 for every user,
    coordinate 2 is 1 (its sum is N score units)."""
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("t")
        p.leader.noise_pool = None  # every draw in the chunk
        for core in (p.leader.core, p.helper.core):
            core.joint_noise_log = []
        yield p


def _reconstruct(p: ReferencePair) -> list[tuple[JointDraw, JointDraw]]:
    logs = p.leader.core.joint_noise_log, p.helper.core.joint_noise_log
    assert logs[0] is not None and logs[1] is not None and len(logs[0]) == len(logs[1])
    return list(zip(logs[0], logs[1], strict=True))


def _nu(p: ReferencePair) -> np.ndarray:
    """Every ν the pair used, r + (ν − r) mod 2^64, as signed integers."""
    return np.concatenate([joint_sum(p, a.stream_id, a.nu, b.nu) for a, b in _reconstruct(p)])


# ---------------------------------------------------------------- the option
def test_the_option_is_validated() -> None:
    assert parse_task_params(spec("a", noise="")).noise == "independent"
    assert parse_task_params(spec("a")).noise == "joint"
    with pytest.raises(InvalidArgument, match="independent or joint"):
        parse_task_params(spec("a", noise="shared"))
    with pytest.raises(InvalidArgument, match="delta_total > 0"):
        parse_task_params(spec("a", delta="0"))


# ---------------------------------------------------------------- CompareToThresholds
CTT_EPS, CTT_DELTA = Fraction(1, 2), Fraction(1, 10**7)


def _ctt_chunk(pair: ReferencePair, sid: str, rows: list[tuple[int, int, int]]) -> Compare:
    """A Compare chunk of (coordinate, τL, τH) rows in score units."""
    del pair
    return Compare(
        sid,
        Queries(tuple(q for q, _, _ in rows)),
        tuple(lo * UNIT for _, lo, _ in rows),
        tuple(hi * UNIT for _, _, hi in rows),
    )


async def test_joint_ctt_stream_answers(pair: ReferencePair) -> None:
    """A ctt stream on a joint-noise task (docs/privacy.md, "CompareToThresholds
    with joint noise"): thresholds closer than `joint_ctt_gap` are refused
    before anything runs; far from a score the answers are LOW and HIGH (the
    stream stays open), between thresholds around the score CLOSE (it closes);
    γ is drawn once, in the first chunk, and kept; both ledgers hold (ε, the
    stream's δ + the sampler's).  ε = 1/2: ν's scale is 12 score units, γ's 4,
    the gap about 200; each expected answer fails with probability < 10^-4."""
    gap = joint_ctt_gap(CTT_EPS, CTT_DELTA, F)
    assert gap < ctt_gap(CTT_EPS, CTT_DELTA, 2)  # no corrupt server knows γ: no widening
    info = await pair.leader.open_stream(OpenStream("t", StreamKind.CTT, "1/2", "1/10000000"))
    sid = info.stream_id
    with pytest.raises(InvalidArgument, match="CompareToThresholds requires"):
        await pair.leader.compare(_ctt_chunk(pair, sid, [(0, 150, 150 + gap - 1)]))
    low, high = (0, 150, 150 + gap), (2, -110 - gap, -110)
    first = await pair.leader.compare(_ctt_chunk(pair, sid, [low, high]))
    assert first.outcomes == (Outcome.LOW, Outcome.HIGH) and not first.closed
    close = (2, N - gap // 2, N + gap - gap // 2)
    second = await pair.leader.compare(_ctt_chunk(pair, sid, [low, close, high]))
    assert second.outcomes == (Outcome.LOW, Outcome.CLOSE) and second.closed

    draws = _reconstruct(pair)
    assert [d.chunk for d, _ in draws] == [0, 1]
    (l0, h0), (l1, h1) = draws
    assert (l0.gamma, h0.gamma) == (l1.gamma, h1.gamma)  # γ drawn once, kept
    assert [len(d.nu) for d, _ in draws] == [2, 3]
    noise = joint_stream_noise(StreamKind.CTT, CTT_EPS, F)
    for core in (pair.leader.core, pair.helper.core):
        budget = core.task("t").budget
        assert (budget.epsilon_spent, budget.delta_spent) == (
            CTT_EPS,
            CTT_DELTA + noise.delta_charge,
        )


async def test_joint_ctt_noise_follows_the_exact_law(pair: ReferencePair) -> None:
    """20,000 ν of a ctt stream (chunks whose every answer is LOW), both
    servers' shares added, fit the exact pmf of the stream's query sampler
    (scale 6/ε); the sum of two independent draws is rejected by the same test."""
    sid = (
        await pair.leader.open_stream(OpenStream("t", StreamKind.CTT, "1/2", "1/10000000"))
    ).stream_id
    gap = joint_ctt_gap(CTT_EPS, CTT_DELTA, F)
    rows = [(i % 4, 2 * N + 400, 2 * N + 400 + gap) for i in range(5000)]
    for _ in range(4):
        answer = await pair.leader.compare(_ctt_chunk(pair, sid, rows))
        assert set(answer.outcomes) == {Outcome.LOW} and not answer.closed
    _check_noise_law(_nu(pair), joint_stream_noise(StreamKind.CTT, CTT_EPS, F))


async def test_joint_ctt_answers_follow_the_exact_law(tmp_path: Path) -> None:
    """300 fresh ctt streams (ε = 9/10) of one chunk — coordinate 0 (score 0)
    between thresholds where LOW and CLOSE are both likely, coordinate 2 (score
    N) where HIGH and CLOSE are, coordinate 0 again — fit the exact law of their
    answers with ONE joint draw per term (`audit.joint_ctt_pmf`; Monte Carlo
    G-test, p > 10^-3).  The law of two independent draws per term differs from
    it by KL ≈ 0.03 per stream here, too little for 300 streams to reject
    reliably: that control is the ν test above."""
    from dataclasses import replace

    from svtagg.analyst.audit import fit_test, joint_ctt_pmf

    streams, eps, delta = 300, Fraction(9, 10), Fraction(1, 10**9)
    gap = joint_ctt_gap(eps, delta, F)
    rows = [(0, -10, gap - 10), (2, N + 13 - gap, N + 13), (0, -10, gap - 10)]
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(replace(spec("c"), epsilon_total=str(streams)))
        p.upload("c", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("c")
        outputs = []
        for _ in range(streams):
            opened = await p.leader.open_stream(
                OpenStream("c", StreamKind.CTT, "9/10", "1/1000000000")
            )
            answer = await p.leader.compare(_ctt_chunk(p, opened.stream_id, rows))
            outputs.append(answer.outcomes)
    law = joint_ctt_pmf(
        (0, N * UNIT, 0), [lo * UNIT for _, lo, _ in rows], [hi * UNIT for _, _, hi in rows], eps, F
    )
    names = sorted(law, key=lambda o: [x.value for x in o])
    pmf = np.array([law[o] for o in names])
    seen = Counter(outputs)
    assert min(pmf[names.index(o)] for o in seen) > 0  # nothing the law rules out
    assert {(Outcome.CLOSE,), (Outcome.LOW, Outcome.CLOSE)} <= set(seen)
    fit = fit_test("joint ctt", [names.index(o) for o in outputs], pmf, np.random.default_rng(5))
    assert fit.p_value > 1e-3, f"{fit} (false failure 10^-3)"


# ---------------------------------------------------------------- the mechanism
@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3])
async def test_joint_stream_answers_svt(pair: ReferencePair, kind: StreamKind) -> None:
    """ε = 4: the noise scales are 1–3 score units, the gap 20: a chunk far below
    τ answers NO (γ drawn, stored, kept), then the chunk with the ones answers
    YES at the ones' coordinate, and the ledgers show (ε, δ_charge)."""
    info = await pair.leader.open_stream(OpenStream("t", kind, "4"))
    sid = info.stream_id
    tau = (N // 2) * UNIT
    no = await pair.leader.ask(Ask(sid, Queries((0, 1, 3)), (tau,) * 3))
    assert not no.yes and not no.closed
    await pair.helper.settled()  # the helper records the result it was sent one way
    stored = [core.store.stream(sid).gamma for core in (pair.leader.core, pair.helper.core)]
    yes = await pair.leader.ask(Ask(sid, Queries((0, 1, 2, 3)), (tau,) * 4))
    assert yes.index == 2 and yes.closed

    draws = _reconstruct(pair)
    assert [d.chunk for d, _ in draws] == [0, 1]
    (l0, h0), (l1, h1) = draws
    assert (l0.gamma, h0.gamma) == (l1.gamma, h1.gamma) == tuple(stored)  # γ kept
    gamma = int(joint_sum(pair, sid, l0.gamma, h0.gamma)[0])
    noise = joint_stream_noise(kind, Fraction(4), F)
    k = len(noise.threshold_constants)  # 2^F·Z + dither, Z in [−2^K, 2^K)
    assert -((1 << k) + 1 << F) <= gamma < (1 << k) + 2 << F
    if kind == StreamKind.EXP3:  # one-sided: Z ≥ 0 and a dither ≥ 0
        assert gamma >= 0 and _nu(pair).min() >= 0
    assert [len(d.nu) for d, _ in draws] == [3, 4]

    for core in (pair.leader.core, pair.helper.core):
        budget = core.task("t").budget
        assert (budget.epsilon_spent, budget.delta_spent) == (4, noise.delta_charge)
    assert 0 < noise.delta <= noise.delta_charge < Fraction(1, 1 << 60)


def test_the_charge_bounds_the_exact_loss() -> None:
    """The exact SVT loss of the samplers (R_ρ at shift Δ, R_ν at 2Δ) is within
    e^ε, and the control — each server drawing at half the central scale, so a
    server colluding with the analyst subtracts its own draw and leaves a
    half-scale one — is caught: its loss exceeds the charge."""
    for kind in (StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3):
        # one-sided noise is only ever shifted upwards (docs/privacy.md)
        ratio = shift_ratio if kind != StreamKind.EXP3 else one_sided_ratio
        for eps in (Fraction(1, 4), Fraction(1), Fraction(4)):
            noise = joint_stream_noise(kind, eps, F)
            assert noise.signed == (kind != StreamKind.EXP3)
            rho = noise.threshold_constants, noise.threshold_widths
            nu = noise.query_constants, noise.query_widths
            exact = ratio(*rho, 1) * ratio(*nu, 2)  # in sensitivities
            assert exact == noise.ratio and _within(exact, eps)

            model = noise_model(kind)
            half_rho = sampler_constants(Fraction(model.threshold_coef) / eps / 2, 64)
            half_nu = sampler_constants(Fraction(model.query_coef) / eps / 2, 64)
            residual = ratio(half_rho, 64, 1) * ratio(half_nu, 64, 2)
            assert not _within(residual, eps)


# ---------------------------------------------------------------- the law
def binned_law(lo: int, grid: np.ndarray, f: int) -> dict[int, Fraction]:
    """The law of ⌊draw / 2^F⌋ from a draw's grid pmf (lowest value `lo`): the
    sensitivity-sized bins a chi-square test can fill."""
    out: dict[int, float] = {}
    for x, p in zip(range(lo, lo + grid.size), grid.tolist(), strict=True):
        out[x >> f] = out.get(x >> f, 0.0) + p
    return {k: Fraction(v) for k, v in out.items() if v > 0}


def _chi_square_pvalue(samples: np.ndarray, law: dict[int, Fraction]) -> float:
    """Pearson's test against `law`, cells expecting fewer than 5 pooled."""
    from scipy.stats import chisquare

    n = samples.size
    counts = Counter(samples.tolist())
    big = sorted(x for x, p in law.items() if p * n >= 5)
    obs = [counts.get(x, 0) for x in big]
    exp = [float(law[x]) * n for x in big]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    return float(chisquare(obs, exp).pvalue)


def _check_noise_law(samples: np.ndarray, noise: JointStreamNoise) -> None:
    """20,000 ν of a stream fit the exact pmf of its query sampler (binned by
    sensitivity, chi-square p > 10^-3), within its support; the sum of two
    independent draws of that sampler (each server its own at the central
    scale) is rejected by the same test (p < 10^-6)."""
    assert samples.size == 20_000
    lo, grid = noise.grid_pmf("query")
    assert lo <= samples.min() and samples.max() < lo + grid.size
    law = binned_law(lo, grid, F)
    assert _chi_square_pvalue(samples >> F, law) > 1e-3
    rng = RandomSource(b"two independent draws")
    twice = noise.sample("query", samples.size, rng) + noise.sample("query", samples.size, rng)
    assert _chi_square_pvalue(twice >> F, law) < 1e-6


async def _many_nu(
    pair: ReferencePair, chunks: int, size: int, kind: StreamKind = StreamKind.LAP24
) -> str:
    """Chunks of `size` queries of a `kind` stream at ε = 1 and a τ no score
    reaches (every answer NO)."""
    sid = (await pair.leader.open_stream(OpenStream("t", kind, "1"))).stream_id
    index = tuple(i % 4 for i in range(size))
    for _ in range(chunks):
        answer = await pair.leader.ask(Ask(sid, Queries(index), (4 * N * UNIT,) * size))
        assert not answer.yes
    return sid


@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3])
async def test_the_noise_follows_the_exact_law(pair: ReferencePair, kind: StreamKind) -> None:
    """20,000 ν from the pair (both servers' shares added) fit the exact pmf of
    the stream's query sampler; the same test rejects the sum of two independent
    draws at the central scale (what the comparison would see if each server
    drew its own at that scale) — 20,000 such sums from the exact sampler.
    (ctt: `test_joint_ctt_noise_follows_the_exact_law`; nmax:
    tests/test_joint_noisy_max.py.)"""
    await _many_nu(pair, 4, 5000, kind)
    _check_noise_law(_nu(pair), joint_stream_noise(kind, Fraction(1), F))


@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.EXP3])
async def test_first_yes_answers_follow_the_exact_joint_law(
    tmp_path: Path, kind: StreamKind
) -> None:
    """800 fresh lap24 (exp3) streams on one chunk (coordinates 0, 1, 2 at
    thresholds 8, 8 and N + 6 score units, ε = 1): the analyst's first-YES
    answers fit the exact law of ONE joint draw per term
    (`audit.joint_first_yes_pmf`: the sampler's exact pmf on the sensitivity
    lattice with the servers' dither), and the same G-test rejects the law of
    two servers' independent draws at the central scale — so the answers come
    from the joint noise.  The two laws differ by KL ≈ 0.058 (0.049) per
    stream: at 800 streams the G statistic against the wrong law has
    non-centrality ≈ 92 (78), and falls below the 10^-3 critical value with
    probability below 10^-7."""
    from dataclasses import replace

    from svtagg.analyst.audit import first_yes_pmf, fit_test, joint_first_yes_pmf

    streams, eps = 800, Fraction(1)
    taus = (8 * UNIT, 8 * UNIT, (N + 6) * UNIT)
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(replace(spec("a"), epsilon_total=str(streams)))
        p.upload("a", np.tile([0.0, 0.0, 1.0, 0.0], (N, 1)))
        await p.leader.close_collection("a")
        outputs = []
        for _ in range(streams):
            sid = (await p.leader.open_stream(OpenStream("a", kind, "1"))).stream_id
            answer = await p.leader.ask(Ask(sid, Queries((0, 1, 2)), taus))
            outputs.append(answer.index if answer.yes else None)
    scores = (0, 0, N * UNIT)
    rng = np.random.default_rng(11)
    joint = joint_first_yes_pmf(scores, taus, kind, eps, F)
    fit = fit_test("joint", outputs, joint, rng)
    assert fit.p_value > 1e-3, f"{fit} (false failure 10^-3)"
    independent = first_yes_pmf(scores, taus, kind, eps, F, parties=2)
    wrong = fit_test("two draws", outputs, independent, rng)
    assert wrong.p_value < 1e-3, f"{wrong} (false failure ≈ 10^-9)"


async def _predicted_by_garbler(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch, evaluator_bits: str, kind: StreamKind
) -> float:
    """How often the garbling server (the helper), from its own random words
    alone, names the ν the pair used in 2,000 queries of a `kind` stream (ctt:
    one Compare chunk whose every answer is LOW).  evaluator_bits "random" (the
    servers' code) or "zero" (the control: only the garbler's bits enter the
    circuit)."""
    guesses = spy_joint_sampler(monkeypatch, garbler_only=evaluator_bits == "zero")
    for core in (pair.leader.core, pair.helper.core):
        core.joint_noise_log = []
    if kind == StreamKind.CTT:
        opened = await pair.leader.open_stream(OpenStream("t", kind, "1/2", "1/10000000"))
        gap = joint_ctt_gap(CTT_EPS, CTT_DELTA, F)
        rows = [(i % 4, 2 * N + 400, 2 * N + 400 + gap) for i in range(2000)]
        answer = await pair.leader.compare(_ctt_chunk(pair, opened.stream_id, rows))
        assert set(answer.outcomes) == {Outcome.LOW}
    else:
        await _many_nu(pair, 1, 2000, kind)
    guess = np.concatenate(guesses[1:])  # [0] is γ's draw
    return float(np.mean(joint_z(_nu(pair), F) == guess))


@pytest.mark.parametrize(
    "kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3, StreamKind.CTT]
)
async def test_one_server_cannot_predict_the_noise(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch, kind: StreamKind
) -> None:
    """With both servers' bits the garbling server's best guess from its own bits
    is right about as often as two independent draws coincide; the control (the
    evaluating server's bits zero) lets it predict every ν, and the same check
    catches it."""
    bound = joint_guess_bound(F, kind.value, "1/2" if kind == StreamKind.CTT else "1")
    honest = await _predicted_by_garbler(pair, monkeypatch, "random", kind)
    assert honest < bound
    control = await _predicted_by_garbler(pair, monkeypatch, "zero", kind)
    assert control == 1.0
    assert not control < bound


# ---------------------------------------------------------------- the deployment
def test_create_task_noise_joint_through_the_servers(tmp_path: Path) -> None:
    """`svtagg analyst create-task --noise joint` on real servers (gRPC, TLS):
    the task says so, a lap24 stream answers, both ledgers hold (ε, δ_charge)
    and the analyst's stats count the same δ; a ctt stream answers CLOSE and
    charges its δ with the sampler's; `analyst run` runs a scan and a
    report-noisy-max on it."""
    import json

    from test_cli_errors import svtagg as run_cli

    import svtagg
    from svtagg.deploy.launch import LocalDeployment
    from svtagg.dp.errors import Refusal
    from svtagg.dp.queries import Query

    with LocalDeployment(tmp_path / "dep") as dep:
        common = ["--leader", dep.address("leader"), "--certs", str(dep.certs), "--task", "j"]
        r = run_cli("analyst", "create-task", *common, "--d", "3", "--min-batch", "1",
                    "--frac-bits", str(F), "--noise", "joint", "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["noise"] == "joint"
        values = np.zeros((N, 3))
        values[:, 1] = 1.0
        with svtagg.connect(
            dep.address("leader"), certs=dep.certs, helper=dep.address("helper")
        ) as conn:
            conn.upload("j", values)
            task = conn.task("j")
            task.close_collection()
            oracle = task.oracle()
            stream = oracle.open_stream("3")
            assert stream.ask([(Query(j), N / 2) for j in range(3)]) == 1
            charge = joint_stream_noise(StreamKind.LAP24, Fraction(3), F).delta_charge
            assert oracle.stats().delta_spent == charge
            state = task.state()
            for ledger in (state.budget, state.helper_budget):
                assert ledger is not None
                assert (ledger.exact["epsilon_spent"], ledger.exact["delta_spent"]) == (3, charge)
            # CompareToThresholds on the joint task: the joint gap, both ledgers
            # charged the stream's δ and the sampler's; a gap too narrow refused.
            gap = joint_ctt_gap(CTT_EPS, CTT_DELTA, F)
            ctt = oracle.open_stream(CTT_EPS, StreamKind.CTT, CTT_DELTA)
            with pytest.raises(Refusal, match="CompareToThresholds requires"):
                ctt.compare([(Query(1), 0, gap - 1)])
            assert ctt.compare([(Query(1), N - gap / 2, N + gap / 2)]) == [Outcome.CLOSE]
            ctt_charge = CTT_DELTA + joint_stream_noise(StreamKind.CTT, CTT_EPS, F).delta_charge
            state = task.state()
            for ledger in (state.budget, state.helper_budget):
                assert ledger is not None
                assert ledger.exact["delta_spent"] == charge + ctt_charge
            charge += ctt_charge
        # `svtagg analyst run` on the joint task: the run's plan holds a δ
        # allowance, the streams charge their sampler δ within it and the rest
        # comes back; noisy-max draws one joint value per candidate.
        r = run_cli("analyst", "run", *common, "--algorithm", "scan", "--epsilon", "2",
                    "--kind", "lap24", "--seed", "1")  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["selected"] == 1
        # how much of the run's noise was ready ahead, as the summary reports it
        assert 0 <= out["noise_drawn_in_chunks"] <= out["noise_queries"]
        assert out["noise_queries"] >= out["queries"]
        spent = Fraction(out["exact"]["delta_spent"])  # this run's: its streams' exact δ
        assert 0 < spent <= out["streams"] * JOINT_DELTA_CAP
        assert Fraction(out["exact"]["task_delta_spent"]) == charge + spent
        # The summary's noise shapes, prepared again on request (`prepare-noise
        # --like`); a request missing its shape is refused, naming what it needs.
        assert sum(out["noise_shapes"].values()) == out["noise_queries"]
        (tmp_path / "run.json").write_text(r.stdout)
        r = run_cli("analyst", "prepare-noise", *common, "--like", str(tmp_path / "run.json"),
                    "--wait", "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        prepared = json.loads(r.stdout)["shapes"]
        assert prepared.keys() == out["noise_shapes"].keys()
        for name, status in prepared.items():
            assert status["asked"] == -(-out["noise_shapes"][name] * 5 // 4)
            assert status["held"] >= status["asked"] and status["pending"] == 0
        r = run_cli("analyst", "prepare-noise", *common, "--kind", "lap24")
        assert r.returncode != 0 and "--epsilon and --count" in r.stderr
        with svtagg.connect(dep.address("leader"), certs=dep.certs) as conn:
            with pytest.raises(Refusal, match="not ctt"):
                conn.task("j").prepare_noise("ctt", "1/2", 10)
            status = conn.task("j").prepare_noise("lap3", "1", 50, wait=True, timeout=60)
            assert (status.held, status.pending) == (50, 0)
        r = run_cli("analyst", "run", *common, "--algorithm", "noisy-max", "--epsilon", "4")
        assert r.returncode == 0, r.stderr
        nmax = json.loads(r.stdout)
        assert nmax["selected"] == 1
        nmax_charge = joint_stream_noise(StreamKind.NMAX, Fraction(4), F).delta_charge
        assert Fraction(nmax["exact"]["delta_spent"]) == nmax_charge
        r = run_cli("analyst", "describe", *common, "--json")
        budget = json.loads(r.stdout)["budget"]["exact"]
        assert (Fraction(budget["epsilon_spent"]), Fraction(budget["delta_spent"])) == (
            3 + CTT_EPS + 2 + 4,
            charge + spent + nmax_charge,
        )


async def test_a_joint_stream_is_sent_at_most_its_queries(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AboveThreshold or ctt stream of a joint task is sent at most
    JOINT_MAX_QUERIES queries (its δ pays ν's tail per query): with the bound
    at 6, a chunk past it is refused by the leader before it runs (the stream
    stays open), and the helper's own check refuses it too; the local oracle
    refuses alike."""
    from svtagg.analyst.local_oracle import LocalOracle
    from svtagg.dp import jointsvt
    from svtagg.dp.queries import Query
    from svtagg.servers.core import parse_chunk

    monkeypatch.setattr(jointsvt, "JOINT_MAX_QUERIES", 6)
    sid = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "1"))).stream_id
    no = (4 * N * UNIT,) * 4
    assert not (await pair.leader.ask(Ask(sid, Queries((0, 1, 3, 0)), no))).yes
    with pytest.raises(InvalidArgument, match="at most 6 queries"):
        await pair.leader.ask(Ask(sid, Queries((0, 1, 3)), no[:3]))
    await pair.helper.settled()  # the helper records the chunk's result it was sent
    stream = pair.helper.core.stream(sid)
    task = pair.helper.core.task("t")
    with pytest.raises(InvalidArgument, match="at most 6 queries"):
        pair.helper.core.check_queries(stream, parse_chunk(task, (0, 1, 3), ()))
    assert not (await pair.leader.ask(Ask(sid, Queries((0, 1)), no[:2]))).yes  # exactly 6
    local = LocalOracle(np.zeros((10, 2)), 4, "1/1000", frac_bits=F, noise="joint")
    ls = local.open_stream("4")
    assert ls.ask([(Query(0), 30.0)] * 6) is None
    with pytest.raises(ValueError, match="at most 6 queries"):
        ls.ask([(Query(0), 30.0)])
