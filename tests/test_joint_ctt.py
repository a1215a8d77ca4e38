"""CompareToThresholds with joint noise: the accounting (`dp.jointsvt`, the
`ctt` branch; docs/privacy.md, "CompareToThresholds with joint noise") checked
exactly, and the mechanism's exact output law checked against (ε, δ) on
neighbouring chunks — with the broken controls the check must catch: the two
thresholds at no distance (the answers never stop), and no threshold noise.

The proof's pieces are checked one by one on supports small enough to
enumerate: the tail-decay bound (`dp.joint.digit_growth`, `tail_decay`)
against every step of the sampler's exact tail, the Close answer's interval
bound against every interval at least `close_span` long (and shown to fail on
short ones), and the charge (R_ρ·R₂/(1 − R₂·η) ≤ e^ε, Z_max from δ)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from svtagg.analyst.audit import joint_ctt_pmf
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.dp.errors import InvalidArgument
from svtagg.dp.joint import digit_growth, magnitude_weights, shift_ratio, tail_decay, tail_mass
from svtagg.dp.jointsvt import (
    JOINT_MAX_QUERIES,
    _close_eta,
    _close_factor,
    _within,
    joint_ctt_gap,
    joint_stream_noise,
)
from svtagg.dp.kinds import StreamKind, ctt_gap
from svtagg.dp.queries import Outcome, Query
from svtagg.mpc.ring import widths_of

CTT = StreamKind.CTT


def _ctt(eps: Fraction, frac_bits: int = 1):  # type: ignore[no-untyped-def]
    return joint_stream_noise(CTT, eps, frac_bits)


# ---------------------------------------------------------------- the pieces
@pytest.mark.parametrize("eps", [Fraction(1, 2), Fraction(9, 10)])
def test_tail_decay_bounds_every_step_of_the_exact_tail(eps: Fraction) -> None:
    """digit_growth(i) is exactly the largest P(H = y + 1)/P(H = y) of the high
    digits H = G >> i, and tail_decay(j) ≥ P(G ≥ a + j)/P(G ≥ a) for every a
    and every step j of the support (exact integers)."""
    noise = _ctt(eps)
    c, w = noise.query_constants, noise.query_widths
    k = len(c)
    weights = magnitude_weights(c, w)
    tail = list(itertools.accumulate(reversed(weights)))[::-1] + [0]  # ∝ P(G ≥ a)
    for i in range(k):
        high = magnitude_weights(c[i:], widths_of(c, w)[i:])
        brute = max(Fraction(high[y + 1], high[y]) for y in range(len(high) - 1))
        assert digit_growth(c, w, i) == brute
    assert digit_growth(c, w, k) == 0
    for j in range(1, 1 << k):
        worst = max(Fraction(tail[a + j], tail[a]) for a in range((1 << k) - j))
        assert worst <= tail_decay(c, w, j)
    assert tail_decay(c, w, 1) > Fraction(1, 2)  # a bound, not a vacuous zero


@pytest.mark.parametrize("eps", [Fraction(1, 2), Fraction(9, 10)])
def test_the_close_interval_bound_holds_for_every_long_interval(eps: Fraction) -> None:
    """For every interval [a, b] of ν's support holding at least `close_span`
    points: P([a, b]) ≤ (R₂·P([a + 2, b − 2]) + tail)/(1 − R₂·η), the step of
    the proof that prices a Close answer.  The control: intervals of 5 points
    (the inner one holds 1) break it by far — the span is needed."""
    noise = _ctt(eps)
    nu = noise.query_constants, noise.query_widths
    k = len(nu[0])
    r2, eta = float(shift_ratio(*nu, 2)), float(_close_eta(nu, noise.close_span))
    tail = float(tail_mass(*nu, (1 << k) - 2)) / 2
    factor = float(_close_factor(nu, noise.close_span))  # type: ignore[arg-type]
    assert factor == pytest.approx(1 / (1 - r2 * eta))
    weights = np.array(magnitude_weights(*nu), dtype=np.float64)
    p = np.concatenate([weights[::-1], weights]) / (2 * weights.sum())  # ν = −2^K .. 2^K − 1
    cum = np.concatenate([[0.0], np.cumsum(p)])

    def mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # indices into p, inclusive
        return cum[np.clip(b + 1, 0, p.size)] - cum[np.clip(a, 0, p.size)]

    worst, short = 0.0, 0.0
    for a in range(p.size):
        b = np.arange(a + noise.close_span - 1, p.size)
        excess = mass(a + 0 * b, b) - (r2 * mass(a + 2 + 0 * b, b - 2) + tail) * factor
        worst = max(worst, float(excess.max(initial=-1.0)))
        if a + 4 < p.size:
            inner = mass(np.array([a + 2]), np.array([a + 2]))[0]
            whole = mass(np.array([a]), np.array([a + 4]))[0]
            if inner > 1e-9:
                short = max(short, whole / inner)
    assert worst <= 1e-15
    assert short > 4 > r2 * factor  # the control: a short interval costs far more than e^ε


@pytest.mark.parametrize(
    "eps", [Fraction(1, 1024), Fraction(1, 16), Fraction(1, 2), Fraction(9, 10)]
)
def test_the_charge_covers_the_exact_loss(eps: Fraction) -> None:
    """ratio = R_ρ(1)·R_ν(2)/(1 − R₂·η) ≤ e^ε exactly; the gap is 2·Z_max + 4 +
    close_span with Z_max the least z whose tail P(Z_ρ > z) is within δ; the
    sampler's δ covers its tails; the gap is smaller than the two-server
    independent one (no server knows γ, so nothing widens it)."""
    noise = _ctt(eps, 16)
    rho = noise.threshold_constants, noise.threshold_widths
    nu = noise.query_constants, noise.query_widths
    factor = _close_factor(nu, noise.close_span)
    assert factor is not None
    exact = shift_ratio(*rho, 1) * shift_ratio(*nu, 2) * factor
    assert exact == noise.ratio and _within(exact, eps)
    shorter = _close_factor(nu, noise.close_span - 1)  # the bisection's last step fails
    assert shorter is None or not _within(shift_ratio(*rho, 1) * shift_ratio(*nu, 2) * shorter, eps)
    nu_tail = tail_mass(*nu, (1 << len(nu[0])) - 2) * factor  # paid per query
    rho_tail = tail_mass(*rho, (1 << len(rho[0])) - 1)
    assert noise.delta_charge >= (rho_tail + JOINT_MAX_QUERIES * nu_tail) / 2
    for delta in (Fraction(1, 10**3), Fraction(1, 10**9)):
        gap = joint_ctt_gap(eps, delta, 16)
        z_max = (gap - 4 - noise.close_span) // 2
        assert 2 * z_max + 4 + noise.close_span == gap
        assert tail_mass(*rho, z_max + 1) / 2 <= delta
        assert z_max == 0 or tail_mass(*rho, z_max) / 2 > delta
        assert gap < ctt_gap(eps, delta, 2)


# ---------------------------------------------------------------- the mechanism
EPSILONS = [Fraction(1, 2), Fraction(9, 10)]
DELTA = Fraction(1, 10**6)


def _excess(p: dict, q: dict, eps: Fraction) -> float:  # type: ignore[type-arg]
    """Σ_o max(0, P_D(o) − e^ε·P_D'(o)): the least δ the pair needs at ε (an
    output missing from a law has probability 0 there)."""
    e = math.exp(float(eps))
    return sum(max(0.0, p[o] - e * q.get(o, 0.0)) for o in p)


def _worst(eps: Fraction, gap_units: int, gamma=None) -> float:  # type: ignore[no-untyped-def]
    """The largest excess over neighbouring chunks at F = 1 (Δ = 2 grid
    units): k ∈ {1, 4, 8} queries of one score placed across and around the
    thresholds (τL = 0, τH = gap), every score moved by −Δ or +Δ, both orders;
    and chunks mixing scores near τL and near τH moved towards or away from
    each other."""
    delta_unit = 2
    lows = [0] * 8
    highs = [gap_units] * 8
    worst = 0.0
    pairs = []
    for frac in (-0.1, 0.0, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 1.0, 1.1):
        s = int(round(frac * gap_units)) if gap_units else int(frac * 40) - 20
        for k in (1, 4, 8):
            for d in (-delta_unit, delta_unit):
                pairs.append(([s] * k, [s + d] * k))
    near_low, near_high = round(0.05 * gap_units), round(0.95 * gap_units)
    for d in (-delta_unit, delta_unit):
        mixed = [near_low, near_high] * 3
        pairs.append((mixed, [x + (d if x == near_low else -d) for x in mixed]))
    for a, b in pairs:
        k = len(a)
        laws = [joint_ctt_pmf(x, lows[:k], highs[:k], eps, 1, gamma) for x in (a, b)]
        worst = max(worst, _excess(laws[0], laws[1], eps), _excess(laws[1], laws[0], eps))
    return worst


@pytest.mark.parametrize("eps", EPSILONS)
def test_the_exact_output_law_is_private(eps: Fraction) -> None:
    """At the gap the servers require, every neighbouring pair of chunks above
    satisfies P_D[E] ≤ e^ε·P_D'[E] + δ for every event E, δ what the stream is
    charged (its own δ plus the sampler's)."""
    charge = float(DELTA + _ctt(eps).delta_charge)
    gap_units = joint_ctt_gap(eps, DELTA, 1) * 2
    assert _worst(eps, gap_units) <= charge


@pytest.mark.parametrize("eps", EPSILONS)
def test_random_adversarial_chunks_stay_private(eps: Fraction) -> None:
    """Forty random chunks of six queries, each query with thresholds of its
    own (the required gap plus up to half of it more, anywhere around the
    score) and its own move (−Δ, +Δ or none), F = 1: each pair, both ways,
    within e^ε and the charged δ.  A breadth check of the placements the
    fixed grid above does not try (per-query thresholds, moves in opposite
    directions); it has little power against a broken mechanism — the same
    draws with gaps of 0–7 grid units pass too, since six scattered queries
    rarely accumulate loss — which is what `test_the_controls_are_caught`
    shows with queries placed to accumulate it."""
    rng = np.random.default_rng(17)
    charge = float(DELTA + _ctt(eps).delta_charge)
    gap = joint_ctt_gap(eps, DELTA, 1) * 2  # grid units (Δ = 2)
    worst = 0.0
    for _ in range(40):
        widths = gap + rng.integers(0, gap // 2 + 1, 6)
        lows = rng.integers(-gap, gap, 6)
        highs = lows + widths
        scores = rng.integers(-gap // 4, gap + gap // 4, 6) + lows
        moved = scores + 2 * rng.integers(-1, 2, 6)
        laws = [
            joint_ctt_pmf(x.tolist(), lows.tolist(), highs.tolist(), eps, 1)
            for x in (scores, moved)
        ]
        worst = max(worst, _excess(laws[0], laws[1], eps), _excess(laws[1], laws[0], eps))
    assert worst <= charge


@pytest.mark.parametrize("eps", EPSILONS)
def test_the_controls_are_caught(eps: Fraction) -> None:
    """The same check fails on the broken variants, by more than 100 times the
    charge (the honest mechanism's worst excess is ≈ 10^-16): thresholds at no
    distance (no answer stops the stream, so eight HIGH/LOW answers each pay),
    and no threshold noise at the required gap (γ = 0: each answer pays on its
    own).  Measured: 3.3·10^-4 and 7.1·10^-4 at ε = 1/2, 6.6·10^-4 and
    1.1·10^-3 at ε = 9/10, against δ = 10^-6."""
    charge = float(DELTA + _ctt(eps).delta_charge)
    assert _worst(eps, 0) > 100 * charge
    gap_units = joint_ctt_gap(eps, DELTA, 1) * 2
    assert _worst(eps, gap_units, gamma=(0, np.ones(1))) > 100 * charge


# ---------------------------------------------------------------- the oracle
def test_the_local_oracle_runs_ctt_as_the_servers() -> None:
    """The local oracle of a joint-noise task opens ctt, charges (ε, δ + the
    sampler's δ), refuses thresholds closer than `joint_ctt_gap`, and answers
    LOW, HIGH, CLOSE where the data put them."""
    rng = np.random.default_rng(3)
    data = (rng.random((3000, 6)) < 0.2).astype(float)
    data[:, 5] = 1.0
    o = LocalOracle(data, 8, "1/1000", frac_bits=8, noise="joint", seed=5)
    eps, delta = Fraction(1, 2), Fraction(1, 10**5)
    stream = o.open_stream(eps, CTT, delta)
    b = o.budget()
    assert (b.epsilon_spent, b.delta_spent) == (eps, delta + _ctt(eps, 8).delta_charge)
    gap = joint_ctt_gap(eps, delta, 8)
    with pytest.raises(InvalidArgument, match="CompareToThresholds requires"):
        stream.compare([(Query(0), 0, gap - 1)])
    answers = stream.compare(
        [
            (Query(0), 2000, 2000 + gap),
            (Query(5), -gap, 0),
            (Query(5), 3000 - gap / 2, 3000 + gap / 2),
        ]
    )
    assert answers == [Outcome.LOW, Outcome.HIGH, Outcome.CLOSE] and stream.closed


def test_the_close_answers_tail_is_paid_per_query() -> None:
    """On a sampler with few digits, whose tails are visible (ρ: t = 4, K = 6;
    ν: t = 6, K = 5; whole sensitivities, no dither), with the proof's own
    constants — e^ε' = R_ρ·R₂/(1 − R₂·η) at the span that minimises it,
    Z_max = 40, thresholds 2·Z_max + 4 + span apart — a stream of two queries
    answered HIGH and then n queries that answer LOW unless ν reaches the top
    of its support, every score moved by −1, stays within
    P(Z_ρ > Z_max) + (n + 2)·tail' (tail' = ½·T_ν(2^K − 2)/(1 − R₂·η), paid
    per query, as `JOINT_MAX_QUERIES` charges it) but exceeds
    P(Z_ρ > Z_max) + tail' once n is large: a stream may end at any of its
    queries, so the tail cannot be paid once per stream."""
    from svtagg.dp.joint import fitted_digits, pmf

    rho, nu = fitted_digits(Fraction(4), 12, 6), fitted_digits(Fraction(6), 12, 5)

    def law(digits: tuple[tuple[int, ...], tuple[int, ...]]) -> tuple[int, np.ndarray]:
        p = pmf(*digits)
        lo = min(p)
        return lo, np.array([float(p[x]) for x in range(lo, max(p) + 1)])

    spans = [(1 << k) + 2 for k in range(1, 7)]
    factors = {s: f for s in spans if (f := _close_factor(nu, s)) is not None}
    span = min(factors, key=lambda s: factors[s])
    ratio = shift_ratio(*rho, 1) * shift_ratio(*nu, 2) * factors[span]
    z_max = 40
    cut = float(tail_mass(*rho, z_max + 1) / 2)
    tail = float(tail_mass(*nu, (1 << len(nu[0])) - 2) / 2 * factors[span])
    gap = 2 * z_max + 4 + span
    e = float(ratio)

    def worst(n: int) -> float:
        h = [-4, -4] + [gap + 32] * n  # HIGH iff Z_ν + Z_ρ ≥ h; top: LOW unless Z_ν tops
        highs, lows = [x - 1 for x in h], [x - 1 - gap for x in h]
        a = joint_ctt_pmf([0] * len(h), lows, highs, Fraction(1, 2), 1, law(rho), law(nu))
        b = joint_ctt_pmf([-1] * len(h), lows, highs, Fraction(1, 2), 1, law(rho), law(nu))
        return max(
            sum(max(0.0, a[o] - e * b.get(o, 0.0)) for o in a),
            sum(max(0.0, b[o] - e * a.get(o, 0.0)) for o in b),
        )

    for n in (10, 80):
        assert worst(n) <= cut + (n + 2) * tail
    assert worst(80) > 3 * (cut + tail)  # measured: 3.6·10^-3 against 9.8·10^-4
