"""Report-noisy-max on the integer grid: the mechanism as pure code (the
reference the servers' distributed version is tested against) and its exact
output law, from which its privacy loss is read.

The mechanism (stream kind `NMAX`).  Candidates are integer scores s_1..s_k in
grid units, each moving by at most Δ = 2^F when one user is replaced.  Each
party draws, for every candidate, one-sided geometric noise

    P(G = g) = (1 − q)·q^g,  g = 0, 1, ...,   q = exp(−1/t),  t = 2Δ/ε

(`kinds.NOISE_MODELS[NMAX]`, drawn exactly by `dp.noise`), and the output is
the *first* index maximising s_j + Σ_parties G_j (ties go to the smaller index,
as in the garbled tournament, `mpc.circuits.argmax_circuit`).

Privacy (docs/privacy.md, "Report-noisy-max").  One party, any integer scores:
fix the other candidates' noise; candidate i wins iff G_i ≥ a, where
a = max(max_{j<i}(s_j + G_j) + 1, max_{j>i}(s_j + G_j)) − s_i.  On a neighbour
every s_j moves by at most Δ, so a moves by at most 2Δ, and
P(G ≥ a) = q^max(a, 0) changes by a factor of at most q^−2Δ = e^ε.  Averaging
over the other draws (independent of the data) gives P(i | D) ≤ e^ε P(i | D')
for every i: ε-DP with no δ, ties included.  Two parties: the corrupt party's
draws are known constants that shift the scores, so the honest party's draws
alone make the output ε-DP; without a corrupt party the output law is a mixture
over those constants of ε-DP laws.

`exact_law` is the one-party law in exact rationals for a rational q (the
inclusion–exclusion below; no float, no truncation), `output_law` the law for
one or two parties at q = exp(−1/t) in floats (truncated where the remaining
mass is below 2^−80), used to test the sampler's output against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.dp.jointsvt import JointStreamNoise
from svtagg.dp.kinds import StreamKind, check_epsilon, noise_model
from svtagg.dp.noise import RandomSource, draw_query_noise

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


def noise_scale(epsilon: Fraction, frac_bits: int) -> Fraction:
    """t = 2Δ/ε in grid units: the scale of each party's per-candidate draw."""
    return noise_model(StreamKind.NMAX).query_scale(epsilon, frac_bits)


def first_argmax(values: npt.ArrayLike) -> int:
    """The first index of the largest value (the tournament's tie rule)."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need a non-empty vector of candidates")
    return int(np.argmax(arr))


def noise(
    epsilon: Fraction,
    frac_bits: int,
    k: int,
    rng: RandomSource,
    parties: int = 1,
    joint: JointStreamNoise | None = None,
) -> I64:
    """The total noise of k candidates: each party's own full-scale draw, summed;
    or with `joint` (a joint-noise task) one draw each of the garbled sampler's
    law with the two servers' dither (`JointStreamNoise.sample`)."""
    if joint is not None:
        return joint.sample("query", k, rng)
    if parties not in (1, 2):
        raise ValueError(f"parties must be 1 or 2, got {parties}")
    total = np.zeros(k, dtype=np.int64)
    for _ in range(parties):
        total += draw_query_noise(StreamKind.NMAX, epsilon, frac_bits, k, rng)
    return total


def noisy_argmax(
    scores: npt.ArrayLike,
    epsilon: Fraction | int | str,
    frac_bits: int,
    rng: RandomSource,
    parties: int = 1,
    joint: JointStreamNoise | None = None,
) -> int:
    """One report-noisy-max: the first j maximising s_j + noise_j (grid units)."""
    eps = check_epsilon(epsilon)
    s = np.asarray(scores, dtype=np.int64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("need a non-empty vector of candidate scores")
    return first_argmax(s + noise(eps, frac_bits, s.size, rng, parties, joint))


def chunked_noisy_argmax(
    scores: npt.ArrayLike,
    epsilon: Fraction | int | str,
    frac_bits: int,
    rng: RandomSource,
    parties: int = 1,
    chunks: Sequence[tuple[int, int]] = (),
    joint: JointStreamNoise | None = None,
) -> int:
    """`noisy_argmax` run chunk by chunk as the servers run it (docs/mpc.md,
    "Chunked tournaments"): each chunk's candidates get their noise when the
    chunk runs, and the winner so far — its noisy value and index, the noise
    never redrawn — meets them, keeping ties (its index is smaller).  The
    same law as one tournament over all the candidates; `chunks` ([lo, hi),
    in order, covering the scores; default: one chunk)."""
    eps = check_epsilon(epsilon)
    s = np.asarray(scores, dtype=np.int64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("need a non-empty vector of candidate scores")
    parts = list(chunks) or [(0, s.size)]
    starts, ends = [lo for lo, _ in parts], [hi for _, hi in parts]
    if starts[0] != 0 or ends[-1] != s.size or starts[1:] != ends[:-1]:
        raise ValueError("the chunks must cover the candidates in order")
    if any(lo >= hi for lo, hi in parts):
        raise ValueError("a chunk needs at least one candidate")
    best: tuple[int, int] | None = None
    for lo, hi in parts:
        noisy = s[lo:hi] + noise(eps, frac_bits, hi - lo, rng, parties, joint)
        j = first_argmax(noisy)
        if best is None or int(noisy[j]) > best[0]:
            best = (int(noisy[j]), lo + j)
    assert best is not None
    return best[1]


# ---------------------------------------------------------------- exact law, one party
def _elementary(xs: Sequence[Fraction]) -> list[Fraction]:
    """e_0..e_m of xs: Σ over the subsets of size m of the products."""
    e = [Fraction(1)] + [Fraction(0)] * len(xs)
    for x in xs:
        for m in range(len(xs), 0, -1):
            e[m] += e[m - 1] * x
    return e


def exact_law(scores: Sequence[int], q: Fraction) -> list[Fraction]:
    """P(output = i) for one party's unclamped geometric noise of ratio q ∈ (0, 1),
    exactly.

    Given G_i = g, candidate j < i must stay below s_i + g and j > i at most at
    it: P = 1 − q^(g + b_j) with b_j = s_i − s_j + [j > i] when g + b_j ≥ 0, else
    0.  From g0 = max(0, −min b_j) on every factor has that form, and
    Σ_{g≥g0} (1 − q) q^g Π_j (1 − q^(g+b_j)) expands over the subsets S of the
    other candidates into
    (1 − q) Σ_m (−1)^m e_m(q^b) q^(g0(1+m)) / (1 − q^(1+m)),
    e_m the elementary symmetric sums of the q^(b_j)."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    s = [int(v) for v in scores]
    if not s:
        raise ValueError("need at least one candidate")
    out = []
    for i, si in enumerate(s):
        b = [si - sj + (j > i) for j, sj in enumerate(s) if j != i]
        g0 = max([0, *(-x for x in b)])
        e = _elementary([q**x for x in b])
        total = sum(
            (-1) ** m * e[m] * q ** (g0 * (1 + m)) / (1 - q ** (1 + m)) for m in range(len(e))
        )
        out.append((1 - q) * total)
    return out


def exact_loss(law: Sequence[Fraction], other: Sequence[Fraction]) -> Fraction:
    """max over outputs of P(i | D)/P(i | D') and its reciprocal (both laws must
    put mass on the same outputs; e^ε of the pair)."""
    worst = Fraction(1)
    for a, b in zip(law, other, strict=True):
        if (a == 0) != (b == 0):
            raise ValueError("the laws have different supports: no finite loss")
        if a:
            worst = max(worst, a / b, b / a)
    return worst


# ---------------------------------------------------------------- float law, 1 or 2 parties
def _noise_pmf(scale: float, parties: int, top: int) -> F64:
    """P(N = x), x = 0..top, N one geometric of scale t or the sum of two."""
    log_q = -1.0 / scale
    x = np.arange(top + 1, dtype=np.float64)
    one_minus_q = -math.expm1(log_q)
    if parties == 1:
        return np.asarray(one_minus_q * np.exp(log_q * x))
    return np.asarray(one_minus_q**2 * (x + 1) * np.exp(log_q * x))


def output_law(scores: Sequence[int], scale: Fraction | float, parties: int = 1) -> F64:
    """P(output = i) for k candidates whose noise is one geometric of scale t
    (one party) or the sum of two independent ones (two parties), ties to the
    smaller index.  Floats; the noise is cut where its remaining mass is below
    2^−80 (the clamp at 4096 scales lies far beyond)."""
    if parties not in (1, 2):
        raise ValueError(f"parties must be 1 or 2, got {parties}")
    t = float(scale)
    top = int(math.ceil(t * (80 * math.log(2) + 2 * math.log(2 + 80 * t)))) + 1
    return law_of_noise(scores, 0, _noise_pmf(t, parties, top))


def joint_output_law(scores: Sequence[int], joint: JointStreamNoise) -> F64:
    """P(output = i) on a joint-noise task: each candidate's noise one draw of
    the sampler's exact law with the servers' dither (`JointStreamNoise.grid_pmf`:
    small supports only)."""
    lo, pmf = joint.grid_pmf("query")
    return law_of_noise(scores, lo, pmf)


def law_of_noise(scores: Sequence[int], lo: int, pmf: F64) -> F64:
    """P(output = i) for k candidates whose noise values are independent, each
    lo + x with probability pmf[x]; ties to the smaller index."""
    s = np.asarray([int(v) for v in scores], dtype=np.int64)
    top = pmf.size - 1
    cdf = np.cumsum(pmf)
    x = np.arange(top + 1, dtype=np.int64)

    def below(y: I64) -> F64:  # P(N − lo ≤ y), 0 below 0 and 1 beyond the support
        return np.where(y < 0, 0.0, np.where(y > top, 1.0, cdf[np.clip(y, 0, top)]))

    out = np.empty(s.size)
    for i in range(s.size):
        p = pmf.copy()
        for j in range(s.size):
            if j != i:
                p *= below(s[i] + x - s[j] - (1 if j < i else 0))
        out[i] = p.sum()
    return np.asarray(out)
