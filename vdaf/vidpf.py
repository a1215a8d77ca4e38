"""The verifiable incremental distributed point function (VIDPF) of the Mastic
draft (draft-mouris-cfrg-mastic, §"Specification of VIDPF", after Mouris,
Sarkar, Tang, PETS 2024 [MST24]), over a field of `vdaf.field`.

A client holding an input string α of BITS bits and a weight β (VALUE_LEN
field elements) makes two keys, one per aggregator, and one correction word
per level of the prefix tree.  Each aggregator evaluates its key on any
prefix X and gets a share of F(X) = β if X is a prefix of α, else zero; the
shares of one level sum, over a set of prefixes, to what heavy hitters need.
Unlike a plain incremental DPF, every node also carries a 32-byte *node proof*
that the two aggregators compute alike for an honest pair of keys (on α's path
exactly one of them corrects it, elsewhere both hold the same seed), so
comparing hashes of them tells the aggregators that a report's tree is
one-hot (Mastic's "onehot check"; the evaluation-proof hash and the weight's
FLP are in vdaf/mastic.py).  The node proof hashes the seed only, which lets a
"split" report through (docs/vdaf.md); vdaf/sparse.py and vdaf/crawl.py key
their proofs by the control bit instead.

How a level works (gen, then what `eval_next` undoes): each of the two seeds
is extended into two children with a control bit each (`extend`); the
correction word makes the child off α's path equal on both sides and the
control bits of the child on the path shares of one; the kept child is
converted into the next seed and a payload (`convert`); the payload's
correction makes the on-path payloads sum to β; the node proof's correction
makes the on-path proofs equal.

Status: written from the draft's text, tested by its properties
(tests/test_vdaf_vidpf.py) and, through vdaf/mastic.py, by all nine of the
draft's vectors (tests/test_vdaf_mastic.py).  Pure Python; not used by the
servers (their sparse path is vdaf/sparse.py).  Constants are the draft's:
the `dst` of its reference (`b"mastic"`, version 0, usage, ctx), usages 9–11,
proofs of 32 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from svtagg.vdaf.field import Field
from svtagg.vdaf.turboshake import XofFixedKeyAes128, XofTurboShake128, next_vec

#: The Mastic draft's version byte (0 until adopted) and its VIDPF usages.
VERSION = 0
USAGE_NODE_PROOF = 9
USAGE_EXTEND = 10
USAGE_CONVERT = 11
PROOF_SIZE = 32
KEY_SIZE = XofFixedKeyAes128.SEED_SIZE
NONCE_SIZE = KEY_SIZE
RAND_SIZE = 2 * KEY_SIZE


def dst(ctx: bytes, usage: int) -> bytes:
    return b"mastic" + bytes([VERSION, usage]) + ctx


def encode_path(path: Sequence[bool]) -> bytes:
    """A prefix's bits packed most significant first, 8 per byte."""
    out = bytearray((len(path) + 7) // 8)
    for i, bit in enumerate(path):
        if bit:
            out[i // 8] |= 0x80 >> (i % 8)
    return bytes(out)


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


@dataclass(frozen=True)
class CorrectionWord:
    """One level's public correction: seed, the two control bits, payload, proof."""

    seed: bytes
    ctrl: tuple[bool, bool]
    payload: tuple[int, ...]
    proof: bytes


@dataclass
class Node:
    """One aggregator's node of the prefix tree: its seed and control bit,
    its payload share (before the aggregator's sign) and its node proof."""

    seed: bytes
    ctrl: bool
    w: list[int]
    proof: bytes
    children: dict[bool, Node] = field(default_factory=dict)


class Vidpf:
    """VIDPF over `field` for inputs of `bits` bits and weights of `value_len`
    elements."""

    def __init__(self, field: Field, bits: int, value_len: int) -> None:
        if bits < 1 or value_len < 1:
            raise ValueError("a VIDPF has at least one bit and one weight element")
        self.field = field
        self.bits = bits
        self.value_len = value_len

    # ------------------------------------------------------------ the draft's aux
    def extend(self, seed: bytes, ctx: bytes, nonce: bytes) -> tuple[list[bytes], list[bool]]:
        """Two children's seeds and control bits; each control bit is its
        seed's least significant bit, cleared in the seed."""
        xof = XofFixedKeyAes128(seed, dst(ctx, USAGE_EXTEND), nonce)
        seeds, ctrls = [], []
        for _ in range(2):
            s = bytearray(xof.next(KEY_SIZE))
            ctrls.append(bool(s[0] & 1))
            s[0] &= 0xFE
            seeds.append(bytes(s))
        return seeds, ctrls

    def convert(self, seed: bytes, ctx: bytes, nonce: bytes) -> tuple[bytes, list[int]]:
        """The next level's seed and this node's payload."""
        xof = XofFixedKeyAes128(seed, dst(ctx, USAGE_CONVERT), nonce)
        next_seed = xof.next(KEY_SIZE)
        f = self.field
        return next_seed, next_vec(xof, f.modulus, f.encoded_size, self.value_len)

    def node_proof(self, seed: bytes, ctx: bytes, path: Sequence[bool]) -> bytes:
        binder = (
            self.bits.to_bytes(2, "little")
            + (len(path) - 1).to_bytes(2, "little")
            + encode_path(path)
        )
        return XofTurboShake128(seed, dst(ctx, USAGE_NODE_PROOF), binder).next(PROOF_SIZE)

    # ------------------------------------------------------------ key generation
    def gen(
        self,
        alpha: Sequence[bool],
        beta: Sequence[int],
        ctx: bytes,
        nonce: bytes,
        rand: bytes,
    ) -> tuple[list[CorrectionWord], tuple[bytes, bytes]]:
        """The public correction words (one per level) and the two keys.
        `rand`: RAND_SIZE bytes from a CSPRNG (the two keys)."""
        if len(alpha) != self.bits:
            raise ValueError(f"alpha has {len(alpha)} bits, not {self.bits}")
        if len(beta) != self.value_len or any(not 0 <= b < self.field.modulus for b in beta):
            raise ValueError(f"beta is {self.value_len} elements of {self.field.name}")
        if len(nonce) != NONCE_SIZE or len(rand) != RAND_SIZE:
            raise ValueError(f"nonce of {NONCE_SIZE} bytes, randomness of {RAND_SIZE}")
        p = self.field.modulus
        keys = (rand[:KEY_SIZE], rand[KEY_SIZE:])
        seed, ctrl = list(keys), [False, True]
        words: list[CorrectionWord] = []
        for i, bit in enumerate(alpha):
            keep, lose = int(bit), 1 - int(bit)
            (s0, t0), (s1, t1) = (self.extend(s, ctx, nonce) for s in seed)
            seed_cw = _xor(s0[lose], s1[lose])
            ctrl_cw = (t0[0] ^ t1[0] ^ (not bit), t0[1] ^ t1[1] ^ bit)
            kept = []
            for s, t, c in ((s0, t0, ctrl[0]), (s1, t1, ctrl[1])):
                if c:
                    s[keep] = _xor(s[keep], seed_cw)
                    t[keep] ^= ctrl_cw[keep]
                kept.append((s[keep], t[keep]))
            (seed[0], w0), (seed[1], w1) = (self.convert(s, ctx, nonce) for s, _ in kept)
            ctrl = [kept[0][1], kept[1][1]]
            w_cw = [(b - a + c) % p for b, a, c in zip(beta, w0, w1, strict=True)]
            if ctrl[1]:
                w_cw = [(-x) % p for x in w_cw]
            path = tuple(alpha[: i + 1])
            proof_cw = _xor(
                self.node_proof(seed[0], ctx, path), self.node_proof(seed[1], ctx, path)
            )
            words.append(CorrectionWord(seed_cw, ctrl_cw, tuple(w_cw), proof_cw))
        return words, keys

    # ------------------------------------------------------------ evaluation
    def root(self, key: bytes, agg_id: int) -> Node:
        if agg_id not in (0, 1):
            raise ValueError("the aggregator id is 0 or 1")
        return Node(key, bool(agg_id), [], b"")

    def eval_next(
        self, node: Node, cw: CorrectionWord, ctx: bytes, nonce: bytes, path: Sequence[bool]
    ) -> Node:
        """The child of `node` at `path` (whose last bit picks it), corrected."""
        keep = int(path[-1])
        s, t = self.extend(node.seed, ctx, nonce)
        if node.ctrl:
            s[keep] = _xor(s[keep], cw.seed)
            t[keep] ^= cw.ctrl[keep]
        next_seed, w = self.convert(s[keep], ctx, nonce)
        ctrl = t[keep]
        proof = self.node_proof(next_seed, ctx, path)
        if ctrl:
            p = self.field.modulus
            w = [(a + b) % p for a, b in zip(w, cw.payload, strict=True)]
            proof = _xor(proof, cw.proof)
        return Node(next_seed, ctrl, w, proof)

    def eval_prefixes(
        self,
        agg_id: int,
        words: Sequence[CorrectionWord],
        key: bytes,
        prefixes: Sequence[Sequence[bool]],
        ctx: bytes,
        nonce: bytes,
    ) -> tuple[list[list[int]], Node]:
        """This aggregator's shares of F(X) for each prefix X (all of one
        level), and the tree it walked (each visited node with its sibling,
        as Mastic's onehot check needs)."""
        if len(words) != self.bits:
            raise ValueError(f"{len(words)} correction words, not {self.bits}")
        levels = {len(x) for x in prefixes}
        if len(levels) > 1 or not levels <= set(range(1, self.bits + 1)):
            raise ValueError("the prefixes are of one level, 1 to BITS bits long")
        if len({tuple(x) for x in prefixes}) != len(prefixes):
            raise ValueError("the candidate prefixes are not distinct")
        root = self.root(key, agg_id)
        p = self.field.modulus
        shares: list[list[int]] = []
        for prefix in prefixes:
            n = root
            for i, bit in enumerate(prefix):
                for side in (False, True):
                    if side not in n.children:
                        path = (*prefix[:i], side)
                        n.children[side] = self.eval_next(n, words[i], ctx, nonce, path)
                n = n.children[bool(bit)]
            shares.append(list(n.w) if agg_id == 0 else [(-x) % p for x in n.w])
        return shares, root

    def beta_share(
        self, agg_id: int, words: Sequence[CorrectionWord], key: bytes, ctx: bytes, nonce: bytes
    ) -> list[int]:
        """This aggregator's share of β: the sum of the first level's two nodes."""
        root = self.root(key, agg_id)
        left, right = (self.eval_next(root, words[0], ctx, nonce, (b,)) for b in (False, True))
        p = self.field.modulus
        total = [(a + b) % p for a, b in zip(left.w, right.w, strict=True)]
        return total if agg_id == 0 else [(-x) % p for x in total]


def visited(root: Node) -> dict[tuple[bool, ...], Node]:
    """Every node of an evaluated tree by its path (the root excluded)."""
    out: dict[tuple[bool, ...], Node] = {}
    todo: list[tuple[tuple[bool, ...], Node]] = [((), root)]
    while todo:
        path, n = todo.pop()
        for side, child in n.children.items():
            out[(*path, side)] = child
            todo.append(((*path, side), child))
    return out
