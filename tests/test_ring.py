"""Fixed-point encoding and the overflow bound."""

from fractions import Fraction

import numpy as np
import pytest

from svtagg.dp.kinds import StreamKind, overflow_possible
from svtagg.mpc.ring import (
    SIGNED_LIMIT,
    can_wrap,
    decode,
    encode,
    encode_scalar,
    from_signed,
    sensitivity,
    to_signed,
    wrap_bound,
)


def test_encode_clips_and_rounds() -> None:
    x = encode([-0.5, 0.0, 0.25, 1.0, 7.0, 0.5 + 2**-20], frac_bits=16)
    assert x.dtype == np.uint64
    assert x.tolist() == [0, 0, 2**14, 2**16, 2**16, 2**15]
    assert decode(x, 16).tolist() == [0.0, 0.0, 0.25, 1.0, 1.0, 0.5]


def test_encode_refuses_nan_and_bad_bits() -> None:
    with pytest.raises(ValueError, match="NaN"):
        encode([0.1, float("nan")])
    with pytest.raises(ValueError):
        encode([0.1], frac_bits=0)
    with pytest.raises(TypeError):
        sensitivity(1.5)  # type: ignore[arg-type]


def test_encode_scalar_is_exact() -> None:
    assert encode_scalar("0.1", 16) == round(Fraction(1, 10) * 2**16)
    assert encode_scalar(Fraction(1, 3), 4) == 5
    assert encode_scalar(-2.5, 2) == -10


def test_signed_roundtrip_wraps_in_ring() -> None:
    a = from_signed(np.array([-5, 3, -(2**62)]))
    b = from_signed(np.array([2, -3, -(2**62)]))
    assert to_signed(a + b).tolist() == [-3, 0, -(2**63)]


def test_wrap_bound_and_can_wrap() -> None:
    assert wrap_bound(10, 4, 100, 50) == 10 * 16 + 100 + 2 * 50 + 1
    assert not can_wrap(2**30, 16, 2**40, 2**50)
    assert can_wrap(2**40, 24, 0, 0)
    # 1 user at F=1 contributes 2, two parties' noise 2, the >= shift 1: 5 in all
    assert not can_wrap(1, 1, SIGNED_LIMIT - 6, 1)
    assert can_wrap(1, 1, SIGNED_LIMIT - 5, 1)


def test_overflow_possible_refuses_extreme_parameters() -> None:
    for kind in StreamKind:
        assert not overflow_possible(10**6, 16, "0.001", kind)
        # tiny ε makes the clamped noise bound huge
        assert overflow_possible(10**6, 30, "1e-9", kind)
    assert overflow_possible(2**40, 30, 1, StreamKind.LAP24)
