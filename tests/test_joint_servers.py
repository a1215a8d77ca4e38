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
from svtagg.dp.jointsvt import JOINT_DELTA_CAP, _within, joint_stream_noise
from svtagg.dp.kinds import StreamKind, noise_model
from svtagg.dp.noise import RandomSource
from svtagg.dp.task import TaskSpec, parse_task_params
from svtagg.servers.exchange.joint import JointDraw
from svtagg.servers.exchange.values import Ask, OpenStream, Queries
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


async def test_joint_task_refuses_other_kinds(pair: ReferencePair) -> None:
    for kind, eps in ((StreamKind.CTT, "1/2"),):
        with pytest.raises(InvalidArgument, match="lap24, lap3, exp3 and nmax streams only"):
            await pair.leader.open_stream(OpenStream("t", kind, eps, "1/100" if eps != "1" else ""))
    # Nothing was charged by the refusals.
    assert pair.leader.core.task("t").budget.epsilon_spent == 0


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


async def _many_nu(pair: ReferencePair, chunks: int, size: int) -> str:
    """Chunks of `size` queries at a τ no score reaches (every answer NO)."""
    sid = (await pair.leader.open_stream(OpenStream("t", StreamKind.LAP24, "1"))).stream_id
    index = tuple(i % 4 for i in range(size))
    for _ in range(chunks):
        answer = await pair.leader.ask(Ask(sid, Queries(index), (4 * N * UNIT,) * size))
        assert not answer.yes
    return sid


async def test_the_noise_follows_the_exact_law(pair: ReferencePair) -> None:
    """20,000 ν from the pair (both servers' shares added) fit the exact pmf of
    the stream's query sampler; the same test rejects the sum of two independent
    draws at the central scale (what the comparison would see if each server
    drew its own at that scale) — 20,000 such sums from the exact sampler."""
    await _many_nu(pair, 4, 5000)
    samples = _nu(pair)
    assert samples.size == 20_000
    noise = joint_stream_noise(StreamKind.LAP24, Fraction(1), F)
    lo, grid = noise.grid_pmf("query")
    assert lo <= samples.min() and samples.max() < lo + grid.size
    law = binned_law(lo, grid, F)
    assert _chi_square_pvalue(samples >> F, law) > 1e-3

    rng = RandomSource(b"two independent draws")
    twice = noise.sample("query", samples.size, rng) + noise.sample("query", samples.size, rng)
    assert _chi_square_pvalue(twice >> F, law) < 1e-6


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
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch, evaluator_bits: str
) -> float:
    """How often the garbling server (the helper), from its own random words
    alone, names the ν the pair used.  evaluator_bits "random" (the servers'
    code) or "zero" (the control: only the garbler's bits enter the circuit)."""
    guesses = spy_joint_sampler(monkeypatch, garbler_only=evaluator_bits == "zero")
    for core in (pair.leader.core, pair.helper.core):
        core.joint_noise_log = []
    await _many_nu(pair, 1, 2000)
    guess = np.concatenate(guesses[1:])  # [0] is γ's draw
    return float(np.mean(joint_z(_nu(pair), F) == guess))


async def test_one_server_cannot_predict_the_noise(
    pair: ReferencePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With both servers' bits the garbling server's best guess from its own bits
    is right about as often as two independent draws coincide; the control (the
    evaluating server's bits zero) lets it predict every ν, and the same check
    catches it."""
    bound = joint_guess_bound(F)
    honest = await _predicted_by_garbler(pair, monkeypatch, "random")
    assert honest < bound
    control = await _predicted_by_garbler(pair, monkeypatch, "zero")
    assert control == 1.0
    assert not control < bound


# ---------------------------------------------------------------- the deployment
def test_create_task_noise_joint_through_the_servers(tmp_path: Path) -> None:
    """`svtagg analyst create-task --noise joint` on real servers (gRPC, TLS):
    the task says so, a lap24 stream answers, both ledgers hold (ε, δ_charge)
    and the analyst's stats count the same δ; a ctt stream is refused; `analyst
    run` runs a scan and a report-noisy-max on it."""
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
            stream = oracle.open_stream("4")
            assert stream.ask([(Query(j), N / 2) for j in range(3)]) == 1
            charge = joint_stream_noise(StreamKind.LAP24, Fraction(4), F).delta_charge
            assert oracle.stats().delta_spent == charge
            state = task.state()
            for ledger in (state.budget, state.helper_budget):
                assert ledger is not None
                assert (ledger.exact["epsilon_spent"], ledger.exact["delta_spent"]) == (4, charge)
            with pytest.raises(Refusal, match="lap24, lap3, exp3 and nmax streams only"):
                oracle.open_stream("1/2", StreamKind.CTT, "1/100")
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
        r = run_cli("analyst", "run", *common, "--algorithm", "noisy-max", "--epsilon", "4")
        assert r.returncode == 0, r.stderr
        nmax = json.loads(r.stdout)
        assert nmax["selected"] == 1
        nmax_charge = joint_stream_noise(StreamKind.NMAX, Fraction(4), F).delta_charge
        assert Fraction(nmax["exact"]["delta_spent"]) == nmax_charge
        r = run_cli("analyst", "describe", *common, "--json")
        budget = json.loads(r.stdout)["budget"]["exact"]
        assert (Fraction(budget["epsilon_spent"]), Fraction(budget["delta_spent"])) == (
            10,
            charge + spent + nmax_charge,
        )
