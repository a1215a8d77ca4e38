"""Half-gates garbling (Zahur–Rosulek–Evans 2015) with free-XOR and
point-and-permute, as three interchangeable gate backends — plaintext bits,
garbler (0-labels), evaluator (active labels) — so each circuit in
`circuits.py` is written once and runs identically on all three.

Every operation acts on a whole layer of gates at once: a "wire bundle" is an
(n, 2) uint64 array of labels (or an (n,) uint8 array of bits in plaintext), so
one AND layer costs two fixed-key AES calls over all its gates.

Tweaks: each backend counts AND layers; half h ∈ {0, 1} of the gate in lane k
of layer L has the low tweak word L·2^32 + 2k + h (a garbler-half gate uses
h = 0), and the session/chunk tag as its high word. Garbler and evaluator make
the same calls in the same order, so their counters agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from svtagg.mpc.aes import Blocks

Bits = npt.NDArray[np.uint8]
Wires = Any  # Blocks for the label backends, Bits for the plaintext backend
_ONE = np.uint64(1)


class Hash(Protocol):
    def __call__(self, x: Blocks, tweaks: Blocks, out: Blocks | None = None) -> Blocks: ...


def lsb(labels: Blocks) -> npt.NDArray[np.uint64]:
    """Point-and-permute bit of each label (bit 0 of word 0)."""
    return labels[:, 0] & _ONE


def _mask(bits: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """0/1 per row → all-zero / all-one 64-bit words, shaped to broadcast over (n, 2)."""
    return (-(bits.astype(np.uint64)))[:, None]


def _lsb_mask(labels: Blocks, out: Blocks | None = None) -> Blocks:
    """All-ones/all-zeros rows by the point-and-permute bit, full (n, 2) shape:
    numpy's same-shape AND is several times faster than broadcasting an (n, 1)
    mask over the length-2 axis."""
    n = labels.shape[0]
    m = np.empty((n, 2), dtype=np.uint64) if out is None else out[:n]
    np.bitwise_and(labels[:, 0], _ONE, out=m[:, 0])
    np.negative(m[:, 0], out=m[:, 0])
    m[:, 1] = m[:, 0]
    return m


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
    and_layers: int = 0
    tweak_hi: np.uint64 = np.uint64(0)
    #: Every tweak used, when a test sets this to a list.
    tweak_log: list[Blocks] | None = None
    #: Every wire a gate produces, in gate order, when a test sets this to a list:
    #: bits (plain), 0-labels (garbler) or active labels (evaluator).
    label_log: list[Wires] | None = None

    def _log(self, w: Wires) -> Wires:
        if self.label_log is not None:
            self.label_log.append(w.copy())
        return w

    def not_(self, a: Wires) -> Wires:
        raise NotImplementedError

    def and_(self, a: Wires, b: Wires) -> Wires:
        raise NotImplementedError

    def or_(self, a: Wires, b: Wires) -> Wires:
        # a ∨ b = ¬(¬a ∧ ¬b); NOT is free.
        return self.not_(self.and_(self.not_(a), self.not_(b)))

    def _workspace(self, name: str, rows: int) -> Blocks:
        """A reusable C-contiguous buffer of at least rows + 1 rows (the slack row
        is for `FixedKeyAES.permute`); callers slice what they use. Reusing
        buffers matters: first-touch page faults cost as much as the AES."""
        ws: dict[str, Blocks] = self.__dict__.setdefault("workspace", {})
        buf = ws.get(name)
        if buf is None or buf.shape[0] < rows + 1:
            buf = np.empty((max(rows + 1, 1024), 2), dtype=np.uint64)
            ws[name] = buf
        return buf

    def _tweaks(self, n: int, halves: tuple[int, ...], step: int = 2) -> Blocks:
        """Tweaks of the next AND layer (n gates), one block of n rows per entry of
        `halves`: half h of the gate in lane k of layer L gets the tweak
        (L·2^32 + step·k + h, hi), h < step (step 3 for three-halves gates, whose
        three hashed pairs take h = 0, 1, 2). Counts the layer."""
        if n >= (1 << 32) // step:
            raise ValueError("AND layer too wide for the tweak format")
        patterns: dict[tuple[int, tuple[int, ...], int], Blocks] = self.__dict__.setdefault(
            "_patterns", {}
        )
        pat = patterns.get((n, halves, step))
        if pat is None:
            pat = np.empty((n * len(halves), 2), dtype=np.uint64)
            lanes = np.arange(0, step * n, step, dtype=np.uint64)
            for k, h in enumerate(halves):
                np.add(lanes, np.uint64(h), out=pat[k * n : (k + 1) * n, 0])
            pat[:, 1] = self.tweak_hi
            patterns[(n, halves, step)] = pat
        tw = self._workspace("tweaks", pat.shape[0])[: pat.shape[0]]
        # Only the low word changes with the layer: one strided XOR over it,
        # the high word copied (no broadcasting over the length-2 axis).
        np.bitwise_xor(pat[:, 0], np.uint64(self.and_layers << 32), out=tw[:, 0])
        tw[:, 1] = pat[:, 1]
        self.and_layers += 1
        if self.tweak_log is not None:
            first = {h: k for k, h in reversed(list(enumerate(halves)))}
            self.tweak_log.extend(tw[k * n : (k + 1) * n].copy() for k in first.values())
        return tw


class PlainBackend(_Common):
    """Plaintext evaluation of the same circuits: the reference semantics."""

    def __init__(self) -> None:
        self.and_gates = 0

    def xor(self, a: Bits, b: Bits) -> Bits:
        return self._log(a ^ b)

    def not_(self, a: Bits) -> Bits:
        return self._log(a ^ np.uint8(1))

    def xor_const(self, a: Bits, bits: Bits | None) -> Bits:
        assert bits is not None
        return self._log(a ^ bits)

    def and_(self, a: Bits, b: Bits) -> Bits:
        self.and_gates += a.shape[0]
        return self._log(a & b)

    def and_const(self, bits: Bits | None, b: Bits) -> Bits:
        assert bits is not None
        self.and_gates += b.shape[0]
        return self._log(bits & b)


class GarbleBackend(_Common):
    """The garbler's side: wires are 0-labels; AND layers write their tables,
    in gate order, into one preallocated buffer that becomes the message."""

    def __init__(
        self,
        delta: Blocks,
        hasher: Hash,
        tweak_hi: int,
        capacity_blocks: int = 0,
        buffer: Blocks | None = None,
        workspace: dict[str, Blocks] | None = None,
    ) -> None:
        """`buffer`: a (rows, 2) uint64 array to write tables into if big enough,
        and `workspace`: scratch buffers by name, so a party can reuse both
        across chunks (fresh pages cost page faults)."""
        self.workspace = workspace if workspace is not None else {}
        if int(delta[0]) & 1 != 1:
            raise ValueError("Δ must have its low bit set (point-and-permute)")
        self.delta = np.ascontiguousarray(delta, dtype=np.uint64).reshape(2)
        self.hasher = hasher
        self.tweak_hi = np.uint64(tweak_hi)
        self.and_gates = 0
        if buffer is not None and buffer.shape[0] >= capacity_blocks + 1:
            self._buf = buffer
        else:
            self._buf = np.empty((capacity_blocks + 1, 2), dtype=np.uint64)
        self._used = 0
        #: Tables before this block were already handed to `on_batch`.
        self._sent = 0
        #: Called (from whatever thread garbles) with the tables of each finished
        #: lane batch of the comparison, when the protocol streams them.
        self.on_batch: Callable[[memoryview], None] | None = None

    def batch_done(self) -> None:
        """End of one lane batch of the sign test: hand its tables on (streaming)."""
        if self.on_batch is not None:
            part = self._buf[self._sent : self._used].reshape(-1).view(np.uint8)
            self._sent = self._used
            self.on_batch(part.data)

    @property
    def buffer(self) -> Blocks:
        """The table buffer, for reuse by the next chunk's backend."""
        return self._buf

    def _alloc(self, n: int) -> Blocks:
        """The next n table blocks of the message buffer (grown if the hint was short)."""
        need = self._used + n
        if need + 1 > self._buf.shape[0]:
            bigger = np.empty((max(need + 1, 2 * self._buf.shape[0]), 2), dtype=np.uint64)
            bigger[: self._used] = self._buf[: self._used]
            self._buf = bigger
        out = self._buf[self._used : need]
        self._used = need
        return out

    def xor(self, a: Blocks, b: Blocks) -> Blocks:
        return self._log(a ^ b)

    def not_(self, a: Blocks) -> Blocks:
        return self._log(a ^ self.delta)

    def _delta_rows(self, n: int) -> Blocks:
        """Δ repeated on n rows (kept), for same-shape ANDs with full masks."""
        rows: Blocks | None = self.__dict__.get("_drows")
        if rows is None or rows.shape[0] < n:
            rows = np.empty((max(n, 1024), 2), dtype=np.uint64)
            rows[:] = self.delta
            self._drows = rows
        return rows[:n]

    def xor_const(self, a: Blocks, bits: Bits | None) -> Blocks:
        # The garbler knows the constant: relabel the wire instead of sending a label.
        assert bits is not None
        n = a.shape[0]
        m = self._workspace("mc", n)[:n]
        np.negative(bits.astype(np.uint64), out=m[:, 0])
        m[:, 1] = m[:, 0]
        np.bitwise_and(m, self._delta_rows(n), out=m)
        return self._log(a ^ m)

    def and_(self, a0: Blocks, b0: Blocks) -> Blocks:
        n = a0.shape[0]
        d = self.delta
        # Hash inputs [A0, A1, B0, B1] under tweaks [j, j, j', j'] (halves 0 and 1).
        tw = self._tweaks(n, (0, 0, 1, 1))
        x = self._workspace("x", 4 * n)[: 4 * n]
        x[:n] = a0
        np.bitwise_xor(a0, d, out=x[n : 2 * n])
        x[2 * n : 3 * n] = b0
        np.bitwise_xor(b0, d, out=x[3 * n :])
        h = self.hasher(x, tw, self._workspace("h", 4 * n))
        ha0, ha1, hb0, hb1 = h[:n], h[n : 2 * n], h[2 * n : 3 * n], h[3 * n :]
        ma = _lsb_mask(a0, self._workspace("ma", n))
        mb = _lsb_mask(b0, self._workspace("mb", n))
        tab = self._alloc(2 * n)
        tg, te = tab[:n], tab[n:]
        # In place over the hash outputs and x, which are dead afterwards:
        # T_G = H(A0) ⊕ H(A1) ⊕ p_b·Δ,  W_G = H(A0) ⊕ p_a·T_G,
        # T_E = H(B0) ⊕ H(B1) ⊕ A0,     W_E = H(B0) ⊕ p_b·(H(B0) ⊕ H(B1)).
        np.bitwise_xor(ha0, ha1, out=tg)
        np.bitwise_and(mb, self._delta_rows(n), out=x[:n])
        np.bitwise_xor(tg, x[:n], out=tg)
        np.bitwise_xor(hb0, hb1, out=hb1)
        np.bitwise_xor(hb1, a0, out=te)
        np.bitwise_and(ma, tg, out=ha1)
        np.bitwise_xor(ha0, ha1, out=ha0)
        np.bitwise_and(mb, hb1, out=hb1)
        np.bitwise_xor(hb0, hb1, out=hb0)
        c0 = np.empty((n, 2), dtype=np.uint64)
        np.bitwise_xor(ha0, hb0, out=c0)
        self.and_gates += n
        return self._log(c0)

    def and_const(self, bits: Bits | None, b0: Blocks) -> Blocks:
        """a ∧ b with a known to the garbler only: one ciphertext per gate."""
        assert bits is not None
        n = b0.shape[0]
        d = self.delta
        tw = self._tweaks(n, (0, 0))
        x = self._workspace("x", 2 * n)[: 2 * n]
        x[:n] = b0
        np.bitwise_xor(b0, d, out=x[n:])
        h = self.hasher(x, tw, self._workspace("h", 2 * n))
        hb0, hb1 = h[:n], h[n:]
        t = self._alloc(n)
        np.bitwise_xor(hb0, hb1, out=t)
        t ^= _mask(bits) & d
        self.and_gates += n
        return self._log(hb0 ^ (_lsb_mask(b0) & t))

    def decoding(self, a0: Blocks) -> Bits:
        """Output-decoding bits: the evaluator's value is lsb(label) ⊕ this."""
        return lsb(a0).astype(np.uint8)

    def table_bytes(self) -> bytes:
        """All tables garbled so far, in gate order."""
        return self._buf[: self._used].tobytes()

    def message(self, trailer: npt.NDArray[np.uint8]) -> memoryview:
        """The tables not yet handed on, followed by `trailer` (e.g. decoding
        bits), as one message: a view of the table buffer, valid until the
        next chunk garbles into it (the protocol sends it before that)."""
        nblocks = (trailer.shape[0] + 15) // 16
        used = self._used
        self._alloc(nblocks)
        raw = self._buf.reshape(-1).view(np.uint8)
        raw[16 * used : 16 * used + trailer.shape[0]] = trailer
        self._used = used
        return raw[16 * self._sent : 16 * used + trailer.shape[0]].data


class EvalBackend(_Common):
    """The evaluator's side: wires are the active labels; AND layers consume the
    garbler's tables in order."""

    def __init__(
        self,
        hasher: Hash,
        tweak_hi: int,
        tables: bytes | bytearray | memoryview,
        workspace: dict[str, Blocks] | None = None,
        more: Callable[[], bytes | bytearray | memoryview] | None = None,
    ) -> None:
        """`more`: when the tables arrive in parts (one per lane batch of the
        sign test, then the rest), returns the next part; a gate never takes
        tables across two parts."""
        self.workspace = workspace if workspace is not None else {}
        self.hasher = hasher
        self.tweak_hi = np.uint64(tweak_hi)
        self.and_gates = 0
        self._tables = self._blocks(tables)
        self._pos = 0
        self._more = more

    @staticmethod
    def _blocks(raw: bytes | bytearray | memoryview) -> Blocks:
        if len(raw) % 16:
            raise ValueError("garbled tables are not whole blocks")
        return np.frombuffer(raw, dtype=np.uint64).reshape(-1, 2)

    def _take(self, n: int) -> Blocks:
        if self._pos + n > self._tables.shape[0]:
            if self._more is None or self._pos != self._tables.shape[0]:
                raise ValueError("garbled tables too short for the circuit")
            self._tables = self._blocks(self._more())
            self._pos = 0
            if n > self._tables.shape[0]:  # a gate never spans two parts
                raise ValueError("garbled tables too short for the circuit")
        t = self._tables[self._pos : self._pos + n]
        self._pos += n
        return t

    def peek(self, n: int) -> Blocks:
        """The next n table blocks, left to be taken."""
        t = self._take(n)
        self._pos -= n
        return t

    def done(self) -> None:
        if self._pos != self._tables.shape[0]:
            raise ValueError("garbled tables longer than the circuit")

    def xor(self, a: Blocks, b: Blocks) -> Blocks:
        return self._log(a ^ b)

    def not_(self, a: Blocks) -> Blocks:
        return self._log(a)

    def xor_const(self, a: Blocks, bits: Bits | None) -> Blocks:
        return self._log(a)

    def and_(self, a: Blocks, b: Blocks) -> Blocks:
        n = a.shape[0]
        x = self._workspace("x", 2 * n)[: 2 * n]
        x[:n] = a
        x[n:] = b
        h = self.hasher(x, self._tweaks(n, (0, 1)), self._workspace("h", 2 * n))
        ha, hb = h[:n], h[n:]
        tab = self._take(2 * n)
        tg, te = tab[:n], tab[n:]
        # W_G = H(A) ⊕ s_a·T_G,  W_E = H(B) ⊕ s_b·(T_E ⊕ A),  C = W_G ⊕ W_E.
        np.bitwise_xor(te, a, out=x[:n])
        np.bitwise_and(_lsb_mask(b, self._workspace("mb", n)), x[:n], out=x[:n])
        np.bitwise_xor(hb, x[:n], out=hb)
        np.bitwise_and(_lsb_mask(a, self._workspace("ma", n)), tg, out=x[n:])
        np.bitwise_xor(ha, x[n:], out=ha)
        c = np.empty((n, 2), dtype=np.uint64)
        np.bitwise_xor(ha, hb, out=c)
        self.and_gates += n
        return self._log(c)

    def and_const(self, bits: Bits | None, b: Blocks) -> Blocks:
        n = b.shape[0]
        h = self.hasher(np.ascontiguousarray(b), self._tweaks(n, (0,)), self._workspace("h", n))
        t = self._take(n)
        self.and_gates += n
        return self._log(h ^ (_lsb_mask(b) & t))

    def decode(self, a: Blocks, decoding: Bits) -> Bits:
        return (lsb(a).astype(np.uint8)) ^ decoding
