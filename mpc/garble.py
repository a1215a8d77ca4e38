"""Half-gates garbling (Zahur–Rosulek–Evans 2015) with free-XOR and
point-and-permute, as three interchangeable gate backends — plaintext bits,
garbler (0-labels), evaluator (active labels) — so each circuit in
`circuits.py` is written once and runs identically on all three.

Every operation acts on a whole layer of gates at once: a "wire bundle" is an
(n, 2) uint64 array of labels (or an (n,) uint8 array of bits in plaintext), so
one AND layer costs two fixed-key AES calls over all its gates.

Gate numbering: each backend counts AND gates; full AND gate g uses tweaks
2g and 2g+1, a garbler-half AND uses 2g, all in the low tweak word, with the
session/chunk tag in the high word. Garbler and evaluator make the same calls
in the same order, so their counters agree.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from svtagg.mpc.aes import Blocks, TweakableHash

Bits = npt.NDArray[np.uint8]
Wires = Any  # Blocks for the label backends, Bits for the plaintext backend
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


class Hash(Protocol):
    def __call__(self, x: Blocks, tweaks: Blocks) -> Blocks: ...


def lsb(labels: Blocks) -> npt.NDArray[np.uint64]:
    """Point-and-permute bit of each label (bit 0 of word 0)."""
    return labels[:, 0] & _ONE


def _mask(bits: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """0/1 per row → all-zero / all-one 64-bit words, shaped to broadcast over (n, 2)."""
    return (-(bits.astype(np.uint64)))[:, None]


class Backend(Protocol):
    """The gate operations a circuit may use, on whole layers of wires."""

    and_gates: int

    def xor(self, a: Wires, b: Wires) -> Wires: ...
    def not_(self, a: Wires) -> Wires: ...
    def xor_const(self, a: Wires, bits: Bits | None) -> Wires: ...
    def and_(self, a: Wires, b: Wires) -> Wires: ...
    def and_const(self, bits: Bits | None, b: Wires) -> Wires: ...
    def or_(self, a: Wires, b: Wires) -> Wires: ...


class _Common:
    """Shared by the backends: OR from AND and free NOT, and tweak allocation."""

    and_gates: int = 0
    tweak_hi: np.uint64 = np.uint64(0)
    #: Every tweak used, when a test sets this to a list.
    tweak_log: list[Blocks] | None = None

    def not_(self, a: Wires) -> Wires:
        raise NotImplementedError

    def and_(self, a: Wires, b: Wires) -> Wires:
        raise NotImplementedError

    def or_(self, a: Wires, b: Wires) -> Wires:
        # a ∨ b = ¬(¬a ∧ ¬b); NOT is free.
        return self.not_(self.and_(self.not_(a), self.not_(b)))

    def _tweaks(self, n: int, per_gate: int) -> Blocks:
        """Tweaks of the next n AND gates, grouped by half: [(2g+h, hi) for g] for h < per_gate."""
        g = self.and_gates
        tw = np.empty((n * per_gate, 2), dtype=np.uint64)
        base = np.arange(2 * g, 2 * (g + n), 2, dtype=np.uint64)
        for h in range(per_gate):
            np.add(base, np.uint64(h), out=tw[h * n : (h + 1) * n, 0])
        tw[:, 1] = self.tweak_hi
        if self.tweak_log is not None:
            self.tweak_log.append(tw)
        return tw


class PlainBackend(_Common):
    """Plaintext evaluation of the same circuits: the reference semantics."""

    def __init__(self) -> None:
        self.and_gates = 0

    def xor(self, a: Bits, b: Bits) -> Bits:
        return a ^ b

    def not_(self, a: Bits) -> Bits:
        return a ^ np.uint8(1)

    def xor_const(self, a: Bits, bits: Bits | None) -> Bits:
        assert bits is not None
        return a ^ bits

    def and_(self, a: Bits, b: Bits) -> Bits:
        self.and_gates += a.shape[0]
        return a & b

    def and_const(self, bits: Bits | None, b: Bits) -> Bits:
        assert bits is not None
        self.and_gates += b.shape[0]
        return bits & b


class GarbleBackend(_Common):
    """The garbler's side: wires are 0-labels; AND layers append their tables."""

    def __init__(self, delta: Blocks, hasher: Hash, tweak_hi: int) -> None:
        if int(delta[0]) & 1 != 1:
            raise ValueError("Δ must have its low bit set (point-and-permute)")
        self.delta = np.ascontiguousarray(delta, dtype=np.uint64).reshape(2)
        self.hasher = hasher
        self.tweak_hi = np.uint64(tweak_hi)
        self.and_gates = 0
        self.tables: list[Blocks] = []

    def xor(self, a: Blocks, b: Blocks) -> Blocks:
        return a ^ b

    def not_(self, a: Blocks) -> Blocks:
        return a ^ self.delta

    def xor_const(self, a: Blocks, bits: Bits | None) -> Blocks:
        # The garbler knows the constant: relabel the wire instead of sending a label.
        assert bits is not None
        return a ^ (_mask(bits) & self.delta)

    def and_(self, a0: Blocks, b0: Blocks) -> Blocks:
        n = a0.shape[0]
        tw = self._tweaks(n, 2)
        d = self.delta
        x = np.empty((4 * n, 2), dtype=np.uint64)
        x[:n] = a0
        np.bitwise_xor(a0, d, out=x[n : 2 * n])
        x[2 * n : 3 * n] = b0
        np.bitwise_xor(b0, d, out=x[3 * n :])
        # Tweak j for both labels of a, j' = j+1 for both labels of b.
        tw4 = np.empty((4 * n, 2), dtype=np.uint64)
        tw4[:n] = tw[:n]
        tw4[n : 2 * n] = tw[:n]
        tw4[2 * n : 3 * n] = tw[n:]
        tw4[3 * n :] = tw[n:]
        h = self.hasher(x, tw4)
        ha0, ha1, hb0, hb1 = h[:n], h[n : 2 * n], h[2 * n : 3 * n], h[3 * n :]
        ma = _mask(lsb(a0))
        mb = _mask(lsb(b0))
        out = np.empty((2 * n, 2), dtype=np.uint64)
        tg, te = out[:n], out[n:]
        # Generator half: T_G = H(A0) ⊕ H(A1) ⊕ p_b·Δ, W_G = H(A0) ⊕ p_a·T_G.
        np.bitwise_xor(ha0, ha1, out=tg)
        tg ^= mb & d
        wg = ha0 ^ (ma & tg)
        # Evaluator half: T_E = H(B0) ⊕ H(B1) ⊕ A0, W_E = H(B0) ⊕ p_b·(T_E ⊕ A0).
        hb = hb0 ^ hb1
        np.bitwise_xor(hb, a0, out=te)
        we = hb0 ^ (mb & hb)
        self.tables.append(out)
        self.and_gates += n
        np.bitwise_xor(wg, we, out=wg)
        return wg

    def and_const(self, bits: Bits | None, b0: Blocks) -> Blocks:
        """a ∧ b with a known to the garbler only: one ciphertext per gate."""
        assert bits is not None
        n = b0.shape[0]
        tw = self._tweaks(n, 1)
        d = self.delta
        x = np.empty((2 * n, 2), dtype=np.uint64)
        x[:n] = b0
        np.bitwise_xor(b0, d, out=x[n:])
        tw2 = np.concatenate([tw, tw])
        h = self.hasher(x, tw2)
        hb0, hb1 = h[:n], h[n:]
        t = hb0 ^ hb1
        t ^= _mask(bits) & d
        self.tables.append(t)
        self.and_gates += n
        return hb0 ^ (_mask(lsb(b0)) & t)

    def decoding(self, a0: Blocks) -> Bits:
        """Output-decoding bits: the evaluator's value is lsb(label) ⊕ this."""
        return lsb(a0).astype(np.uint8)

    def table_bytes(self) -> bytes:
        return b"".join(t.tobytes() for t in self.tables)


class EvalBackend(_Common):
    """The evaluator's side: wires are the active labels; AND layers consume the
    garbler's tables in order."""

    def __init__(self, hasher: Hash, tweak_hi: int, tables: bytes | memoryview) -> None:
        self.hasher = hasher
        self.tweak_hi = np.uint64(tweak_hi)
        self.and_gates = 0
        self._tables = np.frombuffer(tables, dtype=np.uint64).reshape(-1, 2)
        self._pos = 0
        #: Every label the evaluator computes, when a test sets this to a list.
        self.label_log: list[Blocks] | None = None

    def _take(self, n: int) -> Blocks:
        if self._pos + n > self._tables.shape[0]:
            raise ValueError("garbled tables too short for the circuit")
        t = self._tables[self._pos : self._pos + n]
        self._pos += n
        return t

    def done(self) -> None:
        if self._pos != self._tables.shape[0]:
            raise ValueError("garbled tables longer than the circuit")

    def _log(self, w: Blocks) -> Blocks:
        if self.label_log is not None:
            self.label_log.append(w)
        return w

    def xor(self, a: Blocks, b: Blocks) -> Blocks:
        return self._log(a ^ b)

    def not_(self, a: Blocks) -> Blocks:
        return a

    def xor_const(self, a: Blocks, bits: Bits | None) -> Blocks:
        return a

    def and_(self, a: Blocks, b: Blocks) -> Blocks:
        n = a.shape[0]
        x = np.empty((2 * n, 2), dtype=np.uint64)
        x[:n] = a
        x[n:] = b
        h = self.hasher(x, self._tweaks(n, 2))
        tab = self._take(2 * n)
        tg, te = tab[:n], tab[n:]
        wg = h[:n] ^ (_mask(lsb(a)) & tg)
        we = h[n:] ^ (_mask(lsb(b)) & (te ^ a))
        np.bitwise_xor(wg, we, out=wg)
        self.and_gates += n
        return self._log(wg)

    def and_const(self, bits: Bits | None, b: Blocks) -> Blocks:
        n = b.shape[0]
        h = self.hasher(b, self._tweaks(n, 1))
        t = self._take(n)
        self.and_gates += n
        return self._log(h ^ (_mask(lsb(b)) & t))

    def decode(self, a: Blocks, decoding: Bits) -> Bits:
        return (lsb(a).astype(np.uint8)) ^ decoding
