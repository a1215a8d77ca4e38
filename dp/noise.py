"""Exact discrete noise samplers on the integer grid, driven by a CSPRNG.

Both samplers rest on one fact: the binary digits of a geometric variable are
independent.  If P(G = g) = (1 − q)·q^g with q = exp(−1/t), then bit k of G is
Bernoulli(p_k) with p_k = 1 / (1 + exp(2^k / t)), independently of the other bits.
So a geometric draw is a handful of Bernoulli draws, each of which we take by
comparing a uniform 64-bit word with the first 64 binary digits of p_k and, in
the 2^-64 event of a tie, with the next 64 digits, and so on.  The digits are
computed from the exact rational t with rigorous integer interval arithmetic, so
no float lies on the path from ε to a draw and the sampled distribution is
exactly the geometric one (Canonne, Kamath, Steinke 2020 reach exactness with a
different, sequential algorithm; this one vectorises over numpy arrays).

The high part G >> K (K chosen so that P(G >= 2^K) < 2^-64) is handled exactly
too: it is itself geometric with ratio q^(2^K), and by memorylessness
(G >> K | G >> K >= 1) = 1 + a fresh draw of the same law.

- `geometric(t)`: P(G = g) ∝ exp(−g/t), g ≥ 0 — the one-sided "Exp(t)" of the note.
- `discrete_laplace(t)`: a signed geometric with "−0" rejected, P(X = x) ∝ exp(−|x|/t).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.dp.kinds import Family, StreamKind, clamp_bound, noise_model

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

_WORD = 64


class RandomSource:
    """AES-128-CTR keystream as a CSPRNG.

    The key comes from os.urandom unless a seed is given; a seed makes runs
    reproducible and is meant for tests and experiments only (servers never
    pass one).
    """

    def __init__(self, seed: bytes | None = None) -> None:
        key = os.urandom(16) if seed is None else _derive_key(seed)
        self._enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()

    def random_bytes(self, n: int) -> bytes:
        return self._enc.update(b"\x00" * n)

    def u64(self, size: int) -> U64:
        """`size` independent uniform 64-bit words (a read-only array)."""
        return np.frombuffer(self.random_bytes(8 * size), dtype=np.uint64)


def _derive_key(seed: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes

    h = hashes.Hash(hashes.SHA256())
    h.update(b"svtagg RandomSource seed\x00" + seed)
    return h.finalize()[:16]


# --------------------------------------------------------------------------------------
# Exact digits of p = 1/(1+e^y) and of e^-y for rational y >= 0.


def _exp_bounds(y: Fraction, prec: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= e^y * 2^prec <= hi, for rational y >= 0.

    Range reduction z = y / 2^r <= 1/2, a Taylor series in fixed point with
    directed rounding (z and every term rounded down for lo, up for hi) and a
    rigorous remainder bound, then r squarings rounded the same way.
    """
    if y < 0:
        raise ValueError("y must be >= 0")
    num, den = y.numerator, y.denominator
    r = 0
    while 2 * num > den << r:  # y / 2^r > 1/2
        r += 1
    den <<= r
    work = prec + 2 * r + 24
    one = 1 << work
    z_lo = (num << work) // den
    z_hi = -(-(num << work) // den)
    t_lo = t_hi = s_lo = s_hi = one
    i = 0
    while True:
        i += 1
        t_lo = (t_lo * z_lo >> work) // i
        t_hi = -(-(t_hi * z_hi) // (one * i))
        s_lo += t_lo
        s_hi += t_hi
        # remainder <= 2·term_i·z/(i+1) (z <= 1/2), in units of 2^-work
        if 2 * t_hi * z_hi < (i + 1) * one:
            s_hi += 1
            break
    lo, hi = s_lo, s_hi
    for _ in range(r):
        lo = (lo * lo) >> work
        hi = -(-(hi * hi) >> work)
    shift = work - prec
    return lo >> shift, -((-hi) >> shift)


@lru_cache(maxsize=4096)
def _digits(y: Fraction, which: str, m: int) -> int:
    """floor(v * 2^m) exactly, for v = 1/(1+e^y) ("logistic") or v = e^-y ("exp").

    v is irrational for rational y > 0 (e^y is transcendental), so the floor is
    well defined and the refinement loop terminates.
    """
    prec = m + 32
    while True:
        lo, hi = _exp_bounds(y, prec)  # e^y in [lo, hi] / 2^prec
        one = 1 << prec
        if which == "logistic":
            # v in [2^prec/(2^prec+hi), 2^prec/(2^prec+lo)]
            v_lo = (one << m) // (one + hi)
            v_hi = (one << m) // (one + lo)
        elif which == "exp":
            v_lo = (one << m) // hi
            v_hi = (one << m) // lo
        else:
            raise ValueError(which)
        if v_lo == v_hi:
            return v_lo
        prec *= 2


def _word(y: Fraction, which: str, w: int) -> int:
    """The w-th 64-bit word (w = 1, 2, ...) of the binary expansion of v."""
    return _digits(y, which, _WORD * w) & ((1 << _WORD) - 1)


def _bernoulli(y: Fraction, which: str, size: int, rng: RandomSource) -> npt.NDArray[np.bool_]:
    """Exact Bernoulli(v) draws by lazy comparison of uniform words with v's digits."""
    first = np.uint64(_word(y, which, 1))
    u = rng.u64(size)
    out = u < first
    ties = np.flatnonzero(u == first)
    for idx in ties:  # probability 2^-64 each; resolved exactly word by word
        out[idx] = _resolve_tie(y, which, rng)
    return out


@lru_cache(maxsize=1024)
def _plan(scale: Fraction) -> tuple[int, tuple[Fraction, ...], Fraction, U64]:
    """Low-bit count K, exponents y_k = 2^k/t of bits 0..K-1, y_K, first digit words.

    K is the least integer with 2^K/t > 45, so P(G >= 2^K) = exp(-2^K/t) < 2^-64
    (45 > 64·ln 2); K only sets how often the exact high-part path runs.
    """
    k = 0
    while Fraction(1 << k) / scale <= 45:
        k += 1
    ys = tuple(Fraction(1 << i) / scale for i in range(k))
    words = np.array([_word(y, "logistic", 1) for y in ys], dtype=np.uint64)
    return k, ys, Fraction(1 << k) / scale, words


def _resolve_tie(y: Fraction, which: str, rng: RandomSource) -> bool:
    """Bernoulli(v) given that the first uniform word equalled v's first word."""
    w = 2
    while True:
        word = _word(y, which, w)
        uw = int(rng.u64(1)[0])
        if uw != word:
            return uw < word
        w += 1


#: Up to this many draws, the samplers run on Python integers (`_few`): a
#: one-query chunk's noise is one draw per server, where numpy's per-call
#: overhead was most of its cost.  Both paths take the same random words in the
#: same order and compute the same function of them (tests/test_noise_few.py).
FEW = 8


@lru_cache(maxsize=1024)
def _few_plan(
    scale: Fraction,
) -> tuple[int, tuple[int, ...], int, tuple[Fraction, ...], Fraction, int]:
    """`_plan`'s K and first digit words as Python ints, y_K's first word, the
    exponents (for ties) and the clamp bound: one cache lookup per draw."""
    k, ys, y_high, words = _plan(scale)
    first = _word(y_high, "exp", 1)
    return k, tuple(int(w) for w in words), first, ys, y_high, clamp_bound(scale)


def _geometric_few(scale: Fraction, size: int, rng: RandomSource) -> list[int]:
    """`geometric` for size <= FEW, on Python integers: the k·size words of the
    low bits (bit-major, as `geometric`'s matrix), ties resolved in that order,
    then the high part's size words, its ties, and its rare extra draws."""
    k, words, first, ys, y_high, _ = _few_plan(scale)
    out = [0] * size
    if k:
        flat = rng.u64(k * size).tolist()
        for bit, w in enumerate(words):
            for idx in range(size):
                u = flat[bit * size + idx]
                if u < w or (u == w and _resolve_tie(ys[bit], "logistic", rng)):
                    out[idx] |= 1 << bit
    high = [
        u < first or (u == first and _resolve_tie(y_high, "exp", rng))
        for u in rng.u64(size).tolist()
    ]
    for idx, h in enumerate(high):
        if h:
            out[idx] += (1 + int(geometric(scale / (1 << k), 1, rng)[0])) << k
    return out


def _discrete_laplace_few(scale: Fraction, size: int, rng: RandomSource) -> list[int]:
    """`discrete_laplace` for size <= FEW, on Python integers (same rounds,
    same words, same order)."""
    out = [0] * size
    todo = list(range(size))
    while todo:
        mag = _geometric_few(scale, len(todo), rng)
        signs = rng.random_bytes(len(todo))
        again = []
        for i, m, b in zip(todo, mag, signs, strict=True):
            if b & 1 and m == 0:  # "−0": redrawn
                again.append(i)
            else:
                out[i] = -m if b & 1 else m
        todo = again
    return out


def geometric(scale: Fraction, size: int, rng: RandomSource) -> I64:
    """Exact draws with P(G = g) = (1 − q) q^g, q = exp(−1/scale), g = 0, 1, ..."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if size <= FEW:
        return np.array(_geometric_few(scale, size, rng), dtype=np.int64)
    return _geometric_many(scale, size, rng)


def _geometric_many(scale: Fraction, size: int, rng: RandomSource) -> I64:
    """`geometric` on numpy arrays (the path for more than FEW draws)."""
    k, ys, y_high, words = _plan(scale)
    out = np.zeros(size, dtype=np.int64)
    if k:
        if size <= 4096:
            # few draws: one matrix pass beats a Python loop over bits
            u = rng.u64(k * size).reshape(k, size)
            col = words[:, None]
            bits = u < col
            tie = u == col
            if tie.any():
                for bit, idx in zip(*np.nonzero(tie), strict=True):
                    bits[bit, idx] = _resolve_tie(ys[bit], "logistic", rng)
            shifts = np.arange(k, dtype=np.int64)[:, None]
            out = (bits.astype(np.int64) << shifts).sum(axis=0)
        else:  # many draws: row by row keeps the working set small
            for bit in range(k):
                row = rng.u64(size)
                b = row < words[bit]
                for idx in np.flatnonzero(row == words[bit]):
                    b[idx] = _resolve_tie(ys[bit], "logistic", rng)
                out |= b.astype(np.int64) << bit
    # High part: geometric with ratio e^{-y_high}; nonzero with probability < 2^-64.
    high = _bernoulli(y_high, "exp", size, rng)
    for idx in np.flatnonzero(high):
        h = 1 + int(geometric(scale / (1 << k), 1, rng)[0])
        out[idx] += h << k
    return np.asarray(out, dtype=np.int64)


def discrete_laplace(scale: Fraction, size: int, rng: RandomSource) -> I64:
    """Exact draws with P(X = x) ∝ exp(−|x|/scale) on the integers.

    A geometric magnitude with a uniform sign, rejecting "−0" so that zero is not
    counted twice: the accepted law is ∝ q^|x| exactly, and only a (1 − q)/2
    fraction of draws is redone (half the cost of the difference of two geometrics).
    """
    if size <= FEW:
        return np.array(_discrete_laplace_few(scale, size, rng), dtype=np.int64)
    return _discrete_laplace_many(scale, size, rng)


def _discrete_laplace_many(scale: Fraction, size: int, rng: RandomSource) -> I64:
    """`discrete_laplace` on numpy arrays (the path for more than FEW draws)."""
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        mag = _geometric_many(scale, todo.size, rng)
        neg = (np.frombuffer(rng.random_bytes(todo.size), dtype=np.uint8) & 1).astype(bool)
        ok = ~(neg & (mag == 0))
        out[todo[ok]] = np.where(neg[ok], -mag[ok], mag[ok])
        todo = todo[~ok]
    return out


def draw(family: Family, scale: Fraction, size: int, rng: RandomSource) -> I64:
    """Draws of one family, clamped to ±clamp_bound(scale) (see kinds.TAIL_SCALES);
    the family "none" is all zeros and takes no randomness."""
    if family == "none":
        return np.zeros(size, dtype=np.int64)
    if size <= FEW:
        few = (_discrete_laplace_few if family == "laplace" else _geometric_few)(scale, size, rng)
        bound = _few_plan(scale)[5]
        return np.array([min(max(v, -bound), bound) for v in few], dtype=np.int64)
    raw = discrete_laplace(scale, size, rng) if family == "laplace" else geometric(scale, size, rng)
    bound = clamp_bound(scale)
    return np.clip(raw, -bound, bound)


def draw_threshold_noise(
    kind: StreamKind | str, epsilon: Fraction, frac_bits: int, rng: RandomSource
) -> int:
    """One party's threshold noise γ for a stream of this kind, in grid units."""
    model = noise_model(kind)
    return int(draw(model.threshold_family, model.threshold_scale(epsilon, frac_bits), 1, rng)[0])


def draw_query_noise(
    kind: StreamKind | str, epsilon: Fraction, frac_bits: int, k: int, rng: RandomSource
) -> I64:
    """One party's fresh per-query noise ν for k queries, in grid units."""
    model = noise_model(kind)
    return draw(model.query_family, model.query_scale(epsilon, frac_bits), k, rng)


# --------------------------------------------------------------------------------------
# Exact probability mass functions (used by tests and by the accuracy function).


def geometric_log_pmf(scale: Fraction, g: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """log P(G = g) for the geometric law above (float; for tests and tails)."""
    a = 1.0 / float(scale)
    g_arr = np.asarray(g, dtype=np.float64)
    return np.log(-math.expm1(-a)) - a * g_arr


def sum_pmf(family: Family, scale: Fraction, parties: int) -> tuple[int, npt.NDArray[np.float64]]:
    """(lowest value, pmf) of the sum of `parties` independent draws of one
    family, on a window of ±30 scales per draw (the mass left out is below
    e^−30 per draw): the exact law the audits and the crawl's loss compare
    against."""
    span = math.ceil(30 * scale)
    if family == "laplace":
        lo, x = -span, np.arange(-span, span + 1)
        one = np.exp(laplace_log_pmf(scale, x))
    else:
        lo, x = 0, np.arange(0, span + 1)
        one = np.exp(geometric_log_pmf(scale, x))
    pmf = one
    for _ in range(parties - 1):
        pmf = np.convolve(pmf, one)
    return lo * parties, pmf


def laplace_log_pmf(scale: Fraction, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """log P(X = x) for the discrete Laplace law above."""
    a = 1.0 / float(scale)
    x_arr = np.abs(np.asarray(x, dtype=np.float64))
    # (1-q)/(1+q) = tanh(a/2)
    return np.log(math.tanh(a / 2.0)) - a * x_arr
