"""Jointly generated noise: the sampler circuit against its plaintext formula
(exhaustively for small shapes), the formula against the exact pmf, the
protocol end to end on both engines, a chi-square fit of protocol samples to
the exact pmf with a broken control it rejects, the exact privacy loss against
brute force, and the one-server control."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from svtagg.dp.joint import (
    brute_force_loss,
    fitted_digits,
    one_sided_ratio,
    pmf,
    privacy_loss,
    sampler_constants,
    tail_mass,
)
from svtagg.dp.noise import RandomSource
from svtagg.mpc.circuits import bit_planes, planes, ring_from_bits
from svtagg.mpc.garble import PlainBackend
from svtagg.mpc.jointnoise import (
    SamplerShape,
    and_gates_per_sample,
    evaluate_joint_noise,
    garble_joint_noise,
    joint_noise_circuit,
    plain_joint_noise,
)
from svtagg.mpc.protocol import connected_pair

M64 = 1 << 64


def _plain_run(shape: SamplerShape, u: np.ndarray, v: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The circuit in the plaintext backend: y = Z − r mod 2^(64−F), as int64 Z
    after shifting back and adding r (checking the shares' low F bits are 0)."""
    n = r.size
    be = PlainBackend()
    garbler = bit_planes(np.concatenate([u.reshape(-1), np.uint64(0) - r]))
    out = joint_noise_circuit(be, garbler, planes(bit_planes(v.reshape(-1))), n, shape)
    assert be.and_gates == and_gates_per_sample(shape) * n
    assert len(out) == shape.width - shape.shift
    zero = np.zeros_like(out[0])
    pad = [zero] * shape.shift + list(out) + [zero] * (64 - shape.width)
    total = ring_from_bits(pad) + (r << np.uint64(shape.shift))
    return _signed_w(total, shape.width) >> shape.shift


def _signed_w(x: np.ndarray, w: int) -> np.ndarray:
    """x mod 2^w read as a signed w-bit number (the shares are exact mod 2^w)."""
    x = np.asarray(x, dtype=np.uint64)
    if w == 64:
        return x.view(np.int64)
    v = (x & np.uint64((1 << w) - 1)).astype(np.int64)
    return np.where(v >= 1 << (w - 1), v - (1 << w), v)


def _all_words(shape: SamplerShape) -> np.ndarray:
    """Every assignment of the Σb_i + 1 random bits, as (W, 2^(Σb_i+1)) words."""
    total = shape.random_bits
    j = np.arange(1 << total, dtype=np.uint64)
    words = np.zeros((shape.words, j.size), dtype=np.uint64)
    for bit in range(total):
        w, pos = shape.position(bit)
        words[w] |= ((j >> np.uint64(bit)) & np.uint64(1)) << np.uint64(pos)
    return words


@pytest.mark.parametrize(
    "constants,bits,shift,signed,width",
    [
        ((1,), 1, 0, True, 64),
        ((3, 1), 2, 0, True, 64),
        ((5, 3, 1), 3, 0, True, 64),
        ((6, 5, 2), 4, 0, True, 64),
        ((13, 7, 2, 1), 4, 0, True, 64),
        # per-digit widths (a fair digit, an addend with trailing zeros) and a shift
        ((1, 3, 5, 2), (1, 2, 3, 4), 16, True, 64),
        ((4, 11, 1), (4, 5, 3), 3, True, 64),
        # the one-sided sampler (exp3): no sign bit, Z = G ≥ 0
        ((13, 7, 2, 1), 4, 0, False, 64),
        ((4, 11, 1, 1), (4, 5, 3, 2), 16, False, 64),
        # shares exact mod 2^w only (a stream's comparison width)
        ((4, 11, 1), (4, 5, 3), 3, True, 20),
        ((4, 11, 1, 1), (4, 5, 3, 2), 16, False, 34),
    ],
)
def test_circuit_formula_and_pmf_agree_on_every_input(
    constants: tuple[int, ...],
    bits: int | tuple[int, ...],
    shift: int,
    signed: bool,
    width: int,
) -> None:
    """Exhaustive: for every joint bit string the circuit's Z equals the formula,
    and counting the formula's outputs over all 2^(Σb_i+1) strings gives exactly
    2^(Σb_i+1) · pmf — the pmf is the law of what is implemented."""
    shape = SamplerShape(constants, bits, shift, signed, width)
    joint = _all_words(shape)
    rng = np.random.default_rng(len(constants) * 31 + shape.random_bits + shift)
    u = rng.integers(0, M64, joint.shape, dtype=np.uint64, endpoint=False)
    r = rng.integers(0, M64, joint.shape[1], dtype=np.uint64, endpoint=False)
    nu = _plain_run(shape, u, u ^ joint, r)
    formula = plain_joint_noise(joint, shape)
    np.testing.assert_array_equal(nu, formula)
    counts = Counter(formula.tolist())
    total = joint.shape[1]
    exact = pmf(constants, bits, signed)
    assert sum(exact.values()) == 1
    assert {x: Fraction(c, total) for x, c in counts.items()} == exact


def test_shape_checks_and_layout() -> None:
    with pytest.raises(ValueError):
        SamplerShape((0, 1), 2)  # c = 0 would be a constant digit
    with pytest.raises(ValueError):
        SamplerShape((4,), 2)  # c = 2^b is probability 1
    with pytest.raises(ValueError):
        SamplerShape((1, 1), (1,))  # one width per digit
    with pytest.raises(ValueError):
        SamplerShape((1,) * 10, 1, 54)  # no room for 10 digits and a sign above F
    s = SamplerShape(sampler_constants(Fraction(1 << 20), 64), 64)
    assert s.digits == 26 and s.random_bits == 26 * 64 + 1 and s.words == 27
    # each digit's first AND (at the addend's lowest 1) is free, as are the
    # positions below it
    trailing = sum(((1 << 64) - c & -((1 << 64) - c)).bit_length() - 1 for c in s.constants)
    assert and_gates_per_sample(s) == 26 * 63 - trailing + 63
    # per-digit widths: the lanes are as wide as the bits need, not 64
    w = SamplerShape((1, 3, 100), (1, 2, 8), 16)
    assert w.random_bits == 12 and w.words == 1 and w.lane_bits == 12 and w.out_bits == 48
    assert and_gates_per_sample(w) == (0 + 1 + 7 - 2) + 47  # 256 − 100 = 156 = 0b10011100


def test_fitted_digits_keep_their_precision() -> None:
    """`fitted_digits`: every c_i has at least `precision` − 1 significant bits
    (unless capped at 64 bits), so its relative error is below 2^−precision, and
    the widths grow with the digits' leading zeros."""
    t = Fraction(4)
    c, w = fitted_digits(t, 12, 8)
    for i, (ci, bi) in enumerate(zip(c, w, strict=True)):
        p = 1 / (1 + math.exp((1 << i) / float(t)))
        assert ci >= 1 << 11 or bi == 64
        assert abs(ci / (1 << bi) - p) <= p * 2.0**-12
    assert list(w) == sorted(w) and w[-1] > w[0]
    assert max(w) <= 64
    with pytest.raises(ValueError):
        fitted_digits(t, 12, 12)  # digit 11: p ≈ e^−512 rounds to 0 at 64 bits


def test_constants_round_the_ideal_probabilities() -> None:
    for t, b in ((Fraction(3), 8), (Fraction(1000), 32), (Fraction(7, 2), 16)):
        c = sampler_constants(t, b)
        for i, ci in enumerate(c):
            ideal = 1 / (1 + math.exp((1 << i) / float(t)))
            assert abs(ci - ideal * (1 << b)) <= 0.5 + 1e-6 * (1 << b) * ideal
        # the first digit past K rounds to 0
        y = (1 << len(c)) / float(t)
        assert (1 << b) / (1 + math.exp(y)) < 0.5 + 1e-9
    assert len(sampler_constants(Fraction(1000), 32, min_constant=1 << 16)) < len(
        sampler_constants(Fraction(1000), 32)
    )


# ---------------------------------------------------------------- privacy loss
@pytest.mark.parametrize("t,b", [(Fraction(1), 4), (Fraction(5, 2), 6), (Fraction(3), 8)])
def test_privacy_loss_matches_brute_force(t: Fraction, b: int) -> None:
    c = sampler_constants(t, b)
    for sensitivity in range(1, min(4, 1 << len(c)) + 1):
        assert privacy_loss(c, b, sensitivity) == brute_force_loss(c, b, sensitivity)


def test_privacy_loss_near_ideal_at_full_precision() -> None:
    """64-bit constants at a realistic scale: ε within 10^-6 of the ideal Δ/t and
    a negligible δ; coarse 8-bit constants at a small scale are visibly worse."""
    t = Fraction(1 << 20)
    c = sampler_constants(t, 64)
    loss = privacy_loss(c, 64, 64)
    ideal = 64 / float(t)
    assert ideal <= loss.epsilon < ideal * (1 + 1e-6)
    assert 0 < loss.delta < Fraction(1, 1 << 100)
    assert loss.delta == tail_mass(c, 64, (1 << len(c)) - 64) / 2
    coarse = privacy_loss(sampler_constants(Fraction(3), 8), 8, 1)
    assert coarse.epsilon > 1.5 / 3


def test_tail_mass_against_enumeration() -> None:
    c, b = (13, 7, 2, 1), 4
    p = pmf(c, b)
    for m in range(0, 17):
        assert tail_mass(c, b, m) == 2 * sum((v for x, v in p.items() if x >= m), Fraction(0))


# ---------------------------------------------------------------- the protocol
async def _protocol(
    shape: SamplerShape, u: np.ndarray | None, v: np.ndarray | None, n: int
) -> tuple[np.ndarray, np.ndarray, int]:
    g, e = await connected_pair()
    r, y = await asyncio.gather(
        garble_joint_noise(g, n, shape, u), evaluate_joint_noise(e, n, shape, v)
    )
    assert g.last_stats.and_gates == e.last_stats.and_gates
    return r, y, e.last_stats.and_gates


def _words(seed: bytes, shape: SamplerShape, n: int) -> np.ndarray:
    """Reproducible uniform words (a seeded CSPRNG), so statistical tests are fixed."""
    return RandomSource(seed).u64(shape.words * n).reshape(shape.words, n).copy()


def _stream_shape(width: int = 64) -> SamplerShape:
    """The servers' ν sampler of a lap24 stream at ε = 1, F = 16."""
    from svtagg.dp.jointsvt import joint_stream_noise
    from svtagg.dp.kinds import StreamKind

    noise = joint_stream_noise(StreamKind.LAP24, Fraction(1), 16)
    return SamplerShape(noise.query_constants, noise.query_widths, noise.shift, True, width)


def _rare_shape() -> SamplerShape:
    """The servers' ν sampler of a lap24 stream at ε = 9/10, F = 16: its top
    digit (probability ≈ 2^−82) is 92 bits wide, a uniform of two words."""
    from svtagg.dp.jointsvt import joint_stream_noise
    from svtagg.dp.kinds import StreamKind

    noise = joint_stream_noise(StreamKind.LAP24, Fraction(9, 10), 16)
    assert max(noise.query_widths) > 64
    return SamplerShape(noise.query_constants, noise.query_widths, noise.shift, True, 64)


@pytest.mark.parametrize("which", ["t=3,b=8", "t=2^20,b=64", "stream", "stream,w=34", "rare digit"])
def test_protocol_reconstructs_the_sample(mpc_engine: str, which: str) -> None:
    shape = {
        "t=3,b=8": lambda: SamplerShape(sampler_constants(Fraction(3), 8), 8),
        "t=2^20,b=64": lambda: SamplerShape(sampler_constants(Fraction(1 << 20), 64), 64),
        "stream": _stream_shape,
        "stream,w=34": lambda: _stream_shape(34),
        "rare digit": _rare_shape,
    }[which]()
    n = 5000 if shape.words <= 3 else 300  # more than one OT lane batch
    tag = mpc_engine.encode()
    u, v = _words(b"u" + tag, shape, n), _words(b"v" + tag, shape, n)
    r, y, ands = asyncio.run(_protocol(shape, u, v, n))
    f = np.uint64(shape.shift)
    assert not np.any((r | y) & ((np.uint64(1) << f) - np.uint64(1)))  # low F bits 0
    np.testing.assert_array_equal(
        _signed_w(r + y, shape.width) >> shape.shift, plain_joint_noise(u ^ v, shape)
    )
    assert ands == and_gates_per_sample(shape) * n
    # Without test words both sides draw from os.urandom; shares still add up to
    # values in the support, and r is fresh.
    r1, y1, _ = asyncio.run(_protocol(shape, None, None, 200))
    r2, _, _ = asyncio.run(_protocol(shape, None, None, 200))
    nu = _signed_w(r1 + y1, shape.width) >> shape.shift
    assert nu.min() >= -(1 << shape.digits) and nu.max() < 1 << shape.digits
    assert not np.array_equal(r1, r2)


def _chi_square_pvalue(samples: np.ndarray, law: dict[int, Fraction]) -> float:
    """Pearson's test of `samples` against `law`, cells with expected count < 5
    pooled into one."""
    from scipy.stats import chisquare

    n = samples.size
    counts = Counter(samples.tolist())
    big = sorted(x for x, p in law.items() if p * n >= 5)
    obs = [counts.get(x, 0) for x in big]
    exp = [float(law[x]) * n for x in big]
    rest_obs = n - sum(obs)
    rest_exp = n - sum(exp)
    if rest_exp > 0:
        obs.append(rest_obs)
        exp.append(rest_exp)
    assert all(x in law for x in counts)  # nothing outside the support
    return float(chisquare(obs, exp).pvalue)


def test_chi_square_of_protocol_samples() -> None:
    """20,000 samples through the garbled protocol (numpy engine) fit the exact
    pmf; the same test rejects a sampler whose constants are for a 20% larger
    scale, and one whose first digit's probability is off by 8/256 (a 1/256
    error is far below what 20,000 samples can see)."""
    t, b, n = Fraction(3), 8, 20_000
    c = sampler_constants(t, b)
    shape = SamplerShape(c, b)
    u, v = _words(b"chi-u", shape, n), _words(b"chi-v", shape, n)
    r, y, _ = asyncio.run(_protocol(shape, u, v, n))
    samples = (r + y).view(np.int64)
    law = pmf(c, b)
    assert _chi_square_pvalue(samples, law) > 1e-3

    wrong_scale = SamplerShape(sampler_constants(t * Fraction(6, 5), b), b)
    off_digit = SamplerShape((c[0] + 8, *c[1:]), b)
    for broken in (wrong_scale, off_digit):
        bad = plain_joint_noise(u ^ v, broken)
        assert _chi_square_pvalue(bad, law) < 1e-6


def test_one_server_randomness_lets_that_server_predict_the_noise() -> None:
    """The control: with the evaluator's bits fixed to 0 the joint bits are the
    garbler's alone, and the garbler computes ν exactly from what it holds.  With
    the evaluator's random bits its guess is right only about as often as two
    independent draws coincide."""
    shape = SamplerShape(sampler_constants(Fraction(3), 8), 8)
    n = 2000
    u = _words(b"control-u", shape, n)
    zero = np.zeros_like(u)
    r, y, _ = asyncio.run(_protocol(shape, u, zero, n))
    guess = plain_joint_noise(u, shape)
    np.testing.assert_array_equal((r + y).view(np.int64), guess)

    v = _words(b"control-v", shape, n)
    r, y, _ = asyncio.run(_protocol(shape, u, v, n))
    hits = float(np.mean((r + y).view(np.int64) == guess))
    collision = float(sum(p * p for p in pmf(shape.constants, shape.bits).values()))
    assert hits < 2 * collision < 0.2


@pytest.mark.heavy
def test_chi_square_at_scale_on_both_engines(mpc_engine: str) -> None:
    """100,000 protocol samples of a two-word shape (t = 10, b = 12) fit the exact
    pmf on each engine, and the fit rejects the law of a 5% larger scale."""
    t, b, n = Fraction(10), 12, 100_000
    c = sampler_constants(t, b)
    shape = SamplerShape(c, b)
    u = _words(b"heavy-u" + mpc_engine.encode(), shape, n)
    v = _words(b"heavy-v" + mpc_engine.encode(), shape, n)
    r, y, _ = asyncio.run(_protocol(shape, u, v, n))
    samples = (r + y).view(np.int64)
    np.testing.assert_array_equal(samples, plain_joint_noise(u ^ v, shape))
    assert _chi_square_pvalue(samples, pmf(c, b)) > 1e-3
    assert _chi_square_pvalue(samples, pmf(sampler_constants(t * Fraction(21, 20), b), b)) < 1e-6


@pytest.mark.parametrize("fitted", [False, True])
def test_one_sided_ratio_matches_brute_force(fitted: bool) -> None:
    """exp3's joint accounting shifts its one-sided draws upwards only: the
    largest P(G = g)/P(G = g + d) by the digit programme equals enumeration,
    and is within rounding of the ideal e^(d/t)."""
    t = Fraction(5, 2)
    bits: int | tuple[int, ...]
    if fitted:
        c, bits = fitted_digits(t, 12, 5)
    else:
        c, bits = sampler_constants(t, 16, digits=5), 16
    law = pmf(c, bits, signed=False)
    assert sum(law.values()) == 1 and min(law) == 0
    for d in (1, 2, 3):
        brute = max(law[g] / law[g + d] for g in law if g + d in law)
        assert one_sided_ratio(c, bits, d) == brute
        assert abs(math.log(brute) - d / t) < 0.01 * d / t


def test_two_word_digits_are_drawn_exactly() -> None:
    """A digit wider than 64 bits (`dp.joint.MAX_RARE_WIDTH`) compares a
    two-word uniform with its constant: the local sampler (`dp.joint.sample`)
    and the circuit's plaintext reference (`plain_joint_noise`) both draw the
    exact law.  Digits of probability 1/4 + 2^−70 (width 72) and
    1/2 − 3·2^−101 (width 101) beside an 8-bit one: 40,000 draws fit the
    exact pmf, and a constant off by its top word (probability 1/4 + 1/8) is
    rejected."""
    from svtagg.dp.joint import pmf, sample

    consts = (77, (1 << 70) + 4, (1 << 100) - 3)
    widths = (8, 72, 101)
    law = pmf(consts, widths, signed=False)
    draws = sample(consts, widths, 40_000, RandomSource(b"two words"), signed=False)
    assert _chi_square_pvalue(draws, law) > 1e-3
    shape = SamplerShape(consts, widths, 0, False, 64)
    words = _words(b"two words, circuit", shape, 40_000)
    assert _chi_square_pvalue(plain_joint_noise(words, shape), law) > 1e-3
    wrong = sample((77, (3 << 69) + 4, (1 << 100) - 3), widths, 40_000, RandomSource(b"w"), False)
    assert _chi_square_pvalue(wrong, law) < 1e-6
