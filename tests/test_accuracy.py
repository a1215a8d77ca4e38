"""α from exact tails: the simulated failure rate of every stream kind stays below β."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from svtagg.analyst.selection.plans import (
    PracticalOptions,
    ScanOptions,
    plan_practical,
    plan_scan,
)
from svtagg.dp.accuracy import (
    FAST_SCALE_MAX,
    FAST_TARGET_MAX,
    LogTail,
    _best_split,
    _inverse_tails,
    _inverse_tails_reference,
    _log_tail,
    _tail,
    alpha,
    alpha_grid,
)
from svtagg.dp.kinds import Family, StreamKind, noise_model
from svtagg.dp.noise import RandomSource, draw_query_noise, draw_threshold_noise
from svtagg.mpc.ring import sensitivity

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
    0 on one target (the plain search `_inverse_tails_reference` and the fast
    `_inverse_tails` must agree with)."""
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
        got = _inverse_tails_reference(tail, targets)
        want = [_least_a_by_scan(tail, float(t)) for t in targets]
        assert got.tolist() == want, (family, parties, scale)
        fast = _inverse_tails(_tail(family, float(scale), parties), targets)
        assert fast.tolist() == want, (family, parties, scale)
        # the answer is the boundary: its tail meets the target, one below does not
        for a, t in zip(want, targets, strict=True):
            assert float(tail(np.asarray([a]))[0]) <= t
            assert a == 0 or float(tail(np.asarray([a - 1]))[0]) > t


# ------------------------------------------------------------------ fast search vs plain one
#
# `_inverse_tails` (closed-form guess checked on the tail) must give exactly the
# answers of the plain search `_inverse_tails_reference`, and `_best_split`,
# `alpha_grid` and the plans built on them exactly those of the straightforward
# versions below (the code before the fast search, kept verbatim as references).


def _best_split_reference(
    t_gamma: LogTail, t_nu: LogTail, k: int, beta: float, one_sided: bool, has_threshold: bool
) -> tuple[int, int, int]:
    f = np.arange(1, 200) / 200.0 if has_threshold else np.zeros(1)
    with np.errstate(divide="ignore"):
        a1 = np.where(f > 0, _inverse_tails_reference(t_gamma, np.log(f * beta)), 0)
    a2 = _inverse_tails_reference(t_nu, np.log((1.0 - f) * beta / k))
    total = (np.maximum(a1, a2) if one_sided else a1 + a2) + 1
    i = int(np.argmin(total))
    return int(total[i]), int(a1[i]), int(a2[i])


def _split_with(
    tail: Any,
    split: Any,
    kind: StreamKind,
    epsilon: Fraction,
    k: int,
    beta: float,
    parties: int,
    frac_bits: int,
) -> tuple[int, int, int]:
    """`alpha_grid`'s (α, a₁, a₂) from the tails `tail(family, scale, parties)`
    made and the split search `split` (the straightforward code's or the fast one)."""
    model = noise_model(kind)
    t_gamma = tail(
        model.threshold_family, float(model.threshold_scale(epsilon, frac_bits)), parties
    )
    t_nu = tail(model.query_family, float(model.query_scale(epsilon, frac_bits)), parties)
    one_sided = {model.threshold_family, model.query_family} <= {"geometric", "none"}
    has_threshold = model.threshold_family != "none"
    return split(t_gamma, t_nu, k, beta, one_sided, has_threshold)  # type: ignore[no-any-return]


def _split_reference(*args: Any) -> tuple[int, int, int]:
    """As the straightforward code computed it."""
    return _split_with(_log_tail, _best_split_reference, *args)


def _split_fast(*args: Any) -> tuple[int, int, int]:
    return _split_with(_tail, _best_split, *args)


def _hard_targets(
    log_tail: LogTail, scale: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Targets for the least-a searches: random levels (deep tails to levels near 0,
    and those `_best_split` asks for), and the tail's own values at random a, and
    one ulp either side of them (the boundary cases a search off by one gets wrong)."""
    levels = np.concatenate(
        [
            np.log(rng.uniform(1e-15, 1.0, 8)) * rng.uniform(0.5, 30, 8),
            -(10.0 ** rng.uniform(-9, 0, 4)),
            np.log(rng.uniform(1 / 200, 199 / 200, 6) * 10 ** rng.uniform(-9, -0.01, 6)),
        ]
    )
    a = np.unique(np.floor(scale * 10.0 ** rng.uniform(-4, 1.5, 10)).astype(np.int64))
    on = log_tail(a).astype(np.float64)
    on = on[np.isfinite(on)]
    return np.concatenate([levels, on, np.nextafter(on, -np.inf), np.nextafter(on, np.inf)])


FAST_CASES = [(f, p) for f in ("laplace", "geometric") for p in (1, 2)] + [("none", 1)]


def _inverse_mismatches(
    search: Callable[[Family, float, int, npt.NDArray[np.float64]], npt.NDArray[np.int64]],
    seed: int,
) -> int:
    """How many targets `search(family, scale, parties, targets)` answers unlike
    the plain search, over random tails (scales 0.1 to 10^11, past FAST_SCALE_MAX)."""
    rng = np.random.default_rng(seed)
    bad = 0
    for family, parties in FAST_CASES:
        for scale in 10.0 ** rng.uniform(-1, 11, 30):
            ref_tail = _log_tail(family, float(scale), parties)
            targets = _hard_targets(ref_tail, float(scale), rng)
            want = _inverse_tails_reference(ref_tail, targets)
            got = search(family, float(scale), parties, targets)
            bad += int(np.count_nonzero(got != want))
    return bad


def test_fast_inverse_tails_equals_the_plain_search() -> None:
    def fast(family: Family, scale: float, parties: int, t: npt.NDArray[np.float64]) -> Any:
        return _inverse_tails(_tail(family, scale, parties), t)

    assert _inverse_mismatches(fast, seed=11) == 0


def test_inverse_tails_comparison_catches_an_off_by_one() -> None:
    """Negative controls: the same comparison fails for a search that answers
    "least a with tail(a) < t" (off by one exactly at the tail's own values), and
    for the closed-form guess taken without its check on the tail."""

    def strict(family: Family, scale: float, parties: int, t: npt.NDArray[np.float64]) -> Any:
        return _inverse_tails_reference(_log_tail(family, scale, parties), np.nextafter(t, -np.inf))

    def unchecked(family: Family, scale: float, parties: int, t: npt.NDArray[np.float64]) -> Any:
        guess = _tail(family, scale, parties).guess
        if guess is None:
            return _inverse_tails_reference(_log_tail(family, scale, parties), t)
        return np.maximum(np.ceil(guess(t)), 0).astype(np.int64)

    assert _inverse_mismatches(strict, seed=11) > 0
    assert _inverse_mismatches(unchecked, seed=11) > 0


@pytest.mark.parametrize("family", ["laplace", "geometric"])
def test_two_party_tails_strictly_decrease_where_the_fast_search_answers(
    family: Family,
) -> None:
    """The fast search's answer is the plain search's because the computed tail is
    strictly decreasing around the target's level (scale ≤ FAST_SCALE_MAX, target
    ≤ FAST_TARGET_MAX): checked on 4,000 consecutive a around many answers."""
    rng = np.random.default_rng(17)
    for scale in np.concatenate([[FAST_SCALE_MAX], 10.0 ** rng.uniform(0, 10.2, 25)]):
        tail = _log_tail(family, float(scale), 2)
        targets = np.concatenate(
            [[FAST_TARGET_MAX], np.log(rng.uniform(1e-12, 1.0, 6)) * rng.uniform(0.1, 20, 6)]
        )
        targets = targets[targets <= FAST_TARGET_MAX]
        for a in _inverse_tails_reference(tail, targets):
            window = np.arange(max(int(a) - 2000, 0), int(a) + 2000, dtype=np.int64)
            assert (np.diff(tail(window)) < 0).all(), (family, scale, a)


def _random_stream(rng: np.random.Generator) -> tuple[Fraction, int, float]:
    """ε from 1/100 to 10 (a fraction with a modest denominator), K, β."""
    eps = Fraction(float(10 ** rng.uniform(-2, 1))).limit_denominator(10_000)
    k = int(10 ** rng.uniform(0, 7))
    beta = float(10 ** rng.uniform(-12, math.log10(0.9)))
    return eps, k, beta


def test_alpha_grid_equals_the_straightforward_code() -> None:
    rng = np.random.default_rng(23)
    kinds = list(StreamKind)
    for _ in range(400):
        kind = kinds[int(rng.integers(len(kinds)))]
        eps, k, beta = _random_stream(rng)
        parties = int(rng.integers(1, 3))
        frac_bits = int(rng.choice([1, 8, 16, 16, 16, 24, 30]))
        args = (kind, eps, k, beta, parties, frac_bits)
        want = _split_reference(*args)
        assert _split_fast(*args) == want, args
        assert alpha_grid.__wrapped__(*args) == want[0], args


def test_best_split_equals_the_straightforward_code_on_unequal_tails() -> None:
    """Any pair of tails (as `joint_alpha_grid`'s one-draw Laplace ones), either side."""
    rng = np.random.default_rng(29)
    for _ in range(150):
        family = "laplace" if rng.random() < 0.5 else "geometric"
        parties = int(rng.integers(1, 3))
        s1, s2 = (float(s) for s in 10.0 ** rng.uniform(-1, 10.5, 2))
        _, k, beta = _random_stream(rng)
        sided = bool(rng.random() < 0.5)
        want = _best_split_reference(
            _log_tail(family, s1, parties), _log_tail(family, s2, parties), k, beta, sided, True
        )
        got = _best_split(
            _tail(family, s1, parties), _tail(family, s2, parties), k, beta, sided, True
        )
        assert got == want, (family, parties, s1, s2, k, beta, sided)


class _StubOracle:
    """What the planners read of an oracle: n, frac_bits, accuracy."""

    def __init__(
        self, n: int, parties: int, frac_bits: int, split: Callable[..., tuple[int, int, int]]
    ) -> None:
        self.n, self.parties, self.frac_bits, self.split = n, parties, frac_bits, split

    def accuracy(self, kind: StreamKind | str, epsilon: Any, k: int, beta: float) -> float:
        grid = self.split(
            StreamKind.parse(kind),
            Fraction(epsilon),
            int(k),
            float(beta),
            self.parties,
            self.frac_bits,
        )[0]
        return grid / sensitivity(self.frac_bits)


def test_plans_equal_the_straightforward_code() -> None:
    """plan_scan and plan_practical over random parameter sets: the same plan with
    the fast search as with the straightforward code, and a negative control (an
    α one grid unit off for one query count) that the comparison catches."""
    rng = np.random.default_rng(31)
    kinds = ["auto", "exp3", "lap3", "lap24"]
    for i in range(24):
        eps, k_ranks, beta = _random_stream(rng)
        beta = min(beta * 1e6, 0.5)
        size = int(10 ** rng.uniform(0, 4))
        width = float(10 ** rng.uniform(0.5, 6))
        parties = int(rng.integers(1, 3))
        frac_bits = int(rng.choice([8, 16, 16, 20]))
        kind = kinds[i % len(kinds)]
        mid = Fraction(1, 16) if rng.random() < 0.7 else Fraction(0)
        opts = ScanOptions(kind=kind, mid_fraction=mid)
        k = min(size, int(rng.integers(1, 4)))
        n = int(width)
        ref = _StubOracle(n, parties, frac_bits, _split_reference)
        fast = _StubOracle(n, parties, frac_bits, _split_fast)
        case = (eps, beta, size, width, parties, frac_bits, kind, mid, k)
        want = plan_scan(ref, eps, beta, size, width, k=k, options=opts)  # type: ignore[arg-type]
        got = plan_scan(fast, eps, beta, size, width, k=k, options=opts)  # type: ignore[arg-type]
        assert got == want, case
        p_opts = PracticalOptions(kind=kind)
        assert plan_practical(
            fast,
            eps,
            beta,
            size,
            width,
            options=p_opts,  # type: ignore[arg-type]
        ) == plan_practical(ref, eps, beta, size, width, options=p_opts), case  # type: ignore[arg-type]

    def off_by_one(*args: Any) -> tuple[int, int, int]:
        total, a1, a2 = _split_fast(*args)
        return (total + 1, a1, a2) if args[2] == 1000 else (total, a1, a2)

    opts = ScanOptions(kind="exp3")
    want = plan_scan(_StubOracle(10_000, 2, 16, _split_reference), 4, 0.05, 1000, 1e4, options=opts)  # type: ignore[arg-type]
    bad = plan_scan(_StubOracle(10_000, 2, 16, off_by_one), 4, 0.05, 1000, 1e4, options=opts)  # type: ignore[arg-type]
    assert bad != want
