"""The privacy accountant: exact basic composition, advanced composition, zCDP."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from svtagg.dp.accounting import (
    ZCDPAccountant,
    advanced_composition,
    advanced_composition_step,
    basic_composition,
    gaussian_rho,
    gaussian_sigma,
    rho_for_dp,
    zcdp_to_dp,
)


def test_basic_composition_is_exact() -> None:
    eps, delta = basic_composition([(Fraction(1, 3), 0), ("1/3", "1e-9"), (Fraction(1, 3), 0)])
    assert eps == 1 and delta == Fraction(1, 10**9)


def test_advanced_composition_formula() -> None:
    eps, delta = advanced_composition(0.01, 1e-8, 100, 1e-6)
    expect = math.sqrt(200 * math.log(1e6)) * 0.01 + 100 * 0.01 * math.expm1(0.01)
    assert eps == pytest.approx(expect) and delta == pytest.approx(100 * 1e-8 + 1e-6)


def test_advanced_step_inverts_and_never_loses_to_basic() -> None:
    for k in (2, 20, 200, 2000):
        step = advanced_composition_step(1.0, 1e-6, k)
        assert advanced_composition(float(step), 0, k, 1e-6)[0] <= 1.0 + 1e-12 or step == Fraction(
            1, k
        )
        assert step >= Fraction(1, k)
    # with many steps advanced composition beats basic
    assert advanced_composition_step(1.0, 1e-6, 2000) > Fraction(1, 2000)


def test_zcdp_conversion_round_trip() -> None:
    for eps, delta in ((1.0, 1e-6), (0.1, 1e-10), (5.0, 1e-3)):
        rho = rho_for_dp(eps, delta)
        assert zcdp_to_dp(rho, delta) == pytest.approx(eps, rel=1e-12)
    assert gaussian_rho(gaussian_sigma(0.3, 2.0), 2.0) == pytest.approx(0.3)
    # the paper's 2/σ² per answer for sensitivity 2 (unit-ball embeddings)
    assert gaussian_rho(3.0, 2.0) == pytest.approx(2 / 9)


def test_zcdp_accountant_composes_and_refuses() -> None:
    acc = ZCDPAccountant(0.5)
    acc.charge(0.2)
    acc.charge(0.3)
    assert acc.epsilon(1e-6) == pytest.approx(zcdp_to_dp(0.5, 1e-6))
    with pytest.raises(ValueError):
        acc.charge(0.01)
