"""`encode_thresholds`: whole numbers take one array operation, and it must give
what the exact per-threshold path gives, refuse the same bounds and never wrap."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from svtagg.dp.queries import InvalidArgument, encode_scalar, encode_thresholds


def _exact(taus: list[int], frac_bits: int) -> list[int]:
    return [encode_scalar(Fraction(t), frac_bits) for t in taus]


@pytest.mark.parametrize("frac_bits", [1, 8, 16, 24])
def test_whole_thresholds_match_the_exact_path(frac_bits: int) -> None:
    rng = np.random.default_rng(frac_bits)
    lim = (2**63 - 1) >> frac_bits
    taus = [int(t) for t in rng.integers(-lim, lim, 500)] + [0, lim, -lim, 1, -1]
    assert encode_thresholds(taus, frac_bits).tolist() == _exact(taus, frac_bits)
    mixed = [np.int32(3), True, np.uint16(9), -4]
    assert encode_thresholds(mixed, frac_bits).tolist() == _exact([3, 1, 9, -4], frac_bits)


def test_out_of_range_is_refused_not_wrapped() -> None:
    for taus in ([-(2**63)], [2**47], [2**62, 1], [10**30]):
        with pytest.raises(OverflowError):
            encode_thresholds(taus, 16)
    with pytest.raises(InvalidArgument, match="at most 4 score units"):
        encode_thresholds([1, -5], 16, bound=4 << 16)
    assert encode_thresholds([-4, 4], 16, bound=4 << 16).tolist() == [-(4 << 16), 4 << 16]


def test_fractions_and_floats_take_the_exact_path() -> None:
    assert encode_thresholds([Fraction(1, 3), 2], 16).tolist() == [21845, 2 << 16]
    assert encode_thresholds([1.5, 2], 16).tolist() == [3 << 15, 2 << 16]
    assert encode_thresholds([], 16).tolist() == []
