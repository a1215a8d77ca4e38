"""α from exact tails: the simulated failure rate of every stream kind stays below β."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from svtagg.dp.accuracy import LogTail, _inverse_tails, _log_tail, alpha, alpha_grid
from svtagg.dp.kinds import Family, StreamKind
from svtagg.dp.noise import RandomSource, draw_query_noise, draw_threshold_noise

LEVEL = 1e-4


@pytest.mark.parametrize("parties", [1, 2])
@pytest.mark.parametrize("kind", list(StreamKind))
def test_empirical_failure_rate_below_beta(kind: StreamKind, parties: int) -> None:
    eps, k, beta, frac_bits, runs = Fraction(1), 50, 0.2, 6, 1500
    a = alpha_grid(kind, eps, k, beta, parties, frac_bits)
    rng = RandomSource(f"acc-{kind.value}-{parties}".encode())
    failures = 0
    for _ in range(runs):
        gamma = sum(draw_threshold_noise(kind, eps, frac_bits, rng) for _ in range(parties))
        nu = sum(draw_query_noise(kind, eps, frac_bits, k, rng) for _ in range(parties))
        n = np.asarray(nu) - gamma
        # s = τ + α answered NO (α + N < 0), or s = τ − α answered YES (N − α ≥ 0)
        failures += bool(((n < -a) | (n >= a)).any())
    p = stats.binom.sf(failures - 1, runs, beta)
    assert p > LEVEL, (
        f"{kind.value}/{parties} parties: {failures}/{runs} runs off by ≥ α={a}, "
        f"P(Bin({runs},{beta}) ≥ that) = {p:.2e} < {LEVEL} (false-failure prob {LEVEL})"
    )


def test_alpha_is_not_wildly_conservative() -> None:
    """The union bound loses little: the simulated rate at α/2 is well above β."""
    kind, eps, k, beta, fb = StreamKind.LAP24, Fraction(1), 50, 0.2, 6
    half = alpha_grid(kind, eps, k, beta, 1, fb) // 2
    rng = RandomSource(b"tight")
    runs, fails = 400, 0
    for _ in range(runs):
        g = draw_threshold_noise(kind, eps, fb, rng)
        n = draw_query_noise(kind, eps, fb, k, rng) - g
        fails += bool(((n < -half) | (n >= half)).any())
    assert fails / runs > beta


def test_alpha_grows_like_log_k_and_inverse_epsilon() -> None:
    a1 = alpha("lap24", 1, 10, 0.05)
    a2 = alpha("lap24", 1, 10_000, 0.05)
    assert a2 > a1 and a2 - a1 < 4 * math.log(1000) * 1.05 + 1e-3  # slope 4/ε per e-fold
    assert alpha("lap24", "0.5", 100, 0.05) == pytest.approx(2 * alpha("lap24", 1, 100, 0.05), 1e-3)
    assert alpha("lap24", 1, 100, 0.05, parties=2) > alpha("lap24", 1, 100, 0.05)
    # one-sided noise needs only the larger of the two tails
    assert alpha("exp3", 1, 100, 0.05) < alpha("lap3", 1, 100, 0.05)


def test_alpha_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        alpha("lap24", 0, 10, 0.1)
    with pytest.raises(ValueError):
        alpha("lap24", 1, 0, 0.1)
    with pytest.raises(ValueError):
        alpha("lap24", 1, 10, 1.5)
    with pytest.raises(ValueError):
        alpha("nope", 1, 10, 0.1)


def _least_a_by_scan(log_tail: LogTail, target: float) -> int:
    """The least a >= 0 with log_tail(a) <= target, by doubling and bisection from
    0 on one target (the plain search `_inverse_tails` must agree with)."""
    one = lambda a: float(log_tail(np.asarray([a], dtype=np.int64))[0])  # noqa: E731
    if one(0) <= target:
        return 0
    lo, hi = 0, 1
    while one(hi) > target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if one(mid) <= target else (mid, hi)
    return hi


@pytest.mark.parametrize(
    ("family", "parties"), [("laplace", 1), ("laplace", 2), ("geometric", 1), ("geometric", 2)]
)
def test_inverse_tails_is_the_least_a(family: Family, parties: int) -> None:
    rng = np.random.default_rng(5)
    for scale in 10.0 ** rng.uniform(-1, 7, 40):
        tail = _log_tail(family, float(scale), parties)
        targets = np.log(rng.uniform(1e-15, 1.0, 12)) * rng.uniform(0.5, 30)
        got = _inverse_tails(tail, targets)
        want = [_least_a_by_scan(tail, float(t)) for t in targets]
        assert got.tolist() == want, (family, parties, scale)
        # the answer is the boundary: its tail meets the target, one below does not
        for a, t in zip(want, targets, strict=True):
            assert float(tail(np.asarray([a]))[0]) <= t
            assert a == 0 or float(tail(np.asarray([a - 1]))[0]) > t
