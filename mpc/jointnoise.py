"""Jointly generated noise: a geometric-like sample drawn inside the garbled
circuit from both servers' random bits and handed out as additive shares.

Why: with independent noise each server adds its own draw, so a server that
colludes with the analyst knows half of the noise.  Here neither server knows
any of it: the circuit's random bits are u ⊕ v, u the garbler's (the helper's,
on the servers) and v the evaluator's (the leader's), both from os.urandom, so
the joint bits are uniform unless both servers collude.  The output is
re-shared as in the robust pass: the garbler keeps a fresh r, the evaluator
learns y = Z − r mod 2^(w−F), and each scales its share by 2^F, so the
online comparison circuits take 2^F·Z as one more additive share and stay
unchanged.  Z is in whole sensitivities (one user's largest move of a score);
why a lattice that coarse is enough is in docs/privacy.md ("The sampler").

The sampler (its exact law is `svtagg.dp.joint`):

- K binary digits of a geometric magnitude G.  Digit i is Bernoulli(c_i / 2^b_i)
  for public constants c_i of b_i bits (1 ≤ c_i < 2^b_i; `dp.joint.fitted_digits`
  rounds P_i = 1 / (1 + e^(2^i/t)) to a fixed number of significant bits, so a
  digit is as wide as its leading zeros plus that precision): bit_i = [U_i < c_i]
  for the i-th block U_i of b_i joint bits, the complement of the carry out of
  U_i + k_i, k_i = 2^b_i − c_i.  k_i is public, so the carry is 0 below its
  lowest 1, a bit of U_i at it, and c' = c ⊕ ((x ⊕ c) ∧ (k ⊕ c)) above it (one
  AND per bit, the NOT of a public 1 free); the digits still running at a bit
  position share one gate call.
- Two-sided (lap24, lap3): a sign bit s, one more joint bit.  Z = G for s = 0
  and Z = −G − 1 = ¬G for s = 1, i.e. every bit of Z is g_i ⊕ s (bits ≥ K are
  s): free.  The two halves have disjoint supports [0, 2^K) and [−2^K, 0), so
  there is no "−0" to reject and the law is exactly P(Z = x) = ½ P(G = x) for
  x ≥ 0 and ½ P(G = −x − 1) for x < 0: a discrete Laplace centred at −½.
  One-sided (exp3, `signed=False`): Z = G, no sign bit.
- y = Z − r mod 2^(w−F): the carry chain of `circuits._add_const`, w − F − 1
  ANDs, w the stream's comparison width (64 unless the stream's public
  parameters bound it lower): the comparison reads only the low w bits of the
  shares, so the shares are exact mod 2^w and their bits ≥ w are not used.

AND gates per sample: Σ_i (b_i − 1 − tz(k_i)) + w − F − 1
(`and_gates_per_sample`; 201 for lap24's ν at ε = 1, F = 16, w = 64; 171 at
w = 34).  The random bits, Σ b_i (+ 1 for the sign) per sample, are packed
into W = ⌈bits/64⌉ lanes of ⌈bits/W⌉ bits: bit j of a sample is bit
j mod `lane_bits` of its lane j // `lane_bits`.  The evaluator's lanes go in by
OT at that width (W input vectors of n lanes, lane l of sample s at l·n + s);
the garbler's bits and −r are garbler inputs, free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from svtagg.mpc.circuits import WireSource, _add_const, lane_batches, ring_from_bits
from svtagg.mpc.garble import Backend, Bits, Wires
from svtagg.mpc.protocol import ChunkCircuit, ComparisonEvaluator, ComparisonGarbler
from svtagg.mpc.ring import RING_BITS, U64, Widths, widths_of

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SamplerShape:
    """The public description of the sampler: the constants c_0..c_{K−1}, their
    widths b_i (one for all digits or one each), and the shift F: the shares
    are of 2^F·Z."""

    constants: tuple[int, ...]
    bits: Widths
    shift: int = 0
    #: False: the one-sided sampler, Z = G ≥ 0 (no sign bit; exp3's noise).
    signed: bool = True
    #: w: the shares are exact mod 2^w only (the comparison reads the low w
    #: bits, `circuits.sign_yes`), so the re-share stops at bit w − 1.
    width: int = RING_BITS

    def __post_init__(self) -> None:
        widths = widths_of(self.constants, self.bits)
        if not all(1 <= b <= 2 * RING_BITS for b in widths):
            raise ValueError(f"every digit's width must be in [1, 128], got {self.bits}")
        if not 1 <= len(self.constants) < RING_BITS:
            raise ValueError("the sampler needs between 1 and 63 digits")
        if any(not 1 <= c < 1 << b for c, b in zip(self.constants, widths, strict=True)):
            raise ValueError("every constant must be in [1, 2^bits)")
        if not 0 <= self.shift < self.width - len(self.constants) <= RING_BITS:
            raise ValueError("the shift and width leave no room for the sample")

    @property
    def digits(self) -> int:
        """K, the binary digits of the magnitude."""
        return len(self.constants)

    @property
    def widths(self) -> tuple[int, ...]:
        """b_0, …, b_{K−1}."""
        return widths_of(self.constants, self.bits)

    @property
    def random_bits(self) -> int:
        """Joint random bits per sample: Σ b_i for the digits, one for the sign."""
        return sum(self.widths) + int(self.signed)

    @property
    def words(self) -> int:
        """W: input lanes per sample and party (OT'd words on the evaluator)."""
        return -(-self.random_bits // RING_BITS)

    @property
    def lane_bits(self) -> int:
        """Random bits per lane: the evaluator's OT width, ⌈bits / W⌉."""
        return -(-self.random_bits // self.words)

    @property
    def out_bits(self) -> int:
        """Bits of Z − r computed: w − F (the shares' low F bits are 0, bits ≥ w
        are not read)."""
        return self.width - self.shift

    def position(self, j: int) -> tuple[int, int]:
        """(lane, bit) of the sample's random bit j."""
        return divmod(j, self.lane_bits)


def _lowest_set(x: int) -> int:
    return (x & -x).bit_length() - 1


def digit_and_gates(shape: SamplerShape) -> int:
    """ANDs of the K comparisons: b_i − 1 − (trailing zeros of 2^b_i − c_i) each."""
    return sum(
        b - 1 - _lowest_set((1 << b) - c)
        for c, b in zip(shape.constants, shape.widths, strict=True)
    )


def and_gates_per_sample(shape: SamplerShape) -> int:
    """The digit comparisons plus w − F − 1 for subtracting r."""
    return digit_and_gates(shape) + shape.out_bits - 1


def _digit_bits(be: Backend, x: list[Wires], shape: SamplerShape) -> list[Wires]:
    """bit_i = [U_i < c_i] for every digit i: the complement of the carry out of
    U_i + k_i, k_i = 2^b_i − c_i public.  Below k_i's lowest 1 the carry is 0,
    at it the carry is that bit of U_i, above it one AND per bit,
    c' = c ⊕ ((x ⊕ c) ∧ (k_t ⊕ c)) (majority with a public bit); the digits
    still running at bit t share one gate call.  x: digit i's bits start at
    Σ_{j<i} b_j, each an n-lane wire vector."""
    widths = shape.widths
    addends = [(1 << b) - c for c, b in zip(shape.constants, widths, strict=True)]
    starts = [sum(widths[:i]) for i in range(len(widths))]
    low = [_lowest_set(k) for k in addends]
    n = x[0].shape[0]
    carry: list[Wires] = [x[s + t] for s, t in zip(starts, low, strict=True)]
    for t in range(1, max(widths)):
        live = [i for i in range(len(widths)) if low[i] < t < widths[i]]
        if not live:
            continue
        xs = np.concatenate([x[starts[i] + t] for i in live])
        cs = np.concatenate([carry[i] for i in live])
        # k_t ⊕ c: a NOT where the public bit is 1 (the evaluator does nothing)
        ks = np.concatenate([be.not_(carry[i]) if addends[i] >> t & 1 else carry[i] for i in live])
        # c' = c ⊕ ((x ⊕ c) ∧ (k ⊕ c)): the majority of x, k and c.
        out = be.xor(cs, be.and_(be.xor(xs, cs), ks))
        for j, i in enumerate(live):
            carry[i] = out[j * n : (j + 1) * n]
    return [be.not_(c) for c in carry]  # no carry out: U_i + 2^b_i − c_i < 2^b_i


def joint_noise_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, shape: SamplerShape
) -> tuple[Wires, ...]:
    """y = Z − r mod 2^(w−F) for n samples Z of the sampler on the joint bits
    u ⊕ v (w = `shape.width`).

    a_bits: the garbler's (64, (W + 1)·n) bits — W vectors of n words of u, then
    the n constants −r (None on the evaluator); b: the evaluator's W·n lanes of
    v, `lane_bits` each.  Outputs w − F bundles of n wires, bit i of y in
    bundle i."""
    w = shape.words
    # Each batch is copied as it comes: the OT extension reuses its label buffer.
    bw = np.concatenate([b(lo, hi).copy() for lo, hi in lane_batches(w * n)], axis=1)
    bits = shape.lane_bits
    # The joint bits u ⊕ v: one relabelling of all the evaluator's wires by the
    # garbler's bits (bit j of a sample at row j mod lane_bits of its word).
    flat = bw[:bits].reshape(bits * w * n, *bw.shape[2:])
    u_all = None if a_bits is None else a_bits[:bits, : w * n].reshape(-1)
    joint = be.xor_const(flat, u_all).reshape(bw[:bits].shape)
    x: list[Wires] = []
    for j in range(shape.random_bits):
        word, pos = shape.position(j)
        x.append(joint[pos, word * n : (word + 1) * n])
    if shape.signed:
        sign = x[-1]
        mag = _digit_bits(be, x[:-1], shape)
        z = [be.xor(g, sign) for g in mag] + [sign] * (shape.out_bits - shape.digits)
    else:
        mag = _digit_bits(be, x, shape)
        zero = be.xor(x[0], x[0])  # the constant 0 (both labels agree)
        z = mag + [zero] * (shape.out_bits - shape.digits)

    def neg_r(i: int) -> Bits | None:
        return None if a_bits is None else a_bits[i, w * n : (w + 1) * n]

    return tuple(_add_const(be, z, neg_r))


def plain_joint_noise(words: U64, shape: SamplerShape) -> I64:
    """Plaintext reference: the sample Z of each column of `words` ((W, n) joint
    random words, u ⊕ v; bits above `lane_bits` ignored), from the definition."""
    words = np.asarray(words, dtype=np.uint64).reshape(shape.words, -1)

    def bit(j: int) -> npt.NDArray[np.int64]:
        word, pos = shape.position(j)
        return ((words[word] >> np.uint64(pos)) & np.uint64(1)).astype(np.int64)

    g = np.zeros(words.shape[1], dtype=np.int64)
    start = 0
    for i, (c, b) in enumerate(zip(shape.constants, shape.widths, strict=True)):
        u = np.zeros(words.shape[1], dtype=object)  # U_i < 2^b_i: Python integers
        for t in range(b):
            u = u + (bit(start + t).astype(object) << t)
        g |= (u < c).astype(np.int64) << i
        start += b
    if not shape.signed:
        return g
    s = bit(shape.random_bits - 1)
    return np.where(s == 1, -g - 1, g)


def _parse_nothing(msg: bytes, k: int) -> None:
    if msg:
        raise ValueError("malformed result message")


def joint_noise_spec(shape: SamplerShape) -> ChunkCircuit[U64 | None]:
    """The chunk of n samples: W evaluator input vectors (the words of v, OT'd at
    `lane_bits` each), one garbler-only vector (−r); the evaluator decodes
    y·2^F, the garbler learns nothing."""
    ands = and_gates_per_sample(shape)
    low, high = shape.shift, RING_BITS - shape.width

    def decode(rows: list[Bits]) -> U64:
        zero = np.zeros_like(rows[0])
        return ring_from_bits([zero] * low + list(rows) + [zero] * high)

    return ChunkCircuit(
        inputs=tuple(f"v{i}" for i in range(shape.words)),
        outputs=shape.out_bits,
        circuit=lambda be, a_bits, b, k: joint_noise_circuit(be, a_bits, b, k, shape),
        decode=decode,
        encode=lambda y, k: b"",
        parse=_parse_nothing,
        empty=lambda: None,
        garbler_inputs=1,
        # 2 ciphertexts per AND over the W lanes a sample takes, rounded up.
        tables_per_lane=-(-2 * ands // shape.words) + 1,
        width=shape.lane_bits,
    )


def _random_words(count: int) -> U64:
    return np.frombuffer(os.urandom(8 * count), dtype="<u8").astype(np.uint64)


async def garble_joint_noise(
    party: ComparisonGarbler, n: int, shape: SamplerShape, u: U64 | None = None
) -> U64:
    """The garbler's side of n joint samples (the helper's, on the servers):
    returns its share r (os.urandom), which it keeps.

    u: its (W, n) random words; os.urandom unless given — tests pass them to
    check the output against `plain_joint_noise` and to run the one-server
    control; a server never passes them."""
    u = _random_words(shape.words * n) if u is None else np.asarray(u, dtype=np.uint64)
    u = u.reshape(shape.words, n)
    r = _random_words(n)
    await party._chunk_flow(joint_noise_spec(shape), *u, np.uint64(0) - r)
    return r << np.uint64(shape.shift)


async def evaluate_joint_noise(
    party: ComparisonEvaluator, n: int, shape: SamplerShape, v: U64 | None = None
) -> U64:
    """The evaluator's side of n joint samples (the leader's, on the servers):
    returns its share y = ν − r, the only output the circuit decodes.

    v: its (W, n) random words; os.urandom unless given (tests only, as for
    `garble_joint_noise`)."""
    v = _random_words(shape.words * n) if v is None else np.asarray(v, dtype=np.uint64)
    y = await party._chunk_flow(joint_noise_spec(shape), *v.reshape(shape.words, n))
    return y if y is not None else np.zeros(0, dtype=np.uint64)
