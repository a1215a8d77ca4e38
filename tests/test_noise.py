"""Exact samplers against their exact pmfs (chi-square), and the digit machinery.

Each chi-square test fails a correct sampler with probability 1e-4 (its level);
all are seeded, so a run is reproducible.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from svtagg.dp import noise
from svtagg.dp.kinds import StreamKind, clamp_bound, noise_model
from svtagg.dp.noise import (
    RandomSource,
    discrete_laplace,
    draw_query_noise,
    draw_threshold_noise,
    geometric,
    geometric_log_pmf,
    laplace_log_pmf,
)

LEVEL = 1e-4
N = 200_000


def _chi_square(samples: np.ndarray, log_pmf, support_lo: int, support_hi: int) -> float:
    """p-value of a chi-square goodness-of-fit test with tails pooled into end bins."""
    values = np.arange(support_lo, support_hi + 1)
    probs = np.exp(log_pmf(values))
    lo_tail = max(0.0, 1.0 - probs.sum()) if support_lo == 0 else None
    observed = np.array([(samples == v).sum() for v in values], dtype=float)
    if lo_tail is not None:  # one-sided: pool the upper tail
        probs = np.append(probs, 1.0 - probs.sum())
        observed = np.append(observed, (samples > support_hi).sum())
    else:
        rest = 1.0 - probs.sum()
        probs = np.append(probs, rest)
        observed = np.append(observed, ((samples < support_lo) | (samples > support_hi)).sum())
    expected = probs * samples.size
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(40)])
def test_geometric_matches_exact_pmf(scale: Fraction) -> None:
    rng = RandomSource(b"geometric" + str(scale).encode())
    x = geometric(scale, N, rng)
    assert x.min() >= 0
    hi = int(12 * scale) + 3
    p = _chi_square(x, lambda v: geometric_log_pmf(scale, v), 0, hi)
    assert p > LEVEL, f"geometric({scale}) fails chi-square, p={p:.2e} (false-failure prob {LEVEL})"


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(25, 3)])
def test_discrete_laplace_matches_exact_pmf(scale: Fraction) -> None:
    rng = RandomSource(b"laplace" + str(scale).encode())
    x = discrete_laplace(scale, N, rng)
    hi = int(10 * scale) + 3
    p = _chi_square(x, lambda v: laplace_log_pmf(scale, v), -hi, hi)
    assert p > LEVEL, f"discrete_laplace({scale}) fails chi-square, p={p:.2e} (level {LEVEL})"


def test_large_scale_laplace_ks_against_exact_cdf() -> None:
    """At grid scale 2^18 the law is checked through its exact CDF with a KS test."""
    scale = Fraction(4 * 2**16)
    rng = RandomSource(b"ks")
    x = discrete_laplace(scale, 50_000, rng)
    q = math.exp(-1 / float(scale))

    def cdf(v: np.ndarray) -> np.ndarray:
        v = np.floor(v)
        neg = q ** (-v) / (1 + q)  # P(X <= v) for v < 0  = q^{|v|} / (1+q)
        pos = 1 - q ** (v + 1) / (1 + q)
        return np.where(v < 0, neg, pos)

    # The law is discrete but its atoms are ~1e-6: KS is accurate to far below LEVEL.
    p = stats.kstest(x, cdf).pvalue
    assert p > LEVEL, f"large-scale Laplace fails KS, p={p:.2e} (level {LEVEL})"


def test_sampler_rejects_bad_scale() -> None:
    with pytest.raises(ValueError):
        geometric(Fraction(0), 3, RandomSource(b"x"))


def test_exp_bounds_bracket_the_true_value() -> None:
    for y in [Fraction(0), Fraction(1, 7), Fraction(3), Fraction(45, 2), Fraction(101, 3)]:
        lo, hi = noise._exp_bounds(y, 80)
        exact = math.exp(float(y)) * 2**80
        assert lo <= hi
        assert abs(lo - exact) / exact < 1e-12 and abs(hi - exact) / exact < 1e-12
        assert (hi - lo) / lo < 2.0**-60  # tight relative to the 80-bit precision


def test_digits_are_floor_of_value() -> None:
    y = Fraction(1, 5)
    d64 = noise._digits(y, "logistic", 64)
    assert (
        d64 == math.floor(2**64 / (1 + math.exp(0.2)))
        or abs(d64 - 2**64 / (1 + math.exp(0.2))) < 2**12
    )
    d128 = noise._digits(y, "logistic", 128)
    assert d128 >> 64 == d64  # the expansion extends consistently


class _RiggedSource(RandomSource):
    """Replays chosen words first, then real randomness: forces the tie path."""

    def __init__(self, words: list[int]) -> None:
        super().__init__(b"rigged")
        self._words = list(words)

    def u64(self, size: int) -> np.ndarray:
        if self._words:
            take, self._words = self._words[:size], self._words[size:]
            rest = super().u64(size - len(take)) if size > len(take) else np.zeros(0, np.uint64)
            return np.concatenate([np.array(take, dtype=np.uint64), rest])
        return super().u64(size)


def test_tie_is_resolved_by_later_digits() -> None:
    y = Fraction(1, 3)
    w1, w2 = noise._word(y, "logistic", 1), noise._word(y, "logistic", 2)
    # U equals the first word, then is one below the second: U < p, so True.
    below = noise._bernoulli(y, "logistic", 1, _RiggedSource([w1, w2 - 1]))
    above = noise._bernoulli(y, "logistic", 1, _RiggedSource([w1, w2 + 1]))
    assert below.tolist() == [True] and above.tolist() == [False]


def test_high_part_path_is_exact_and_reachable() -> None:
    scale = Fraction(2)
    k, _, _, words = noise._plan(scale)
    # Low bits all 1 (U = 0 < every word); then U = 0 for the high-part Bernoulli,
    # whose value e^-64 < 2^-64 has first word 0: a tie, resolved by the second word
    # (nonzero), which U = 0 again undercuts, so the high part is drawn.
    zeros = [0] * k
    src = _RiggedSource(zeros + [0, 0])
    g = geometric(scale, 1, src)
    assert int(g[0]) >= (1 << k)  # the high part was added
    assert int(g[0]) & ((1 << k) - 1) == (1 << k) - 1


def test_draws_are_clamped_and_kinds_use_their_families() -> None:
    rng = RandomSource(b"kinds")
    eps = Fraction(1, 2)
    for kind in StreamKind:
        model = noise_model(kind)
        nu = draw_query_noise(kind, eps, 8, 10_000, rng)
        bound = clamp_bound(model.query_scale(eps, 8))
        assert np.abs(nu).max() <= bound
        if model.query_family == "geometric":
            assert nu.min() >= 0
        else:
            assert nu.min() < 0 < nu.max()
        assert isinstance(draw_threshold_noise(kind, eps, 8, rng), int)


def test_random_source_is_seeded_only_on_request() -> None:
    a, b = RandomSource(b"s"), RandomSource(b"s")
    assert a.random_bytes(32) == b.random_bytes(32)
    assert RandomSource().random_bytes(32) != RandomSource().random_bytes(32)
