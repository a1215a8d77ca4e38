"""The single definition of every stream kind's noise model.

All scales are exact rationals in units of the encoded grid: a scale `c * Δ / ε`
with Δ = 2^F.  In the two-server system each server draws its *own* full-scale
noise for every term, so the total noise is the sum of two independent draws;
`parties` says which of the two models an accuracy bound is for.

Why two full draws are private against one corrupt server: the corrupt server
knows its own draws, so to it and the analyst the honest server's draws alone
randomise the test, with the corrupt server's terms acting as a data-independent
shift of each query's threshold.  AboveThreshold with adaptively chosen
per-query thresholds is ε-DP (Lyu, Su, Li 2017, Algorithm 1 allows them), so
each stream stays ε-DP.  CompareToThresholds needs more; see `ctt_gap`.

Report-noisy-max (`NMAX`) has no threshold: each server adds one-sided
geometric noise of scale 2Δ/ε to its share of every candidate, and only the
argmax of the sums is revealed.  With the corrupt server's draws fixed, that is
report-noisy-max on shifted scores of sensitivity Δ, ε-DP on the integer grid
(`dp.noisy_max`, docs/privacy.md).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Literal

from svtagg.mpc.ring import RING_BITS, can_wrap, sensitivity, wrap_bound

#: "none": the kind draws no such term (report-noisy-max has no threshold noise).
Family = Literal["laplace", "geometric", "none"]

#: Each draw is clamped to +-TAIL_SCALES * scale so that the overflow bound is a
#: theorem.  The clamped mass is at most 2 * exp(-4096) < 2^-5900 per draw, far
#: below any δ anyone would charge; we state it rather than hide it.
TAIL_SCALES = 4096


class StreamKind(StrEnum):
    """Noise family of a stream, chosen when it is opened."""

    LAP24 = "lap24"  # Algorithms 1-3: γ ~ Lap(2Δ/ε), ν ~ Lap(4Δ/ε)
    LAP3 = "lap3"  # note, Mechanism One: γ, ν ~ Lap(3Δ/ε)
    EXP3 = "exp3"  # note, Mechanism Two: γ, ν ~ one-sided Exp(3Δ/ε)
    CTT = "ctt"  # CompareToThresholds (Algorithms 4-5): γ ~ Lap(2Δ/ε), ν ~ Lap(6Δ/ε)
    NMAX = "nmax"  # report-noisy-max: no γ; ν ~ one-sided Exp(2Δ/ε) per candidate
    #: One level of a prefix crawl (dp/crawl.py): no γ; ν ~ Lap(2/ε) per
    #: candidate on the *counts* (one unit per user, not the task's grid).
    CRAWL = "crawl"

    @classmethod
    def parse(cls, value: str | StreamKind) -> StreamKind:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(k.value for k in cls)
            raise ValueError(f"unknown stream kind {value!r}; expected one of {names}") from None


#: The AboveThreshold kinds: first-YES streams of (query, τ) pairs (Ask chunks).
ABOVE_THRESHOLD_KINDS = frozenset({StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3})


@dataclass(frozen=True)
class NoiseModel:
    """Families and coefficients of the threshold noise γ and per-query noise ν."""

    kind: StreamKind
    threshold_family: Family
    threshold_coef: int
    query_family: Family
    query_coef: int

    def threshold_scale(self, epsilon: Fraction, frac_bits: int) -> Fraction:
        return Fraction(self.threshold_coef * sensitivity(frac_bits)) / epsilon

    def query_scale(self, epsilon: Fraction, frac_bits: int) -> Fraction:
        return Fraction(self.query_coef * sensitivity(frac_bits)) / epsilon

    def noise_bound_per_party(self, epsilon: Fraction, frac_bits: int) -> int:
        """Clamp bound of one party's γ plus ν, in grid units."""
        return clamp_bound(self.threshold_scale(epsilon, frac_bits)) + clamp_bound(
            self.query_scale(epsilon, frac_bits)
        )


NOISE_MODELS: dict[StreamKind, NoiseModel] = {
    StreamKind.LAP24: NoiseModel(StreamKind.LAP24, "laplace", 2, "laplace", 4),
    StreamKind.LAP3: NoiseModel(StreamKind.LAP3, "laplace", 3, "laplace", 3),
    StreamKind.EXP3: NoiseModel(StreamKind.EXP3, "geometric", 3, "geometric", 3),
    StreamKind.CTT: NoiseModel(StreamKind.CTT, "laplace", 2, "laplace", 6),
    StreamKind.NMAX: NoiseModel(StreamKind.NMAX, "none", 0, "geometric", 2),
    # The crawl draws its noise on counts (dp.crawl.draw_level_noise, scale
    # 2/ε); stated here on the grid (2·2^F/ε), which only over-states the
    # bound the overflow checks take.
    StreamKind.CRAWL: NoiseModel(StreamKind.CRAWL, "none", 0, "laplace", 2),
}


def noise_model(kind: StreamKind | str) -> NoiseModel:
    return NOISE_MODELS[StreamKind.parse(kind)]


def clamp_bound(scale: Fraction) -> int:
    """Grid bound a single draw of this scale is clamped to."""
    return math.ceil(TAIL_SCALES * scale)


#: Decimal, optional exponent of at most 3 digits, or a ratio of integers: the
#: forms a user may write.  Bounding the text bounds the work of parsing it
#: (Fraction("1e-10000000") alone takes seconds).
_NUMBER_RE = re.compile(
    r"[+-]?(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][+-]?\d{1,3})?|[+-]?\d{1,80}/\d{1,80}"
)
#: Rationals from users are limited to this many bits of numerator and denominator.
MAX_RATIONAL_BITS = 512


def as_fraction(value: Fraction | int | float | str, name: str = "value") -> Fraction:
    """Exact rational from user input; floats go through their shortest repr.

    Text must look like a number (decimal with an exponent of at most 3 digits,
    or p/q), and the result is limited to MAX_RATIONAL_BITS, so that hostile
    input cannot make parsing or exact arithmetic expensive.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got a bool")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if isinstance(value, Fraction):
        out = value
    else:
        text = str(value).strip()
        if not _NUMBER_RE.fullmatch(text):
            raise ValueError(f"{name} must be a number, got {_shown(value)}")
        try:
            out = Fraction(text)
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"{name} must be a number, got {_shown(value)}") from exc
    if max(out.numerator.bit_length(), out.denominator.bit_length()) > MAX_RATIONAL_BITS:
        raise ValueError(f"{name} is too large or too precise: {_shown(value)}")
    return out


def _shown(value: object, limit: int = 40) -> str:
    """`value` as a refusal quotes it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def check_epsilon(epsilon: Fraction | int | float | str) -> Fraction:
    eps = as_fraction(epsilon, "epsilon")
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    return eps


#: Largest ε one stream may use.  Beyond it the noise scale is below Δ/16 and
#: the stream is all but exact; the cap also bounds the sampler's exact
#: arithmetic, whose cost grows with ε (digits of exp(2^K ε / (cΔ))).
MAX_STREAM_EPSILON = 64


def ctt_gap(epsilon: Fraction, delta: Fraction, parties: int = 1) -> float:
    """Minimum τH − τL (score units) for a CompareToThresholds stream.

    One party: the gap of Algorithm 4, (12/ε)(ln(10/ε) + ln(1/δ) + 1).
    Two parties: the corrupt server knows its own threshold draw n_L, which moves
    the two thresholds *towards each other* by 2·n_L.  For the discrete Laplace
    law, P(n_L ≥ x) = q^x/(1+q) ≤ δ at x = (2/ε)·ln(1/δ), so we widen the gap by
    twice that and the stream is charged (ε, 2δ) (see `ctt_delta_charge`).
    """
    check_ctt_parameters(epsilon, delta)
    eps, dl = float(epsilon), float(delta)
    if eps <= 0 or dl <= 0:  # a positive rational too small for a float
        raise ValueError(f"epsilon and delta are too small: {epsilon}, {delta}")
    gap = (12.0 / eps) * (math.log(10.0 / eps) + math.log(1.0 / dl) + 1.0)
    if parties == 2:
        # Discrete tail: P(γ_L ≥ x) = q^x / (1 + q) ≤ e^{−xε/2} = δ at x = (2/ε)ln(1/δ).
        gap += 2.0 * (2.0 / eps) * math.log(1.0 / dl)
    return gap


def check_ctt_parameters(epsilon: Fraction, delta: Fraction) -> None:
    """Algorithms 4–5 (and their gap) are stated for ε, δ ∈ (0, 1): at ε ≥ 1 the
    ln(10/ε) term can go negative enough to make the gap meaningless, so larger
    parameters are refused everywhere (oracles, servers, CLI)."""
    if not 0 < epsilon < 1:
        raise ValueError(f"CompareToThresholds needs 0 < epsilon < 1, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"CompareToThresholds needs 0 < delta < 1, got {delta}")


def ctt_delta_charge(delta: Fraction, parties: int) -> Fraction:
    """δ a CompareToThresholds stream charges: δ alone, or 2δ with two servers."""
    return delta * 2 if parties == 2 else delta


def overflow_possible(
    n_max: int,
    frac_bits: int,
    epsilon_min: Fraction | float | str,
    kind: StreamKind | str,
    tau_bound: int | None = None,
    parties: int = 2,
) -> bool:
    """Whether z_L + z_H could wrap mod 2^64 for these task parameters.

    tau_bound defaults to the largest threshold a server accepts:
    `default_tau_bound(n_max, frac_bits)` grid units.
    """
    eps = check_epsilon(epsilon_min)
    if tau_bound is None:
        tau_bound = default_tau_bound(n_max, frac_bits)
    bound = noise_model(kind).noise_bound_per_party(eps, frac_bits)
    return can_wrap(n_max, frac_bits, tau_bound, bound, parties)


def default_tau_bound(n_max: int, frac_bits: int) -> int:
    """Thresholds beyond ±4·n_max (score units) carry no information; refuse them."""
    return 4 * n_max * sensitivity(frac_bits)


def stream_width(n_max: int, frac_bits: int, kind: StreamKind | str, epsilon: Fraction) -> int:
    """The comparison width w of a stream of `kind` at budget ε in a task of
    n_max and F = frac_bits: the least w, in bits, with wrap_bound < 2^(w−1)
    (docs/mpc.md, "Width from public parameters").  Both servers derive it from
    these public values alone; every AND gate, OT and table of a comparison is
    per bit of w, so a bit of slack costs ≈ 1/w of a chunk."""
    if not isinstance(kind, StreamKind) or not isinstance(epsilon, Fraction):
        kind, epsilon = (
            StreamKind.parse(kind),
            Fraction(epsilon),
        )  # not per chunk: servers pass these
    return _stream_width(n_max, frac_bits, kind, epsilon)


@functools.lru_cache(maxsize=1024)
def _stream_width(n_max: int, frac_bits: int, kind: StreamKind, epsilon: Fraction) -> int:
    noise = noise_model(kind).noise_bound_per_party(epsilon, frac_bits)
    bound = wrap_bound(n_max, frac_bits, default_tau_bound(n_max, frac_bits), noise, parties=2)
    return min(RING_BITS, bound.bit_length() + 1)


@dataclass(frozen=True)
class StreamRequest:
    """A validated request to open a stream: what it is and what it charges."""

    kind: StreamKind
    epsilon: Fraction
    delta: Fraction
    charge_delta: Fraction


def validate_stream(
    kind: StreamKind | str,
    epsilon: Fraction | int | float | str,
    delta: Fraction | int | float | str,
    parties: int,
) -> StreamRequest:
    """The one check every oracle and server applies before charging a stream.

    AboveThreshold and report-noisy-max kinds are pure ε-DP (δ must be 0); CompareToThresholds needs
    ε, δ ∈ (0, 1) and charges `ctt_delta_charge(δ, parties)`.  Raises ValueError.
    """
    k = StreamKind.parse(kind)
    eps = check_epsilon(epsilon)
    if eps > MAX_STREAM_EPSILON:
        raise ValueError(f"a stream's epsilon is at most {MAX_STREAM_EPSILON}, got {eps}")
    dl = as_fraction(delta, "delta")
    if k == StreamKind.CTT:
        ctt_gap(eps, dl, parties)  # validates ε, δ ∈ (0, 1)
        return StreamRequest(k, eps, dl, ctt_delta_charge(dl, parties))
    if dl != 0:
        what = {StreamKind.NMAX: "a report-noisy-max", StreamKind.CRAWL: "a crawl level's"}.get(
            k, "an AboveThreshold"
        )
        raise ValueError(f"{what} stream is pure ε-DP; got delta={dl}")
    return StreamRequest(k, eps, dl, Fraction(0))
