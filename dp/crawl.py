"""The privacy mechanism of the prefix crawl (heavy hitters over bit strings):
per level, which candidate prefixes hold a noisy count at or above a threshold
(docs/privacy.md, "The prefix crawl").

A walk over strings of B bits in strides of s bits runs L = ⌈B/s⌉ levels.  At
level ℓ the candidates are the s-bit extensions of the prefixes kept at level
ℓ − 1 (the root's at level 1): a function of earlier outputs only.  Each valid
report counts 1 for the candidate that is its string's prefix, if any, and 0
for the rest (the verifiable DPF's per-level check, `vdaf.crawl`, enforces
that for hostile clients too), so replacing one user moves the level's count
vector by at most 1 on two coordinates: L1 sensitivity 2.

Each server draws, per candidate, its own discrete Laplace noise of scale
t = 2/ε_ℓ (`level_scale`), and the level answers, per candidate,

    above_j = [c_j + ν_L,j + ν_H,j ≥ τ]

and nothing else — no count.  With one server's draws known (a corrupt
server's, or both to nobody), the answers are a post-processing of c + ν, the
discrete Laplace mechanism on a vector of L1 sensitivity 2 at scale 2/ε_ℓ:
ε_ℓ-DP for replace-one neighbours.  Levels compose: the walk costs Σ ε_ℓ = ε.
No threshold noise and no gap are needed (unlike AboveThreshold or
CompareToThresholds, which pay per YES answer or stop at a CLOSE), because
one user moves at most two of a level's counts, each by one.

This module holds the plan, the draws and the exact output law (for the
audits); `analyst.crawl` walks, `vdaf.crawl` makes and checks the reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.dp.noise import RandomSource, draw, sum_pmf

#: How far one replace-one change moves a level's count vector in L1.
CRAWL_SENSITIVITY = 2
#: Strings of at most this many bits (vdaf.crawl.MAX_BITS).
MAX_CRAWL_BITS = 256
#: Bits one level may extend a prefix by (2^8 candidates per kept prefix).
MAX_STRIDE = 8
#: Candidates one level may hold (kept prefixes × 2^stride).
MAX_LEVEL_CANDIDATES = 1 << 16


@dataclass(frozen=True)
class CrawlPlan:
    """A walk's public parameters: string length, stride, total ε (split evenly
    over the levels), the count threshold τ, and the most prefixes a level may
    keep (more above τ stops the walk: raise τ or ε)."""

    bits: int
    stride: int
    epsilon: Fraction
    threshold: int
    max_kept: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= MAX_CRAWL_BITS:
            raise ValueError(f"strings of 1 to {MAX_CRAWL_BITS} bits, got {self.bits}")
        if not 1 <= self.stride <= MAX_STRIDE:
            raise ValueError(f"a stride of 1 to {MAX_STRIDE} bits, got {self.stride}")
        if Fraction(self.epsilon) <= 0:
            raise ValueError(f"ε must be positive, got {self.epsilon}")
        if self.threshold < 1:
            raise ValueError(f"the threshold is a count of at least 1, got {self.threshold}")
        if self.max_kept < 1 or (self.max_kept << self.stride) > MAX_LEVEL_CANDIDATES:
            raise ValueError(
                f"max_kept ≥ 1 and max_kept × 2^stride ≤ {MAX_LEVEL_CANDIDATES:,} "
                f"(max_kept {self.max_kept}, stride {self.stride})"
            )
        object.__setattr__(self, "epsilon", Fraction(self.epsilon))

    @property
    def levels(self) -> int:
        return -(-self.bits // self.stride)

    @property
    def level_epsilon(self) -> Fraction:
        """ε_ℓ: the walk's ε split evenly over its levels."""
        return self.epsilon / self.levels

    def prefix_bits(self, level: int) -> int:
        """Bits of the prefixes of `level` (1-based); the last may be short."""
        if not 1 <= level <= self.levels:
            raise ValueError(f"level {level} of {self.levels}")
        return min(level * self.stride, self.bits)


def level_scale(epsilon: Fraction, sensitivity: int = CRAWL_SENSITIVITY) -> Fraction:
    """Each server's discrete Laplace scale t = Δ₁/ε_ℓ for one level."""
    return Fraction(sensitivity) / Fraction(epsilon)


def draw_level_noise(epsilon: Fraction, k: int, rng: RandomSource) -> npt.NDArray[np.int64]:
    """One server's noise for a level's k candidates (exact, clamped as every
    draw of `dp.noise` is)."""
    return draw("laplace", level_scale(epsilon), k, rng)


def above(
    counts: Sequence[int] | npt.NDArray[np.int64],
    threshold: int,
    epsilon: Fraction,
    rng: RandomSource,
    parties: int = 2,
) -> npt.NDArray[np.bool_]:
    """The level's answers in the clear (the reference the servers' comparison
    computes securely): each of `parties` adds its own noise per candidate."""
    c = np.asarray(counts, dtype=np.int64)
    noisy = c.copy()
    for _ in range(parties):
        noisy += draw_level_noise(epsilon, c.size, rng)
    return noisy >= threshold


# ----------------------------------------------------------------------------- exact law


def above_probability(count: int, threshold: int, scale: Fraction, parties: int = 2) -> float:
    """P(count + Σ ν ≥ threshold), the ν `parties` independent discrete Laplace
    draws of scale `scale` (`dp.noise.sum_pmf`'s window)."""
    lo, pmf = sum_pmf("laplace", scale, parties)
    need = threshold - count - lo  # index of the least sum that answers yes
    if need <= 0:
        return float(pmf.sum())
    return float(pmf[need:].sum()) if need < pmf.size else 0.0


def level_loss(
    counts: Sequence[int],
    neighbour: Sequence[int],
    threshold: int,
    scale: Fraction,
    parties: int = 1,
) -> float:
    """The exact worst-case privacy loss max_o |ln P(o | counts) / P(o | neighbour)|
    of one level's answers over every output vector o: the answers are
    independent per candidate, so it is the sum over candidates of each one's
    worst log-ratio.  `parties` = 1 is the view of an analyst colluding with a
    server (the honest server's noise alone)."""
    if len(counts) != len(neighbour):
        raise ValueError("the two count vectors differ in length")
    total = 0.0
    for c, c2 in zip(counts, neighbour, strict=True):
        if c == c2:
            continue
        p = above_probability(c, threshold, scale, parties)
        q = above_probability(c2, threshold, scale, parties)
        total += max(abs(math.log(p / q)), abs(math.log((1 - p) / (1 - q))))
    return total
