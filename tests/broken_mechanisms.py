"""Known non-private SVT variants, kept only as negative controls for the audit.

Each subclasses the reference local oracle and breaks exactly one thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from svtagg.analyst.kinds import StreamKind
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.oracle import Number, Query
from svtagg.analyst.svt import AboveThresholdStream


class _NoThresholdNoise(AboveThresholdStream):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._gamma = 0  # the note's counterexample: the threshold is not noised


class NoThresholdNoiseOracle(LocalOracle):
    """YES iff s + ν ≥ τ: not private for any finite ε (the note, §3)."""

    def _make_mechanism(self, kind: StreamKind, eps: Fraction):  # type: ignore[no-untyped-def]
        return _NoThresholdNoise(kind, eps, self.frac_bits, self._rng, self._parties)


class KeepsAnsweringOracle(LocalOracle):
    """Answers every query of the chunk (the YES/NO vector) instead of halting."""

    def run_vector(self, epsilon: Number, kind: str, chunk: Sequence[tuple[Query, Number]]):  # type: ignore[no-untyped-def]
        stream = self.open_stream(epsilon, kind)
        mech = stream._mech
        assert isinstance(mech, AboveThresholdStream)
        scores = self._scores([q for q, _ in chunk])
        taus = self._encode_taus([t for _, t in chunk])
        nu = mech._query_noise(len(chunk))
        return tuple((scores - taus + nu - mech._gamma >= 0).tolist())


class RevealsValueOracle(LocalOracle):
    """Returns the noisy value s_j + ν_j of the first YES along with its index."""

    def run_revealing(self, epsilon: Number, kind: str, chunk: Sequence[tuple[Query, Number]]):  # type: ignore[no-untyped-def]
        stream = self.open_stream(epsilon, kind)
        mech = stream._mech
        assert isinstance(mech, AboveThresholdStream)
        scores = self._scores([q for q, _ in chunk])
        taus = self._encode_taus([t for _, t in chunk])
        nu = mech._query_noise(len(chunk))
        yes = np.flatnonzero(scores - taus + nu - mech._gamma >= 0)
        if yes.size == 0:
            return None
        j = int(yes[0])
        return j, int(scores[j] + nu[j])
