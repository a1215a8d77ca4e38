"""Joint noise off the servers: the exact sampler the local simulation draws
from, the accuracy bound of one draw, the per-stream δ cap and the plan
allowance an adaptive run reserves (dp/joint.py, dp/jointsvt.py, dp/accuracy.py,
analyst/local_oracle.py, analyst/oracle.py)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chi2

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.oracle import adaptive_groups, planned
from svtagg.analyst.selection import scan_selection
from svtagg.dp import accuracy, jointsvt
from svtagg.dp.joint import abs_tail, pmf, sample, sampler_constants
from svtagg.dp.jointsvt import JOINT_DELTA_CAP, joint_allowance, joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.dp.noise import RandomSource
from svtagg.mpc.ring import sensitivity

BITS = 10
CONSTANTS = sampler_constants(Fraction(3), BITS, digits=4)


def _chi2_stat(counts: Counter[int], law: dict[int, Fraction], n: int) -> tuple[float, int]:
    """Pearson's statistic over the support (cells with expectation < 5 pooled)."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for x, p in law.items():
        e = float(p) * n
        if e < 5:
            pooled_obs += counts.get(x, 0)
            pooled_exp += e
            continue
        stat += (counts.get(x, 0) - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    outside = sum(c for x, c in counts.items() if x not in law)
    return (float("inf") if outside else stat), cells - 1


def _p_value(stat: float, dof: int) -> float:
    return float(chi2.sf(stat, dof))


def test_the_local_sampler_follows_the_exact_law() -> None:
    """`sample` draws exactly `pmf` (the circuit's law); the broken control — the
    same digits with ν = −G for a negative sign (a "−0" and no −2^K) — is caught."""
    n = 40_000
    draws = sample(CONSTANTS, BITS, n, RandomSource(b"joint-local-law"))
    law = pmf(CONSTANTS, BITS)
    stat, dof = _chi2_stat(Counter(draws.tolist()), law, n)
    assert _p_value(stat, dof) > 1e-4
    rng = RandomSource(b"joint-local-broken")
    g = sample(CONSTANTS, BITS, n, rng)
    broken = np.where(g < 0, g + 1, g)  # −G instead of −G − 1
    stat, dof = _chi2_stat(Counter(broken.tolist()), law, n)
    assert _p_value(stat, dof) < 1e-12


def test_abs_tail_is_the_exact_tail() -> None:
    law = pmf(CONSTANTS, BITS)
    for a in range(0, 18):
        exact = sum(p for x, p in law.items() if abs(x) > a)
        assert abs(abs_tail(CONSTANTS, BITS, a) - float(exact)) < 1e-12


@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3])
def test_one_draw_alpha_holds_and_is_the_one_party_bound(kind: StreamKind) -> None:
    """α of a joint stream bounds every answer's error w.p. ≥ 1 − β (checked by
    drawing γ and k ν's from the exact law), sits within 1% of the one-party α
    (the scales are the central ones, inflated by ≤ 1 + 2^−4) and below the
    two-party α the SDK used before."""
    f, eps, k, beta = 8, Fraction(1), 50, 0.2
    grid = accuracy.joint_alpha_grid(kind, eps, k, beta, f)
    one = accuracy.alpha_grid(kind, eps, k, beta, 1, f)
    two = accuracy.alpha_grid(kind, eps, k, beta, 2, f)
    assert abs(grid - one) <= 0.01 * one and grid < two
    noise = joint_stream_noise(kind, eps, f)
    rng = RandomSource(b"joint-alpha")
    trials = 4000
    gamma = noise.sample("threshold", trials, rng)
    nu = noise.sample("query", trials * k, rng).reshape(trials, k)
    worst = np.max(np.abs(nu - gamma[:, None]), axis=1)
    assert np.mean(worst >= grid) <= beta  # the union bound is loose: typically far below β
    assert np.mean(worst >= grid // 2) > beta  # ... and α is not vacuous
    assert accuracy.joint_alpha(kind, eps, k, beta, f) == grid / sensitivity(f)


def test_the_digits_follow_the_delta_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler takes the fewest digits whose tail fits the cap: a cap of
    2^−24 instead of 2^−64 (on a stream of one query, so ν's tail is paid
    once) saves a digit and is met; a cap no 128-bit digit can reach refuses
    the stream."""
    kind, eps, f = StreamKind.LAP24, Fraction(1), 8
    noise = joint_stream_noise(kind, eps, f)
    assert 0 < noise.delta <= noise.delta_charge <= JOINT_DELTA_CAP
    jointsvt.joint_stream_noise.cache_clear()
    try:
        monkeypatch.setattr(jointsvt, "JOINT_DELTA_CAP", Fraction(1, 1 << 24))
        monkeypatch.setattr(jointsvt, "JOINT_MAX_QUERIES", 1)
        higher = jointsvt.joint_stream_noise(kind, eps, f)
        assert noise.delta < higher.delta <= Fraction(1, 1 << 24)
        assert len(higher.query_constants) + len(higher.threshold_constants) < len(
            noise.query_constants
        ) + len(noise.threshold_constants)
        jointsvt.joint_stream_noise.cache_clear()
        monkeypatch.setattr(jointsvt, "JOINT_DELTA_CAP", Fraction(1, 1 << 400))
        with pytest.raises(ValueError, match="cannot fit"):
            jointsvt.joint_stream_noise(kind, eps, f)
    finally:
        jointsvt.joint_stream_noise.cache_clear()


def test_adaptive_groups_hold_the_allowance() -> None:
    data = np.zeros((10, 3))
    plain = LocalOracle(data, 4)
    assert adaptive_groups(plain, ["1", "1/2"]) == [(1, 0), (Fraction(1, 2), 0)]
    joint = LocalOracle(data, 4, "1/1000", noise="joint", epsilon_min="1/8")
    assert adaptive_groups(joint, ["1", "1/2"]) == [
        (1, 8 * JOINT_DELTA_CAP),
        (Fraction(1, 2), 4 * JOINT_DELTA_CAP),
    ]
    assert joint_allowance(Fraction(1), Fraction(3, 8)) == 2 * JOINT_DELTA_CAP
    with pytest.raises(ValueError, match="epsilon_min"):
        adaptive_groups(LocalOracle(data, 4, noise="joint"), ["1"])


def test_local_joint_oracle_charges_and_refuses_as_the_servers() -> None:
    rng = np.random.default_rng(3)
    data = (rng.random((3000, 40)) < 0.2).astype(float)
    data[:, 11] = rng.random(3000) < 0.6
    o = LocalOracle(data, 8, "1/1000", frac_bits=8, noise="joint", epsilon_min="1/64", seed=5)
    with pytest.raises(ValueError, match="epsilon_min"):
        o.open_stream("1/128", StreamKind.LAP24)
    assert o.budget().epsilon_spent == 0
    with planned(o, adaptive_groups(o, ["2"])) as view:
        res = scan_selection(view, 2, 0.05)
    assert res.index == 11
    b = o.budget()
    streams = o.stats().streams
    assert b.epsilon_spent == 2 and 0 < b.delta_spent <= streams * JOINT_DELTA_CAP
