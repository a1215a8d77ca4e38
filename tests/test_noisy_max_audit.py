"""The privacy of report-noisy-max (stream kind nmax), exactly and by audit.

Exact: the output law of one party's one-sided geometric noise of ratio q,
computed in rationals (`dp.noisy_max.exact_law`, no float, no truncation), is
a law, agrees with brute-force enumeration, and on every pair of neighbouring
score vectors in a box (each score moved by at most Δ, in either direction) its
loss is at most q^−2Δ = e^ε — attained, so the analysis is tight.  The same
computation catches noise at half the scale (the loss reaches e^2ε).  Two
parties: the joint law (the analyst alone) stays within e^ε; with the corrupt
party's draws fixed it is the one-party law on shifted scores.

By audit: the mechanism as the servers draw it (`dp.noise`'s exact sampler via
`LocalOracle.noisy_max`, one and two parties, and with a corrupt server's draws
fixed) on neighbouring datasets, each event's ratio tested against e^ε and
each dataset's outputs against the exact law; the broken controls
(`tests/broken_mechanisms.py`: half-scale noise, and one server adding none
while the other adds half) are caught."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from broken_mechanisms import HalfScaleNoisyMaxOracle, OneNoisyServerOracle

from svtagg.analyst.audit import AuditReport, Output, audit_outputs, collect, fit_test
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.dp.noise import RandomSource
from svtagg.dp.noisy_max import (
    exact_law,
    exact_loss,
    first_argmax,
    noise,
    noise_scale,
    noisy_argmax,
    output_law,
)
from svtagg.dp.queries import Query

# ---------------------------------------------------------------- exact
QS = [Fraction(1, 2), Fraction(3, 4)]


def enumerated_law(scores: list[int], q: float, top: int) -> np.ndarray:
    """P(output = i) by summing over every noise vector in [0, top]^k (floats)."""
    k = len(scores)
    p = (1 - q) * q ** np.arange(top + 1)
    out = np.zeros(k)
    for g in itertools.product(range(top + 1), repeat=k):
        out[first_argmax(np.add(scores, g))] += np.prod(p[list(g)])
    return out


@pytest.mark.parametrize("q", QS)
def test_the_exact_law_is_a_law_and_matches_enumeration(q: Fraction) -> None:
    top = 36 if q == Fraction(1, 2) else 130  # left-over mass < 3·q^(top+1) < 10^−10
    for scores in ([0], [3, 3], [0, 2, 1], [5, 0, 5], [-2, 4, 1]):
        law = exact_law(scores, q)
        assert sum(law) == 1 and all(p > 0 for p in law)
        if len(scores) <= 2 or q == Fraction(1, 2):
            got = enumerated_law(scores, float(q), top)
            assert np.allclose([float(p) for p in law], got, rtol=0, atol=1e-10)
        t = -1 / math.log(float(q))
        assert np.allclose([float(p) for p in law], output_law(scores, t), rtol=1e-9, atol=0)
    assert exact_law([4, 4, 4], q)[0] > exact_law([4, 4, 4], q)[1]  # ties to the first


@cache
def law_of(scores: tuple[int, ...], q: Fraction) -> tuple[Fraction, ...]:
    return tuple(exact_law(scores, q))


def worst_loss(q: Fraction, delta: int, k: int, box: int) -> Fraction:
    """max over score vectors in [0, box]^k and their neighbours (each score
    moved by −Δ..Δ) of the exact loss of the one-party law of ratio q."""
    worst = Fraction(1)
    moves = list(itertools.product(range(-delta, delta + 1), repeat=k))
    for s in itertools.product(range(box + 1), repeat=k):
        for m in moves:
            t = tuple(a + b for a, b in zip(s, m, strict=True))
            worst = max(worst, exact_loss(law_of(s, q), law_of(t, q)))
    return worst


@pytest.mark.parametrize("q", QS)
@pytest.mark.parametrize(("delta", "k"), [(1, 2), (1, 3), (2, 2), (2, 3)])
def test_the_loss_is_e_epsilon_on_every_neighbour_and_no_less(
    q: Fraction, delta: int, k: int
) -> None:
    """With t = 2Δ/ε, e^ε = q^−2Δ.  Every pair in the box stays within it,
    and the pair (0, 2Δ) → (Δ, Δ) attains it: the bound is exact, ties and
    all, on the integer grid."""
    assert worst_loss(q, delta, k, 2 * delta + 1) == q ** (-2 * delta)
    tight = exact_loss(law_of((0, 2 * delta), q), law_of((delta, delta), q))
    assert tight == q ** (-2 * delta)


@pytest.mark.parametrize("q", QS)
def test_half_scale_noise_is_caught_exactly(q: Fraction) -> None:
    """The control: noise Exp(Δ/ε) (ratio q² where the claim needs q) on the
    same box exceeds e^ε = q^−2Δ, reaching its square."""
    delta = 2
    broken = worst_loss(q * q, delta, 2, 2 * delta + 1)
    assert broken > q ** (-2 * delta)
    assert broken == q ** (-4 * delta)


def two_party_loss(scores: tuple[int, ...], other: tuple[int, ...], t: float) -> float:
    a, b = output_law(scores, t, 2), output_law(other, t, 2)
    return float(np.max(np.maximum(a / b, b / a)))


def test_two_parties_stay_within_e_epsilon() -> None:
    """The analyst alone sees the sum of both parties' draws: within e^ε on
    every neighbour in a box (floats, to 10^−9); the control with one party
    adding nothing and the other half the scale exceeds it."""
    delta, eps = 2, 1.0
    t = 2 * delta / eps
    worst, broken = 1.0, 1.0
    moves = list(itertools.product(range(-delta, delta + 1), repeat=2))
    for s in itertools.product(range(2 * delta + 2), repeat=2):
        for m in moves:
            o = (s[0] + m[0], s[1] + m[1])
            worst = max(worst, two_party_loss(s, o, t))
            a, b = output_law(s, t / 2, 1), output_law(o, t / 2, 1)
            broken = max(broken, float(np.max(np.maximum(a / b, b / a))))
    assert worst <= math.exp(eps) * (1 + 1e-9)
    assert broken > math.exp(eps) * 1.5


# ---------------------------------------------------------------- audit
F = 6
EPS = Fraction(1)
#: D has two users on candidate 1; D' moves one of them to candidate 0: the
#: scores go from (0, 2Δ) to (Δ, Δ), the pair where the loss is exactly e^ε.
DATA = np.array([[0.0, 1.0], [0.0, 1.0]])
NEIGHBOUR = np.array([[1.0, 0.0], [0.0, 1.0]])
CANDIDATES = (Query(0), Query(1))
TRIALS = 3000
EVENTS = [(f"={j}", lambda o, j=j: o == j) for j in range(2)]


def grid(data: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in data.sum(axis=0) * (1 << F))


def oracle_maker(cls: type[LocalOracle], parties: int, seed: int) -> Callable[..., LocalOracle]:
    counter = itertools.count()

    def make(data: np.ndarray) -> LocalOracle:
        return cls(data, 10**9, frac_bits=F, parties=parties, seed=seed * 1000 + next(counter))

    return make


def run_oracle(oracle: LocalOracle) -> Output:
    return oracle.noisy_max(CANDIDATES, EPS)


def report(
    name: str, out_d: list[Output], out_dp: list[Output], laws: tuple[np.ndarray, np.ndarray]
) -> AuditReport:
    """The ratio tests of both events in both directions, and each dataset's
    outputs against its exact law, one Bonferroni family at level 10^−3."""
    rep = audit_outputs(name, float(EPS), out_d, out_dp, EVENTS)
    rng = np.random.default_rng(0)
    for label, outs, law in (("D", out_d, laws[0]), ("D'", out_dp, laws[1])):
        rep.fits.append(fit_test(label, outs, np.append(law, 0.0), rng))
    return rep


def audit_oracle(cls: type[LocalOracle], parties: int, seed: int) -> AuditReport:
    """The analyst's view: outputs of fresh noisy-max runs on D and on D'."""
    out_d = collect(oracle_maker(cls, parties, seed), DATA, run_oracle, TRIALS)
    out_dp = collect(oracle_maker(cls, parties, seed + 1), NEIGHBOUR, run_oracle, TRIALS)
    t = noise_scale(EPS, F)
    laws = (output_law(grid(DATA), t, parties), output_law(grid(NEIGHBOUR), t, parties))
    return report(f"{cls.__name__}/{parties}", out_d, out_dp, laws)


@pytest.mark.parametrize("parties", [1, 2])
def test_the_mechanism_passes_the_audit(parties: int) -> None:
    rep = audit_oracle(LocalOracle, parties, seed=1)
    assert not rep.violated, rep.summary()


def test_half_scale_noise_is_caught() -> None:
    rep = audit_oracle(HalfScaleNoisyMaxOracle, 1, seed=3)
    assert rep.ratio_violated, rep.summary()


def test_one_server_without_noise_is_caught_by_the_analyst() -> None:
    """The analyst alone: the sum of the two draws is half-scale noise."""
    rep = audit_oracle(OneNoisyServerOracle, 2, seed=5)
    assert rep.ratio_violated, rep.summary()


def corrupt_view(
    honest: Callable[[int, RandomSource], np.ndarray], seed: int, y: np.ndarray
) -> AuditReport:
    """The view of an analyst colluding with one server: that server's draws y
    are known and fixed (the claim is for every value they take), and only the
    honest server's draws vary; the output is argmax(s + y + honest noise)."""
    outs = []
    for i, data in enumerate((DATA, NEIGHBOUR)):
        rng = RandomSource(f"honest {seed} {i}".encode())
        s = np.asarray(grid(data)) + y
        outs.append([first_argmax(s + honest(2, rng)) for _ in range(TRIALS)])
    t = noise_scale(EPS, F)
    laws = tuple(output_law(tuple(np.asarray(grid(d)) + y), t, 1) for d in (DATA, NEIGHBOUR))
    return report("corrupt view", outs[0], outs[1], (laws[0], laws[1]))


#: The corrupt server's draws: both 0 (the mode of its noise), and one draw of
#: the real sampler.
CORRUPT_DRAWS = [np.zeros(2, dtype=np.int64), noise(EPS, F, 2, RandomSource(b"corrupt draws"))]


@pytest.mark.parametrize("y", CORRUPT_DRAWS, ids=["zero", "drawn"])
def test_the_honest_server_alone_makes_it_private(y: np.ndarray) -> None:
    rep = corrupt_view(lambda k, rng: noise(EPS, F, k, rng), 7, y)
    assert not rep.violated, rep.summary()


def test_one_server_without_noise_is_caught_by_the_other() -> None:
    """The control seen by the noisy server: the honest one adds nothing, so
    given its own draws (here both 0) the answer is a function of the data."""
    rep = corrupt_view(lambda k, rng: np.zeros(k, dtype=np.int64), 9, CORRUPT_DRAWS[0])
    assert rep.ratio_violated, rep.summary()


def test_the_local_oracle_is_the_reference_mechanism() -> None:
    """`LocalOracle.noisy_max` and `noisy_argmax` draw the same noise from the
    same seed, and the oracle charges ε to its ledger."""
    oracle = LocalOracle(DATA, 100, frac_bits=F, parties=2, seed=11)
    again = RandomSource((11).to_bytes(16, "little", signed=True))
    for _ in range(50):
        got = oracle.noisy_max(CANDIDATES, EPS)
        assert got == noisy_argmax(grid(DATA), EPS, F, again, parties=2)
    assert oracle.budget().epsilon_spent == 50
    with pytest.raises(ValueError, match="noisy_max"):
        oracle.open_stream(1, "nmax")


def test_the_baseline_on_the_local_oracle() -> None:
    """`noisy_max_selection` over every coordinate finds a clear maximum, its α
    is the nmax accuracy, a plan's group pays for it, more candidates than one
    chunk run as one tournament in chunks, and more candidates than one
    tournament holds are refused before anything is charged."""
    from svtagg.analyst.oracle import planned
    from svtagg.analyst.selection import noisy_max_selection
    from svtagg.analyst.selection.noisy_max import check_candidates
    from svtagg.dp.accuracy import alpha
    from svtagg.dp.queries import MAX_CHUNK, MAX_TOURNAMENT

    sums = np.arange(50, dtype=np.int64) * (1 << F)
    sums[17] = 200 << F  # 151 units above the next
    oracle = LocalOracle.from_sums(sums, 200, 10, frac_bits=F, parties=2, seed=3)
    res = noisy_max_selection(oracle, 1, beta=0.1)
    assert res.index == 17 and res.query == Query(17)
    assert res.alpha == alpha("nmax", 1, 50, 0.1, parties=2, frac_bits=F)
    with planned(oracle, [(2, 0)]) as plan:
        assert noisy_max_selection(plan, 1).index == 17
        assert noisy_max_selection(plan, 1, candidates=[Query(3), Query(17)]).index == 1
    assert oracle.budget().epsilon_spent == 3  # the plan used all of its group
    # More candidates than one chunk: one tournament in two chunks, one ε.
    big_sums = np.zeros(MAX_CHUNK + 1, dtype=np.int64)
    big_sums[MAX_CHUNK] = 500 << F  # in the second chunk, far above the rest
    big = LocalOracle.from_sums(big_sums, 500, 10, frac_bits=F, parties=2, seed=4)
    sent: list[tuple[int, int]] = []
    res = noisy_max_selection(big, 1, progress=lambda done, k: sent.append((done, k)))
    assert res.index == MAX_CHUNK and sent == [(MAX_CHUNK, MAX_CHUNK + 1), (MAX_CHUNK + 1,) * 2]
    assert big.budget().epsilon_spent == 1 and big.stats().chunks == 2
    # A bad chunk size or more candidates than a tournament holds: refused
    # before anything is charged.
    for size in (0, MAX_CHUNK + 1):
        with pytest.raises(ValueError, match="chunk_size"):
            noisy_max_selection(big, 1, chunk_size=size)
    with pytest.raises(ValueError, match="one tournament"):
        check_candidates(MAX_TOURNAMENT + 1)
    assert big.budget().epsilon_spent == 1
