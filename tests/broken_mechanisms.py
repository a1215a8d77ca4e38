"""Known non-private SVT and report-noisy-max variants, kept only as negative
controls for the audits.

Each subclasses the reference local oracle and breaks exactly one thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.dp.kinds import StreamKind, validate_stream
from svtagg.dp.noise import draw
from svtagg.dp.noisy_max import first_argmax, noise_scale
from svtagg.dp.queries import Number, Query
from svtagg.dp.svt import AboveThresholdStream


class _NoThresholdNoise(AboveThresholdStream):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._gamma = 0  # the note's counterexample: the threshold is not noised


class NoThresholdNoiseOracle(LocalOracle):
    """YES iff s + ν ≥ τ: not private for any finite ε (the note, §3)."""

    def _make_mechanism(self, kind: StreamKind, eps: Fraction):  # type: ignore[no-untyped-def]
        return _NoThresholdNoise(kind, eps, self.frac_bits, self._rng, self._parties)


def _encoded_taus(oracle: LocalOracle, chunk: Sequence[tuple[Query, Number]]) -> np.ndarray:
    """The chunk's thresholds on the grid, encoded once per oracle and chunk
    (exact encoding of a fractional τ dominates the cost of a control's stream)."""
    cache: dict[tuple[Number, ...], np.ndarray] = oracle.__dict__.setdefault("_tau_cache", {})
    key = tuple(t for _, t in chunk)
    if key not in cache:
        cache[key] = oracle._encode_taus(list(key))
    return cache[key]


def _noisy_margins(  # type: ignore[no-untyped-def]
    oracle: LocalOracle, epsilon: Number, kind: str, chunk: Sequence[tuple[Query, Number]]
):
    """Open a real stream, then compute what it would compare: scores, and
    s + ν − τ − γ for every query of the chunk (the broken controls reveal more
    of this than the correct stream's first-YES index)."""
    mech = oracle.open_stream(epsilon, kind)._mech
    assert isinstance(mech, AboveThresholdStream)
    scores = oracle._scores([q for q, _ in chunk])
    taus = _encoded_taus(oracle, chunk)
    nu = mech._query_noise(len(chunk))
    return scores, nu, scores - taus + nu - mech._gamma


class KeepsAnsweringOracle(LocalOracle):
    """Answers every query of the chunk (the YES/NO vector) instead of halting."""

    def run_vector(self, epsilon: Number, kind: str, chunk: Sequence[tuple[Query, Number]]):  # type: ignore[no-untyped-def]
        _, _, margin = _noisy_margins(self, epsilon, kind, chunk)
        return tuple((margin >= 0).tolist())


class RevealsValueOracle(LocalOracle):
    """Returns the noisy value s_j + ν_j of the first YES along with its index."""

    def run_revealing(self, epsilon: Number, kind: str, chunk: Sequence[tuple[Query, Number]]):  # type: ignore[no-untyped-def]
        scores, nu, margin = _noisy_margins(self, epsilon, kind, chunk)
        yes = np.flatnonzero(margin >= 0)
        if yes.size == 0:
            return None
        j = int(yes[0])
        return j, int(scores[j] + nu[j])


# --- report-noisy-max ------------------------------------------------------------------


class _NoisyMaxScales(LocalOracle):
    """Report-noisy-max whose parties draw one-sided geometric noise at the given
    fractions of the correct scale 2Δ/ε (0: the party adds none); charged as the
    correct mechanism is.  Subclasses fix the fractions."""

    fractions: tuple[Fraction, ...] = ()

    def noisy_max(self, queries, epsilon, plan=None):  # type: ignore[no-untyped-def]
        req = validate_stream(StreamKind.NMAX, epsilon, 0, self.parties)
        scores = self._scores(queries)
        self._charge(req, plan)
        return first_argmax(scores + broken_noise(self, req.epsilon, len(queries)))


def broken_noise(oracle: _NoisyMaxScales, epsilon: Fraction, k: int) -> np.ndarray:
    """The total of the parties' draws at their fractions of the scale."""
    total = np.zeros(k, dtype=np.int64)
    for f in oracle.fractions:
        if f:
            total += draw("geometric", noise_scale(epsilon, oracle.frac_bits) * f, k, oracle._rng)
    return total


class HalfScaleNoisyMaxOracle(_NoisyMaxScales):
    """Noise Exp(Δ/ε), the scale of monotone counting queries, where the scores
    may move in opposite directions (a replaced user): the loss reaches 2ε."""

    fractions = (Fraction(1, 2),)


class OneNoisyServerOracle(_NoisyMaxScales):
    """Two servers, one adding no noise and the other half the scale: the sum
    looks like one party's noise at Δ/ε, and against the noisy server (who knows
    its draws) the answer is deterministic."""

    fractions = (Fraction(0), Fraction(1, 2))
