"""SoftSpoken OT extension (Roy, CRYPTO 2022), semi-honest, producing the same
correlated OTs as IKNP (`ot.IKNPReceiver` / `ot.IKNPSender`) with a shorter
per-extension message: κ/k bits per OT instead of κ.

Roles as in `ot.py`: the evaluator (OT receiver, base-OT sender) and the
garbler (OT sender, base-OT receiver with choice string s = Δ).  κ = 128 is cut
into n = κ/k blocks of k bits; Δ_i = Σ_b s[i·k + b]·2^b.

Setup (once, after the base OTs): for every block i the evaluator grows a GGM
tree of depth k from a fresh CSPRNG seed; at each level it sends the XOR of the
left children masked with base-OT key k_{j,1} and the XOR of the right children
masked with k_{j,0} (j = i·k + b, b = k − level: the tree's first split is the
high bit of the leaf index).  The garbler, whose choice s_j is Δ_i's bit b,
unmasks the sum of the side its path does not take, and so learns every leaf
s_{i,x} except x = Δ_i.  It keeps its leaves relabelled by y = x ⊕ Δ_i, so the
unknown one is always y = 0 and no address depends on Δ.  The GGM PRG is the
project's fixed-key AES hash: children H(node, (side, GGM_TWEAK | level)).

Per extension (nonce fresh per extension under one setup), for ℓ OTs:
G_{i,x} = AES-CTR_{s_{i,x}}(nonce ‖ counter), ℓ bits (the IKNP row PRG's
counter layout).  Evaluator: u_i = ⊕_x G_{i,x}, t rows v_i[b] = ⊕_{x_b = 1}
G_{i,x}, message c_i = u_i ⊕ r.  Garbler: w_i[b] = ⊕_{y_b = 1} G_{i,y⊕Δ_i}
(= v_i[b] ⊕ Δ_i[b]·u_i), rows q = w_i[b] ⊕ Δ_i[b]·c_i = t ⊕ r·Δ_i[b].  After the
transpose q_j ⊕ t_j = r_j·Δ, exactly the IKNP correlation.  The sums over x
are folded bit by bit (≈ 2·2^k row XORs per block); the native core fuses the
AES-CTR expansion with the fold (`_gc.ss_expand`), the numpy reference uses
OpenSSL ECB per leaf; both give the same bytes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.mpc import ferret, native
from svtagg.mpc.aes import Blocks, TweakableHash, ggm_level
from svtagg.mpc.channel import Channel
from svtagg.mpc.ot import (
    KAPPA,
    IKNPReceiver,
    IKNPSender,
    _bits_to_block,
    _check_widths,
    _label_buffer,
    transpose_rows,
)

#: Supported block sizes k (k divides κ = 128).
SOFTSPOKEN_KS = (1, 2, 4, 8)
DEFAULT_K = 4
#: High tweak word of the GGM hash (the level is or-ed in); garbling tweaks
#: carry a session tag and a chunk counter there instead.
GGM_TWEAK = 0x5353_6767_6D00_0000
_HEADER = b"SSOT"


def _check_k(k: int) -> int:
    if k not in SOFTSPOKEN_KS:
        raise ValueError(f"SoftSpoken k must be one of {SOFTSPOKEN_KS}, got {k!r}")
    return k


def setup_message_bytes(k: int) -> int:
    """Length of the evaluator's setup message: header, then two 16-byte sums
    per level of each of the κ/k trees (4,096 bytes + 5 for any k)."""
    return len(_HEADER) + 1 + 2 * 16 * KAPPA


def message_bytes(widths: list[int], k: int) -> int:
    """Length of the per-extension message for pieces of `widths` bytes (8 OTs
    a byte): κ/k bits per OT."""
    return (KAPPA // k) * sum(widths)


def _stride(width: int) -> int:
    """Row stride for `width` bytes: whole AES blocks and one spare, so that a
    width of a multiple of 4 KiB does not put every row of the transpose's
    byte-column gather in the same cache set (measured 10× slower)."""
    return 16 * ((width + 15) // 16) + 16


def _reuse(owner: Any, name: str, size: int) -> npt.NDArray[np.uint8]:
    """A per-party scratch buffer of `size` bytes kept across extensions
    (fresh pages cost a page fault per 4 KiB)."""
    buf: npt.NDArray[np.uint8] | None = getattr(owner, name, None)
    if buf is None or buf.shape[0] < size:
        buf = np.empty(size, dtype=np.uint8)
        setattr(owner, name, buf)
    return buf[:size]


def _hasher() -> Any:
    return native.NativeHash() if native.active() == "native" else TweakableHash()


def _children(h: Any, nodes: Blocks, level: int) -> npt.NDArray[np.uint64]:
    """GGM children (n, width, side, word) of the nodes (n, width, 2) of n trees."""
    return ggm_level(h, nodes, GGM_TWEAK | level)


def _key_blocks(keys: list[bytes]) -> Blocks:
    return np.frombuffer(b"".join(keys), dtype=np.uint64).reshape(-1, 2).copy()


def fold(g: npt.NDArray[np.uint8], k: int, v_out: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """The numpy reference of the sums: g is (n, 2^k, W) leaf streams; writes
    v_out[i·k + b] = ⊕_{x: bit b of x set} g[i, x] and returns u = ⊕_x g[i, x],
    (n, W).  Bit by bit: pairs differing in bit b are summed after their odd
    member has been added to v[b]."""
    n, leaves, width = g.shape
    v = v_out.reshape(n, k, width)
    cur = g
    for b in range(k):
        c = cur.reshape(n, leaves >> (b + 1), 2, width)
        np.bitwise_xor.reduce(c[:, :, 1], axis=1, out=v[:, b])
        cur = c[:, :, 0] ^ c[:, :, 1]
    return cur.reshape(n, width)


class _LeafPRG:
    """AES-CTR streams of the leaf seeds, folded per block.  `skip0`: the
    garbler's blocks have no leaf 0 (its relabelled punctured leaf, taken as
    zero).  Counter blocks nonce ‖ first + j, big-endian, as `ot._RowPRG`."""

    def __init__(self, leaves: Blocks, k: int, skip0: bool) -> None:
        self.k, self.skip0 = k, skip0
        self.n = KAPPA // k
        per = (1 << k) - int(skip0)
        if leaves.shape != (self.n * per, 2):
            raise ValueError("wrong number of leaf seeds")
        raw = np.ascontiguousarray(leaves).tobytes()
        self._enc = [
            Cipher(algorithms.AES(raw[16 * i : 16 * i + 16]), modes.ECB()).encryptor()
            for i in range(self.n * per)
        ]
        self._schedules = native.core().expand_keys(raw) if native.available() else None

    def fused(self) -> bool:
        """The native core expands, corrects and transposes in one pass (`labels`)."""
        return native.active() == "native" and self._schedules is not None

    def labels(
        self, nonce: int, first: int, width: int, out: Blocks, garbler: tuple[Any, Any] | None,
        evaluator: tuple[Any, Any] | None,
    ) -> None:  # fmt: skip
        """The native core's one pass over a piece (`_gc.ss_labels`): the
        transposed rows into `out`, corrected with (c, Δ bits) for the garbler,
        or writing the message piece (u_out, r) for the evaluator."""
        c, s = garbler if garbler is not None else (None, None)
        u, r = evaluator if evaluator is not None else (None, None)
        native.core().ss_labels(
            self._schedules, self.k, int(self.skip0), nonce, first, width, c, s, u, r, out
        )

    def expand(
        self, nonce: int, first: int, width: int, v_out: npt.NDArray[np.uint8], u_out: Any
    ) -> None:
        """v_out (128, ≥ 16·nblk) rows and, if given, u_out (n, ≥ 16·nblk) for
        `width` bytes of every leaf stream from counter `first` on."""
        nblk = (width + 15) // 16
        if native.active() == "native" and self._schedules is not None:
            native.core().ss_expand(
                self._schedules, self.k, int(self.skip0), nonce, first, nblk,
                v_out, v_out.shape[1], u_out, 0 if u_out is None else u_out.shape[1],
            )  # fmt: skip
            return
        ctr = np.empty((nblk, 2), dtype=">u8")
        ctr[:, 0] = nonce
        ctr[:, 1] = np.arange(first, first + nblk, dtype=np.uint64)
        src = ctr.data.cast("B")
        leaves = 1 << self.k
        size = self.n * leaves * (16 * nblk + 16)  # rows with OpenSSL's slack block
        g = _reuse(self, "_g", size).reshape(self.n, leaves, 16 * nblk + 16)
        if self.skip0:
            g[:, 0] = 0  # the garbler's unknown leaf counts as zero
        start = int(self.skip0)
        targets = [g[i, x] for i in range(self.n) for x in range(start, leaves)]
        for enc, row in zip(self._enc, targets, strict=True):
            enc.update_into(src, row.data)
        u = fold(g[:, :, : 16 * nblk], self.k, v_out[:, : 16 * nblk])
        if u_out is not None:
            u_out[:, : 16 * nblk] = u


class SoftSpokenReceiver:
    """The evaluator: grows the trees, knows every leaf; sends c_i = u_i ⊕ r."""

    def __init__(self, keys: list[tuple[bytes, bytes]], k: int = DEFAULT_K) -> None:
        if len(keys) != KAPPA:
            raise ValueError(f"need {KAPPA} base OTs")
        self.k = _check_k(k)
        self._keys0 = _key_blocks([p[0] for p in keys])
        self._keys1 = _key_blocks([p[1] for p in keys])
        self._prg: _LeafPRG | None = None
        self.leaves: Blocks | None = None  # (n·2^k, 2), block-major; tests read it
        self._msg_buf = np.empty(0, dtype=np.uint8)
        self._t_buf = np.empty(0, dtype=np.uint8)  # the pieces' (128, padded width) rows
        self._t_at: list[tuple[int, int]] = []
        self._nonce: int | None = None
        self._fused: Blocks | None = None  # the native core's labels of the last u_message

    def fork(self) -> SoftSpokenReceiver:
        """The same extension (seeds, leaves) with scratch buffers of its own:
        a message made on the fork does not touch this receiver's buffers, so a
        worker thread may make one while this receiver is in use (native core
        only: the numpy reference's PRG keeps scratch of its own)."""
        if not (self._prg is not None and self._prg.fused()):
            raise RuntimeError("fork() needs the set-up native SoftSpoken receiver")
        twin = copy.copy(self)
        twin._msg_buf = np.empty(0, dtype=np.uint8)
        twin._t_buf = np.empty(0, dtype=np.uint8)
        twin._t_at, twin._nonce, twin._fused = [], None, None
        for name in ("_lab", "_u", "_labels_buf"):
            twin.__dict__.pop(name, None)
        return twin

    def setup_message(self) -> bytes:
        """Fresh trees (CSPRNG roots) and the level sums masked with the base-OT keys."""
        k, n = self.k, KAPPA // self.k
        h = _hasher()
        nodes = np.frombuffer(os.urandom(16 * n), dtype=np.uint64).reshape(n, 1, 2).copy()
        sums = np.empty((k, n, 2, 2), dtype=np.uint64)
        for level in range(1, k + 1):
            width = nodes.shape[1]
            child = _children(h, nodes, level)
            j = np.arange(n) * k + (k - level)
            sums[level - 1, :, 0] = np.bitwise_xor.reduce(child[:, :, 0], axis=1) ^ self._keys1[j]
            sums[level - 1, :, 1] = np.bitwise_xor.reduce(child[:, :, 1], axis=1) ^ self._keys0[j]
            nodes = child.reshape(n, 2 * width, 2)
        self.leaves = nodes.reshape(-1, 2)
        self._prg = _LeafPRG(self.leaves, k, skip0=False)
        return _HEADER + bytes([k]) + sums.tobytes()

    def u_message(self, choices: list[npt.NDArray[np.uint8]], nonce: int) -> memoryview:
        """The message (c_i = u_i ⊕ r per piece, n rows of the piece's width,
        pieces concatenated) for packed choice bits r given piece by piece.
        Keeps the rows t for `labels(…, nonce)`.  A view of a buffer the next
        call overwrites: send it before extending again."""
        total, pieces = self.u_pieces(choices, nonce)
        for _ in pieces:
            pass
        return self._msg_buf[:total].data

    def u_pieces(
        self, choices: list[npt.NDArray[np.uint8]], nonce: int
    ) -> tuple[int, Iterator[memoryview]]:
        """`u_message` piece by piece: its length, and an iterator that makes
        each piece's part of the message when asked for it (so one piece can
        travel while the next is made); `labels` after the last."""
        if self._prg is None:
            raise RuntimeError("SoftSpoken setup_message() not run")
        widths = [c.shape[0] for c in choices]
        _check_widths(widths)
        total = message_bytes(widths, self.k)
        self._t_at, self._nonce = [], None  # labels() only once every piece is made
        return total, self._pieces(choices, widths, nonce, total)

    def _pieces(
        self, choices: list[npt.NDArray[np.uint8]], widths: list[int], nonce: int, total: int
    ) -> Iterator[memoryview]:
        assert self._prg is not None
        n = KAPPA // self.k
        if self._msg_buf.shape[0] < total:
            self._msg_buf = np.empty(total, dtype=np.uint8)
        pad = [_stride(w) for w in widths]
        fused = self._prg.fused()
        if not fused and self._t_buf.shape[0] < KAPPA * sum(pad):
            self._t_buf = np.empty(KAPPA * sum(pad), dtype=np.uint8)
        out = self._msg_buf[:total]
        pos, col, first = 0, 0, 0
        if fused:  # labels now, piece by piece, while the rows are in cache
            labels = _reuse(self, "_lab", 128 * sum(widths)).view(np.uint64).reshape(-1, 2)
            self._fused = labels
            for r, w in zip(choices, widths, strict=True):
                c = out[pos : pos + n * w]
                self._prg.labels(nonce, first, w, labels[col : col + 8 * w], None, (c, r))
                self._t_at.append((col, w))
                first += (w + 15) // 16
                pos += n * w
                col += 8 * w
                yield c.data
            self._nonce = nonce
            return
        self._fused = None
        u = _reuse(self, "_u", n * max(pad)).reshape(n, max(pad))
        for r, w, p in zip(choices, widths, pad, strict=True):
            t = self._t_buf[KAPPA * col : KAPPA * (col + p)].reshape(KAPPA, p)
            self._prg.expand(nonce, first, w, t, u)
            c = out[pos : pos + n * w].reshape(n, w)
            np.bitwise_xor(u[:, :w], r[None, :], out=c)
            self._t_at.append((col, w))
            first += (w + 15) // 16
            pos += n * w
            col += p
            yield c.reshape(-1).data
        self._nonce = nonce

    def labels(self, widths: list[int], nonce: int) -> Iterator[Blocks]:
        """The blocks t_j of the last `u_message` (same nonce and widths),
        piece by piece; each yielded array is overwritten by the next one."""
        _check_widths(widths)
        if nonce != self._nonce or [w for _, w in self._t_at] != list(widths):
            raise ValueError("labels() must follow u_message() with the same nonce and widths")
        if self._fused is not None:  # made by u_message: views, valid until the next one
            for col, w in self._t_at:
                yield self._fused[col : col + 8 * w]
            return
        out = _label_buffer(self, 8 * max(widths))
        for col, w in self._t_at:
            p = _stride(w)
            t = self._t_buf[KAPPA * col : KAPPA * (col + p)].reshape(KAPPA, p)
            yield transpose_rows(t[:, :w], out[: 8 * w])

    def extend(self, choice_bytes: npt.NDArray[np.uint8], nonce: int) -> tuple[bytes, Blocks]:
        """One-piece convenience: (message, t) for packed choice bits."""
        msg = bytes(self.u_message([choice_bytes], nonce))
        return msg, next(self.labels([choice_bytes.shape[0]], nonce)).copy()


class SoftSpokenSender:
    """The garbler: holds s = Δ and k_{s_j}; learns all leaves but x = Δ_i."""

    def __init__(self, s_bits: list[int], keys: list[bytes], k: int = DEFAULT_K) -> None:
        if len(keys) != KAPPA or len(s_bits) != KAPPA:
            raise ValueError(f"need {KAPPA} base OTs")
        self.k = _check_k(k)
        self._s_bits = np.asarray(s_bits, dtype=np.uint64) & np.uint64(1)
        self._keys = _key_blocks(keys)
        self._s = np.flatnonzero(self._s_bits)
        #: Δ's bits packed as the native core's `ss_labels` takes them.
        self._s_packed = np.packbits(self._s_bits.astype(np.uint8), bitorder="little")
        self.delta = _bits_to_block(list(s_bits))[0]
        self._prg: _LeafPRG | None = None
        #: (n, 2^k, 2) leaves by y = x ⊕ Δ_i; row y = 0 (the unknown one) is zero.
        self.leaves: Blocks | None = None

    def receive_setup(self, msg: bytes) -> None:
        """Check the evaluator's setup message and rebuild every leaf but the punctured one."""
        k, n = self.k, KAPPA // self.k
        if len(msg) != setup_message_bytes(k) or msg[: len(_HEADER)] != _HEADER:
            raise ValueError("malformed SoftSpoken setup message")
        if msg[len(_HEADER)] != k:
            raise ValueError(f"SoftSpoken k mismatch: peer uses {msg[len(_HEADER)]}, this side {k}")
        sums = np.frombuffer(msg, dtype=np.uint64, offset=len(_HEADER) + 1).reshape(k, n, 2, 2)
        h = _hasher()
        nodes = np.zeros((n, 1, 2), dtype=np.uint64)  # relabelled: the path node is index 0
        for level in range(1, k + 1):
            width = nodes.shape[1]
            j = np.arange(n) * k + (k - level)
            mask = (np.uint64(0) - self._s_bits[j])[:, None]  # all ones where the path goes right
            child = _children(h, nodes, level)
            swap = (child[:, :, 0] ^ child[:, :, 1]) & mask[:, None]
            child[:, :, 0] ^= swap  # relabelled child d is original side d ⊕ c
            child[:, :, 1] ^= swap
            e0, e1 = sums[level - 1, :, 0], sums[level - 1, :, 1]
            other = e1 ^ ((e0 ^ e1) & mask) ^ self._keys[j]  # the off-path side's sum
            rest = np.bitwise_xor.reduce(child[:, 1:, 1], axis=1) if width > 1 else 0
            child[:, 0, 1] = other ^ rest
            child[:, 0, 0] = 0
            nodes = child.reshape(n, 2 * width, 2)
        self.leaves = nodes
        self._prg = _LeafPRG(nodes[:, 1:].reshape(-1, 2), k, skip0=True)

    def labels(
        self,
        msg: bytes | bytearray | memoryview,
        widths: list[int],
        nonce: int,
        ready: Callable[[int], object] | None = None,
    ) -> Iterator[Blocks]:
        """Blocks q_j = t_j ⊕ r_j·Δ, transposed, piece by piece; each yielded
        array is overwritten by the next one.  `ready(end)`, if given, is
        called before a piece is read and returns once msg[:end] holds the
        message's bytes (a message still arriving)."""
        if self._prg is None:
            raise RuntimeError("SoftSpoken receive_setup() not run")
        _check_widths(widths)
        n = KAPPA // self.k
        if len(msg) != message_bytes(widths, self.k):
            raise ValueError(
                f"OT extension message has {len(msg)} bytes, want {message_bytes(widths, self.k)}"
            )
        c_all = np.frombuffer(msg, dtype=np.uint8)
        out = _label_buffer(self, 8 * max(widths))
        pos, first = 0, 0
        if self._prg.fused():
            for w in widths:
                if ready is not None:
                    ready(pos + n * w)
                c = c_all[pos : pos + n * w]
                pos += n * w
                self._prg.labels(nonce, first, w, out[: 8 * w], (c, self._s_packed), None)
                first += (w + 15) // 16
                yield out[: 8 * w]
            return
        rows = _reuse(self, "_rows", KAPPA * _stride(max(widths))).reshape(KAPPA, -1)
        blk = self._s // self.k
        for w in widths:
            if ready is not None:
                ready(pos + n * w)
            c = c_all[pos : pos + n * w].reshape(n, w)
            pos += n * w
            self._prg.expand(nonce, first, w, rows, None)
            first += (w + 15) // 16
            q = rows[:, :w]
            q[self._s] ^= c[blk]
            yield transpose_rows(q, out[: 8 * w])

    def extend(self, msg: bytes, m: int, nonce: int) -> Blocks:
        """One-piece convenience: q_j for j < m."""
        if m % 8:
            raise ValueError("m must be a multiple of 8")
        return next(self.labels(msg, [m // 8], nonce)).copy()


# ---------------------------------------------------------------- choosing the extension

#: The OT extensions a party can run: "iknp" (16 bytes per OT), "softspoken"
#: ("softspoken:k" for k in SOFTSPOKEN_KS; plain "softspoken" is k = DEFAULT_K)
#: or "ferret" (a pool of silent OTs, one bit per OT in a chunk; "ferret:set"
#: for a set of `ferret.LPN_SETS`, plain "ferret" is `ferret.DEFAULT_SET`).
OT_KINDS = ("iknp", "softspoken", "ferret")
DEFAULT_OT = f"softspoken:{DEFAULT_K}"

Receiver = IKNPReceiver | SoftSpokenReceiver | ferret.FerretReceiver
Sender = IKNPSender | SoftSpokenSender | ferret.FerretSender


def parse_ot(spec: str | None) -> tuple[str, int]:
    """("iknp", 0), ("softspoken", k) or ("ferret", index into `ferret.SET_NAMES`)
    for an OT spec; None is `DEFAULT_OT`."""
    name, _, k = (spec or DEFAULT_OT).partition(":")
    if name == "iknp" and not k:
        return "iknp", 0
    if name == "softspoken":
        try:
            return "softspoken", _check_k(int(k) if k else DEFAULT_K)
        except ValueError:
            pass
    if name == "ferret" and (k or ferret.DEFAULT_SET) in ferret.SET_NAMES:
        return "ferret", ferret.SET_NAMES.index(k or ferret.DEFAULT_SET)
    raise ValueError(f"unknown OT extension {spec!r}: 'iknp', 'softspoken[:k]' or 'ferret[:set]'")


def server_ot() -> str:
    """The servers' OT extension: `SVTAGG_OT` if set (it must parse), else `DEFAULT_OT`.
    Both servers must run the same one: the helper refuses another at SessionOpen."""
    spec = os.environ.get("SVTAGG_OT") or DEFAULT_OT
    parse_ot(spec)
    return spec


def bytes_per_ot(ot: tuple[str, int]) -> float:
    """Bytes of a chunk's OT message per OT: 16 (IKNP), 16/k (SoftSpoken), 1/8 (Ferret)."""
    if ot[0] == "ferret":
        return 1 / 8
    return KAPPA // 8 if ot[0] == "iknp" else KAPPA // 8 // ot[1]


def extension_bound(ot: tuple[str, int]) -> int:
    """The longest message of an extension run inside a chunk (Ferret's refill)."""
    return ferret.max_reply(ferret.SET_NAMES[ot[1]]) if ot[0] == "ferret" else 0


async def refill(ext: Receiver | Sender, channel: Channel, need: int) -> None:
    """Before a chunk of `need` OTs: Ferret extends its pool while it is short
    (both parties count alike, so both run the same extensions)."""
    if isinstance(ext, ferret.FerretReceiver | ferret.FerretSender):
        await ext.refill(channel, need)


async def extension_receiver(
    channel: Channel, keys: list[tuple[bytes, bytes]], ot: tuple[str, int], session_id: bytes = b""
) -> Receiver:
    """The evaluator's extension after its base OTs; SoftSpoken sends its setup
    message (the session's third, evaluator → garbler).  Ferret bootstraps its
    pool from SoftSpoken (k = DEFAULT_K) and runs its first extension."""
    if ot[0] == "iknp":
        return IKNPReceiver(keys)
    receiver = SoftSpokenReceiver(keys, ot[1] if ot[0] == "softspoken" else DEFAULT_K)
    await channel.send(receiver.setup_message())
    if ot[0] == "ferret":
        name = ferret.SET_NAMES[ot[1]]
        return await ferret.bootstrap_receiver(channel, receiver, name, session_id)
    return receiver


async def extension_sender(
    channel: Channel,
    s_bits: list[int],
    keys: list[bytes],
    ot: tuple[str, int],
    session_id: bytes = b"",
) -> Sender:
    """The garbler's extension after its base OTs (SoftSpoken: receives the
    setup; Ferret: then its pool)."""
    if ot[0] == "iknp":
        return IKNPSender(s_bits, keys)
    sender = SoftSpokenSender(s_bits, keys, ot[1] if ot[0] == "softspoken" else DEFAULT_K)
    sender.receive_setup(await channel.recv())
    if ot[0] == "ferret":
        name = ferret.SET_NAMES[ot[1]]
        return await ferret.bootstrap_sender(channel, sender, name, session_id)
    return sender
