"""SVT mechanisms as pure code on the encoded grid (Algorithms 1-5 and the note's variants).

Everything is in grid units: true scores `s` and thresholds `tau` are integers
(score × 2^F), and the noise model of each kind comes from `kinds.NOISE_MODELS`.
`parties` = 2 reproduces the two-server noise: every noise term is the sum of two
independent full-scale draws, one per server.  These classes are the reference
the servers' distributed version is tested against.

Tie rule: a query is YES when s + ν ≥ τ + γ (Algorithm 3 and the note use ≥;
with discrete noise ties have positive probability, so one rule is fixed here and
used by the servers' circuits too: YES iff z = s − τ + ν − γ ≥ 0).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from svtagg.dp.errors import StreamClosed
from svtagg.dp.kinds import ABOVE_THRESHOLD_KINDS, StreamKind, check_epsilon
from svtagg.dp.noise import RandomSource, draw_query_noise, draw_threshold_noise
from svtagg.dp.queries import Outcome

if TYPE_CHECKING:
    from svtagg.dp.jointsvt import JointStreamNoise

I64 = npt.NDArray[np.int64]


class _StreamBase:
    def __init__(
        self,
        kind: StreamKind,
        epsilon: Fraction,
        frac_bits: int,
        rng: RandomSource,
        parties: int = 1,
        joint: JointStreamNoise | None = None,
    ) -> None:
        if parties not in (1, 2):
            raise ValueError(f"parties must be 1 or 2, got {parties}")
        self.kind = kind
        self.epsilon = check_epsilon(epsilon)
        self.frac_bits = frac_bits
        self.parties = parties
        self._rng = rng
        self._closed = False
        self.queries_answered = 0
        #: Joint noise (a joint-noise task): γ and each ν are ONE draw each of the
        #: garbled sampler's exact law (`dp.joint.sample`), whatever `parties` is.
        self._joint = joint
        # init(ε): the secret threshold noise, drawn once per stream (per party).
        if joint is not None:
            self._gamma = int(joint.sample("threshold", 1, rng)[0])
        else:
            self._gamma = sum(
                draw_threshold_noise(kind, self.epsilon, frac_bits, rng) for _ in range(parties)
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def _query_noise(self, k: int) -> I64:
        if self._joint is not None:
            return self._joint.sample("query", k, self._rng)
        total = np.zeros(k, dtype=np.int64)
        for _ in range(self.parties):
            total += draw_query_noise(self.kind, self.epsilon, self.frac_bits, k, self._rng)
        return total

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosed("this stream has already answered and is closed")


class AboveThresholdStream(_StreamBase):
    """Algorithms 1-3 (kind lap24) and the note's Mechanisms One/Two (lap3, exp3).

    ε-DP for the whole stream however many NO answers it gives (Theorem 5.1);
    answered in chunks, it is exactly Batch SVT (Algorithm 3) on each chunk.
    """

    def __init__(
        self,
        kind: StreamKind,
        epsilon: Fraction,
        frac_bits: int,
        rng: RandomSource,
        parties: int = 1,
        joint: JointStreamNoise | None = None,
    ) -> None:
        if kind not in ABOVE_THRESHOLD_KINDS:
            raise ValueError(f"kind {kind.value!r} is not an AboveThreshold kind")
        super().__init__(kind, epsilon, frac_bits, rng, parties, joint)

    def ask(self, scores: I64, taus: I64) -> int | None:
        """First j with s_j + ν_j ≥ τ_j + γ, or None; a YES closes the stream."""
        self._check_open()
        scores = np.asarray(scores, dtype=np.int64)
        taus = np.asarray(taus, dtype=np.int64)
        if scores.shape != taus.shape or scores.ndim != 1 or scores.size == 0:
            raise ValueError("scores and taus must be equal-length non-empty vectors")
        nu = self._query_noise(scores.size)
        yes = np.flatnonzero(scores - taus + nu - self._gamma >= 0)
        if yes.size == 0:
            self.queries_answered += scores.size
            return None
        first = int(yes[0])
        self.queries_answered += first + 1
        self._closed = True
        return first


class CompareToThresholdsStream(_StreamBase):
    """Algorithms 4-5: High / Low per query until the first Close.

    Requires τH − τL ≥ gap (checked by the caller that knows δ and the units).
    """

    def __init__(
        self,
        epsilon: Fraction,
        frac_bits: int,
        rng: RandomSource,
        parties: int = 1,
        joint: JointStreamNoise | None = None,
    ) -> None:
        super().__init__(StreamKind.CTT, epsilon, frac_bits, rng, parties, joint)

    def compare(self, scores: I64, tau_low: I64, tau_high: I64) -> list[Outcome]:
        self._check_open()
        scores = np.asarray(scores, dtype=np.int64)
        u = self._query_noise(scores.size)
        noisy = scores + u
        high = noisy > np.asarray(tau_high, dtype=np.int64) - self._gamma
        low = noisy < np.asarray(tau_low, dtype=np.int64) + self._gamma
        out: list[Outcome] = []
        for h, lo in zip(high.tolist(), low.tolist(), strict=True):
            if h:
                out.append(Outcome.HIGH)
            elif lo:
                out.append(Outcome.LOW)
            else:
                out.append(Outcome.CLOSE)
                self._closed = True
                break
        self.queries_answered += len(out)
        return out


def batch_above_threshold(
    scores: I64,
    taus: I64,
    epsilon: Fraction,
    kind: StreamKind = StreamKind.LAP24,
    frac_bits: int = 16,
    rng: RandomSource | None = None,
    parties: int = 1,
) -> int | None:
    """Algorithm 3 (Batch SVT): one fresh stream, one chunk."""
    stream = AboveThresholdStream(kind, epsilon, frac_bits, rng or RandomSource(), parties)
    return stream.ask(scores, taus)
