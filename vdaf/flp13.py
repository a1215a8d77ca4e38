"""The fully linear proof of draft-irtf-cfrg-vdaf-13 (§7.3, [BBCGGI19] Thm 4.3)
with draft-13's validity circuits, for Mastic's weights (vdaf/mastic.py).

The rest of `vdaf/` is draft 07 (vdaf/flp.py, vectorised for Prio3's long
measurements).  Draft 13 changed what a circuit returns — a vector of
EVAL_OUTPUT_LEN values that the verifier reduces with query randomness,
instead of one value folded with joint randomness inside the circuit — and its
circuits (Sum with an offset, MultihotCountVec with a claimed weight).  A
Mastic weight is short (one element for a count, a few for a histogram), so
this module is scalar Python on ints: clarity first; the sparse path's cost is
the VIDPF, not this proof.

How the proof works is what docs/vdaf.md says of draft 07's: the prover
records every gadget call's inputs as wire values at the P-th roots of unity
(α^0 holding a random wire seed), interpolates the wire polynomials and sends
the seeds with the gadget polynomial G(wires(x)); the verifier reruns the
circuit on its share with call k answered by G(α^k), and tests G against the
wire polynomials at a random point t.  All of it is linear in (measurement,
proof) for a fixed t and joint randomness, so each aggregator does it on its
share and the two verifier shares add.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from svtagg.vdaf.field import Field, next_power_of_2, ntt

#: A circuit's way of calling its gadget `i` on a list of inputs.
Call = Callable[[int, list[int]], int]


class FlpError(ValueError):
    """An input the FLP cannot take (wrong lengths, a degenerate test point)."""


# ------------------------------------------------------------------ polynomials


def poly_eval(p: int, coeffs: Sequence[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % p
    return acc


def poly_mul(p: int, a: Sequence[int], b: Sequence[int]) -> list[int]:
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] = (out[i + j] + x * y) % p
    return out


def interpolate(f: Field, values: Sequence[int]) -> list[int]:
    """The coefficients of the polynomial of degree < n through
    (α^k, values[k]) for the n-th root α (n a power of two): the field's
    inverse NTT."""
    return f.to_ints(ntt(f, f.vec(list(values)), inverse=True))


# ------------------------------------------------------------------ gadgets


class Mul:
    arity = 2
    degree = 2

    def eval(self, p: int, x: Sequence[int]) -> int:
        return x[0] * x[1] % p

    def eval_poly(self, p: int, polys: Sequence[Sequence[int]]) -> list[int]:
        return poly_mul(p, polys[0], polys[1])


@dataclass(frozen=True)
class PolyEval:
    """x ↦ Σ coeffs[i]·x^i (coefficients as signed ints)."""

    coeffs: tuple[int, ...]
    arity = 1

    @property
    def degree(self) -> int:
        return len(self.coeffs) - 1

    def eval(self, p: int, x: Sequence[int]) -> int:
        return poly_eval(p, [c % p for c in self.coeffs], x[0])

    def eval_poly(self, p: int, polys: Sequence[Sequence[int]]) -> list[int]:
        out = [self.coeffs[0] % p]
        power: list[int] = [1]
        for c in self.coeffs[1:]:
            power = poly_mul(p, power, polys[0])
            out += [0] * (len(power) - len(out))
            for i, y in enumerate(power):
                out[i] = (out[i] + c * y) % p
        return out


class ParallelSum:
    """Σ of `count` Mul gadgets on consecutive pairs of the input (the only
    sub-gadget draft 13's circuits sum in parallel)."""

    degree = 2

    def __init__(self, count: int) -> None:
        self.count = count
        self.arity = 2 * count
        self._mul = Mul()

    def eval(self, p: int, x: Sequence[int]) -> int:
        return sum(x[2 * i] * x[2 * i + 1] for i in range(self.count)) % p

    def eval_poly(self, p: int, polys: Sequence[Sequence[int]]) -> list[int]:
        out: list[int] = []
        for i in range(self.count):
            part = self._mul.eval_poly(p, polys[2 * i : 2 * i + 2])
            out += [0] * (len(part) - len(out))
            for j, y in enumerate(part):
                out[j] = (out[j] + y) % p
        return out


Gadget = Mul | PolyEval | ParallelSum


# ------------------------------------------------------------------ circuits


class Circuit:
    """A draft-13 validity circuit: `eval` returns EVAL_OUTPUT_LEN values, all
    zero iff the encoded measurement is valid (on the sum of the shares)."""

    field: Field
    gadgets: list[Gadget]
    calls: list[int]
    meas_len: int
    joint_rand_len: int
    output_len: int
    eval_output_len: int

    def encode(self, measurement: object) -> list[int]:
        raise NotImplementedError

    def eval(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> list[int]:
        raise NotImplementedError

    def truncate(self, meas: list[int]) -> list[int]:
        return meas

    def decode(self, output: list[int], count: int) -> object:
        return list(output)

    # -- the draft's lengths
    @property
    def prove_rand_len(self) -> int:
        return sum(g.arity for g in self.gadgets)

    @property
    def query_rand_len(self) -> int:
        extra = self.eval_output_len if self.eval_output_len > 1 else 0
        return len(self.gadgets) + extra

    @property
    def proof_len(self) -> int:
        return sum(
            g.arity + g.degree * (next_power_of_2(1 + c) - 1) + 1
            for g, c in zip(self.gadgets, self.calls, strict=True)
        )

    @property
    def verifier_len(self) -> int:
        return 1 + sum(g.arity + 1 for g in self.gadgets)

    def _bits(self, value: int, bits: int) -> list[int]:
        if not 0 <= value < 1 << bits:
            raise ValueError(f"{value} does not fit in {bits} bits")
        return [(value >> i) & 1 for i in range(bits)]

    def _from_bits(self, bits: Sequence[int]) -> int:
        return sum(b << i for i, b in enumerate(bits)) % self.field.modulus

    def _bit_checks(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> int:
        """Σ over chunks of Σ_j r^(j+1)·m_j·(m_j − 1/num_shares): zero (w.h.p.
        over r) iff every m_j is a bit; the chunks of ParallelSum(Mul)."""
        p = self.field.modulus
        inv = pow(num_shares, -1, p)
        chunk = self.gadgets[0].arity // 2
        total = 0
        for i in range(self.calls[0]):
            r = joint_rand[i]
            rp = r
            inputs: list[int] = []
            for j in range(chunk):
                k = i * chunk + j
                m = meas[k] if k < len(meas) else 0
                inputs += [rp * m % p, (m - inv) % p]
                rp = rp * r % p
            total += g(0, inputs)
        return total % p


class Count(Circuit):
    """A 0/1 measurement: m² − m = 0."""

    def __init__(self, field: Field) -> None:
        self.field = field
        self.gadgets = [Mul()]
        self.calls = [1]
        self.meas_len, self.joint_rand_len, self.output_len, self.eval_output_len = 1, 0, 1, 1

    def encode(self, measurement: object) -> list[int]:
        if measurement not in (0, 1, True, False):
            raise ValueError("a count is 0 or 1")
        return [int(measurement)]  # type: ignore[call-overload]

    def eval(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> list[int]:
        return [(g(0, [meas[0], meas[0]]) - meas[0]) % self.field.modulus]

    def decode(self, output: list[int], count: int) -> object:
        return output[0]


class Sum(Circuit):
    """An integer in [0, max]: its bits, and the bits of it plus an offset
    2^bits − 1 − max, each checked to be bits, and checked to agree."""

    def __init__(self, field: Field, max_measurement: int) -> None:
        if max_measurement < 1:
            raise ValueError("Sum needs a maximum of at least 1")
        self.field = field
        self.max_measurement = max_measurement
        self.bits = max_measurement.bit_length()
        self.offset = (1 << self.bits) - 1 - max_measurement
        self.gadgets = [PolyEval((0, -1, 1))]
        self.calls = [2 * self.bits]
        self.meas_len = 2 * self.bits
        self.joint_rand_len, self.output_len = 0, 1
        self.eval_output_len = 2 * self.bits + 1

    def encode(self, measurement: object) -> list[int]:
        if not isinstance(measurement, int) or not 0 <= measurement <= self.max_measurement:
            raise ValueError(f"a Sum measurement is an integer in [0, {self.max_measurement}]")
        return self._bits(measurement, self.bits) + self._bits(measurement + self.offset, self.bits)

    def eval(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> list[int]:
        p = self.field.modulus
        inv = pow(num_shares, -1, p)
        out = [g(0, [b]) for b in meas]
        out.append(
            (
                self.offset * inv
                + self._from_bits(meas[: self.bits])
                - self._from_bits(meas[self.bits :])
            )
            % p
        )
        return out

    def truncate(self, meas: list[int]) -> list[int]:
        return [self._from_bits(meas[: self.bits])]

    def decode(self, output: list[int], count: int) -> object:
        return output[0]


class SumVec(Circuit):
    """`length` integers of `bits` bits each, bit-encoded."""

    def __init__(self, field: Field, length: int, bits: int, chunk_length: int) -> None:
        if length < 1 or bits < 1 or chunk_length < 1 or 1 << bits >= field.modulus:
            raise ValueError("SumVec needs length, bits, chunk_length ≥ 1 and 2^bits < p")
        self.field, self.length, self.bits = field, length, bits
        self.gadgets = [ParallelSum(chunk_length)]
        self.calls = [(length * bits + chunk_length - 1) // chunk_length]
        self.meas_len, self.output_len = length * bits, length
        self.joint_rand_len, self.eval_output_len = self.calls[0], 1

    def encode(self, measurement: object) -> list[int]:
        if not isinstance(measurement, Sequence) or len(measurement) != self.length:
            raise ValueError(f"a SumVec measurement is {self.length} integers")
        out: list[int] = []
        for v in measurement:
            out += self._bits(int(v), self.bits)
        return out

    def eval(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> list[int]:
        return [self._bit_checks(meas, joint_rand, num_shares, g)]

    def truncate(self, meas: list[int]) -> list[int]:
        b = self.bits
        return [self._from_bits(meas[i * b : (i + 1) * b]) for i in range(self.length)]


class Histogram(Circuit):
    """A one-hot vector of `length` buckets."""

    def __init__(self, field: Field, length: int, chunk_length: int) -> None:
        if length < 1 or chunk_length < 1:
            raise ValueError("Histogram needs length and chunk_length ≥ 1")
        self.field, self.length = field, length
        self.gadgets = [ParallelSum(chunk_length)]
        self.calls = [(length + chunk_length - 1) // chunk_length]
        self.meas_len = self.output_len = length
        self.joint_rand_len, self.eval_output_len = self.calls[0], 2

    def encode(self, measurement: object) -> list[int]:
        if not isinstance(measurement, int) or not 0 <= measurement < self.length:
            raise ValueError(f"a Histogram measurement is a bucket in [0, {self.length})")
        out = [0] * self.length
        out[measurement] = 1
        return out

    def eval(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> list[int]:
        p = self.field.modulus
        inv = pow(num_shares, -1, p)
        return [self._bit_checks(meas, joint_rand, num_shares, g), (sum(meas) - inv) % p]


class MultihotCountVec(Circuit):
    """A 0/1 vector with at most `max_weight` ones: the bits, and the claimed
    weight plus an offset 2^k − 1 − max_weight in k bits, checked to agree."""

    def __init__(self, field: Field, length: int, max_weight: int, chunk_length: int) -> None:
        if length < 1 or not 0 < max_weight <= length or chunk_length < 1:
            raise ValueError("MultihotCountVec needs 0 < max_weight ≤ length, chunk_length ≥ 1")
        self.field, self.length, self.max_weight = field, length, max_weight
        self.weight_bits = max_weight.bit_length()
        self.offset = (1 << self.weight_bits) - 1 - max_weight
        if field.modulus - self.offset <= length:
            raise ValueError("length and max_weight too large for the field")
        self.gadgets = [ParallelSum(chunk_length)]
        self.calls = [(length + self.weight_bits + chunk_length - 1) // chunk_length]
        self.meas_len = length + self.weight_bits
        self.output_len = length
        self.joint_rand_len, self.eval_output_len = self.calls[0], 2

    def encode(self, measurement: object) -> list[int]:
        if not isinstance(measurement, Sequence) or len(measurement) != self.length:
            raise ValueError(f"a MultihotCountVec measurement is {self.length} booleans")
        counts = [int(bool(x)) for x in measurement]
        if sum(counts) > self.max_weight:
            raise ValueError(f"more than {self.max_weight} items set")
        return counts + self._bits(self.offset + sum(counts), self.weight_bits)

    def eval(self, meas: list[int], joint_rand: list[int], num_shares: int, g: Call) -> list[int]:
        p = self.field.modulus
        inv = pow(num_shares, -1, p)
        weight = sum(meas[: self.length])
        claimed = self._from_bits(meas[self.length :])
        check = (self.offset * inv + weight - claimed) % p
        return [self._bit_checks(meas, joint_rand, num_shares, g), check]

    def truncate(self, meas: list[int]) -> list[int]:
        return meas[: self.length]


# ------------------------------------------------------------------ the FLP


class Flp:
    """prove / query / decide for one circuit."""

    def __init__(self, circuit: Circuit) -> None:
        self.circuit = circuit
        self.field = circuit.field
        self.p = circuit.field.modulus

    def _sizes(self, i: int) -> tuple[int, int]:
        """Gadget i's number of wire points P and its gadget polynomial's length."""
        g = self.circuit.gadgets[i]
        n = next_power_of_2(1 + self.circuit.calls[i])
        return n, g.degree * (n - 1) + 1

    def _check(self, meas: Sequence[int], joint_rand: Sequence[int]) -> None:
        c = self.circuit
        if len(meas) != c.meas_len or len(joint_rand) != c.joint_rand_len:
            raise FlpError("measurement or joint randomness of the wrong length")

    def prove(self, meas: list[int], prove_rand: list[int], joint_rand: list[int]) -> list[int]:
        c, p = self.circuit, self.p
        self._check(meas, joint_rand)
        if len(prove_rand) != c.prove_rand_len:
            raise FlpError("prover randomness of the wrong length")
        wires: list[list[list[int]]] = []
        seeds = iter(prove_rand)
        for i, g in enumerate(c.gadgets):
            n, _ = self._sizes(i)
            wires.append([[next(seeds)] + [0] * (n - 1) for _ in range(g.arity)])
        calls = [0] * len(c.gadgets)

        def call(i: int, x: list[int]) -> int:
            calls[i] += 1
            for w, v in zip(wires[i], x, strict=True):
                w[calls[i]] = v
            return c.gadgets[i].eval(p, x)

        c.eval(meas, joint_rand, 1, call)
        proof: list[int] = []
        for i, g in enumerate(c.gadgets):
            _, length = self._sizes(i)
            poly = g.eval_poly(p, [interpolate(self.field, w) for w in wires[i]])
            if any(poly[length:]):
                raise FlpError("a gadget polynomial longer than its degree allows")
            proof += [w[0] for w in wires[i]] + (poly + [0] * length)[:length]
        return proof

    def query(
        self,
        meas: list[int],
        proof: list[int],
        query_rand: list[int],
        joint_rand: list[int],
        num_shares: int,
    ) -> list[int]:
        c, p, f = self.circuit, self.p, self.field
        self._check(meas, joint_rand)
        if len(proof) != c.proof_len or len(query_rand) != c.query_rand_len:
            raise FlpError("proof or query randomness of the wrong length")
        wires: list[list[list[int]]] = []
        polys: list[list[int]] = []
        at = 0
        for i, g in enumerate(c.gadgets):
            n, length = self._sizes(i)
            wires.append([[s] + [0] * (n - 1) for s in proof[at : at + g.arity]])
            at += g.arity
            polys.append(proof[at : at + length])
            at += length
        calls = [0] * len(c.gadgets)

        def call(i: int, x: list[int]) -> int:
            calls[i] += 1
            for w, v in zip(wires[i], x, strict=True):
                w[calls[i]] = v
            n = len(wires[i][0])
            return poly_eval(p, polys[i], pow(f.root(n), calls[i], p))

        out = c.eval(meas, joint_rand, num_shares, call)
        rand = list(query_rand)
        if c.eval_output_len > 1:
            weights, rand = rand[: c.eval_output_len], rand[c.eval_output_len :]
            v = sum(r * o for r, o in zip(weights, out, strict=True)) % p
        else:
            (v,) = out
        verifier = [v]
        for i, t in enumerate(rand):
            n = len(wires[i][0])
            if pow(t, n, p) == 1:
                raise FlpError("the test point is a root of unity")
            verifier += [poly_eval(p, interpolate(f, w), t) for w in wires[i]]
            verifier.append(poly_eval(p, polys[i], t))
        return verifier

    def decide(self, verifier: list[int]) -> bool:
        c, p = self.circuit, self.p
        if len(verifier) != c.verifier_len:
            raise FlpError("verifier of the wrong length")
        if verifier[0] != 0:
            return False
        at = 1
        for g in c.gadgets:
            wires, check = verifier[at : at + g.arity], verifier[at + g.arity]
            at += g.arity + 1
            if g.eval(p, wires) != check:
                return False
        return True
