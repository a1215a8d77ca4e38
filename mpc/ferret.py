"""Ferret silent OT extension (Yang, Weng, Lan, Zhang, Wang, CCS 2020),
semi-honest, producing correlated OTs under the session's Δ into a pool that
the chunks draw from.

Roles as in `ot.py`: the garbler is the COT sender (holds Δ and q_j), the
evaluator the receiver (holds r_j and t_j = q_j ⊕ r_j·Δ).

One extension with parameters (t, k = 2^logk, h) turns M = k + t·h COTs (the
*reserve*) into N = t·2^h:
- MPCOT over regular noise: t single-point COTs, one per bin of 2^h outputs.
  The garbler grows a GGM tree from a fresh CSPRNG seed per bin (children
  H(node, (side, GGM tweak | level)), the project's fixed-key AES hash); the
  evaluator picks the bin's noise position α (CSPRNG) and learns every leaf
  but α: for level ℓ it uses one reserve COT, whose choice it corrects to
  ¬α's bit (it sends c = r ⊕ ¬α_bit), and the garbler sends the level's two
  side sums masked with H(q ⊕ c·Δ, i) and H(q ⊕ c·Δ ⊕ Δ, i) (i unique per use
  under Δ); the evaluator unmasks the one of the side off its path.  Then the
  garbler sends φ = Δ ⊕ ⊕_x v[x] and the evaluator sets w[α] = φ ⊕ ⊕_{x≠α} v[x]:
  w = v ⊕ e_α·Δ.
- LPN expansion: output i is ⊕ over d = 10 entries of the first k reserve
  COTs (indices from AES-CTR under a public seed derived from the session and
  the extension counter) ⊕ the bin's leaf i.  Garbler y_q = A·q_k ⊕ v,
  evaluator y_t = A·t_k ⊕ w and choice bits A·r_k ⊕ e: y_t = y_q ⊕ (A·r_k ⊕ e)·Δ.
- The first M' outputs (M' the next extension's reserve) are kept back, the
  rest go to the pool.  The session's first reserve comes from the base
  extension (SoftSpoken k = 4) once, at setup.

A chunk draws its w·K COTs in order: the evaluator sends d_j = b_j ⊕ r_j
(one bit per input bit), the garbler's 0-label is q_j ⊕ d_j·Δ, the evaluator
keeps t_j.  Both pools count the same draws, so no COT is used twice.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.mpc import native
from svtagg.mpc.aes import Blocks, TweakableHash, ggm_level
from svtagg.mpc.channel import Channel
from svtagg.mpc.ot import _check_widths

#: Nonzeros per LPN output row (the local-linear code's d).
LPN_D = 10
#: High tweak words: the GGM PRG (level or-ed in) and the SPCOT masks
#: (extension counter or-ed in); garbling tweaks carry a session tag there.
GGM_TWEAK = 0x4652_6767_6D00_0000
MASK_TWEAK = 0x4652_4D61_0000_0000
_REQ, _REPLY = b"FXRQ", b"FXRP"
#: Trees expanded (and LPN-encoded) together: bounds the working set.
_GROUP_LEAVES = 1 << 16


@dataclass(frozen=True)
class LpnSet:
    """A regular-noise LPN parameter set: t bins of 2^depth, secret k = 2^logk."""

    name: str
    t: int
    logk: int
    depth: int

    @property
    def k(self) -> int:
        return 1 << self.logk

    @property
    def n(self) -> int:
        """COTs an extension outputs."""
        return self.t << self.depth

    @property
    def base(self) -> int:
        """COTs an extension consumes (its reserve): k + t·depth."""
        return self.k + self.t * self.depth

    def reply_bytes(self) -> int:
        """The garbler's message: two masked 16-byte sums per level per tree, φ per tree."""
        return len(_REPLY) + 16 * self.t * (2 * self.depth + 1)

    def request_bytes(self) -> int:
        """The evaluator's message: one correction bit per level per tree."""
        return len(_REQ) + (self.t * self.depth + 7) // 8


#: The published semi-honest sets (emp-toolkit/emp-ot, emp-ot/tuning.h:
#: ferret_b10 … ferret_b13, (t, logk, tree depth), chosen there for ≈ 128-bit
#: security against the published regular-LPN attacks) and small test-only sets.
LPN_SETS = {
    "b10": LpnSet("b10", 850, 16, 10),  # N =    870,400
    "b11": LpnSet("b11", 1170, 17, 11),  # N =  2,396,160
    "b12": LpnSet("b12", 1520, 18, 12),  # N =  6,225,920
    "b13": LpnSet("b13", 1900, 19, 13),  # N = 15,564,800
    "test": LpnSet("test", 16, 8, 6),  # N = 1,024: tests only, not secure
    "tiny": LpnSet("tiny", 8, 4, 3),  # N = 64: tests only, not secure
}
#: The set of a session's first extension when the chosen one is a published set.
FIRST_SET = "b10"
DEFAULT_SET = "b10"
SET_NAMES = tuple(LPN_SETS)


def first_set(name: str) -> LpnSet:
    """The first extension's set: the small published one, or the test set itself."""
    return LPN_SETS[name] if name in ("test", "tiny", FIRST_SET) else LPN_SETS[FIRST_SET]


def steady_bytes_per_ot(name: str) -> float:
    """Bytes per OT once the pool runs on set `name`: an extension's two messages
    over the COTs it adds to the pool, plus the chunk's one bit."""
    s = LPN_SETS[name]
    return (s.request_bytes() + s.reply_bytes()) / (s.n - s.base) + 1 / 8


def max_reply(name: str) -> int:
    return max(first_set(name).reply_bytes(), LPN_SETS[name].reply_bytes())


def _hasher() -> Any:
    return native.NativeHash() if native.active() == "native" else TweakableHash()


def _mask(bits: npt.NDArray[np.uint8], delta: Blocks) -> Blocks:
    """bits·Δ as (n, 2) blocks."""
    return (np.uint64(0) - bits.astype(np.uint64))[:, None] & delta.reshape(1, 2)


def lpn_seed(session_id: bytes, counter: int) -> bytes:
    """The public seed of extension `counter` of a session (fresh per extension)."""
    h = hashlib.sha256(b"svtagg-ferret-lpn" + len(session_id).to_bytes(2, "big") + session_id)
    h.update(counter.to_bytes(8, "big"))
    return h.digest()[:16]


def lpn_indices(seed: bytes, first: int, count: int, k: int) -> npt.NDArray[np.uint32]:
    """(count, d) row indices of outputs first … first + count − 1: AES-128-CTR
    under `seed` (128-bit big-endian counter from 0), 4 little-endian bytes per
    index, reduced mod k = 2^logk (unbiased).  `first` must be even."""
    if first % 2 or k & (k - 1):
        raise ValueError("lpn_indices: even first output, power-of-two k")
    nbytes = 4 * LPN_D * count
    start = (4 * LPN_D * first) // 16
    enc = Cipher(algorithms.AES(seed), modes.CTR(start.to_bytes(16, "big"))).encryptor()
    raw = enc.update(bytes(nbytes))
    idx = np.frombuffer(raw, dtype="<u4").astype(np.uint32).reshape(count, LPN_D)
    return idx & np.uint32(k - 1)


def lpn_encode(base: Blocks, idx: npt.NDArray[np.uint32], noise: Blocks, out: Blocks) -> None:
    """out[i] = ⊕_j base[idx[i, j]] ⊕ noise[i] (numpy gathers)."""
    np.copyto(out, noise)
    for j in range(LPN_D):
        out ^= base[idx[:, j]]


def lpn_encode_bits(
    base: npt.NDArray[np.uint8], idx: npt.NDArray[np.uint32], noise: npt.NDArray[np.uint8]
) -> npt.NDArray[np.uint8]:
    out = noise.copy()
    for j in range(LPN_D):
        out ^= base[idx[:, j]]
    return out


def lpn_expand(
    seed: bytes,
    first: int,
    base: Blocks,
    noise: Blocks,
    out: Blocks,
    bits: tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]] | None = None,
) -> npt.NDArray[np.uint8] | None:
    """Outputs first … first + len(noise) − 1 of the expansion with k = len(base):
    out = A·base ⊕ noise, and A·base_bits ⊕ noise_bits for `bits` (the
    evaluator's choice bits).  The native core and the numpy reference give the
    same bytes."""
    k, count = base.shape[0], noise.shape[0]
    if native.active() == "native":
        sched = native.core().expand_keys(seed)
        ob = None if bits is None else np.empty(count, dtype=np.uint8)
        extra = (
            ()
            if bits is None
            else (np.ascontiguousarray(bits[0]), np.ascontiguousarray(bits[1]), ob)
        )
        native.core().fr_lpn(
            sched,
            first,
            count,
            k - 1,
            np.ascontiguousarray(base),
            np.ascontiguousarray(noise),
            out,
            *extra,
        )
        return ob
    idx = lpn_indices(seed, first, count, k)
    lpn_encode(base, idx, noise, out)
    return None if bits is None else lpn_encode_bits(bits[0], idx, bits[1])


def _expand(h: Any, nodes: Blocks, level: int) -> npt.NDArray[np.uint64]:
    """GGM children (t, width, side, word) of the nodes (t, width, 2) of t trees."""
    return ggm_level(h, nodes, GGM_TWEAK | level)


def _mask_tweaks(counter: int, count: int) -> Blocks:
    tw = np.empty((count, 2), dtype=np.uint64)
    tw[:, 0] = np.arange(count, dtype=np.uint64)
    tw[:, 1] = np.uint64(MASK_TWEAK | counter)
    return tw


def ggm_send(h: Any, seeds: Blocks, depth: int) -> tuple[Blocks, Blocks]:
    """The garbler's trees: leaves (t, 2^depth, 2) and level sums (t, depth, 2 sides, 2)."""
    t = seeds.shape[0]
    if native.active() == "native":
        leaves = np.empty((t, 1 << depth, 2), dtype=np.uint64)
        sums = np.empty((t, depth, 2, 2), dtype=np.uint64)
        native.core().fr_ggm(
            False, depth, GGM_TWEAK, np.ascontiguousarray(seeds), None, None, leaves, sums
        )
        return leaves, sums
    nodes = seeds.reshape(t, 1, 2)
    sums = np.empty((t, depth, 2, 2), dtype=np.uint64)
    for level in range(1, depth + 1):
        width = nodes.shape[1]
        child = _expand(h, nodes, level)
        sums[:, level - 1] = np.bitwise_xor.reduce(child, axis=1)
        nodes = child.reshape(t, 2 * width, 2)
    return nodes, sums


def spcot_leaves(
    h: Any, known: Blocks, alphas: npt.NDArray[np.int64], phi: Blocks, depth: int
) -> Blocks:
    """The evaluator's SPCOT outputs: every leaf from the off-path sums, leaf α
    from φ (w = v ⊕ e_α·Δ), (t, 2^depth, 2)."""
    if native.active() == "native":
        leaves = np.empty((known.shape[0], 1 << depth, 2), dtype=np.uint64)
        native.core().fr_ggm(
            True, depth, GGM_TWEAK, np.ascontiguousarray(known),
            np.ascontiguousarray(alphas, dtype=np.int64),
            np.ascontiguousarray(phi), leaves, None,
        )  # fmt: skip
        return leaves
    w = ggm_receive(h, known, alphas, depth)
    ar = np.arange(known.shape[0])
    w[ar, alphas] = phi ^ np.bitwise_xor.reduce(w, axis=1)
    return w


def ggm_receive(h: Any, known: Blocks, alphas: npt.NDArray[np.int64], depth: int) -> Blocks:
    """The evaluator's trees from the off-path level sums `known` (t, depth, 2):
    every leaf but α (left zero), (t, 2^depth, 2)."""
    t = known.shape[0]
    ar = np.arange(t)
    nodes = np.zeros((t, 1, 2), dtype=np.uint64)
    path = np.zeros(t, dtype=np.int64)
    for level in range(1, depth + 1):
        width = nodes.shape[1]
        child = _expand(h, nodes, level)
        child[ar, path] = 0  # the unknown node's children
        a = (alphas >> (depth - level)) & 1
        side = np.bitwise_xor.reduce(child, axis=1)  # (t, 2, 2)
        off = 1 - a
        child[ar, path, off] = known[:, level - 1] ^ side[ar, off]
        nodes = child.reshape(t, 2 * width, 2)
        path = 2 * path + a
    return nodes


def alpha_bits(alphas: npt.NDArray[np.int64], depth: int) -> npt.NDArray[np.uint8]:
    """(t·depth,) bits of the α's, MSB (level 1) first, tree-major."""
    shifts = np.arange(depth - 1, -1, -1, dtype=np.int64)
    return ((alphas[:, None] >> shifts[None, :]) & 1).astype(np.uint8).reshape(-1)


def _scratch(owner: Any, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
    """A buffer kept across extensions (fresh pages cost a fault per 4 KiB)."""
    buf = getattr(owner, name, None)
    if buf is None or buf.shape[0] < shape[0]:
        buf = np.empty(shape, dtype=dtype)
        setattr(owner, name, buf)
    return buf[: shape[0]]


def _append(owner: Any, name: str, old: Any, new: Any) -> Any:
    """old ‖ new in the buffer `name` (reused when large enough; old may lie in it)."""
    rows = old.shape[0] + new.shape[0]
    buf = getattr(owner, name, None)
    if buf is None or buf.shape[0] < rows:
        fresh = np.empty((max(rows, 1),) + new.shape[1:], dtype=new.dtype)
        fresh[: old.shape[0]] = old
        buf = fresh
        setattr(owner, name, buf)
    else:
        buf[: old.shape[0]] = old.copy() if np.shares_memory(buf, old) else old
    buf[old.shape[0] : rows] = new
    return buf[:rows]


class _Pool:
    """What both sides share: the reserve, the pool, counters."""

    def __init__(self, session_id: bytes, name: str) -> None:
        if name not in LPN_SETS:
            raise ValueError(f"unknown Ferret parameter set {name!r}")
        self.session_id = bytes(session_id)
        self.name = name
        self.extensions = 0  # extensions run so far (the next one's counter)
        self.consumed = 0  # COTs drawn by chunks so far
        self.pos = 0  # next unused pool entry
        self.h = _hasher()

    def current(self) -> LpnSet:
        """The set of the next extension."""
        return first_set(self.name) if self.extensions == 0 else LPN_SETS[self.name]

    def next_set(self) -> LpnSet:
        return LPN_SETS[self.name]

    def available(self) -> int:
        raise NotImplementedError

    async def extend(self, channel: Channel) -> None:
        raise NotImplementedError

    async def refill(self, channel: Channel, need: int) -> int:
        """Extensions until the pool holds `need` COTs; returns how many ran
        (both sides know the pool's size, so both run the same number)."""
        runs = 0
        while self.available() < need:
            await self.extend(channel)
            runs += 1
        return runs

    def groups(self, s: LpnSet) -> Iterator[tuple[int, int]]:
        """Tree ranges expanded together (≈ 2^16 leaves each)."""
        step = max(1, _GROUP_LEAVES >> s.depth)
        for lo in range(0, s.t, step):
            yield lo, min(lo + step, s.t)

    def memory_bytes(self) -> int:
        """Bytes this party's arrays hold (buffers counted once)."""
        owners = {}
        for a in vars(self).values():
            if isinstance(a, np.ndarray):
                b = a.base if isinstance(a.base, np.ndarray) else a
                owners[id(b)] = b.nbytes
        return sum(owners.values())


class FerretReceiver(_Pool):
    """The evaluator's pool: choice bits r_j and blocks t_j."""

    def __init__(self, session_id: bytes, name: str = DEFAULT_SET) -> None:
        super().__init__(session_id, name)
        self.res_r = np.zeros(0, dtype=np.uint8)
        self.res_t = np.zeros((0, 2), dtype=np.uint64)
        self.pool_r = np.zeros(0, dtype=np.uint8)
        self.pool_t = np.zeros((0, 2), dtype=np.uint64)
        self._taken: tuple[Blocks, list[int], int] | None = None
        #: Tests may set this to a fixed α (per tree) to look at the garbler's view.
        self.fixed_alphas: npt.NDArray[np.int64] | None = None

    def available(self) -> int:
        return self.pool_t.shape[0] - self.pos

    def seed_reserve(self, r: npt.NDArray[np.uint8], t: Blocks) -> None:
        """The first reserve, from the base extension."""
        m = self.current().base
        self.res_r, self.res_t = r[:m].copy(), np.ascontiguousarray(t[:m])

    def _alphas(self, s: LpnSet) -> npt.NDArray[np.int64]:
        if self.fixed_alphas is not None:
            return self.fixed_alphas.astype(np.int64)
        raw = np.frombuffer(os.urandom(4 * s.t), dtype="<u4").astype(np.int64)
        return raw & ((1 << s.depth) - 1)

    def request(self) -> tuple[bytes, npt.NDArray[np.int64]]:
        """The SPCOT choice corrections c = r ⊕ ¬α_bit of the next extension."""
        s = self.current()
        alphas = self._alphas(s)
        r = self.res_r[s.k : s.base]
        c = r ^ (1 - alpha_bits(alphas, s.depth))
        return _REQ + np.packbits(c, bitorder="little").tobytes(), alphas

    def finish(self, reply: bytes, alphas: npt.NDArray[np.int64]) -> None:
        """The evaluator's side of the extension from the garbler's reply."""
        s, nxt = self.current(), self.next_set()
        if len(reply) != s.reply_bytes() or reply[: len(_REPLY)] != _REPLY:
            raise ValueError("malformed Ferret extension reply")
        body = np.frombuffer(reply, dtype=np.uint64, offset=len(_REPLY))
        m = body[: s.t * s.depth * 4].reshape(s.t, s.depth, 2, 2)
        phi = body[s.t * s.depth * 4 :].reshape(s.t, 2)
        b = (1 - alpha_bits(alphas, s.depth)).astype(np.int64)
        tj = np.ascontiguousarray(self.res_t[s.k : s.base])
        hs = self.h(tj, _mask_tweaks(self.extensions, s.t * s.depth))
        flat = m.reshape(-1, 2, 2)
        known = (flat[np.arange(flat.shape[0]), b] ^ hs).reshape(s.t, s.depth, 2)
        seed = lpn_seed(self.session_id, self.extensions)
        out_t = _scratch(self, "_out_t", (s.n, 2), np.uint64)
        out_r = _scratch(self, "_out_r", (s.n,), np.uint8)
        base_t, base_r = self.res_t[: s.k], self.res_r[: s.k]
        leaves = 1 << s.depth
        for lo, hi in self.groups(s):
            w = spcot_leaves(self.h, known[lo:hi], alphas[lo:hi], phi[lo:hi], s.depth)
            ar = np.arange(hi - lo)
            e = np.zeros((hi - lo, leaves), dtype=np.uint8)
            e[ar, alphas[lo:hi]] = 1
            sl = slice(lo * leaves, hi * leaves)
            ob = lpn_expand(
                seed, sl.start, base_t, w.reshape(-1, 2), out_t[sl], (base_r, e.reshape(-1))
            )
            assert ob is not None
            out_r[sl] = ob
        self.extensions += 1
        self.res_t, self.res_r = out_t[: nxt.base].copy(), out_r[: nxt.base].copy()
        self.pool_t = _append(self, "_buf_t", self.pool_t[self.pos :], out_t[nxt.base :])
        self.pool_r = _append(self, "_buf_r", self.pool_r[self.pos :], out_r[nxt.base :])
        self.pos = 0

    async def extend(self, channel: Channel) -> None:
        msg, alphas = self.request()
        await channel.send(msg)
        self.finish(await channel.recv(), alphas)

    def u_message(self, choices: list[npt.NDArray[np.uint8]], nonce: int) -> bytes:
        """d = b ⊕ r for the chunk's packed choice bits (one bit per OT), drawing
        the next Σ 8·width COTs of the pool."""
        widths = [c.shape[0] for c in choices]
        _check_widths(widths)
        m = 8 * sum(widths)
        if self.available() < m:
            raise RuntimeError("Ferret pool short: refill() first")
        b = np.unpackbits(np.concatenate(choices), bitorder="little")
        r = self.pool_r[self.pos : self.pos + m]
        self._taken = (self.pool_t[self.pos : self.pos + m], widths, nonce)
        self.pos += m
        self.consumed += m
        return np.packbits(b ^ r, bitorder="little").tobytes()

    def labels(self, widths: list[int], nonce: int) -> Iterator[Blocks]:
        """The t_j of the last `u_message`, piece by piece."""
        if self._taken is None or self._taken[1:] != (list(widths), nonce):
            raise ValueError("labels() must follow u_message() with the same nonce and widths")
        return _pieces(self._taken[0], widths)


class FerretSender(_Pool):
    """The garbler's pool: blocks q_j under Δ."""

    def __init__(self, session_id: bytes, delta: Blocks, name: str = DEFAULT_SET) -> None:
        super().__init__(session_id, name)
        self.delta = np.asarray(delta, dtype=np.uint64).reshape(2).copy()
        self.res_q = np.zeros((0, 2), dtype=np.uint64)
        self.pool_q = np.zeros((0, 2), dtype=np.uint64)

    def available(self) -> int:
        return self.pool_q.shape[0] - self.pos

    def seed_reserve(self, q: Blocks) -> None:
        self.res_q = np.ascontiguousarray(q[: self.current().base])

    def reply(self, request: bytes) -> bytes:
        """The garbler's side of the extension: masked level sums and φ."""
        s, nxt = self.current(), self.next_set()
        if len(request) != s.request_bytes() or request[: len(_REQ)] != _REQ:
            raise ValueError("malformed Ferret extension request")
        c = np.unpackbits(np.frombuffer(request, np.uint8, offset=len(_REQ)), bitorder="little")
        c = c[: s.t * s.depth]
        qj = self.res_q[s.k : s.base] ^ _mask(c, self.delta)
        tw = _mask_tweaks(self.extensions, s.t * s.depth)
        h0 = np.array(self.h(np.ascontiguousarray(qj), tw), copy=True)
        h1 = np.array(self.h(np.ascontiguousarray(qj ^ self.delta), tw), copy=True)
        seeds = np.frombuffer(os.urandom(16 * s.t), dtype=np.uint64).reshape(s.t, 2)
        seed = lpn_seed(self.session_id, self.extensions)
        msg = np.empty((s.t, s.depth, 2, 2), dtype=np.uint64)
        phi = np.empty((s.t, 2), dtype=np.uint64)
        out = _scratch(self, "_out", (s.n, 2), np.uint64)
        base = self.res_q[: s.k]
        leaves = 1 << s.depth
        for lo, hi in self.groups(s):
            v, sums = ggm_send(self.h, seeds[lo:hi], s.depth)
            msg[lo:hi] = sums
            phi[lo:hi] = sums[:, -1, 0] ^ sums[:, -1, 1] ^ self.delta  # Δ ⊕ all leaves
            lpn_expand(seed, lo * leaves, base, v.reshape(-1, 2), out[lo * leaves : hi * leaves])
        flat = msg.reshape(-1, 2, 2)
        flat[:, 0] ^= h0
        flat[:, 1] ^= h1
        self.extensions += 1
        self.res_q = out[: nxt.base].copy()
        self.pool_q = _append(self, "_buf_q", self.pool_q[self.pos :], out[nxt.base :])
        self.pos = 0
        return _REPLY + msg.tobytes() + phi.tobytes()

    async def extend(self, channel: Channel) -> None:
        await channel.send(self.reply(await channel.recv()))

    def labels(self, msg: bytes, widths: list[int], nonce: int) -> Iterator[Blocks]:
        """0-labels q_j ⊕ d_j·Δ for the evaluator's d bits, piece by piece."""
        _check_widths(widths)
        m = 8 * sum(widths)
        if len(msg) != m // 8:
            raise ValueError(f"Ferret chunk message has {len(msg)} bytes, want {m // 8}")
        if self.available() < m:
            raise RuntimeError("Ferret pool short: refill() first")
        d = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
        q = self.pool_q[self.pos : self.pos + m] ^ _mask(d, self.delta)
        self.pos += m
        self.consumed += m
        return _pieces(q, widths)


def _pieces(blocks: Blocks, widths: list[int]) -> Iterator[Blocks]:
    at = 0
    for w in widths:
        yield blocks[at : at + 8 * w]
        at += 8 * w


def _raise_limit(channel: Channel, bound: int) -> None:
    limit = getattr(channel, "limit_messages", None)
    if limit is not None:
        limit(bound)


async def bootstrap_receiver(
    channel: Channel, base: Any, name: str, session_id: bytes
) -> FerretReceiver:
    """The evaluator's pool at setup: the first reserve from the base extension
    `base` (random choice bits; its message under nonce 0, which no chunk uses
    in a Ferret session), then the first extension."""
    rx = FerretReceiver(session_id, name)
    width = (rx.current().base + 7) // 8
    _raise_limit(channel, max(base_message_bound(width), max_reply(name)))
    r = np.frombuffer(os.urandom(width), dtype=np.uint8)
    await channel.send(bytes(base.u_message([r], 0)))
    t = next(base.labels([width], 0))
    rx.seed_reserve(np.unpackbits(r, bitorder="little"), t)
    await rx.extend(channel)
    return rx


async def bootstrap_sender(
    channel: Channel, base: Any, name: str, session_id: bytes
) -> FerretSender:
    """The garbler's pool at setup (see `bootstrap_receiver`)."""
    tx = FerretSender(session_id, base.delta, name)
    width = (tx.current().base + 7) // 8
    _raise_limit(channel, max(base_message_bound(width), max_reply(name)))
    q = next(base.labels(await channel.recv(), [width], 0))
    tx.seed_reserve(q)
    await tx.extend(channel)
    return tx


def base_message_bound(width: int) -> int:
    """The base extension's message for `width` bytes of choices (IKNP's 16
    bytes per OT bound SoftSpoken's too)."""
    return 128 * width
