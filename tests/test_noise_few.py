"""The samplers' two paths agree exactly: up to FEW draws they run on Python
integers (`_geometric_few`, `_discrete_laplace_few`), above on numpy arrays.
Given the same random words, both return the same draws and leave the source
at the same place (so a server's noise, and the frozen transcript, do not
depend on which path ran).  Ties with the digit words (probability 2^-64 per
word) are forced here with a source that returns chosen words."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from svtagg.dp import noise
from svtagg.dp.noise import (
    FEW,
    RandomSource,
    _discrete_laplace_few,
    _discrete_laplace_many,
    _geometric_few,
    _geometric_many,
    _plan,
    _word,
)

SCALES = [Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(262144), Fraction(10**6, 7)]


class Scripted(RandomSource):
    """A seeded source whose first u64 words are replaced by `script` (None:
    the seeded word), to force ties; bytes are the seeded keystream's."""

    def __init__(self, seed: bytes, script: list[int | None]) -> None:
        super().__init__(seed)
        self.script = list(script)

    def u64(self, size: int) -> noise.U64:
        words = super().u64(size).copy()
        for i in range(size):
            if self.script:
                chosen = self.script.pop(0)
                if chosen is not None:
                    words[i] = chosen
        return words


def tail(rng: RandomSource) -> bytes:
    """Where the source stands: its next keystream bytes."""
    return rng.random_bytes(16)


@pytest.mark.parametrize("scale", SCALES, ids=str)
def test_geometric_paths_agree(scale: Fraction) -> None:
    for size in range(1, FEW + 1):
        for seed in range(40):
            a, b = RandomSource(bytes([seed, size])), RandomSource(bytes([seed, size]))
            few = _geometric_few(scale, size, a)
            many = _geometric_many(scale, size, b)
            assert few == many.tolist(), (scale, size, seed)
            assert tail(a) == tail(b)


@pytest.mark.parametrize("scale", SCALES, ids=str)
def test_discrete_laplace_paths_agree(scale: Fraction) -> None:
    for size in range(1, FEW + 1):
        for seed in range(60):
            a, b = RandomSource(bytes([seed, size, 1])), RandomSource(bytes([seed, size, 1]))
            few = _discrete_laplace_few(scale, size, a)
            many = _discrete_laplace_many(scale, size, b)
            assert few == many.tolist(), (scale, size, seed)
            assert tail(a) == tail(b)


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(262144)], ids=str)
def test_the_paths_agree_on_forced_ties(scale: Fraction) -> None:
    """Every low-bit word and the high word equal to the digit words they are
    compared with: each comparison goes to the exact tie resolution."""
    k, ys, y_high, words = _plan(scale)
    for size in (1, 3):
        script: list[int | None] = [int(w) for w in words for _ in range(size)]
        script += [_word(y_high, "exp", 1)] * size
        a, b = Scripted(b"tie", script), Scripted(b"tie", script)
        assert _geometric_few(scale, size, a) == _geometric_many(scale, size, b).tolist()
        assert tail(a) == tail(b)
    assert k == len(ys)


def test_draw_takes_the_few_path_below_the_bound_and_clamps() -> None:
    """draw() for one query: the few path's value, clamped as the numpy path clamps."""
    scale = Fraction(262144)
    for seed in range(30):
        a, b = RandomSource(bytes([seed])), RandomSource(bytes([seed]))
        one = noise.draw("laplace", scale, 1, a)
        bound = noise.clamp_bound(scale)
        ref = np.clip(_discrete_laplace_many(scale, 1, b), -bound, bound)
        assert one.dtype == np.int64 and one.tolist() == ref.tolist()
