"""The exact law and privacy loss of the jointly generated noise
(`svtagg.mpc.jointnoise`), finite precision included.

The sampler draws K independent digits, digit i equal to 1 with probability
exactly p_i = c_i / 2^b_i (a b_i-bit uniform compared with the public constant
c_i; one width b for every digit, or one each: `Widths`), a fair sign s, and
outputs ν = G = Σ g_i 2^i for s = 0 and ν = −G − 1 for s = 1 (the one-sided
sampler, `signed=False`, outputs G).  So, with f_i(1) = c_i and
f_i(0) = 2^b_i − c_i,

    P(G = g) = Π_i f_i(g_i) / 2^(Σ b_i)            for 0 ≤ g < 2^K,
    P(ν = x) = ½ P(G = x) (x ≥ 0),  ½ P(G = −x − 1) (x < 0),

all exact rationals (`magnitude_weights`, `pmf`).  The ideal p_i would be
1/(1 + e^(2^i/t)), which makes G geometric with ratio e^(−1/t) and ν a discrete
Laplace centred at −½; the rounded c_i and the K-digit truncation make the law
slightly different, and it is this law, not the ideal one, whose privacy loss
is derived here.

Privacy loss for additive noise of sensitivity Δ: neighbouring inputs shift the
noise by some d with 1 ≤ |d| ≤ Δ.  The law is symmetric about −½
(P(ν = x) = P(ν = −x − 1)), so the ratios for −d are the reciprocals of those
for +d, and the loss bound is

    e^ε = max over 1 ≤ d ≤ Δ and over x with P(ν = x), P(ν = x + d) > 0 of
          max(P(ν = x)/P(ν = x + d), P(ν = x + d)/P(ν = x)).

The pairs (x, x + d) are of two kinds: on one side of zero, a pair (g, g + d)
of magnitudes; across zero (x = −g − 1, x + d = h), a pair with g + h = d − 1.
Both are constraints of a binary adder, so the extreme ratio Π f_i(g_i)/f_i(h_i)
is found exactly by a dynamic programme over the digits with the carry as
state (`_extreme_ratio`), O(K) per d, with integer numerators and
denominators — no enumeration of the 2^(K+1) support.  Where the shifted point
leaves the support ([−2^K, 2^K)) the ratio is unbounded; that mass is
δ = max_d P(ν ≥ 2^K − d) = ½ P(G ≥ 2^K − Δ) (`tail_mass`), and with e^ε ≥ every
finite ratio, the hockey-stick divergence of the pair is exactly that mass, so
the noise gives (ε, δ) for sensitivity Δ (`privacy_loss`).

As SVT noise: the usual change-of-variables proof shifts the threshold noise
by Δ and the one answered query's noise by 2Δ (Δ for monotone queries); with
these pointwise bounds and the shifted points that leave the support charged
to δ, the stream costs (ε_ρ + ε_ν, δ_ρ + δ_ν), each term `privacy_loss` at its
shift; `dp.jointsvt` charges it (docs/privacy.md).

For the one-sided law only upward shifts occur (`one_sided_ratio`, the same
programme in one direction) and δ = P(G ≥ 2^K − Δ).  `fitted_digits` picks
the constants and widths the servers use (a fixed number of significant bits
per digit).

`sample` draws from this law exactly, as the circuit does, for the local
simulation; `abs_tail` gives P(|ν| > a) for the accuracy bounds of one draw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.dp.noise import RandomSource, _digits
from svtagg.mpc.ring import Widths, widths_of

#: Above this many digits `pmf` refuses to enumerate the support.
MAX_ENUMERATED_DIGITS = 20
#: The most significant bits per digit (`fitted_digits`' precision).
MAX_WIDTH = 64
#: The widest digit: a rare one (probability far below 2^−64, where a
#: per-query tail far below 2^−64 is needed: `dp.jointsvt`) takes a uniform of
#: two 64-bit words.
MAX_RARE_WIDTH = 128


def sampler_constants(
    scale: Fraction, bits: int, digits: int | None = None, min_constant: int = 1
) -> tuple[int, ...]:
    """c_i = round(2^b / (1 + e^(2^i/t))) for i = 0, 1, …, exact (the digits of
    the logistic value come from `dp.noise`'s interval arithmetic, so no float
    is involved; an exact half cannot occur since the value is irrational).

    Without `digits`, K counts the digits whose constant is ≥ `min_constant`.
    With the default 1, beyond K the rounded probability is 0 anyway; but a
    small c_i is a coarse approximation of p_i (c_i = 1 stands for anything in
    [½, 1.5)/2^b), and a pair of neighbouring outputs that differ in digit i
    pays log(c_i) error in full, so a larger `min_constant` (e.g. 2^(b/2))
    trades a little truncation mass (δ) for an ε close to the ideal d/t.
    """
    if scale <= 0:
        raise ValueError("scale must be > 0")
    out: list[int] = []
    i = 0
    while digits is None or i < digits:
        y = Fraction(1 << i) / Fraction(scale)
        c = (_digits(y, "logistic", bits + 1) + 1) >> 1
        if c < min_constant:
            if digits is not None:
                raise ValueError(f"digit {i} rounds below {min_constant} at {bits} bits")
            break
        out.append(c)
        i += 1
    if not out:
        raise ValueError("the first digit rounds below min_constant: more bits needed")
    return tuple(out)


def fitted_digits(
    scale: Fraction, precision: int, digits: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(c_i, b_i) for i < `digits`, each digit as narrow as `precision`
    significant bits allow: b_i is the least width with
    c_i = round(2^b_i / (1 + e^(2^i/t))) ≥ 2^(precision − 1), so every c_i and
    every 2^b_i − c_i carry a relative rounding error below 2^−precision — up
    to `MAX_RARE_WIDTH` bits, with fewer significant bits, for a digit whose
    probability is below 2^(precision − 129) (its error counts in the exact
    loss like any other).  A digit wider than 64 bits (probability below
    2^(precision − 65): a rare top digit, which the per-query tails of
    `dp.jointsvt` call for) takes a uniform of two words.  ValueError if a
    digit rounds to 0 at 128 bits."""
    if scale <= 0:
        raise ValueError("scale must be > 0")
    if not 2 <= precision <= MAX_WIDTH:
        raise ValueError(f"precision must be in [2, {MAX_WIDTH}]")
    t = Fraction(scale)
    digits_ = [_fitted_digit(t.numerator, t.denominator, precision, i) for i in range(digits)]
    return tuple(c for c, _ in digits_), tuple(b for _, b in digits_)


@functools.lru_cache(maxsize=8192)
def _fitted_digit(num: int, den: int, precision: int, i: int) -> tuple[int, int]:
    """(c_i, b_i) of `fitted_digits` at the scale num/den; cached, since the
    accounting grows K one digit at a time and tries several precisions."""
    floor = 1 << (precision - 1)
    top = MAX_RARE_WIDTH
    full = _digits(Fraction(den << i, num), "logistic", top + 1)  # floor(p_i·2^129)
    lead = full.bit_length() - top - 1  # p_i's leading 1 is at 2^lead
    b = min(top, max(precision, precision - lead))
    c = ((full >> (top - b)) + 1) >> 1  # round(p_i·2^b), from the same digits
    if c < floor and b < top:  # rounding down across a power of two
        b += 1
        c = ((full >> (top - b)) + 1) >> 1
    if c < 1:
        raise ValueError(f"digit {i} rounds to 0 at {MAX_RARE_WIDTH} bits: too many digits")
    return c, b


def _factors(constants: tuple[int, ...], bits: Widths) -> list[tuple[int, int]]:
    """(f_i(0), f_i(1)) = (2^b_i − c_i, c_i) per digit."""
    return [((1 << b) - c, c) for c, b in zip(constants, widths_of(constants, bits), strict=True)]


def magnitude_weights(constants: tuple[int, ...], bits: Widths) -> list[int]:
    """2^(Σ b_i) · P(G = g) for g = 0 .. 2^K − 1: exact integers."""
    k = len(constants)
    if k > MAX_ENUMERATED_DIGITS:
        raise ValueError(f"{k} digits: the support is too large to enumerate")
    w = [1]
    for f0, f1 in _factors(constants, bits):  # digit i doubles the table
        w = [x * f0 for x in w] + [x * f1 for x in w]
    return w


def total_width(constants: tuple[int, ...], bits: Widths) -> int:
    """Σ b_i: the uniform bits the digits take, and log2 of `magnitude_weights`' total."""
    return sum(widths_of(constants, bits))


def pmf(constants: tuple[int, ...], bits: Widths, signed: bool = True) -> dict[int, Fraction]:
    """P(ν = x) for every x in the support [−2^K, 2^K), as exact Fractions; with
    `signed` False, P(G = g) on [0, 2^K) (the one-sided sampler)."""
    w = magnitude_weights(constants, bits)
    if not signed:
        den1 = 1 << total_width(constants, bits)
        return {g: Fraction(v, den1) for g, v in enumerate(w)}
    den = 2 << total_width(constants, bits)
    out = {g: Fraction(v, den) for g, v in enumerate(w)}
    out.update({-g - 1: Fraction(v, den) for g, v in enumerate(w)})
    return out


def _adder_pairs(k: int, target: int, add: bool) -> Iterator[tuple[int, int, int, int, int]]:
    """The steps of a digit DP over pairs (g, h) of K-bit numbers with h = g + d
    (add = False; target = d) or g + h = m (add = True; target = m): yields
    (i, carry in, g_i, h_i, carry out) for every consistent digit choice."""
    for i in range(k):
        t = (target >> i) & 1
        for c in (0, 1):
            for gi in (0, 1):
                if add:
                    for hi in (0, 1):
                        if gi ^ hi ^ c == t:
                            yield i, c, gi, hi, (gi + hi + c) >> 1
                else:
                    hi = gi ^ t ^ c
                    yield i, c, gi, hi, (gi + t + c) >> 1


def _extreme_ratio(
    constants: tuple[int, ...], bits: Widths, target: int, add: bool, largest: bool
) -> Fraction | None:
    """max (or min) of P(G = g)/P(G = h) over the pairs of `_adder_pairs`, or None
    if there is no pair.  Ratios are kept as (numerator, denominator) integers."""
    k = len(constants)
    f = _factors(constants, bits)
    final_carry = target >> k  # h = g + d must not overflow; g + h may carry into bit K
    if final_carry > (1 if add else 0):
        return None
    best: list[tuple[int, int] | None] = [(1, 1), None]  # by carry, before digit 0
    layer: list[tuple[int, int] | None] = [None, None]
    current = 0
    for i, c, gi, hi, co in _adder_pairs(k, target, add):
        if i != current:
            best, layer, current = layer, [None, None], i
        prev = best[c]
        if prev is None:
            continue
        cand = (prev[0] * f[i][gi], prev[1] * f[i][hi])
        old = layer[co]
        if old is None or (cand[0] * old[1] > old[0] * cand[1]) == largest:
            layer[co] = cand
    end = layer[final_carry]
    return None if end is None else Fraction(*end)


@dataclass(frozen=True)
class PrivacyLoss:
    """(ε, δ) of the sampler as additive noise for sensitivity Δ: `ratio` = e^ε
    exactly, `delta` exact; `epsilon` is its natural log (a float, for display)."""

    ratio: Fraction
    delta: Fraction

    @property
    def epsilon(self) -> float:
        return math.log(self.ratio.numerator) - math.log(self.ratio.denominator)


def shift_ratio(constants: tuple[int, ...], bits: Widths, d: int) -> Fraction:
    """The largest P(ν = x)/P(ν = x + d) or its reciprocal over the support, for a
    shift 1 ≤ d ≤ 2^K."""
    k = len(constants)
    if not 1 <= d <= 1 << k:
        raise ValueError("shift out of range")
    found: list[Fraction] = []
    for target, add in ((d, False), (d - 1, True)):  # one side, across zero
        hi = _extreme_ratio(constants, bits, target, add, True)
        lo = _extreme_ratio(constants, bits, target, add, False)
        found += [r for r in (hi, None if lo is None else 1 / lo) if r is not None]
    return max(found)


def one_sided_ratio(constants: tuple[int, ...], bits: Widths, d: int) -> Fraction:
    """The largest P(G = g)/P(G = g + d) over 0 ≤ g < g + d < 2^K: what a shift of
    the one-sided sampler by +d costs (the change of variables for one-sided
    noise only ever shifts upwards; docs/privacy.md)."""
    k = len(constants)
    if not 1 <= d < 1 << k:
        raise ValueError("shift out of range")
    ratio = _extreme_ratio(constants, bits, d, False, True)
    assert ratio is not None  # g = 0 is a pair
    return ratio


def digit_growth(constants: tuple[int, ...], bits: Widths, i: int) -> Fraction:
    """r_i: the largest P(H = y + 1)/P(H = y) for H = G >> i (the digits i .. K − 1,
    independent of the lower ones), 0 if i ≥ K.  It bounds the tail's decay over
    a step of 2^i: P(G ≥ a + 2^i) ≤ r_i·P(G ≥ a) for every a ≥ 0, since with
    a = A·2^i + α, P(G ≥ a) = P(H ≥ A + 1) + P(H = A)·P(G mod 2^i ≥ α) and the
    step moves both H terms up by one (CompareToThresholds' Close answer,
    `dp.jointsvt`, docs/privacy.md).  Exact, by the same digit programme."""
    k = len(constants)
    if i >= k:
        return Fraction(0)
    widths = widths_of(constants, bits)
    least = _extreme_ratio(constants[i:], widths[i:], 1, False, False)
    assert least is not None  # y = 0 is a pair
    return 1 / least


def tail_decay(constants: tuple[int, ...], bits: Widths, j: int) -> Fraction:
    """An upper bound on max over a ≥ 0 with P(G ≥ a) > 0 of P(G ≥ a + j)/P(G ≥ a)
    for j ≥ 1: the product of `digit_growth` over the binary digits of j (a step
    of j is steps of its powers of two), at most 1."""
    if j < 1:
        raise ValueError("j must be >= 1")
    out = Fraction(1)
    for i in range(j.bit_length()):
        if (j >> i) & 1:
            out *= digit_growth(constants, bits, i)
    return min(out, Fraction(1))


def tail_mass(constants: tuple[int, ...], bits: Widths, m: int) -> Fraction:
    """P(G ≥ m), exact, by walking m's digits from the top: O(K)."""
    k = len(constants)
    if m <= 0:
        return Fraction(1)
    if m >= 1 << k:
        return Fraction(0)
    widths = widths_of(constants, bits)
    # In integers over the common denominator 2^(Σ b_i) of the digits walked.
    total, prefix = 0, 1  # prefix: G agrees with m on the digits so far
    for i in reversed(range(k)):
        c, one = constants[i], 1 << widths[i]
        if (m >> i) & 1:
            total, prefix = total * one, prefix * c
        else:  # G has a 1 where m has a 0: G > m
            total, prefix = total * one + prefix * c, prefix * (one - c)
    return Fraction(total + prefix, 1 << sum(widths))  # ... or G = m


def privacy_loss(constants: tuple[int, ...], bits: Widths, sensitivity: int) -> PrivacyLoss:
    """(ε, δ) for additive noise of this sampler with sensitivity Δ: the largest
    ratio over every shift 1 ≤ d ≤ Δ and the mass that a shift by Δ pushes out
    of the support (see the module docstring).  O(Δ·K)."""
    k = len(constants)
    if not 1 <= sensitivity <= 1 << k:
        raise ValueError(f"sensitivity must be in [1, 2^K] = [1, {1 << k}]")
    ratio = max(shift_ratio(constants, bits, d) for d in range(1, sensitivity + 1))
    return PrivacyLoss(ratio, tail_mass(constants, bits, (1 << k) - sensitivity) / 2)


def brute_force_loss(constants: tuple[int, ...], bits: Widths, sensitivity: int) -> PrivacyLoss:
    """`privacy_loss` by enumerating the support (small K only): the reference the
    dynamic programme is tested against."""
    p = pmf(constants, bits)
    ratio, delta = Fraction(1), Fraction(0)
    for d in range(1, sensitivity + 1):
        for x, px in p.items():
            q = p.get(x + d)
            if q is None:
                continue
            ratio = max(ratio, px / q, q / px)
        delta = max(delta, sum((px for x, px in p.items() if x + d not in p), Fraction(0)))
    return PrivacyLoss(ratio, delta)


def sample(
    constants: tuple[int, ...], bits: Widths, k: int, rng: RandomSource, signed: bool = True
) -> npt.NDArray[np.int64]:
    """k independent draws of ν from exactly this law, digit by digit as the
    circuit draws them: digit i is [U_i < c_i] for a uniform b_i-bit U_i (the low
    b_i bits of a CSPRNG word), the sign one more bit.  For the local simulation
    of a joint-noise task; the servers draw inside the garbled circuit."""
    widths = widths_of(constants, bits)
    if not all(1 <= b <= MAX_RARE_WIDTH for b in widths):
        raise ValueError(f"bits must be in [1, {MAX_RARE_WIDTH}]")
    g = np.zeros(k, dtype=np.int64)
    for i, (c, b) in enumerate(zip(constants, widths, strict=True)):
        if b <= 64:
            u = rng.u64(k) & np.uint64((1 << b) - 1)
            g |= (u < np.uint64(c)).astype(np.int64) << i
            continue
        # Two words: U = hi·2^64 + lo < c  ⟺  hi < c_hi, or hi = c_hi and lo < c_lo.
        hi = rng.u64(k) & np.uint64((1 << (b - 64)) - 1)
        lo = rng.u64(k)
        c_hi, c_lo = np.uint64(c >> 64), np.uint64(c & ((1 << 64) - 1))
        g |= ((hi < c_hi) | ((hi == c_hi) & (lo < c_lo))).astype(np.int64) << i
    if not signed:
        return g
    sign = (rng.u64(k) & np.uint64(1)).astype(bool)
    return np.where(sign, -g - 1, g)


def abs_tail(constants: tuple[int, ...], bits: Widths, a: int) -> float:
    """P(|ν| > a) for an integer a ≥ 0, in floating point (for accuracy bounds,
    never for the privacy charge): ν > a is G ≥ a + 1 with sign 0, ν < −a is
    G ≥ a with sign 1 (ν = −G − 1)."""
    return 0.5 * (float_tail(constants, bits, a + 1) + float_tail(constants, bits, a))


def float_tail(constants: tuple[int, ...], bits: Widths, m: int) -> float:
    """`tail_mass` in floating point."""
    k = len(constants)
    if m <= 0:
        return 1.0
    if m >= 1 << k:
        return 0.0
    p = [c / float(1 << b) for c, b in zip(constants, widths_of(constants, bits), strict=True)]
    total, prefix = 0.0, 1.0
    for i in reversed(range(k)):
        if (m >> i) & 1:
            prefix *= p[i]
        else:
            total += prefix * p[i]
            prefix *= 1.0 - p[i]
    return total + prefix
