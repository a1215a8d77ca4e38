"""Jointly generated noise: a two-sided geometric-like sample drawn inside the
garbled circuit from both servers' random bits and handed out as additive shares.

Why: with independent noise each server adds its own draw, so a server that
colludes with the analyst knows half of the noise.  Here neither server knows
any of it: the circuit's random bits are u ⊕ v, u the garbler's (the helper's,
on the servers) and v the evaluator's (the leader's), both from os.urandom, so the joint bits are
uniform unless both servers collude.  The output is re-shared as in the robust
pass: the garbler keeps a fresh r, the evaluator learns y = ν − r mod 2^64, so the
online comparison circuits take ν as one more additive share and stay unchanged.

The sampler (its exact law is `svtagg.dp.joint`):

- K binary digits of a geometric magnitude G.  Digit i is Bernoulli(c_i / 2^b)
  for public b-bit constants c_i (1 ≤ c_i < 2^b; `dp.joint.sampler_constants`
  rounds P_i = q^(2^i) / (1 + q^(2^i)) = 1 / (1 + e^(2^i/t))): bit_i = [U_i < c_i]
  for the i-th b-bit block U_i of the joint bits, the complement of the carry
  out of U_i + (2^b − c_i).  With the public addend bits k, the carry is
  c' = c ⊕ ((x ⊕ c) ∧ (k ⊕ c)), one AND per bit (the first a garbler-half
  gate), and the K comparisons run side by side: b AND layers for all digits.
- A sign bit s, one more joint bit.  ν = G for s = 0 and ν = −G − 1 = ¬G for
  s = 1, i.e. every bit of ν is g_i ⊕ s (bits ≥ K are s): free.  This maps the
  two halves onto disjoint supports [0, 2^K) and [−2^K, 0), so there is no
  "−0" to reject and the law is exactly P(ν = x) = ½ P(G = x) for x ≥ 0 and
  ½ P(G = −x − 1) for x < 0: a discrete Laplace centred at −½.
- y = ν − r: the carry chain of `circuits._add_const`, 63 ANDs.

AND gates per sample: K·b + 63 (`and_gates_per_sample`).  The random bits,
K·b + 1 per sample, are packed into W = ⌈(K·b + 1)/64⌉ 64-bit words: bit j of
a sample is bit j mod 64 of its word j // 64.  The evaluator's words go in by
OT (as W input vectors of n lanes, word w of sample s in lane w·n + s); the
garbler's words and −r are garbler inputs, free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from svtagg.mpc.circuits import WireSource, _add_const, lane_batches, ring_from_bits
from svtagg.mpc.garble import Backend, Bits, Wires
from svtagg.mpc.protocol import ChunkCircuit, ComparisonEvaluator, ComparisonGarbler
from svtagg.mpc.ring import RING_BITS, U64

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SamplerShape:
    """The public description of the sampler: b and the constants c_0..c_{K−1}."""

    constants: tuple[int, ...]
    bits: int

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= RING_BITS:
            raise ValueError(f"constant width must be in [1, 64], got {self.bits}")
        if not 1 <= len(self.constants) < RING_BITS:
            raise ValueError("the sampler needs between 1 and 63 digits")
        if any(not 1 <= c < 1 << self.bits for c in self.constants):
            raise ValueError("every constant must be in [1, 2^bits)")

    @property
    def digits(self) -> int:
        """K, the binary digits of the magnitude."""
        return len(self.constants)

    @property
    def random_bits(self) -> int:
        """Joint random bits per sample: K·b for the digits, one for the sign."""
        return self.digits * self.bits + 1

    @property
    def words(self) -> int:
        """W: 64-bit words of random bits per sample and party."""
        return -(-self.random_bits // RING_BITS)


def and_gates_per_sample(shape: SamplerShape) -> int:
    """K·b for the digit comparisons plus 63 for subtracting r."""
    return shape.digits * shape.bits + RING_BITS - 1


def _digit_bits(be: Backend, x: list[Wires], shape: SamplerShape, garbler: bool) -> list[Wires]:
    """bit_i = [U_i < c_i] for every digit i, all digits in one gate call per bit
    position: x holds the joint bits j = 0..K·b − 1, each an n-lane wire vector."""
    k, b = shape.digits, shape.bits
    n = x[0].shape[0]
    addends = [(1 << b) - c for c in shape.constants]

    def addend_bits(t: int) -> Bits | None:  # bit t of every digit's addend, K·n lanes
        if not garbler:
            return None
        return np.repeat(np.array([(a >> t) & 1 for a in addends], dtype=np.uint8), n)

    def row(t: int) -> Wires:  # bit t of U_0, …, U_{K−1}, laid end to end
        return np.concatenate([x[i * b + t] for i in range(k)])

    carry = be.and_const(addend_bits(0), row(0))  # c_1 = x_0 ∧ k_0
    for t in range(1, b):
        xt, c = row(t), carry
        carry = be.xor(c, be.and_(be.xor(xt, c), be.xor_const(c, addend_bits(t))))
    below = be.not_(carry)  # no carry out: U_i + 2^b − c_i < 2^b, i.e. U_i < c_i
    return [below[i * n : (i + 1) * n] for i in range(k)]


def joint_noise_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, shape: SamplerShape
) -> tuple[Wires, ...]:
    """y = ν − r mod 2^64 for n samples ν of the sampler on the joint bits u ⊕ v.

    a_bits: the garbler's (64, (W + 1)·n) bits — W vectors of n words of u, then
    the n constants −r (None on the evaluator); b: the evaluator's W·n words of
    v.  Outputs 64 bundles of n wires, bit i of y in bundle i.
    """
    w = shape.words
    garbler = a_bits is not None
    # Each batch is copied as it comes: the OT extension reuses its label buffer.
    bw = np.concatenate([b(lo, hi).copy() for lo, hi in lane_batches(w * n)], axis=1)
    x: list[Wires] = []
    for j in range(shape.random_bits):
        word, pos = divmod(j, RING_BITS)
        u = None if a_bits is None else a_bits[pos, word * n : (word + 1) * n]
        x.append(be.xor_const(bw[pos, word * n : (word + 1) * n], u))
    sign = x[-1]
    mag = _digit_bits(be, x[:-1], shape, garbler)
    nu = [be.xor(g, sign) for g in mag] + [sign] * (RING_BITS - shape.digits)

    def neg_r(i: int) -> Bits | None:
        return None if a_bits is None else a_bits[i, w * n : (w + 1) * n]

    return tuple(_add_const(be, nu, neg_r))


def plain_joint_noise(words: U64, shape: SamplerShape) -> I64:
    """Plaintext reference: the sample of each column of `words` ((W, n) joint
    random words, u ⊕ v), straight from the definition."""
    words = np.asarray(words, dtype=np.uint64).reshape(shape.words, -1)

    def bit(j: int) -> npt.NDArray[np.int64]:
        word, pos = divmod(j, RING_BITS)
        return ((words[word] >> np.uint64(pos)) & np.uint64(1)).astype(np.int64)

    b = shape.bits
    g = np.zeros(words.shape[1], dtype=np.int64)
    for i, c in enumerate(shape.constants):
        u = np.zeros(words.shape[1], dtype=object)  # U_i < 2^b: Python integers
        for t in range(b):
            u = u + (bit(i * b + t).astype(object) << t)
        g |= (u < c).astype(np.int64) << i
    s = bit(shape.random_bits - 1)
    return np.where(s == 1, -g - 1, g)


def _parse_nothing(msg: bytes, k: int) -> None:
    if msg:
        raise ValueError("malformed result message")


def joint_noise_spec(shape: SamplerShape) -> ChunkCircuit[U64 | None]:
    """The chunk of n samples: W evaluator input vectors (the words of v), one
    garbler-only vector (−r); the evaluator decodes y, the garbler learns nothing."""
    ands = and_gates_per_sample(shape)
    return ChunkCircuit(
        inputs=tuple(f"v{i}" for i in range(shape.words)),
        outputs=RING_BITS,
        circuit=lambda be, a_bits, b, k: joint_noise_circuit(be, a_bits, b, k, shape),
        decode=ring_from_bits,
        encode=lambda y, k: b"",
        parse=_parse_nothing,
        empty=lambda: None,
        garbler_inputs=1,
        # 2 ciphertexts per AND over the W lanes a sample takes, rounded up.
        tables_per_lane=-(-2 * ands // shape.words) + 1,
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
    return r


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
