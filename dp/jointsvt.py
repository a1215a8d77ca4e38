"""The accounting of an AboveThreshold stream whose noise is drawn jointly
(task option noise = joint; docs/privacy.md, "Jointly generated noise").

With joint noise the threshold noise ρ (γ) and each query's noise ν are single
draws Z of the garbled sampler (`svtagg.mpc.jointnoise`), in whole
sensitivities, whose exact law is `dp.joint.pmf`, not the ideal discrete
Laplace.  The comparison "s + 2^F·ν_Z + dither ≥ τ + 2^F·γ_Z + dither" is SVT
on the integer scores ⌊(s − τ + dithers)/2^F⌋, which move by at most 1 on
neighbouring data, so the change-of-variables proof of AboveThreshold (Lyu,
Su, Li 2017, Theorem 2) runs on Z with sensitivity 1: the output "NO for
i < j, YES at j" maps to itself under ρ ↦ ρ + 1 and ν_j ↦ ν_j + 2 (the other
ν_i unchanged).  So, with R_ρ the largest P(ρ = x)/P(ρ = x + 1) over the
support (and, for the two-sided law, its reciprocal), R_ν the same for ν and
the shift 2, and the pairs whose shifted point leaves the finite support
charged to δ:

    P_D[E] ≤ R_ρ·R_ν·P_D'[E] + P(ρ + 1 ∉ supp) + N·P(ν + 2 ∉ supp),

i.e. (ln R_ρ + ln R_ν, δ_ρ + N·δ_ν)-DP, both directions: the ν term belongs
to the query the output ends at, and a stream sent N queries may end at any
of them (the events "reaches query j" are nested, so the terms add up to N
times one), so a stream is sent at most N = `JOINT_MAX_QUERIES` queries and
ν's digits keep N·δ_ν within the cap.  `dp.joint.shift_ratio`
gives R exactly for the two-sided law, `dp.joint.one_sided_ratio` for exp3's
one-sided one (upward shifts only), `dp.joint.tail_mass` the tails.

The servers charge the stream's ε unchanged: the sampler is built for scales
t·(1 + 2^−m) — the kind's central scales, inflated by the least of a fixed
ladder of factors, at the cheapest per-digit precision that reaches
1 + 2^−8 — such that R_ρ·R_ν ≤ e^ε holds, checked in integers against a
rigorous lower bound of e^ε (`dp.noise._exp_bounds`).  δ is charged, rounded
up to a power of two (`delta_charge`).  The kinds: lap24 and lap3 (two-sided
noise for both terms), exp3 (one-sided), ctt (two-sided, with its own gap
and Close argument: `joint_ctt_gap`, below) and report-noisy-max (nmax:
one-sided ν per candidate, no γ; below).

Report-noisy-max with joint noise: candidate j's noisy score is
s_j + 2^F·G_j + dither_j, G_j one draw of the one-sided sampler at Exp(2Δ/ε)'s
scale.  Fix every other draw and every dither: candidate i wins iff G_i ≥ m,
m the ceiling of (the best other noisy score, tie rule included, − s_i −
dither_i)/2^F, and on a neighbour m moves by at most 2 (that best score and
s_i each move by at most 2^F).  Σ_{g≥m} P(g) ≤ R·Σ_{g≥m} P(g + 2) + P(G ≥ 2^K − 2)
with R = max P(G = g)/P(G = g + 2) over the support (`one_sided_ratio` at
shift 2), and a smaller m only helps, so P_D(i) ≤ R·P_D'(i) + P(G ≥ 2^K − 2)
for every i, either direction, and an event's δ is at most the number of
candidates times that tail: the sampler's digits keep it within
`JOINT_DELTA_CAP` for `JOINT_MAX_TOURNAMENT` candidates, the most a joint
tournament holds (2^20, not the 2^32 − 1 of an independent one: a tail of
2^−96 per candidate would need digits rarer than 64 bits can hold at ε ≥ ½).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.dp.joint import (
    fitted_digits,
    float_tail,
    one_sided_ratio,
    pmf,
    sample,
    shift_ratio,
    tail_decay,
    tail_mass,
)
from svtagg.dp.kinds import StreamKind, StreamRequest, check_ctt_parameters, noise_model
from svtagg.dp.noise import RandomSource, _exp_bounds
from svtagg.mpc.ring import check_frac_bits

#: A task's noise option.
INDEPENDENT = "independent"
JOINT = "joint"
NOISE_OPTIONS = (INDEPENDENT, JOINT)
#: The stream kinds a joint-noise task opens.
JOINT_KINDS = (
    StreamKind.LAP24,
    StreamKind.LAP3,
    StreamKind.EXP3,
    StreamKind.CTT,
    StreamKind.NMAX,
)
#: The AboveThreshold kinds among them (a stream of questions, not a tournament).
JOINT_SVT_KINDS = (StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3)
#: The per-digit precisions tried, cheapest first (`dp.joint.fitted_digits`):
#: the first that fits ε within `TARGET_INFLATION_EXPONENT` is used.
PRECISIONS = (8, 10, 12, 14, 16, 20, 24, 32, 40, 48)
#: The scale inflations tried, 1 + 2^−m for m in this order.
INFLATION_EXPONENTS = (40, 32, 24, 16, 12, 10, 8, 6, 4, 3, 2, 1)
#: A precision is taken once it fits with an inflation of at most 1 + 2^−8
#: (0.4% more noise than the ideal); if none does, the finest precision with
#: the least inflation that fits.
TARGET_INFLATION_EXPONENT = 8
#: Binary digits of e^ε for the rigorous comparison.
_EXP_PRECISION = 192
#: The most δ one joint-noise stream may be charged.  The digits are chosen so
#: that each stream's δ_ρ + δ_ν stays below it, so a (kind, ε) is refused only
#: if no sampler of at most 64-bit digits reaches it; it gives a plan that
#: cannot list its streams in advance a rigorous allowance (`joint_allowance`).
JOINT_DELTA_CAP = Fraction(1, 1 << 64)
#: The most candidates one report-noisy-max stream of a joint-noise task holds
#: (every coordinate of the largest task; `dp.queries.MAX_TOURNAMENT` with
#: independent noise): its δ is this many times one draw's tail.
JOINT_MAX_TOURNAMENT = 1 << 20
#: The most queries one AboveThreshold or CompareToThresholds stream of a
#: joint-noise task is sent (counted as the chunks' lengths added to the
#: queries it answered before them): the answer that ends a stream (YES, or
#: CLOSE) pays ν's tail past the support, and a stream may end at any of its
#: queries, so its δ is this many times one draw's tail (docs/privacy.md).
#: ν's digits are fitted so that it stays within `JOINT_DELTA_CAP` (a rare top
#: digit takes a uniform of two words: `dp.joint.MAX_RARE_WIDTH`).
JOINT_MAX_QUERIES = 1 << 24


def check_joint_queries(answered: int, k: int) -> None:
    """A joint-noise AboveThreshold or CompareToThresholds stream that answered
    `answered` queries takes a chunk of k more only within `JOINT_MAX_QUERIES`;
    ValueError otherwise (both servers and the local oracle check it before
    the chunk runs)."""
    if answered + k > JOINT_MAX_QUERIES:
        raise ValueError(
            f"a stream of a task with joint noise is sent at most {JOINT_MAX_QUERIES:,} "
            f"queries (its δ is paid per query); it answered {answered:,}: open a new stream"
        )


def check_joint_tournament(candidates: int) -> None:
    """A report-noisy-max stream of a joint-noise task holds at most
    `JOINT_MAX_TOURNAMENT` candidates (its δ is paid per candidate); ValueError
    otherwise.  The oracles check it before anything is charged; the servers
    check it again (`ServerCore.check_queries`)."""
    if candidates > JOINT_MAX_TOURNAMENT:
        raise ValueError(
            f"a report-noisy-max stream holds at most {JOINT_MAX_TOURNAMENT:,} candidates "
            "on a task with joint noise"
        )


def check_joint_kind(kind: StreamKind | str) -> StreamKind:
    """The kind, if a joint-noise task opens it; else ValueError saying why."""
    k = StreamKind.parse(kind)
    if k not in JOINT_KINDS:
        raise ValueError(
            f"a task with joint noise opens lap24, lap3, exp3, ctt and nmax streams only, "
            f"not {k.value}"
        )
    return k


@dataclass(frozen=True)
class JointStreamNoise:
    """The two samplers of a joint-noise stream and what the stream costs.

    A draw is Z, in whole sensitivities (one user's largest move of a score),
    from `dp.joint`'s law at the digits (constants, widths); on the servers it
    enters the comparison as 2^F·Z plus a dither (`dither_law`)."""

    threshold_constants: tuple[int, ...]
    threshold_widths: tuple[int, ...]
    query_constants: tuple[int, ...]
    query_widths: tuple[int, ...]
    #: The scales the constants round, in sensitivities: the kind's, times `inflation`.
    threshold_scale: Fraction
    query_scale: Fraction
    inflation: Fraction
    #: R_ρ·R_ν exactly: e^(the stream's ε-loss), ≤ e^ε.
    ratio: Fraction
    #: δ_ρ + δ_ν exactly, and the power of two ≥ it that the ledger is charged.
    delta: Fraction
    delta_charge: Fraction
    #: F: a draw Z moves a score by 2^F·Z grid units.
    shift: int
    #: False: one-sided draws Z = G ≥ 0 (exp3); True: two-sided, centred at −½.
    signed: bool = True
    #: CompareToThresholds only: the fewest lattice points the Close answer's
    #: interval of ν must hold for `ratio` to cover it (`joint_ctt_gap`); 0 otherwise.
    close_span: int = 0

    @property
    def max_magnitude(self) -> int:
        """|γ| + |ν| ≤ this in grid units: each Z lies in [−2^K, 2^K), each
        dither in [−2^F, 2^(F+1))."""
        k_rho, k_nu = len(self.threshold_constants), len(self.query_constants)
        return ((1 << k_rho) + (1 << k_nu) + 2) << self.shift

    def sample(self, which: str, k: int, rng: RandomSource) -> npt.NDArray[np.int64]:
        """k draws in grid units, as the servers add them: 2^F·Z + the two
        servers' dither (`which`: "threshold" or "query")."""
        c, w = self._digits(which)
        z = sample(c, w, k, rng, self.signed)
        if self.shift == 0:
            return z
        mask = np.uint64((1 << self.shift) - 1)
        d = (rng.u64(k) & mask).astype(np.int64) + (rng.u64(k) & mask).astype(np.int64)
        return (z << self.shift) + d + dither_offset(self.shift, self.signed)

    def _digits(self, which: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if which == "threshold":
            return self.threshold_constants, self.threshold_widths
        if which == "query":
            return self.query_constants, self.query_widths
        raise ValueError(which)

    def _z_at_least(self, which: str, m: int) -> float:
        """P(Z ≥ m): Z = G, or for the two-sided law G or −G − 1 by the sign."""
        c, w = self._digits(which)
        if not self.signed:
            return float_tail(c, w, max(m, 0))
        neg = 0.5 * (1.0 - float_tail(c, w, -m)) if m <= -1 else 0.0
        return 0.5 * float_tail(c, w, max(m, 0)) + neg

    def grid_upper(self, which: str, a: int) -> float:
        """P(draw > a) in grid units, exact up to floating point: the whole tail
        of Z where no dither value can bring the draw down to a, the few z with
        2^F·z near a term by term (for exp3's one-sided draws, the tail that
        bounds ν − γ: `accuracy.joint_alpha_grid`)."""
        if self.shift == 0:
            return self._z_at_least(which, a + 1)
        f, lo = self.shift, dither_offset(self.shift, self.signed)
        hi = lo + (2 << f) - 2  # D's range
        sure = ((a - lo) >> f) + 1  # the least z with 2^F·z + lo > a
        return self._z_at_least(which, sure) + sum(
            (self._z_at_least(which, z) - self._z_at_least(which, z + 1))
            * (1.0 - _dither_at_most(a - (z << f), f, lo))
            for z in range((a - hi) >> f, sure)
        )

    def grid_tail(self, which: str, a: int) -> float:
        """P(|draw| > a) for a ≥ 0 in grid units: `grid_upper` plus the same
        sum for draw < −a."""
        if self.shift == 0:
            return self.grid_upper(which, a) + 1.0 - self._z_at_least(which, -a)
        f, lo = self.shift, dither_offset(self.shift, self.signed)
        hi = lo + (2 << f) - 2
        top = -((a + lo) >> f)  # above it, 2^F·z + lo ≥ −a: never below −a
        sure = -((a + hi) >> f) - 1  # the largest z with 2^F·z + hi < −a
        while (sure + 1 << f) + hi < -a:
            sure += 1
        below = (
            1.0
            - self._z_at_least(which, sure + 1)
            + sum(
                (self._z_at_least(which, z) - self._z_at_least(which, z + 1))
                * _dither_at_most(-a - (z << f) - 1, f, lo)
                for z in range(sure + 1, top + 1)
            )
        )
        return self.grid_upper(which, a) + below

    def grid_pmf(self, which: str) -> tuple[int, npt.NDArray[np.float64]]:
        """(lowest value, pmf) of one draw in grid units (small supports only):
        2^F·Z convolved with the dither's law."""
        c, w = self._digits(which)
        exact = pmf(c, w, self.signed)
        lo = min(exact)
        z = np.zeros(max(exact) - lo + 1)
        for x, p in exact.items():
            z[x - lo] = float(p)
        if self.shift == 0:
            return lo, z
        spread = np.zeros((len(z) - 1 << self.shift) + 1)
        spread[:: 1 << self.shift] = z
        d_lo, d = dither_law(self.shift, self.signed)
        return (lo << self.shift) + d_lo, np.convolve(spread, d)


def dither_offset(shift: int, signed: bool) -> int:
    """The dither's least value: −2^(F−1) for the two-sided sampler (so a draw
    stays symmetric about −1 grid unit), 0 for the one-sided one (so its draws
    stay ≥ 0, which exp3's scans rely on)."""
    return -(1 << (shift - 1)) if signed and shift else 0


def _dither_at_most(x: int, shift: int, lo: int) -> float:
    """P(D ≤ x) for the dither at F = shift ≥ 1 with least value lo
    (`dither_law`), closed form: D − lo = U + U' is triangular on
    [0, 2^(F+1) − 2]."""
    n = 1 << shift
    s = x - lo
    if s < 0:
        return 0.0
    if s >= 2 * n - 2:
        return 1.0
    if s <= n - 1:
        return (s + 1) * (s + 2) / 2 / (n * n)
    return 1.0 - (2 * n - 2 - s) * (2 * n - 1 - s) / 2 / (n * n)


def dither_law(shift: int, signed: bool = True) -> tuple[int, npt.NDArray[np.float64]]:
    """(lowest value, pmf) of the dither the two servers add to a draw at
    F = shift ≥ 1: U_helper + U_leader + `dither_offset`, each U uniform in
    [0, 2^F)."""
    n = 1 << shift
    one = np.full(n, 1.0 / n)
    return dither_offset(shift, signed), np.convolve(one, one)


def _power_of_two_above(x: Fraction) -> Fraction:
    """The least 2^e ≥ x (x > 0)."""
    e = x.numerator.bit_length() - x.denominator.bit_length() + 1  # 2^e > x
    while Fraction(2) ** (e - 1) >= x:
        e -= 1
    return Fraction(2) ** e


@functools.lru_cache(maxsize=1024)
def _exp_lower(epsilon: Fraction) -> int:
    return _exp_bounds(epsilon, _EXP_PRECISION)[0]


def _within(ratio: Fraction, epsilon: Fraction) -> bool:
    """ratio ≤ e^ε, decided in integers from a rigorous lower bound of e^ε."""
    return ratio.numerator << _EXP_PRECISION <= _exp_lower(epsilon) * ratio.denominator


Digits = tuple[tuple[int, ...], tuple[int, ...]]


def _fit(
    scale: Fraction, precision: int, shift: int, cap: Fraction = JOINT_DELTA_CAP
) -> Digits | None:
    """The fewest digits at this precision whose tail past a shift by `shift`
    sensitivities, P(G ≥ 2^K − shift), is at most `cap` (the two-sided
    sampler's δ is half that); None if a digit needed cannot be fitted in 64
    bits."""
    # Start just below the ideal geometric's answer, P(G ≥ 2^K) = e^(−2^K/t) ≤ cap:
    # 2^K ≥ t·ln(1/cap) = t·64·ln 2 ≈ 44.4·t.
    k = max(2, shift.bit_length() + 1, math.floor(math.log2(float(scale) * 44.3)) - 1)
    while True:
        try:
            c, w = fitted_digits(scale, precision, k)
        except ValueError:
            return None
        if tail_mass(c, w, (1 << k) - shift) <= cap:
            return c, w
        k += 1


@functools.lru_cache(maxsize=256)
def joint_stream_noise(kind: StreamKind, epsilon: Fraction, frac_bits: int) -> JointStreamNoise:
    """The samplers and charge of a joint-noise stream of this kind and ε.
    ValueError for a kind that cannot take joint noise, or an ε no sampler of
    at most 64-bit digits fits."""
    model = noise_model(check_joint_kind(kind))
    ctt = kind == StreamKind.CTT
    shift = check_frac_bits(frac_bits)
    signed = model.query_family == "laplace"  # exp3: one-sided geometric
    ratio_at = shift_ratio if signed else one_sided_ratio
    # In sensitivities: the change of variables shifts ρ by 1 and ν by 2.
    t_rho = Fraction(model.threshold_coef) / epsilon
    t_nu = Fraction(model.query_coef) / epsilon
    # ν's tail is paid once per candidate (report-noisy-max: no γ) or per query.
    tournament = model.threshold_family == "none"
    nu_cap = JOINT_DELTA_CAP / (JOINT_MAX_TOURNAMENT if tournament else JOINT_MAX_QUERIES)

    def attempt(precision: int, m: int) -> tuple[Digits, Digits, Fraction, int] | None:
        """The samplers at this precision and inflation 1 + 2^−m, if they fit ε
        (for ctt with the least Close span that fits)."""
        inflation = 1 + Fraction(1, 1 << m)
        rho = ((), ()) if tournament else _fit(t_rho * inflation, precision, 1)
        nu = _fit(t_nu * inflation, precision, 2, nu_cap)
        if rho is None or nu is None:
            return None
        ratio = ratio_at(*nu, 2) * (ratio_at(*rho, 1) if rho[0] else 1)
        if not _within(ratio, epsilon):
            return None
        if not ctt:
            return rho, nu, ratio, 0
        found = _close_span(nu, ratio, epsilon)
        return None if found is None else (rho, nu, found[1], found[0])

    for precision in PRECISIONS:
        # The least inflation that fits at this precision, down to 1 + 2^−8 (not
        # monotone in m: a larger scale can take one digit more, whose
        # constant rounds differently, so each is tried).
        for m in INFLATION_EXPONENTS:
            if m < TARGET_INFLATION_EXPONENT:
                break
            if m > precision:  # rounding errors of 2^−p leave no room for 1 + 2^−m
                continue
            found = attempt(precision, m)
            if found is not None:
                rho, nu, ratio, span = found
                inflation = 1 + Fraction(1, 1 << m)
                return _stream(rho, nu, t_rho, t_nu, inflation, ratio, shift, signed, span)
    # No precision reaches 1 + 2^−8: the finest precision, least inflation that fits.
    for m in INFLATION_EXPONENTS:
        if m < TARGET_INFLATION_EXPONENT:
            found = attempt(PRECISIONS[-1], m)
            if found is not None:
                rho, nu, ratio, span = found
                inflation = 1 + Fraction(1, 1 << m)
                return _stream(rho, nu, t_rho, t_nu, inflation, ratio, shift, signed, span)
    raise ValueError(f"the joint sampler cannot fit epsilon={epsilon}")


def _stream(
    rho: Digits,
    nu: Digits,
    t_rho: Fraction,
    t_nu: Fraction,
    inflation: Fraction,
    ratio: Fraction,
    shift: int,
    signed: bool,
    span: int = 0,
) -> JointStreamNoise:
    # The mass a shift by 1 (γ) or 2 (ν) pushes past the top of the support;
    # the two-sided sampler reaches it with its positive half only.  ν's is
    # paid once per query a stream may end at (JOINT_MAX_QUERIES) or per
    # candidate of a tournament (no γ; JOINT_MAX_TOURNAMENT); ctt's Close
    # answer pays it divided by 1 − R₂·η (`_close_factor`).
    nu_tail = tail_mass(*nu, (1 << len(nu[0])) - 2)
    if span:
        factor = _close_factor(nu, span)
        assert factor is not None  # the span was chosen where it is
        nu_tail *= factor
    if rho[0]:
        delta = tail_mass(*rho, (1 << len(rho[0])) - 1) + JOINT_MAX_QUERIES * nu_tail
    else:
        delta = JOINT_MAX_TOURNAMENT * nu_tail
    if signed:
        delta /= 2
    return JointStreamNoise(
        *rho,
        *nu,
        t_rho * inflation,
        t_nu * inflation,
        inflation,
        ratio,
        delta,
        _power_of_two_above(delta),
        shift,
        signed,
        span,
    )


# -- CompareToThresholds with joint noise (docs/privacy.md, "ctt with joint noise")
#
# In whole sensitivities, with every dither fixed: High iff Z_ν + Z_ρ ≥ h, Low
# iff Z_ρ − Z_ν ≥ l (High first), Close otherwise, where h and l each move by at
# most 1 on a neighbour and h + l ≥ G − 3 for thresholds G sensitivities apart.
# Mapping Z_ρ ↦ Z_ρ + 1 keeps every High and every Low answer (a Low cannot turn
# High while 2·Z_ρ ≤ G − 6), and a Close answer's interval [a, b] of Z_ν becomes
# one that contains [a + 2, b − 2], where P(Z_ν ∈ [a, b]) ≤
# (R₂·P(Z_ν ∈ [a + 2, b − 2]) + tail)/(1 − R₂·η): R₂ = the shift ratio at 2, η
# bounds the mass of four points at the interval's far end relative to the
# whole interval, which holds at least `close_span` points while Z_ρ ≤ Z_max.
# Z_ρ > Z_max is charged to δ: that is the stream's own δ.


def _close_eta(nu: Digits, span: int) -> Fraction:
    """η for a Close interval of at least `span` (≥ 4) points of the
    two-sided law: its far end b lies ≥ B = ⌈(span − 2)/2⌉ above the centre, and
    P(ν ∈ [b − 1, b + 2]) ≤ ½·T(b − 1) against the interval's ≥ ½·(1 − T(B + 1))
    (when it reaches 0) or ≥ ½·(T(a) − T(b − 1)) ≥ ½·T(a)·(1 − ρ) (when a ≥ 1, ρ
    the tail's decay over span − 2 points), T(m) = P(G ≥ m)."""
    c, w = nu
    far = (span - 1) // 2  # ⌈(span − 2)/2⌉
    eta1 = tail_mass(c, w, far - 1) / (1 - tail_mass(c, w, far + 1))
    decay = tail_decay(c, w, span - 2)
    eta2 = decay / (1 - decay) if decay < 1 else Fraction(1 << 64)
    return max(eta1, eta2)


def _close_factor(nu: Digits, span: int) -> Fraction | None:
    """1/(1 − R₂·η): what a Close answer costs on top of R₂, or None when
    R₂·η ≥ 1 (the span is too short to bound it)."""
    r2_eta = shift_ratio(*nu, 2) * _close_eta(nu, span)
    return None if r2_eta >= 1 else 1 / (1 - r2_eta)


def _close_span(nu: Digits, ratio: Fraction, epsilon: Fraction) -> tuple[int, Fraction] | None:
    """A span whose Close factor keeps ratio·factor within e^ε, with that
    product; None if no span up to past the support does.  The least 2^k + 2
    (k ≥ 1) that fits, then a bisection down to the ladder's step before it:
    a span s with s − 1 failing (the bound at s holds for every longer
    interval, so any s that fits is sound; the bisection only narrows the gap)."""

    def fits(span: int) -> Fraction | None:
        factor = _close_factor(nu, span)
        return ratio * factor if factor is not None and _within(ratio * factor, epsilon) else None

    for k in range(1, len(nu[0]) + 2):
        hi = (1 << k) + 2
        product = fits(hi)
        if product is None:
            continue
        lo = (1 << (k - 1)) + 2 if k > 1 else 3  # fails (or is below the least span, 4)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = fits(mid)
            if found is None:
                lo = mid
            else:
                hi, product = mid, found
        return hi, product
    return None


@functools.lru_cache(maxsize=1024)
def joint_ctt_gap(epsilon: Fraction, delta: Fraction, frac_bits: int) -> int:
    """The least τH − τL, in score units (whole sensitivities), that a
    CompareToThresholds stream of a joint-noise task accepts: 2·Z_max + 4 +
    `close_span`, where Z_max is the least z ≥ 0 with P(Z_ρ > z) ≤ δ (at most
    2^K − 2, where the sampler's own δ covers the rest).  ValueError for ε or δ
    outside (0, 1) or an ε the sampler cannot fit."""
    check_ctt_parameters(epsilon, delta)
    noise = joint_stream_noise(StreamKind.CTT, epsilon, frac_bits)
    c, w = noise.threshold_constants, noise.threshold_widths
    lo, hi = 0, (1 << len(c)) - 2
    while lo < hi:  # P(Z_ρ > z) = ½·P(G ≥ z + 1), non-increasing in z
        mid = (lo + hi) // 2
        if tail_mass(c, w, mid + 1) / 2 <= delta:
            hi = mid
        else:
            lo = mid + 1
    return 2 * lo + 4 + noise.close_span


def joint_charge(request: StreamRequest, frac_bits: int) -> Fraction:
    """The δ a stream of a joint-noise task is charged: the stream's own δ (ctt's
    Z_ρ > Z_max; 0 for the other kinds) plus the sampler's (`delta_charge`).  The
    one rule for both servers and both oracles; ValueError for a kind or ε the
    sampler does not cover."""
    noise = joint_stream_noise(request.kind, request.epsilon, frac_bits)
    return request.delta + noise.delta_charge


def joint_group_delta(
    streams: Iterable[tuple[StreamKind | str, Fraction]], frac_bits: int
) -> Fraction:
    """The δ a plan group must hold on a joint-noise task for `streams` (kind, ε)
    to open in it: the sum of their charged δ (each rounded up to its power of
    two, as the servers charge it; basic composition inside the group, as
    `dp.plans.PlanBook.admit` counts it).  Exact; ValueError for a kind or ε the
    joint sampler does not cover."""
    total = Fraction(0)
    for kind, eps in streams:
        total += joint_stream_noise(StreamKind.parse(kind), Fraction(eps), frac_bits).delta_charge
    return total


def joint_allowance(epsilon: Fraction, epsilon_min: Fraction) -> Fraction:
    """The δ a plan group of ε must hold on a joint-noise task when the streams
    it will open are not known in advance (an adaptive algorithm): every stream
    takes at least the task's epsilon_min, so at most ⌊ε / epsilon_min⌋ of them
    open, and each is charged at most `JOINT_DELTA_CAP`.  An upper bound; a basic
    plan returns what its streams did not use when it ends."""
    if epsilon_min <= 0:
        raise ValueError("epsilon_min must be > 0")
    return (Fraction(epsilon) // Fraction(epsilon_min)) * JOINT_DELTA_CAP
