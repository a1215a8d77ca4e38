"""The OT-based comparison (docs/mpc.md, "The OT-based comparison path"): XOR
shares of YES_j = [signed(z_L[j] + z_H[j]) ≥ 0] on the low w bits, from a
millionaires' protocol over correlated OTs, with no garbled table per bit.

The carry into bit w − 1 of z_G + z_E (mod 2^w) is [x > ȳ] for the low n = w − 1
bits x of the garbler's share and ȳ = ¬(the evaluator's low n bits): x + y ≥ 2^n
⇔ x > 2^n − 1 − y.  So YES = ¬(a_{n} ⊕ b_{n} ⊕ [x > ȳ]), and each party's
share of YES is one bit of its own plus its share of the millionaires' bit.

The millionaires' protocol follows CrypTFlow2 (Rathee, Rathee, Goyal, Gupta,
Sharma, Chandran, Rastogi, "CrypTFlow2: Practical 2-Party Secure Inference",
CCS 2020, §4.1):

* the n bits are cut into q leaf blocks; for each block the evaluator, as the
  receiver of a 1-out-of-2^s OT on its block value v, learns the garbler's
  masked table entry (lt, eq)[v] ⊕ (gt_G, eq_G): XOR shares of [x_j > v] and
  [x_j = v];
* the leaves are combined pairwise up a tree, gt = gt_hi ⊕ eq_hi·gt_lo and
  eq = eq_hi·eq_lo, each AND a Beaver multiplication on XOR shares.

Both parts run on the session's OT extension (SoftSpoken, IKNP or Ferret): one
chunk's correlated OTs q ⊕ t = r·Δ, the evaluator choosing r.

* 1-out-of-2^s OT from s correlated OTs: the garbler's keys K_i^b = H(q_i ⊕ b·Δ,
  τ_i), the evaluator's K_i^{r_i} = H(t_i, τ_i); entry u is masked by
  H(⊕_i K_i^{u_i}, τ_{block, u}).  For u ≠ v the XOR contains some key
  K_i^{¬v_i} the evaluator cannot compute, so the mask is pseudorandom to it
  (H a tweakable correlation-robust hash, every tweak used once per Δ).
* A bit triple from two correlated OTs with random choices: a random OT's
  messages s_b = lsb H(q ⊕ b·Δ, τ) give (s_0 ⊕ s_1)·r = s_0 ⊕ s_r, shares of the
  product of a garbler bit and an evaluator bit; two of them are the two cross
  terms of (a_G ⊕ a_E)(b_G ⊕ b_E) (the construction of ABY and CrypTFlow2).  A
  node computing gt and eq shares a between its two triples and takes three
  OTs, one with two-bit messages, and one correction bit κ from the garbler
  (`Triples`).
* The chunk logic's input: one more correlated OT per slot, derandomized by
  the evaluator's e = yes_E ⊕ c (`logic_choices`, `logic_labels`).

The tree's depth D is made odd where that costs little (blocks of ≤ 5 bits):
then the evaluator holds its last share one flight before the garbler and its
input message for the chunk's garbled logic rides in that flight.  Flights per
chunk (E = evaluator, G = garbler): E its d bits (and the next fill's OT
message); G the leaf tables, the corrections κ and its level-1 openings; then
alternately each party's openings of every level it can open, two levels per
flight.  `schedule(D)` is that order, the same on both.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.mpc.aes import Blocks

Bits = npt.NDArray[np.uint8]

#: Bits per leaf block before the depth is made odd (CrypTFlow2's m = 4).
BLOCK_BITS = 4
#: The largest leaf block taken to save a tree level (a 2^5-entry table).
MAX_BLOCK_BITS = 5
_PAD = np.uint64(1 << 63)  # high bit of the low tweak word: the leaf masks


@dataclass(frozen=True)
class Gate:
    """One node of a tree level: a pair (hi, lo) of the level below, or one
    node passed up unchanged (lo = -1); `eq` says whether its eq is needed."""

    hi: int
    lo: int
    eq: bool


@dataclass(frozen=True)
class Plan:
    """The public shape of one width's comparison: leaf blocks, tree, OT count."""

    width: int
    #: (lowest bit, bits) of each leaf block, most significant block first.
    blocks: tuple[tuple[int, int], ...]
    #: Whether each leaf's eq share is needed (the lowest block's never is).
    leaf_eq: tuple[bool, ...]
    levels: tuple[tuple[Gate, ...], ...]

    @property
    def bits(self) -> int:
        return self.width - 1

    @property
    def depth(self) -> int:
        return len(self.levels)

    def level_ands(self, level: int) -> int:
        return sum(1 + g.eq for g in self.levels[level] if g.lo >= 0)

    @property
    def ands(self) -> int:
        """Beaver ANDs per comparison."""
        return sum(self.level_ands(i) for i in range(self.depth))

    def level_openings(self, level: int) -> int:
        """Bits one party opens per comparison at `level`: per node x ⊕ a once
        (a node's two ANDs share x = eq_hi and its mask a) and y ⊕ b per AND."""
        return sum(2 + g.eq for g in self.levels[level] if g.lo >= 0)

    @property
    def pairs(self) -> int:
        """Nodes with two ANDs (gt and eq), whose triples share a: one
        correction bit each from the garbler per comparison (`Triples`)."""
        return sum(g.eq for level in self.levels for g in level if g.lo >= 0)

    @property
    def planes(self) -> int:
        """Correlated OTs per comparison: one per leaf bit, two per node that
        computes gt only, three per node whose two ANDs share a (`Triples`)."""
        return self.bits + 2 * self.ands - self.pairs

    @functools.cached_property
    def triples(self) -> Triples:
        return Triples.of(self)

    @property
    def fill_planes(self) -> int:
        """Correlated OTs per slot of a fill: the comparison's `planes`, then one
        whose raw blocks are the chunk logic's input labels (the evaluator's
        YES share enters the garbled logic by it: `logic_choices`)."""
        return self.planes + 1

    @property
    def table_bits(self) -> int:
        """Bits of the garbler's leaf tables per comparison."""
        return sum((1 + eq) << s for (_, s), eq in zip(self.blocks, self.leaf_eq, strict=True))


@dataclass(frozen=True)
class Triples:
    """Where each node's Beaver triples come from: its OT planes (after the
    leaf bits) and its ANDs.  A node computing gt only has one triple (a, b, c)
    from two random OTs: plane B, the evaluator choosing b_E, whose correlation
    s_0 ⊕ s_1 is the garbler's a_G, and plane A, choosing a_E, whose
    correlation is b_G (the OT-based triples of ABY).  A node computing gt and
    eq multiplies eq_hi by gt_lo and by eq_lo: its two triples share a
    (correlated triples), so x ⊕ a is opened once and one OT, plane A with
    two-bit messages, gives both a_E·b1_G and a_E·b2_G; plane B1 gives
    a_G·b1_E, and plane B2 (choice b2_E) a_G·b2_E once the garbler sends the
    correction κ = r_2 ⊕ a_G for its random correlation r_2 (one-time padded
    by r_2, which the evaluator cannot compute): 3 OTs instead of 4.  Each
    array holds, per triple of its kind, a plane (relative to the first
    triple plane) or an AND index."""

    plain_b: npt.NDArray[np.intp]
    plain_a: npt.NDArray[np.intp]
    plain_and: npt.NDArray[np.intp]
    pair_b1: npt.NDArray[np.intp]
    pair_a: npt.NDArray[np.intp]
    pair_b2: npt.NDArray[np.intp]
    pair_and: npt.NDArray[np.intp]  # the node's gt AND; its eq AND is the next

    @staticmethod
    def of(p: Plan) -> Triples:
        lists: list[list[int]] = [[] for _ in range(7)]
        plane = t = 0
        for level in p.levels:
            for g in level:
                if g.lo < 0:
                    continue
                if g.eq:
                    for i, v in zip((3, 4, 5, 6), (plane, plane + 1, plane + 2, t), strict=True):
                        lists[i].append(v)
                    plane, t = plane + 3, t + 2
                else:
                    for i, v in zip((0, 1, 2), (plane, plane + 1, t), strict=True):
                        lists[i].append(v)
                    plane, t = plane + 2, t + 1
        return Triples(*(np.array(v, dtype=np.intp) for v in lists))


def _blocks(n: int) -> list[int]:
    q = -(-n // BLOCK_BITS)
    depth = math.ceil(math.log2(q)) if q > 1 else 0
    if depth >= 2 and depth % 2 == 0 and -(-n // (1 << (depth - 1))) <= MAX_BLOCK_BITS:
        q = 1 << (depth - 1)
    base, extra = divmod(n, q)
    return [base + (1 if j < extra else 0) for j in range(q)]


@functools.lru_cache(maxsize=64)
def plan(width: int) -> Plan:
    if not 2 <= width <= 64:
        raise ValueError(f"comparison width must be in [2, 64] bits, got {width}")
    sizes = _blocks(width - 1)
    blocks, top = [], width - 1
    for s in sizes:
        top -= s
        blocks.append((top, s))
    # Bottom-up shape: pairs (0,1), (2,3), …; an odd last node passes up.
    shapes: list[list[tuple[int, int]]] = []
    count = len(blocks)
    while count > 1:
        level = [(2 * i, 2 * i + 1) for i in range(count // 2)]
        if count % 2:
            level.append((count - 1, -1))
        shapes.append(level)
        count = len(level)
    # Top-down needs: the root needs gt only; a pair needs its hi's eq always
    # and its lo's eq when it needs eq itself; a passed node as its parent.
    need = [False]
    levels: list[tuple[Gate, ...]] = []
    for level in reversed(shapes):
        below = [False] * (max(max(h, lo) for h, lo in level) + 1)
        gates = []
        for (h, lo), eq in zip(level, need, strict=True):
            gates.append(Gate(h, lo, eq))
            if lo >= 0:
                below[h], below[lo] = True, eq
            else:
                below[h] = eq
        levels.append(tuple(gates))
        need = below
    levels.reverse()
    leaf_eq = tuple(need) if shapes else (False,)
    return Plan(width, tuple(blocks), leaf_eq, tuple(levels))


def schedule(depth: int) -> list[tuple[str, tuple[int, ...]]]:
    """The flights after the evaluator's OT message: (sender "G"/"E", tree levels
    (1-based) whose openings it carries).  The first is the garbler's, with the
    leaf tables.  A party opens level L once it holds both openings of L − 1."""
    if depth == 0:
        return [("G", ())]
    flights: list[tuple[str, tuple[int, ...]]] = [("G", (1,))]
    mine, theirs = {"G": 1, "E": 0}, {"G": 0, "E": 1}
    turn = "E"
    while min(mine.values()) < depth:
        other = "G" if turn == "E" else "E"
        sent = []
        level = mine[turn] + 1
        while level <= depth and level - 1 <= theirs[turn]:
            sent.append(level)
            level += 1
        mine[turn] += len(sent)
        theirs[other] = mine[turn]
        flights.append((turn, tuple(sent)))
        turn = other
    return flights


def _scratch(ws: dict[str, Any], name: str, rows: int) -> Blocks:
    """`rows` blocks of the buffer `name` in `ws`, grown when too small."""
    buf = ws.get("mill_" + name)
    if buf is None or buf.shape[0] < rows:
        buf = ws["mill_" + name] = np.empty((rows, 2), dtype=np.uint64)
    return buf[:rows]


def _lane_tweaks(first: int, lanes: int, planes: int, hi: int, ws: dict[str, Any]) -> Blocks:
    """Tweaks (lane·planes + plane, hi) of one lane batch's OTs, plane-major."""
    tw = _scratch(ws, "tw", planes * lanes).reshape(planes, lanes, 2)
    lane = np.arange(first, first + lanes, dtype=np.uint64) * np.uint64(planes)
    np.add(lane[None, :], np.arange(planes, dtype=np.uint64)[:, None], out=tw[:, :, 0])
    tw[:, :, 1] = np.uint64(hi)
    return tw.reshape(-1, 2)


def _pad_tweaks(
    first: int, lanes: int, block: int, blocks: int, u: Any, hi: int, ws: dict[str, Any]
) -> Blocks:
    """Tweaks of block `block`'s masks, entry-major: (2^63 | (lane·q + block)·2^8 |
    u, hi) for u the rows of `u` (entries × 1, or 1 × lanes: one per lane)."""
    base = (np.arange(first, first + lanes, dtype=np.uint64) * np.uint64(blocks)
            + np.uint64(block)) << np.uint64(8)  # fmt: skip
    u = np.asarray(u, dtype=np.uint64)
    rows = u.shape[0]
    tw = _scratch(ws, "twu", rows * lanes).reshape(rows, lanes, 2)
    np.bitwise_or(base[None, :] | _PAD, u, out=tw[..., 0])
    tw[..., 1] = np.uint64(hi)
    return tw.reshape(-1, 2)


def _native(h: Any) -> bool:
    """Whether `h` is the native core's hash (then the core runs the leaves)."""
    from svtagg.mpc.native import NativeHash

    return isinstance(h, NativeHash)


@functools.lru_cache(maxsize=64)
def _blocks_cached(width: int) -> bytes:
    p = plan(width)
    rows = [(first, s, int(eq)) for (first, s), eq in zip(p.blocks, p.leaf_eq, strict=True)]
    return np.array(rows, dtype=np.int32).tobytes()


def _blocks_arg(p: Plan) -> bytes:
    """The leaves as the native core takes them: int32 (first bit, bits, eq) each."""
    return _blocks_cached(p.width)


def random_bits(n: int) -> Bits:
    """n uniform bits from the CSPRNG."""
    raw = np.frombuffer(os.urandom(-(-n // 8)), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n]


def low_bits(z: npt.NDArray[np.uint64], lo: int, s: int) -> npt.NDArray[np.int64]:
    return ((z >> np.uint64(lo)) & np.uint64((1 << s) - 1)).astype(np.int64)


class _Side:
    """What both parties hold during one chunk: leaf shares, triples, the tree."""

    garbler: bool

    def __init__(self, p: Plan, lanes: int) -> None:
        self.plan, self.lanes = p, lanes
        t = p.ands
        self.a = np.empty((t, lanes), np.uint8)
        self.b = np.empty((t, lanes), np.uint8)
        self.c = np.empty((t, lanes), np.uint8)
        q = len(p.blocks)
        self.gt = np.empty((q, lanes), np.uint8)
        self.eq = np.zeros((q, lanes), np.uint8)
        self._closed = 0  # tree levels whose outputs this side holds
        self._opened: dict[int, Bits] = {}  # this side's openings (d ‖ e) per level
        self._theirs: dict[int, Bits] = {}  # the peer's
        self._t0 = [0]
        #: Per level: each node's first AND (its x ⊕ a is opened once), and
        #: each AND's node (both relative to the level).
        self._firsts: list[npt.NDArray[np.intp]] = []
        self._node_of: list[npt.NDArray[np.intp]] = []
        for i in range(p.depth):
            self._t0.append(self._t0[-1] + p.level_ands(i))
            sizes = [1 + g.eq for g in p.levels[i] if g.lo >= 0]
            assert sizes, "every tree level has a node with an AND"
            self._firsts.append(np.cumsum([0] + sizes[:-1]).astype(np.intp))
            self._node_of.append(np.repeat(np.arange(len(sizes)), sizes).astype(np.intp))

    def open_level(self, level: int) -> Bits:
        """This side's openings (x ⊕ a, y ⊕ b) of `level`'s ANDs (0-based), as bits."""
        if level != self._closed or level in self._opened:
            raise AssertionError("tree levels are opened once, in order")
        xs, ys = [], []
        for g in self.plan.levels[level]:
            if g.lo < 0:
                continue
            xs.append(self.eq[g.hi])
            ys.append(self.gt[g.lo])
            if g.eq:
                xs.append(self.eq[g.hi])
                ys.append(self.eq[g.lo])
        t0, t1 = self._t0[level], self._t0[level + 1]
        x, y = np.stack(xs), np.stack(ys)
        d = (x ^ self.a[t0:t1])[self._firsts[level]]  # a node's two ANDs share x and a
        mine = np.concatenate([d.ravel(), (y ^ self.b[t0:t1]).ravel()])
        self._opened[level] = mine
        return mine

    def _settle(self) -> None:
        """Close every level whose two openings are in, in order."""
        while self._closed in self._opened and self._closed in self._theirs:
            self._close_level(self._closed)
            self._closed += 1

    def _close_level(self, level: int) -> None:
        """With both openings of `level`: this side's output shares; the level's
        nodes become the tree's current nodes."""
        t0, t1 = self._t0[level], self._t0[level + 1]
        nodes = self._firsts[level].shape[0]
        m = nodes * self.lanes
        both = self._opened.pop(level) ^ self._theirs.pop(level)
        d = both[:m].reshape(nodes, self.lanes)[self._node_of[level]]
        e = both[m:].reshape(t1 - t0, self.lanes)
        z = self.c[t0:t1] ^ (d & self.b[t0:t1]) ^ (e & self.a[t0:t1])
        if self.garbler:
            z ^= d & e
        gates = self.plan.levels[level]
        gt = np.empty((len(gates), self.lanes), np.uint8)
        eq = np.zeros((len(gates), self.lanes), np.uint8)
        at = 0
        for i, g in enumerate(gates):
            if g.lo < 0:
                gt[i], eq[i] = self.gt[g.hi], self.eq[g.hi]
                continue
            gt[i] = self.gt[g.hi] ^ z[at]
            at += 1
            if g.eq:
                eq[i] = z[at]
                at += 1
        self.gt, self.eq = gt, eq

    def pack(self, levels: tuple[int, ...]) -> bytes:
        """This side's openings of `levels` (1-based), each level closed as soon
        as the peer's openings of it are in (so the next can be opened)."""
        bits = []
        for lv in levels:
            bits.append(self.open_level(lv - 1))
            self._settle()
        if not bits:
            return b""
        return np.packbits(np.concatenate(bits), bitorder="little").tobytes()

    def _set_triples(
        self,
        sl: slice,
        plain: tuple[npt.NDArray[Any], npt.NDArray[Any]],
        pair: tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]],
        cross: Bits,
    ) -> None:
        """A lane batch's triples of a fill, either side (`Triples`): this side's
        shares of (a, b) of each gt-only node and of (a, b1, b2) of each node
        with two ANDs, and its bits of the cross terms, per triple plane (the
        OT messages' two low bits it holds): c = a·b ⊕ both cross terms."""
        tr = self.plan.triples
        t, ta = tr.plain_and, tr.pair_and
        a, b = plain
        self.a[t, sl], self.b[t, sl] = a, b
        self.c[t, sl] = (a & b) ^ (cross[tr.plain_b] & 1) ^ (cross[tr.plain_a] & 1)
        a, b1, b2 = pair
        w = cross[tr.pair_a]  # both a_E·b_G terms: bit 0 for b1, bit 1 for b2
        self.a[ta, sl] = self.a[ta + 1, sl] = a
        self.b[ta, sl], self.b[ta + 1, sl] = b1, b2
        self.c[ta, sl] = (a & b1) ^ (cross[tr.pair_b1] & 1) ^ (w & 1)
        self.c[ta + 1, sl] = (a & b2) ^ (cross[tr.pair_b2] & 1) ^ (w >> 1)

    def opening_bytes(self, levels: tuple[int, ...]) -> int:
        """Bytes of one party's openings of `levels` (1-based)."""
        return -(-sum(self.plan.level_openings(lv - 1) * self.lanes for lv in levels) // 8)

    def receive(self, msg: bytes | memoryview, levels: tuple[int, ...]) -> None:
        """The peer's openings of `levels` (1-based), of the length they must have."""
        sizes = [self.plan.level_openings(lv - 1) * self.lanes for lv in levels]
        if len(msg) != self.opening_bytes(levels):
            raise ValueError("malformed comparison opening message")
        bits = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
        at = 0
        for lv, size in zip(levels, sizes, strict=True):
            self._theirs[lv - 1] = bits[at : at + size]
            at += size
        if bits[at:].any():
            raise ValueError("malformed comparison opening message")
        self._settle()

    def carry(self) -> Bits:
        if self.gt.shape[0] != 1:
            raise AssertionError("tree not finished")
        return self.gt[0]

    z: npt.NDArray[np.uint64]

    def yes_share(self) -> Bits:
        """This side's share of YES: ¬(a_n ⊕ carry_G) on the garbler, b_n ⊕
        carry_E on the evaluator."""
        top = ((self.z >> np.uint64(self.plan.bits)) & np.uint64(1)).astype(np.uint8)
        share = top ^ self.carry()
        return np.bitwise_xor(share, np.uint8(1)) if self.garbler else share


class GarblerSide(_Side):
    """The OT sender (on the servers, the helper): holds Δ and x."""

    garbler = True

    def __init__(
        self,
        p: Plan,
        z: npt.NDArray[np.uint64],
        delta: Blocks,
        tweak_hi: int,
        fill: bool = False,
    ) -> None:
        """`fill`: a fill's side (`garbler_slots`): x and the garbler's shares
        are zero, and the native core writes the slots' masks straight."""
        super().__init__(p, z.shape[0])
        self.z = z
        #: κ = r_2 ⊕ a_G of each pair node (`Triples`), sent with a chunk's tables.
        self.k = np.empty((p.pairs, self.lanes), np.uint8)
        self.delta = np.ascontiguousarray(delta, dtype=np.uint64).reshape(1, 2)
        self.hi = tweak_hi
        self.fill = fill
        q = len(p.blocks)
        if fill:
            if z.any():
                raise ValueError("a fill's side has x = 0")
            self.gt[:] = 0
            self.eq[:] = 0
        else:
            self.gt[:] = random_bits(q * self.lanes).reshape(q, self.lanes)
            self.eq[:] = random_bits(q * self.lanes).reshape(q, self.lanes)
        #: Block j's table: (gt, and eq if needed) × entry u × lane, entry-major
        #: (made on first use); a fill on the native core writes `_m` instead.
        self._tables_: list[npt.NDArray[np.uint8]] | None = None
        self._m: npt.NDArray[np.uint8] | None = None

    @property
    def _tables(self) -> list[npt.NDArray[np.uint8]]:
        if self._tables_ is None:
            p = self.plan
            self._tables_ = [np.empty((1 + eq, 1 << s, self.lanes), np.uint8)
                             for (_, s), eq in zip(p.blocks, p.leaf_eq, strict=True)]  # fmt: skip
        return self._tables_

    def batch(self, h: Any, lo: int, q: Blocks, ws: dict[str, Any]) -> None:
        """One lane batch's correlated OTs (planes × lanes × 2 words): its
        part of the leaf tables and its triples.  `ws`: scratch buffers kept
        by the caller across batches and chunks (fresh pages fault per 4 KiB).
        With the native hash, the native core does it in one pass (same bytes)."""
        p, n = self.plan, self.plan.bits
        lanes, rows = q.shape[1], p.planes * q.shape[1]
        sl = slice(lo, lo + lanes)
        if _native(h):
            from svtagg.mpc.native import core

            t = p.planes - p.bits
            s0, s1 = np.empty((t, lanes), np.uint8), np.empty((t, lanes), np.uint8)
            if self.fill:  # the slots' masks, slot-major, as `garbler_slots` keeps them
                if self._m is None:
                    entries = sum(1 << s for _, s in p.blocks)
                    self._m = np.empty((self.lanes, entries), np.uint8)
                core().mill_garbler_slots(
                    np.ascontiguousarray(q), self.delta, self.hi, lo, _blocks_arg(p),
                    np.ascontiguousarray(self.z[sl]), self._m[sl], s0, s1,
                )  # fmt: skip
                self._triples(sl, s0, s1)
                return
            table = np.empty(p.table_bits * lanes, np.uint8)
            core().mill_garbler(
                np.ascontiguousarray(q), self.delta, self.hi, lo, _blocks_arg(p),
                np.ascontiguousarray(self.z[sl]), np.ascontiguousarray(self.gt[:, sl]),
                np.ascontiguousarray(self.eq[:, sl]), table, s0, s1,
            )  # fmt: skip
            at = 0
            for j, ((_, s), eq) in enumerate(zip(p.blocks, p.leaf_eq, strict=True)):
                size = (1 + eq) << s
                self._tables[j][:, :, sl] = table[at * lanes : (at + size) * lanes].reshape(
                    1 + eq, 1 << s, lanes
                )
                at += size
            self._triples(sl, s0, s1)
            return
        flat = q.reshape(-1, 2)
        tw = _lane_tweaks(lo, lanes, p.planes, self.hi, ws)
        k0 = h(flat, tw, _scratch(ws, "k0", rows + 1)).reshape(p.planes, lanes, 2)
        x = _scratch(ws, "x", rows)
        np.bitwise_xor(flat, self.delta, out=x)
        k1 = h(x, tw, _scratch(ws, "k1", rows + 1)).reshape(p.planes, lanes, 2)
        nb = len(p.blocks)
        for j, ((first, s), eq) in enumerate(zip(p.blocks, p.leaf_eq, strict=True)):
            # Entry u = Σ u_l·2^l: comb[u] = ⊕_l K_l^{u_l}, doubled bit by bit
            # (entry-major, so every XOR runs over a whole lane batch).
            comb = _scratch(ws, "comb", lanes << s).reshape(1 << s, lanes, 2)
            comb[0] = k0[first]
            comb[1] = k1[first]
            for bit in range(1, s):
                w = 1 << bit
                np.bitwise_xor(comb[:w], k1[first + bit], out=comb[w : 2 * w])
                np.bitwise_xor(comb[:w], k0[first + bit], out=comb[:w])
            u = np.arange(1 << s, dtype=np.uint64)[:, None]
            tw_u = _pad_tweaks(lo, lanes, j, nb, u, self.hi, ws)
            pad = h(comb.reshape(-1, 2), tw_u, _scratch(ws, "pad", (lanes << s) + 1))
            pw = pad[:, 0].reshape(1 << s, lanes)
            xj = low_bits(self.z[sl], first, s)[None, :]
            table = self._tables[j]
            gt = (pw & np.uint64(1)).astype(np.uint8)
            gt ^= (xj > u).astype(np.uint8)
            gt ^= self.gt[j, sl]
            table[0, :, sl] = gt
            if eq:
                e = ((pw >> np.uint64(1)) & np.uint64(1)).astype(np.uint8)
                e ^= (xj == u).astype(np.uint8)
                e ^= self.eq[j, sl]
                table[1, :, sl] = e
        s0 = (k0[n:, :, 0] & np.uint64(3)).astype(np.uint8)
        s1 = (k1[n:, :, 0] & np.uint64(3)).astype(np.uint8)
        self._triples(sl, s0, s1)

    def _triples(self, sl: slice, s0: Bits, s1: Bits) -> None:
        """Triples from the random OTs' two low bits s_b = H(q ⊕ b·Δ) & 3 of
        the triple planes (`Triples`): the correlation s_0 ⊕ s_1 is the
        garbler's share of the product, s_0 its share of the cross term."""
        tr, x = self.plan.triples, s0 ^ s1
        a = x[tr.pair_b1] & 1
        plain = (x[tr.plain_b] & 1, x[tr.plain_a] & 1)
        self._set_triples(sl, plain, (a, x[tr.pair_a] & 1, x[tr.pair_a] >> 1), s0)
        self.k[:, sl] = (x[tr.pair_b2] & 1) ^ a

    def tables(self) -> bytes:
        bits = np.concatenate([t.ravel() for t in self._tables])
        return np.packbits(bits, bitorder="little").tobytes()


class EvaluatorSide(_Side):
    """The OT receiver (on the servers, the leader): holds ȳ = ¬y."""

    garbler = False

    def __init__(self, p: Plan, z: npt.NDArray[np.uint64], tweak_hi: int) -> None:
        super().__init__(p, z.shape[0])
        self.z = z
        self.ybar = ~z
        self.hi = tweak_hi
        self.r = np.empty((p.planes, self.lanes), np.uint8)
        for i in range(p.bits):
            self.r[i] = low_bits(self.ybar, i, 1)
        t = p.planes - p.bits
        self.r[p.bits :] = random_bits(t * self.lanes).reshape(t, self.lanes)
        #: The choice bit c of each slot's logic OT (the fill's last plane).
        self.logic_c = random_bits(self.lanes)
        q = len(p.blocks)
        self._pads = np.empty((q, self.lanes), np.uint64)

    def choices(self, lo: int, hi: int) -> Bits:
        """Packed choice bits of a lane batch's fill, plane-major (the
        extension's layout): the `planes`, then the logic's plane."""
        rows = np.concatenate([self.r[:, lo:hi].reshape(-1), self.logic_c[lo:hi]])
        return np.packbits(rows, bitorder="little")

    def batch(self, h: Any, lo: int, t: Blocks, ws: dict[str, Any]) -> None:
        """One lane batch's OT blocks t: its entries' masks and its triples."""
        p, n = self.plan, self.plan.bits
        lanes, rows = t.shape[1], p.planes * t.shape[1]
        sl = slice(lo, lo + lanes)
        if _native(h):
            from svtagg.mpc.native import core

            v_bits = np.empty((p.planes - p.bits, lanes), np.uint8)
            pads = np.empty((len(p.blocks), lanes), np.uint64)
            core().mill_evaluator(
                np.ascontiguousarray(t), self.hi, lo, _blocks_arg(p),
                np.ascontiguousarray(self.ybar[sl]), pads, v_bits,
            )  # fmt: skip
            self._pads[:, sl] = pads
            self._triples(sl, v_bits)
            return
        tw = _lane_tweaks(lo, lanes, p.planes, self.hi, ws)
        k = h(t.reshape(-1, 2), tw, _scratch(ws, "k0", rows + 1)).reshape(p.planes, lanes, 2)
        nb = len(p.blocks)
        comb = _scratch(ws, "comb", lanes)
        for j, (first, s) in enumerate(p.blocks):
            comb[:] = k[first]
            for bit in range(1, s):
                comb ^= k[first + bit]
            v = low_bits(self.ybar[sl], first, s)[None, :]
            pad = h(
                comb, _pad_tweaks(lo, lanes, j, nb, v, self.hi, ws), _scratch(ws, "pad", lanes + 1)
            )
            self._pads[j, sl] = pad[:, 0]
        self._triples(sl, (k[n:, :, 0] & np.uint64(3)).astype(np.uint8))

    def _triples(self, sl: slice, v: Bits) -> None:
        """Triples from the OT bits H(t) & 3 of the triple planes (see the
        garbler's); a pair node's second c still lacks b_2E·κ (`EvaluatorChunk`)."""
        tr, r = self.plan.triples, self.r[self.plan.bits :, sl]
        plain = (r[tr.plain_a], r[tr.plain_b])
        self._set_triples(sl, plain, (r[tr.pair_a], r[tr.pair_b1], r[tr.pair_b2]), v)


# ------------------------------------------------------------------ slots and chunks
#: The most slots a session fills ahead: after a chunk of k comparisons, both
#: parties top their pool up to min(k, MAX_AHEAD) slots for the next chunk.
MAX_AHEAD = 1 << 17
#: Fills of at most this many slots are made off a chunk's critical path: the
#: evaluator's in the previous chunk's wait for its logic's tables, the
#: garbler's once its logic's tables are sent (`protocol.py`).  A larger fill
#: takes longer than those windows (≈ 2 µs per slot of the garbler's CPU) and
#: is made during its chunk, in pieces, as the chunk's flights go on.
MAX_SHIFTED = 1 << 14


class Slots:
    """Precomputed comparisons of one width (the offline phase): arrays whose
    first axis is the slot (a slot's data contiguous), taken in order by both
    parties alike."""

    def __init__(self, width: int, arrays: dict[str, npt.NDArray[Any]]) -> None:
        self.width, self.arrays = width, arrays

    def __len__(self) -> int:
        return int(self.arrays["a"].shape[0])

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.arrays[name]

    def split(self, n: int) -> tuple[Slots, Slots]:
        head = {k: v[:n] for k, v in self.arrays.items()}
        tail = {k: v[n:] for k, v in self.arrays.items()}
        return Slots(self.width, head), Slots(self.width, tail)

    def __add__(self, other: Slots) -> Slots:
        if other.width != self.width:
            raise ValueError("slots of two widths")
        both = {k: np.concatenate([v, other.arrays[k]]) for k, v in self.arrays.items()}
        return Slots(self.width, both)


class SlotPool:
    """A session's slots, of the width of its last OT-path chunk: a chunk of
    another width discards them (both parties alike: widths are public)."""

    def __init__(self) -> None:
        self.slots: Slots | None = None

    def available(self, width: int) -> int:
        if self.slots is not None and self.slots.width != width:
            self.slots = None
        return 0 if self.slots is None else len(self.slots)

    def add(self, slots: Slots) -> None:
        if self.slots is None or self.slots.width != slots.width:
            self.slots = slots
        else:
            self.slots = self.slots + slots

    def take(self, width: int, n: int) -> Slots:
        if self.available(width) < n or self.slots is None:
            raise AssertionError("the pool is short: fill it first")
        head, self.slots = self.slots.split(n)
        return head


@dataclass(frozen=True)
class LogicInputs:
    """The OT path's inputs to its chunk's garbled logic: the chunk's slots
    (their logic OTs), and the evaluator's `logic_choices` when they rode its
    last flight of the tree (at odd depths; else None: they are sent alone)."""

    slots: Slots
    choices: bytes | memoryview | None = None


def logic_choices(yes: npt.NDArray[Any], slots: Slots) -> bytes:
    """The evaluator's input to the chunk's garbled logic: e = yes_E ⊕ c per
    lane, packed, c the choice of the lane's slot's logic OT (uniform, hidden
    by the extension, used once: e is one-time padded).  Its label is then that
    OT's own block t = q ⊕ c·Δ, which is the label of yes_E under the zero
    label q ⊕ e·Δ (`logic_labels`): the extension's random OT, derandomized."""
    return np.packbits(yes.astype(np.uint8) ^ slots["lc"], bitorder="little").tobytes()


def logic_labels(msg: bytes | memoryview, slots: Slots, delta: Blocks) -> Blocks:
    """The garbler's zero labels of the evaluator's logic inputs: q ⊕ e·Δ per
    lane, from the evaluator's `logic_choices` message (checked: its length,
    and zero padding)."""
    lanes = len(slots)
    if len(msg) != -(-lanes // 8):
        raise ValueError("malformed logic input message")
    e = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
    if e[lanes:].any():
        raise ValueError("malformed logic input message")
    mask = np.uint64(0) - e[:lanes].astype(np.uint64)  # all ones where e = 1
    return slots["l"] ^ (mask[:, None] & np.asarray(delta, np.uint64).reshape(1, 2))


def garbler_slots(side: GarblerSide) -> Slots:
    """The garbler's slots from a fill: made with x = 0 and zero shares, so
    entry w of block j's table is its mask (the eq half XOR [w = 0]); kept as
    mask bits (gt in bit 0, eq in bit 1) per entry w and slot ("m"), and the
    triples ("a", "b", "c") and corrections ("k"); the fill adds the logic
    OT's block ("l": `protocol._fill_slots`)."""
    p = side.plan
    arrays = {
        k: np.ascontiguousarray(v.T)
        for k, v in (("a", side.a), ("b", side.b), ("c", side.c), ("k", side.k))
    }
    if side._m is not None:  # written slot-major by the native core
        return Slots(p.width, {**arrays, "m": side._m})
    masks = []
    for j, eq in enumerate(p.leaf_eq):
        m = side._tables[j][0].copy()
        if eq:
            e = side._tables[j][1].copy()
            e[0] ^= 1  # [0 = w] at w = 0
            m |= e << 1
        masks.append(m)
    # Slot-major: the entries of every block of one slot side by side.
    arrays["m"] = np.ascontiguousarray(np.concatenate(masks).T)
    return Slots(p.width, arrays)


def evaluator_slots(side: EvaluatorSide) -> Slots:
    """The evaluator's slots from a fill: its random choices r (the low n bits
    of ȳ it chose with), the two mask bits of the entry r_j of each block, the
    triples, and the logic OT's choice c ("lc"; the fill adds its block "l")."""
    p = side.plan
    r = side.ybar & np.uint64((1 << p.bits) - 1)
    masks = np.ascontiguousarray((side._pads & np.uint64(3)).astype(np.uint8).T)
    arrays = {
        k: np.ascontiguousarray(v.T) for k, v in (("a", side.a), ("b", side.b), ("c", side.c))
    }
    return Slots(p.width, {**arrays, "r": r, "m": masks, "lc": side.logic_c.copy()})


def _d_message(d: npt.NDArray[np.uint64], n: int) -> bytes:
    """The n low bits of every lane's d, plane-major, packed."""
    planes = np.stack([low_bits(d, i, 1).astype(np.uint8) for i in range(n)])
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def parse_d(msg: bytes | memoryview, n: int, lanes: int) -> npt.NDArray[np.uint64]:
    """`_d_message` back, refusing a message of another length."""
    if len(msg) != -(-n * lanes // 8):
        raise ValueError("malformed comparison choice message")
    bits = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
    if bits[n * lanes :].any():
        raise ValueError("malformed comparison choice message")
    planes = bits[: n * lanes].reshape(n, lanes).astype(np.uint64)
    d = np.zeros(lanes, np.uint64)
    for i in range(n):
        d |= planes[i] << np.uint64(i)
    return d


class GarblerChunk(_Side):
    """The garbler's side of one chunk on precomputed slots: with the
    evaluator's d = v ⊕ r, entry u of block j is masked by the slot's mask of
    entry u ⊕ d_j (the OTs derandomized: the keys K_l^{u_l} of the chunk are
    the fill's K_l^{u_l ⊕ d_l}), so the tables cost no hashing."""

    garbler = True

    def __init__(self, p: Plan, z: npt.NDArray[np.uint64], slots: Slots) -> None:
        super().__init__(p, z.shape[0])
        self.z, self.slots = z, slots
        self.a, self.b, self.c = slots["a"].T, slots["b"].T, slots["c"].T
        q = len(p.blocks)
        self.gt = random_bits(q * self.lanes).reshape(q, self.lanes)
        self.eq = random_bits(q * self.lanes).reshape(q, self.lanes)

    def corrections(self) -> bytes:
        """κ of the chunk's slots, node by node (each node's lanes in order),
        packed: sent right after the tables (`Triples`)."""
        return np.packbits(self.slots["k"].T.reshape(-1), bitorder="little").tobytes()

    def tables(self, d: npt.NDArray[np.uint64], native_core: bool = False) -> bytes:
        """The leaf tables (the native core's pass, or numpy: the same bytes)."""
        p = self.plan
        if native_core:
            from svtagg.mpc.native import core

            out = bytearray(-(-p.table_bits * self.lanes // 8))
            core().mill_tables(
                np.ascontiguousarray(self.slots["m"]), np.ascontiguousarray(d),
                np.ascontiguousarray(self.z), self.gt, self.eq, _blocks_arg(p), out,
            )  # fmt: skip
            return bytes(out)
        parts, row = [], 0
        for j, ((first, s), eq) in enumerate(zip(p.blocks, p.leaf_eq, strict=True)):
            u = np.arange(1 << s, dtype=np.int64)[None, :]
            idx = u ^ low_bits(d, first, s)[:, None]
            m = np.take_along_axis(self.slots["m"][:, row : row + (1 << s)], idx, axis=1).T
            row += 1 << s
            xj = low_bits(self.z, first, s)[None, :]
            parts.append(((m & 1) ^ (xj > u.T) ^ self.gt[j]).astype(np.uint8).ravel())
            if eq:
                bit = ((m >> 1) & 1) ^ (xj == u.T) ^ self.eq[j]
                parts.append(bit.astype(np.uint8).ravel())
        return np.packbits(np.concatenate(parts), bitorder="little").tobytes()


class EvaluatorChunk(_Side):
    """The evaluator's side of one chunk on precomputed slots: it sends d =
    ȳ ⊕ r (one-time padded by the fill's random choices) and unmasks its
    entry v = ȳ_j with the slot's mask of entry r_j."""

    garbler = False

    def __init__(self, p: Plan, z: npt.NDArray[np.uint64], slots: Slots) -> None:
        super().__init__(p, z.shape[0])
        self.z, self.slots = z, slots
        self.a, self.b, self.c = slots["a"].T, slots["b"].T, slots["c"].T
        self.ybar = ~z
        self.d = (self.ybar ^ slots["r"]) & np.uint64((1 << p.bits) - 1)

    def d_message(self) -> bytes:
        return _d_message(self.d, self.plan.bits)

    def read_corrections(self, msg: bytes | memoryview) -> None:
        """The garbler's κ per pair node: a pair's second c gains b_2E·κ."""
        p, ta = self.plan, self.plan.triples.pair_and
        n = p.pairs * self.lanes
        if len(msg) != -(-n // 8):
            raise ValueError("malformed comparison correction message")
        bits = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
        if bits[n:].any():
            raise ValueError("malformed comparison correction message")
        self.c = self.c.copy()  # the slots' own c stays as made
        self.c[ta + 1] ^= self.b[ta + 1] & bits[:n].reshape(p.pairs, self.lanes)

    def read_tables(self, msg: bytes | memoryview) -> None:
        p = self.plan
        if len(msg) != -(-p.table_bits * self.lanes // 8):
            raise ValueError("malformed comparison table message")
        bits = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
        if bits[p.table_bits * self.lanes :].any():
            raise ValueError("malformed comparison table message")
        at, lanes = 0, np.arange(self.lanes)
        masks = self.slots["m"].T
        for j, ((first, s), eq) in enumerate(zip(p.blocks, p.leaf_eq, strict=True)):
            idx = at + low_bits(self.ybar, first, s) * self.lanes + lanes  # entry v, lane
            self.gt[j] = bits[idx] ^ (masks[j] & 1)
            if eq:
                self.eq[j] = bits[idx + (self.lanes << s)] ^ (masks[j] >> 1)
            at += (1 + eq) * (self.lanes << s)


def plain_yes(z_g: npt.NDArray[np.uint64], z_e: npt.NDArray[np.uint64], width: int) -> Bits:
    """Plaintext reference: YES_j on the low `width` bits of z_g + z_e."""
    s = (z_g + z_e) & np.uint64((1 << width) - 1 if width < 64 else (1 << 64) - 1)
    return (1 ^ ((s >> np.uint64(width - 1)) & np.uint64(1))).astype(np.uint8)


# ------------------------------------------------------------------ choosing the path
#: Seconds per comparison of a chunk beyond its round trips and its bytes at the
#: link's rate, measured through both server processes at w = 34 (`bench_network
#: --quick --rtt 10 --rate 1g,100m --comparison garbled,ot,auto:10:1000 --chunks
#: 1000,10000,100000`, docs/scaling.md "Comparison path"): 3.4–6.3 µs garbled and
#: 5.2–7.6 µs on the OT path at chunks of 10^5 / 10^4 (two cores for both servers).
CPU_GARBLED = 4.0e-6
CPU_OT = 6.0e-6


def garbled_bytes(width: int, ot_bytes: float) -> float:
    """Bytes per first-YES comparison of the garbled path (half-gates): 32 per
    carry AND, 16 for the garbler-half gate, the OT per input bit, 32 for the
    prefix OR."""
    return 32 * (width - 2) + 16 + ot_bytes * width + 32


def ot_path_bytes(width: int, ot_bytes: float) -> float:
    """Bytes per comparison of the OT path in a steady stream of chunks: the
    fill's OTs (leaf bits, triples, the logic's input), the online d bits (one
    per leaf bit), the leaf tables and the pair nodes' corrections κ, the
    openings (per node and party x ⊕ a once and y ⊕ b per AND), the logic
    input's one bit e, and the prefix OR's one AND garbled under three-halves
    (1.5κ bits and 5 control bits)."""
    p = plan(width)
    openings = 2 * sum(p.level_openings(i) for i in range(p.depth))
    online = p.bits / 8 + (p.table_bits + p.pairs + openings + 1) / 8
    return ot_bytes * p.fill_planes + online + 24 + 5 / 8


def ot_path_round_trips(width: int) -> int:
    """Round trips before the evaluator holds the result (garbled path: 1)."""
    flights = schedule(plan(width).depth)
    # E's OT message, the schedule, then E's input message for the logic if its
    # last share came in a garbler flight (else it rides E's last flight), tables.
    return (1 + len(flights) + (flights[-1][0] == "G") + 1) // 2


def server_path() -> str:
    """The servers' default path rule: `SVTAGG_COMPARISON` if set (it must
    parse), else "garbled".  Only the leader's counts: the helper runs the rule
    its leader announces."""
    spec = os.environ.get("SVTAGG_COMPARISON") or "garbled"
    PathRule.parse(spec)
    return spec


#: The OT path's wire (its messages' contents and order).  A leader announces
#: its rule as "RULE@WIRE" (`announce`), and a helper refuses any other wire
#: at the session's opening, before any chunk (`announced_rule`): servers of
#: two versions never fail a chunk, and so never spend its budget, on it.
#: 2: the logic's inputs from the fill, correlated triples, e on the last flight.
WIRE = 2


def announce(rule: str) -> str:
    """The leader's SessionOpen.comparison_path: "" for garbled (unchanged)."""
    return "" if rule == "garbled" else f"{rule}@{WIRE}"


def announced_rule(text: str) -> str:
    """The rule a leader announced, if its OT path speaks this wire."""
    if not text or text == "garbled":
        return "garbled"
    rule, _, wire = text.partition("@")
    if wire != str(WIRE):
        theirs = f"wire {wire}" if wire else "an older wire"
        raise ValueError(
            f"the leader's OT path speaks {theirs}, this helper wire {WIRE} "
            "(run both servers on the same svtagg version)"
        )
    return rule


@dataclass(frozen=True)
class PathRule:
    """Which path a first-YES / CTT chunk takes, the same on both servers.

    "garbled" and "ot" fix it; "auto:RTT_MS:MBPS" chooses per chunk the path
    with the lower modelled time, round trips × RTT + comparisons × (bytes ×
    8 / bandwidth + CPU), from the link the deployment states (RTT in
    milliseconds, bandwidth in Mbit/s) and the measured constants above."""

    mode: str = "garbled"
    rtt: float = 0.0  # seconds
    bandwidth: float = 0.0  # bytes per second

    @classmethod
    def parse(cls, text: str) -> PathRule:
        t = (text or "garbled").strip()
        if t in ("garbled", "ot"):
            return cls(t)
        parts = t.split(":")
        if parts[0] == "auto" and len(parts) == 3:
            try:
                rtt_ms, mbps = float(parts[1]), float(parts[2])
            except ValueError:
                rtt_ms = mbps = -1.0
            if rtt_ms >= 0 and mbps > 0 and math.isfinite(rtt_ms) and math.isfinite(mbps):
                return cls("auto", rtt_ms / 1000, mbps * 1e6 / 8)
        raise ValueError(
            f"unknown comparison path {text!r}; choose garbled, ot or auto:RTT_MS:MBPS "
            "(e.g. auto:10:1000 for a 10 ms, 1 Gbit/s link)"
        )

    def __str__(self) -> str:
        if self.mode != "auto":
            return self.mode
        return f"auto:{self.rtt * 1000:g}:{self.bandwidth * 8 / 1e6:g}"

    def modelled(self, comparisons: int, width: int, ot_bytes: float) -> tuple[float, float]:
        """(garbled, OT path) modelled seconds for a chunk of `comparisons`."""
        per_byte = 1 / self.bandwidth if self.bandwidth else 0.0
        g = self.rtt + comparisons * (garbled_bytes(width, ot_bytes) * per_byte + CPU_GARBLED)
        o = ot_path_round_trips(width) * self.rtt + comparisons * (
            ot_path_bytes(width, ot_bytes) * per_byte + CPU_OT
        )
        return g, o

    def use_ot(self, comparisons: int, width: int, ot_bytes: float) -> bool:
        if comparisons <= 0 or self.mode == "garbled":
            return False
        if self.mode == "ot":
            return True
        g, o = self.modelled(comparisons, width, ot_bytes)
        return o < g
