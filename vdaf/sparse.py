"""Sparse one-hot reports: a verifiable distributed point function (DPF) key
per report instead of d field elements — the `sparse-onehot` circuit.

A client holding one item α ∈ [0, d) makes two DPF keys over the n-bit domain
(n = ⌈log₂ d⌉) whose leaf outputs are additive Field128 shares of the unit
vector e_α.  Each server expands its key over [0, d) in one pass of the GGM
tree (level by level, only the nodes whose subtree meets [0, d)), gets
its share of e_α, and folds it into the task's sums as the dense path folds a
Prio3 output share.  One report is 16 bytes of key per server plus a public
share of 16·n + ⌈2n/8⌉ + 32 bytes: 276 bytes to the leader at d = 10⁴ where a
dense `onehot` report is 167 KB.

The tree (Boyle–Gilboa–Ishai's DPF, CCS 2016, with the seed/control-bit
layout of the Mastic draft's VIDPF): each node holds a 16-byte seed and a
control bit per server; a node's children are H(s ⊕ 1) and H(s ⊕ 2), each
control bit the child's lowest bit (then cleared); the server whose parent
control bit is 1 XORs the level's seed correction into both children and the
level's control correction into their bits.  Off α's path both servers hold
the same seed and bit, on it different seeds and bits that differ.  A leaf's
output is (−1)^b·(conv(s) + t·CW) with CW chosen so the two shares at α add
to 1 and all others to 0.  H is the fixed-key AES hash of draft-irtf-cfrg-vdaf-13's
XofFixedKeyAes128 (σ-MMO, a circular correlation-robust hash) under a key
derived from the report's nonce (SHAKE128), as the VIDPF derives one.

The check (one exchange, no interaction with the client): every leaf has a
proof π = H_t(s ⊕ 5) — the control bit bound in, as the choice of
the hash's key — and the public share
carries one proof correction cs, XORed in where t = 1.  A leaf whose two
servers' (seed, bit) are equal has equal proofs; a leaf where they differ
agrees only if cs = H_{t₀}(s₀ ⊕ 5) ⊕ H_{t₁}(s₁ ⊕ 5), a value of its own, so
at most one leaf can be live.  Each server compresses the proofs of the
leaves of [0, d) as ⊕_x AES_{K_v}(π_x ⊕ x) with a key K_v derived from the
task's verify key, the nonce and the public share (clients do not hold it, so
they cannot make differences cancel; servers handed different public shares
get different keys),
and sends that 16-byte digest with its share of Σ_{x<d} y_x.  Valid iff the
digests are equal and the two sums add to 1: one live leaf, inside [0, d),
worth exactly 1.

Why the control bit is in the leaf proof: without it (the Mastic draft's
node proofs hash the seed only), a client can give both servers the same
seed and different bits at several nodes with a zero proof correction; those
nodes all agree yet all carry weight.  tests/test_vdaf_sparse.py keeps that
construction as the negative control: it is accepted without the bit and
refused with it (and the same split report passes Mastic-04's checks,
tests/test_vdaf_mastic.py).

Soundness: a malformed tree passes only by a collision of H-differences
between two leaves (≈ 2^{2n−128} per attempt for the client) or by a
digest collision under an unknown key (2^−128).  Privacy: each server sees
one pseudorandom key, the public corrections, and the other server's digest
and sum share, which for an honest report are equal to its own and 1 minus
its own.  conv(s) reduces 128 bits mod p (p = 2^128 − 7·2^66 + 1): its
distance from uniform is below 2^−59.

This module holds the numpy reference (every step a batch over a level's
nodes, ≈ 8 ms per report at d = 10⁴) and calls the native core
`svtagg.vdaf._sparse` (vdaf/_sparse.c, ≈ 0.4 ms) where it is built; both give
the same bytes (docs/vdaf.md has figures).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.vdaf import native
from svtagg.vdaf.field import FIELD128, Vec

_core: Any = None
try:
    from svtagg.vdaf import _sparse as _loaded  # type: ignore[attr-defined,unused-ignore]

    _core = _loaded
except ImportError:  # not built here: the numpy reference below does the same
    pass

DST = b"svtagg/sparse-onehot/v1"
KEY_SIZE = 16
NONCE_SIZE = 16
RAND_SIZE = 2 * KEY_SIZE
DIGEST_SIZE = 16
#: The largest domain: 2^24 leaves (the native core's bound too).
MAX_BITS = 24
PREP_SHARE_SIZE = DIGEST_SIZE + FIELD128.encoded_size
P = FIELD128.modulus
_P_LO, _P_HI = P & (2**64 - 1), P >> 64
_TWO_128 = (1 << 128) % P
#: Tweaks XORed into a seed's low word: the two children, the output, a second
#: payload's output (`SparseRange`'s weights), the proofs.
LEFT, RIGHT, CONVERT, WEIGHT, PROOF = 1, 2, 3, 4, 5

U64 = npt.NDArray[np.uint64]


class SparseError(ValueError):
    """A report or prep share that does not decode."""


def domain_bits(d: int) -> int:
    if not 2 <= d <= 1 << MAX_BITS:
        raise SparseError(f"a sparse one-hot task needs 2 ≤ d ≤ 2^{MAX_BITS}")
    return (d - 1).bit_length()


@lru_cache(maxsize=4096)
def _hash_key(nonce: bytes, usage: int = 0, dst: bytes = DST) -> bytes:
    """The report's fixed AES keys, SHAKE128(dst ‖ usage ‖ nonce): usage 0 for
    the tree, 1 + t for the leaf proofs of control bit t (one set per report,
    as the VIDPF's XOF derives its key from the nonce)."""
    return hashlib.shake_128(dst + bytes([usage]) + nonce).digest(16)


def _digest_key(
    verify_key: bytes, nonce: bytes, public: bytes, dst: bytes = DST, extra: bytes = b""
) -> bytes:
    """The servers' key for compressing the leaf proofs (usage 3): clients do
    not hold the verify key.  It binds the public share, so two servers
    handed different corrections for one report get different digests (with
    a correction each, a client could otherwise keep two leaves live, one of
    each orientation of the control bits)."""
    msg = dst + bytes([3, len(verify_key)]) + verify_key + nonce + extra + public
    return hashlib.shake_128(msg).digest(16)


class _Hash:
    """H(x) = AES_k(σ(x)) ⊕ σ(x), σ(lo ‖ hi) = hi ‖ hi ⊕ lo, on (m, 2) uint64 blocks."""

    def __init__(self, key: bytes) -> None:
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()

    def __call__(self, x: U64, tweak: int) -> U64:
        sigma = np.empty_like(x)
        sigma[:, 0] = x[:, 1]
        sigma[:, 1] = x[:, 1] ^ x[:, 0] ^ np.uint64(tweak)
        out = np.frombuffer(self._enc.update(sigma.tobytes()), dtype="<u8").reshape(-1, 2)
        return out ^ sigma  # type: ignore[no-any-return]


def _blocks(data: bytes) -> U64:
    return np.frombuffer(data, dtype="<u8").reshape(-1, 2).copy()


def _to_field(words: U64, like: Vec | None = None) -> Vec:
    """128-bit values reduced mod p, as a Field128 vector (in the
    representation of `like` when given)."""
    words = words.copy()
    over = (words[:, 1] > _P_HI) | ((words[:, 1] == _P_HI) & (words[:, 0] >= _P_LO))
    for i in np.flatnonzero(over):  # probability 7·2^-62 each
        v = int(words[i, 0]) + (int(words[i, 1]) << 64) - P
        words[i] = (v & (2**64 - 1), v >> 64)
    out = FIELD128.decode_vec(words.astype("<u8").tobytes())
    return out if like is None else FIELD128.as_like(like, out)


def leaf_outputs(
    h: _Hash,
    seeds: U64,
    ctrl: npt.NDArray[np.bool_],
    output: int,
    agg_id: int,
    like: Vec | None = None,
    tweak: int = CONVERT,
) -> Vec:
    """One server's Field128 shares of the nodes' outputs: each converted seed
    (under `tweak`: WEIGHT for a second payload), plus the output correction
    where the node's bit is 1, negated on server 1 (so the two shares of a
    node both hold alike add to 0)."""
    y = _to_field(h(seeds, tweak), like=like)
    where = np.flatnonzero(ctrl)
    if where.size:
        y[where] = FIELD128.add(y[where], output)
    return FIELD128.neg(y) if agg_id == 1 else y


def pack_ctrl(pairs: Sequence[tuple[bool, bool]]) -> bytes:
    """The levels' control corrections, two bits a level, least significant
    bit first (the draft's pack_bits)."""
    packed = bytearray((2 * len(pairs) + 7) // 8)
    for i, pair in enumerate(pairs):
        for j, bit in enumerate(pair):
            packed[(2 * i + j) // 8] |= int(bit) << ((2 * i + j) % 8)
    return bytes(packed)


def ctrl_bits(data: bytes, n: int, size: int) -> tuple[npt.NDArray[np.uint8], int]:
    """`n` levels' control corrections from the head of a public share of
    `size` bytes, one byte per bit, two a level (SparseError for another
    length or set padding bits), and where the rest starts."""
    if len(data) != size:
        raise SparseError(f"a public share is {size} bytes")
    head = (2 * n + 7) // 8
    if (2 * n) % 8 and data[head - 1] >> ((2 * n) % 8):
        raise SparseError("padding bits of the control corrections are set")
    return np.unpackbits(np.frombuffer(data, np.uint8, head), bitorder="little")[: 2 * n], head


def unpack_ctrl(data: bytes, n: int, size: int) -> tuple[list[tuple[bool, bool]], int]:
    """`ctrl_bits` as (bool, bool) pairs, one a level."""
    bits, head = ctrl_bits(data, n, size)
    pairs = bits.astype(bool).reshape(n, 2).tolist()
    return [(a, b) for a, b in pairs], head


def gen_level(
    h: _Hash, seed: U64, ctrl: npt.NDArray[np.bool_], bit: int
) -> tuple[U64, npt.NDArray[np.bool_], bytes, tuple[bool, bool]]:
    """One level of key generation on α's path: the two servers' seeds and
    bits of the kept child, and the level's seed and control corrections."""
    kids = [h(seed, LEFT), h(seed, RIGHT)]
    t = [(k[:, 0] & np.uint64(1)).astype(bool) for k in kids]
    for k in kids:
        k[:, 0] &= ~np.uint64(1)
    lose = kids[1 - bit]
    seed_cw = lose[0] ^ lose[1]
    ctrl_cw = (bool(t[0][0] ^ t[0][1] ^ (bit == 0)), bool(t[1][0] ^ t[1][1] ^ (bit == 1)))
    kept, kept_t = kids[bit].copy(), t[bit].copy()
    kept[ctrl] ^= seed_cw
    kept_t[ctrl] ^= ctrl_cw[bit]
    return kept, kept_t, seed_cw.astype("<u8").tobytes(), ctrl_cw


def children(
    h: _Hash, seed: U64, ctrl: npt.NDArray[np.bool_], seed_cw: bytes, ctrl_cw: tuple[bool, bool]
) -> tuple[U64, npt.NDArray[np.bool_]]:
    """One server's children of the nodes (`seed`, `ctrl`), in order (left,
    right of each), the level's corrections applied where the parent bit is 1."""
    kids = np.empty((2 * len(seed), 2), dtype=np.uint64)
    kids[0::2] = h(seed, LEFT)
    kids[1::2] = h(seed, RIGHT)
    t = (kids[:, 0] & np.uint64(1)).astype(bool)
    kids[:, 0] &= ~np.uint64(1)
    parent = np.repeat(ctrl, 2)
    kids[parent] ^= _blocks(seed_cw)[0]
    t ^= parent & np.tile(np.array(ctrl_cw), len(seed))
    return kids, t


def digest(
    verify_key: bytes,
    nonce: bytes,
    public: bytes,
    proofs: U64,
    ctrl: npt.NDArray[np.bool_],
    proof_cw: bytes,
    dst: bytes = DST,
    extra: bytes = b"",
) -> bytes:
    """⊕_x AES_{K_v}(π̃_x ⊕ x) over proofs π (one per node, in order), with
    the proof correction XORed in where the node's bit is 1."""
    return digest_with(_digest_key(verify_key, nonce, public, dst, extra), proofs, ctrl, proof_cw)


def digest_with(key: bytes, proofs: U64, ctrl: npt.NDArray[np.bool_], proof_cw: bytes) -> bytes:
    """`digest` under a given 16-byte key."""
    proofs = proofs.copy()
    proofs[ctrl] ^= _blocks(proof_cw)[0]
    proofs[:, 0] ^= np.arange(len(proofs), dtype=np.uint64)
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    masked = np.frombuffer(enc.update(proofs.astype("<u8").tobytes()), dtype="<u8")
    return np.bitwise_xor.reduce(masked.reshape(-1, 2), axis=0).astype("<u8").tobytes()


def _limbs(data: bytes) -> int:
    """Three little-endian 64-bit limbs as an integer reduced mod p."""
    return int.from_bytes(data, "little") % P


def _keys(nonce: bytes) -> tuple[bytes, bytes, bytes]:
    """The report's tree key and its two proof keys."""
    return _hash_key(nonce), _hash_key(nonce, 1), _hash_key(nonce, 2)


class Accumulator:
    """The sum of one server's output shares of sparse reports on [0, d).

    Natively a wide integer per coordinate (three uint64 limbs, no reduction
    while adding: each key adds a value below 2p, so 2^63 keys fit), and
    reduced mod p once by `value`; in the reference a Field128 vector.  It
    may hold more elements (`size`) than it sums (`d`): a sparse multi-hot
    report's padding items sit past d and are never part of the value."""

    def __init__(self, d: int, wide: bool, size: int = 0) -> None:
        self.d, self.size = d, max(size, d)
        self.wide = np.zeros((self.size, 3), dtype=np.uint64) if wide else None
        self.vec = None if wide else FIELD128.zeros(self.size)

    def copy(self) -> Accumulator:
        out = Accumulator.__new__(Accumulator)
        out.d, out.size = self.d, self.size
        out.wide = None if self.wide is None else self.wide.copy()
        out.vec = None if self.vec is None else self.vec.copy()
        return out

    def add(self, other: Accumulator) -> None:
        """Add `other` (of the same kind) into this one."""
        if self.wide is not None and other.wide is not None:
            a, b = self.wide, other.wide
            lo = a[:, 0] + b[:, 0]
            c1 = (lo < a[:, 0]).astype(np.uint64)
            hi = a[:, 1] + b[:, 1]
            c2 = (hi < a[:, 1]).astype(np.uint64)
            hi2 = hi + c1
            c2 |= (hi2 < hi).astype(np.uint64)
            a[:, 0], a[:, 1], a[:, 2] = lo, hi2, a[:, 2] + b[:, 2] + c2
        elif self.vec is not None and other.vec is not None:
            self.vec[...] = FIELD128.add(self.vec, other.vec)
        else:
            raise SparseError("accumulators of two kinds")

    def value(self) -> Vec:
        """The sum as a Field128 vector (canonical)."""
        if self.wide is None:
            assert self.vec is not None
            return self.vec if self.size == self.d else self.vec[: self.d].copy()
        # lo + hi·2^64 + top·2^128 ≡ (lo, hi) mod p + top·(2^128 mod p), in
        # the field's vector ops (top ≤ 2 per report added: far below 2^63)
        wide = self.wide[: self.d]
        low = _to_field(np.ascontiguousarray(wide[:, :2]))
        top = FIELD128.from_small(wide[:, 2].astype(np.int64))
        return FIELD128.add(low, FIELD128.mul(top, _TWO_128))


@dataclass(frozen=True)
class PublicShare:
    """The corrections: per level a seed and two control bits, the leaf-proof
    correction cs and the output correction CW."""

    seeds: bytes  # n × 16
    ctrl: tuple[tuple[bool, bool], ...]
    proof: bytes  # 16
    output: int  # a Field128 element


@dataclass(frozen=True)
class Expanded:
    """One server's expansion of one report: its output shares on [0, d),
    its leaf-proof digest and its share of the total."""

    out: Vec
    digest: bytes
    total: int

    def prep_share(self) -> bytes:
        return self.digest + self.total.to_bytes(16, "little")


class SparseOnehot:
    """Sparse one-hot reports over a domain of d items."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.bits = domain_bits(d)

    # ------------------------------------------------------------ sizes
    def public_share_bytes(self) -> int:
        n = self.bits
        return (2 * n + 7) // 8 + 16 * n + 16 + 16

    def input_share_bytes(self) -> int:
        return KEY_SIZE

    # ------------------------------------------------------------ encodings
    def encode_public_share(self, ps: PublicShare) -> bytes:
        return pack_ctrl(ps.ctrl) + ps.seeds + ps.proof + ps.output.to_bytes(16, "little")

    def decode_public_share(self, data: bytes) -> PublicShare:
        seeds, bits, proof, output = self._split_public(data)
        pairs = [(bool(bits[i]), bool(bits[i + 1])) for i in range(0, len(bits), 2)]
        return PublicShare(seeds, tuple(pairs), proof, int.from_bytes(output, "little"))

    def _split_public(self, data: bytes) -> tuple[bytes, bytes, bytes, bytes]:
        """The public share checked and cut, as the native core takes it: the
        seed corrections, the control corrections one byte per bit, the proof
        and the output corrections, as bytes."""
        n = self.bits
        bits, head = ctrl_bits(data, n, self.public_share_bytes())
        at = head + 16 * n
        output = data[at + 16 :]
        if int.from_bytes(output, "little") >= P:
            raise SparseError("the output correction is not below the Field128 modulus")
        return data[head:at], bits.tobytes(), data[at : at + 16], output

    # ------------------------------------------------------------ the client
    def gen(
        self, alpha: int, nonce: bytes, rand: bytes, weight: int = 1, second: int | None = None
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """The encoded public share and the two keys for item `alpha`;
        `rand`: RAND_SIZE bytes from a CSPRNG.  A `weight` other than 1 makes a
        report the servers refuse (tests and the demo's forgeries).  `second`:
        a second payload on the same leaf, its output correction appended to
        the public share (16 bytes; `evaluate(payload2=)` takes it)."""
        if not 0 <= alpha < self.d:
            raise SparseError(f"the item is in [0, {self.d}), got {alpha}")
        if len(nonce) != NONCE_SIZE or len(rand) != RAND_SIZE:
            raise SparseError(f"a nonce of {NONCE_SIZE} bytes and {RAND_SIZE} random bytes")
        keys = (rand[:KEY_SIZE], rand[KEY_SIZE:])
        if _core is not None and native.active() == "native":
            extra = () if second is None else ((second % P).to_bytes(16, "little"),)
            public = _core.gen(
                *_keys(nonce),
                self.bits,
                alpha,
                rand,
                (weight % P).to_bytes(16, "little"),
                *extra,
            )
            return bytes(public), keys
        h = _Hash(_hash_key(nonce))
        seed = _blocks(rand)  # row b: server b's seed on α's path
        ctrl = np.array([False, True])
        seed_cws, ctrl_cws = [], []
        for i in range(self.bits):
            bit = (alpha >> (self.bits - 1 - i)) & 1
            seed, ctrl, seed_cw, ctrl_cw = gen_level(h, seed, ctrl, bit)
            seed_cws.append(seed_cw)
            ctrl_cws.append(ctrl_cw)
        conv = FIELD128.to_ints(_to_field(h(seed, CONVERT)))
        proofs = _leaf_proofs(nonce, seed, ctrl)
        proof_cw = (proofs[0] ^ proofs[1]).astype("<u8").tobytes()
        sign = 1 if ctrl[0] else -1  # t₀ − t₁
        output = sign * (weight - conv[0] + conv[1]) % P
        ps = PublicShare(b"".join(seed_cws), tuple(ctrl_cws), proof_cw, output)
        tail = b""
        if second is not None:
            conv2 = FIELD128.to_ints(_to_field(h(seed, WEIGHT)))
            tail = (sign * (second - conv2[0] + conv2[1]) % P).to_bytes(16, "little")
        return self.encode_public_share(ps) + tail, keys

    def gen_measurement(
        self, item: Any, nonce: bytes, rand: bytes
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """`gen` of a measurement as `Validity.measurements` gives it: the item."""
        return self.gen(int(item), nonce, rand)

    # ------------------------------------------------------------ the servers
    def accumulator(self) -> Accumulator:
        """An empty sum for `expand_into` (wide and native where the core is)."""
        return Accumulator(self.d, _core is not None and native.active() == "native")

    def expand(
        self, agg_id: int, verify_key: bytes, nonce: bytes, public: bytes, key: bytes
    ) -> Expanded:
        """Evaluate `key` on every leaf: this server's output shares on [0, d),
        its digest of the leaf proofs and its share of Σ_{x<d} y_x."""
        acc = self.accumulator()
        share = self.expand_into(acc, agg_id, verify_key, nonce, public, key)
        digest, total = self.decode_prep_share(share)
        return Expanded(acc.value(), digest, total)

    def expand_into(
        self,
        acc: Accumulator,
        agg_id: int,
        verify_key: bytes,
        nonce: bytes,
        public: bytes,
        key: bytes,
        negate: bool = False,
    ) -> bytes:
        """Add this server's output shares on [0, d) to `acc` (subtract them
        when `negate`) and return its prep share: the 16-byte leaf-proof
        digest, then its share of Σ_{x<d} y_x."""
        dg, total, _, _ = self.evaluate(acc, agg_id, verify_key, nonce, public, key, negate)
        return dg + total.to_bytes(16, "little")

    def evaluate(
        self,
        acc: Accumulator,
        agg_id: int,
        verify_key: bytes,
        nonce: bytes,
        public: bytes,
        key: bytes,
        negate: bool = False,
        fold: bool = True,
        weighted: bool = False,
        payload2: bytes = b"",
    ) -> tuple[bytes, int, int, int]:
        """`expand_into`'s work, its parts apart: the leaf-proof digest, this
        server's share of Σ_x y_x, (when `weighted`, else 0) of Σ_x x·y_x —
        the live leaf's index, for a valid key — and of the second payload's
        total (0 without one).  `fold=False` checks the key without adding its
        outputs to `acc` (which still sets d).  `payload2`: a second payload's
        16-byte output correction (`gen(second=)`); it is evaluated in the
        same pass, folded instead of the first, and bound into the digest's
        key with the public share."""
        if agg_id not in (0, 1):
            raise SparseError("the server id is 0 or 1")
        if len(key) != KEY_SIZE or len(nonce) != NONCE_SIZE:
            raise SparseError(f"a key and a nonce of {KEY_SIZE} bytes")
        if acc.size != self.d:
            raise SparseError(f"the accumulator holds {self.d} elements")
        if acc.wide is not None:
            if _core is None:
                raise SparseError("a wide accumulator needs the native core")
            seeds, ctrl_bits, proof, output = self._split_public(public)
            out = _core.expand(
                *_keys(nonce),
                _digest_key(verify_key, nonce, public + payload2),
                agg_id,
                seeds,
                ctrl_bits,
                proof,
                output,
                key,
                negate,
                acc.wide,
                fold,
                weighted,
                payload2,
            )
            total, weight = _limbs(out[16:40]), _limbs(out[40:64]) if weighted else 0
            total2 = _limbs(out[64:88]) if payload2 else 0
            if agg_id == 1:
                total, weight, total2 = -total % P, -weight % P, -total2 % P
            return bytes(out[:16]), total, weight, total2
        ps = self.decode_public_share(public)
        h = _Hash(_hash_key(nonce))
        seed = _blocks(key)
        ctrl = np.array([bool(agg_id)])
        for i in range(self.bits):
            cw = ps.seeds[16 * i : 16 * (i + 1)]
            kids, t = children(h, seed, ctrl, cw, ps.ctrl[i])
            span = 1 << (self.bits - 1 - i)  # only the nodes whose subtree meets [0, d)
            keep = -(-self.d // span)
            seed, ctrl = kids[:keep], t[:keep]
        proofs = _leaf_proofs(nonce, seed, ctrl)
        dg = digest(verify_key, nonce, public + payload2, proofs, ctrl, ps.proof)
        assert acc.vec is not None  # the reference's accumulator
        y = leaf_outputs(h, seed, ctrl, ps.output, agg_id, like=acc.vec)
        folded, total2 = y, 0
        if payload2:
            cw2 = int.from_bytes(payload2, "little")
            folded = leaf_outputs(h, seed, ctrl, cw2, agg_id, like=acc.vec, tweak=WEIGHT)
            total2 = FIELD128.to_int(FIELD128.sum(folded))
        if fold:
            acc.vec[...] = (
                FIELD128.sub(acc.vec, folded) if negate else FIELD128.add(acc.vec, folded)
            )
        total = FIELD128.to_int(FIELD128.sum(y))
        weight = 0
        if weighted:
            index = FIELD128.as_like(y, FIELD128.from_small(np.arange(self.d, dtype=np.int64)))
            weight = FIELD128.to_int(FIELD128.sum(FIELD128.mul(y, index)))
        return dg, total, weight, total2

    def expand_batch(
        self,
        agg_id: int,
        verify_key: bytes,
        reports: Sequence[tuple[bytes, bytes, bytes]],
        threads: int = 1,
    ) -> tuple[Accumulator, list[bytes | None]]:
        """`expand_into` over (nonce, public share, key) triples into one
        accumulator, on up to `threads` threads (each its own accumulator,
        added at the end; the native expansion runs without the GIL): the sum
        and each report's prep share (None where the report does not decode)."""
        return _expand_batch(self, agg_id, verify_key, reports, threads)

    @staticmethod
    def decode_prep_share(data: bytes) -> tuple[bytes, int]:
        if len(data) != PREP_SHARE_SIZE:
            raise SparseError(f"a prep share is {PREP_SHARE_SIZE} bytes")
        total = int.from_bytes(data[DIGEST_SIZE:], "little")
        if total >= P:
            raise SparseError("a prep share's total is not below the Field128 modulus")
        return data[:DIGEST_SIZE], total

    @classmethod
    def decide(cls, leader: bytes, helper: bytes) -> bool:
        """Valid iff the digests agree and the two totals add to one."""
        d0, s0 = cls.decode_prep_share(leader)
        d1, s1 = cls.decode_prep_share(helper)
        return d0 == d1 and (s0 + s1) % P == 1


def _leaf_proofs(nonce: bytes, seed: U64, ctrl: npt.NDArray[np.bool_], dst: bytes = DST) -> U64:
    """π = H_t(s ⊕ 5): the control bit t picks the hash's key, so no seed
    difference a client could put between the servers maps one bit's input
    onto the other's (an XOR tweak for t could be cancelled by one)."""
    out = np.empty_like(seed)
    for t in (False, True):
        rows = np.flatnonzero(ctrl == t)
        if rows.size:
            out[rows] = _Hash(_hash_key(nonce, 1 + int(t), dst))(seed[rows], PROOF)
    return out


MULTI_DST = b"svtagg/sparse-multihot/v1"


def _derive(seed: bytes, usage: bytes, k: int) -> bytes:
    """The k-th 16-byte value derived from `seed` (SHAKE128, domain-separated)."""
    return hashlib.shake_128(MULTI_DST + usage + k.to_bytes(4, "little") + seed).digest(16)


class SparseMultihot:
    """Sparse multi-hot reports: at most r distinct items of [0, d) as
    one-hot DPF keys (the `sparse-multihot:r` circuit).

    The client sorts its items and pads them to r with padding items d,
    d + 1, … (each past the task's domain, so never folded): x_1 < … < x_r in
    [0, D), D = d + r.  Keys 1..r are one-hot keys over [0, D) at the x_i.
    Each gap g_i = x_{i+1} − x_i − 1 is written in base B = ⌈√D⌉ as
    g_i = B·h_i + l_i, with a one-hot key over [0, H) at h_i (H = ⌈D/B⌉) and
    one over [0, B) at l_i: 2(r − 1) small keys.  Each server checks every key
    as a `SparseOnehot` key (one live leaf, worth 1) and computes its shares
    of each key's index, w = Σ_x x·y_x; valid iff also
    w(x_{i+1}) − w(x_i) − 1 − B·w(h_i) − w(l_i) = 0 for every i.  As every
    value is below D + B·H < p, that is x_{i+1} = x_i + 1 + g_i over the
    integers with g_i ≥ 0: the items are distinct, so the folded vector
    (keys 1..r on [0, d)) is 0/1 with at most r ones — what `multihot:r`
    proves with Prio3.  A gap costs two expansions of about √D leaves, not
    one of D.

    The servers compare one 32-byte hash: the leader hashes its digests,
    totals and check shares, the helper its digests, 1 − its totals and its
    negated check shares; the hashes are equal iff every check holds (but for
    a BLAKE2b collision), and for a valid report each is a function of the
    other server's view, so the exchange shows nothing more.  The indices'
    shares never leave a server.

    A report: one 16-byte seed per server (the keys are derived from it) and
    a public share of the keys' public shares, 5,228 bytes at d = 10⁴, r = 10."""

    def __init__(self, d: int, r: int) -> None:
        if not 1 <= r <= d:
            raise SparseError(f"a sparse multi-hot task needs 1 ≤ r ≤ d, got r = {r}")
        self.d, self.r = d, r
        size = d + r
        self.base = max(2, math.isqrt(size - 1) + 1)  # ⌈√D⌉, at least 2
        self.unit = SparseOnehot(size)
        self.high = SparseOnehot(max(2, -(-size // self.base)))
        self.low = SparseOnehot(self.base)
        self.bits = self.unit.bits
        #: One scheme per key: the r items, then per gap its high and low digit.
        self.keys = [self.unit] * r + [self.high, self.low] * (r - 1)
        self.count = len(self.keys)
        self._sizes = [k.public_share_bytes() for k in self.keys]

    def public_share_bytes(self) -> int:
        return sum(self._sizes)

    def input_share_bytes(self) -> int:
        return KEY_SIZE

    def verify_bytes(self) -> int:
        """Domain elements one report's check passes over, in bytes."""
        return sum(16 * (1 << k.bits) for k in self.keys)

    def _parts(self, nonce: bytes, public: bytes, seed: bytes) -> list[tuple[bytes, bytes, bytes]]:
        """Each key's (nonce, public share, key), every public share checked
        first (SparseError): a report that does not decode must be refused
        before any of its keys is folded, or the keys before the bad one would
        stay in the sums of a report nobody counts."""
        if len(public) != self.public_share_bytes():
            raise SparseError(f"a public share is {self.public_share_bytes()} bytes")
        if len(nonce) != NONCE_SIZE or len(seed) != KEY_SIZE:
            raise SparseError(f"a key and a nonce of {KEY_SIZE} bytes")
        out, at = [], 0
        for k, (scheme, size) in enumerate(zip(self.keys, self._sizes, strict=True)):
            part = public[at : at + size]
            self._check_part(k, scheme, part)
            out.append((_derive(nonce, b"n", k), part, _derive(seed, b"k", k)))
            at += size
        return out

    def _check_part(self, k: int, scheme: SparseOnehot, part: bytes) -> None:
        """Key k's public share decodes (SparseError if not)."""
        scheme._split_public(part)

    def points(self, items: Sequence[int]) -> list[int]:
        """The one-hot points of a report holding `items`: the sorted items
        padded to r, then each gap's high and low digit."""
        xs = sorted(int(x) for x in items)
        if len(xs) > self.r:
            raise SparseError(f"at most {self.r} items per report, got {len(xs)}")
        if any(not 0 <= x < self.d for x in xs) or len(set(xs)) != len(xs):
            raise SparseError(f"distinct items in [0, {self.d}), got {xs}")
        xs += range(self.d, self.d + self.r - len(xs))
        digits: list[int] = []
        for i in range(self.r - 1):
            digits += divmod(xs[i + 1] - xs[i] - 1, self.base)
        return xs + digits

    def gen(
        self, items: Sequence[int], nonce: bytes, rand: bytes
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """The encoded public share and the two seeds for a report holding
        `items` (at most r distinct); `rand`: RAND_SIZE CSPRNG bytes."""
        return self.gen_points(self.points(items), nonce, rand)

    def gen_measurement(
        self, row: Any, nonce: bytes, rand: bytes
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """`gen` of a measurement as `Validity.measurements` gives it: a 0/1 row."""
        return self.gen(np.flatnonzero(np.asarray(row)).tolist(), nonce, rand)

    def gen_points(
        self,
        points: Sequence[int],
        nonce: bytes,
        rand: bytes,
        weights: Sequence[int] | None = None,
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """A report of the given one-hot points (r items, then a high and a
        low digit per gap) and weights, unchecked: `gen`'s encoder, and tests'
        and the demo's forgeries (repeated items, gaps that do not add up, a
        weight of 2)."""
        return self._encode(points, None, nonce, rand, weights)

    def _encode(
        self,
        points: Sequence[int],
        payloads: Sequence[int] | None,
        nonce: bytes,
        rand: bytes,
        weights: Sequence[int] | None,
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """Each key at its point with its weight (1 by default) and, given
        `payloads`, the items' keys with a second payload each."""
        if len(rand) != RAND_SIZE or len(points) != self.count:
            raise SparseError(f"{self.count} points and {RAND_SIZE} random bytes")
        if payloads is not None and len(payloads) != self.r:
            raise SparseError(f"{self.r} payloads, one an item")
        seeds = (rand[:KEY_SIZE], rand[KEY_SIZE:])
        parts = []
        for k, (scheme, x) in enumerate(zip(self.keys, points, strict=True)):
            sub = _derive(seeds[0], b"k", k) + _derive(seeds[1], b"k", k)
            w = 1 if weights is None else weights[k]
            second = int(payloads[k]) if payloads is not None and k < self.r else None
            public, _ = scheme.gen(int(x), _derive(nonce, b"n", k), sub, weight=w, second=second)
            parts.append(public)
        return b"".join(parts), seeds

    def accumulator(self) -> Accumulator:
        """An empty sum over [0, d), with room for the padding items."""
        wide = _core is not None and native.active() == "native"
        return Accumulator(self.d, wide, size=self.d + self.r)

    def expand_into(
        self,
        acc: Accumulator,
        agg_id: int,
        verify_key: bytes,
        nonce: bytes,
        public: bytes,
        key: bytes,
        negate: bool = False,
    ) -> bytes:
        """Add this server's shares of the report's items to `acc` (subtract
        them when `negate`) and return its 32-byte prep share."""
        if acc.d != self.d or acc.size != self.d + self.r:
            raise SparseError(f"the accumulator holds {self.d} + {self.r} elements")
        digests, totals, index, payloads = self._evaluate(
            acc, agg_id, verify_key, self._parts(nonce, public, key), negate
        )
        checks = self._checks(index, payloads, 1 if agg_id == 0 else 0)
        if agg_id == 1:
            checks = [-c % P for c in checks]
        h = hashlib.blake2b(MULTI_DST + b"/check", digest_size=PREP_SHARE_SIZE)
        h.update(b"".join(digests))
        for v in totals + checks:
            h.update(v.to_bytes(16, "little"))
        return h.digest()

    def _evaluate(
        self,
        acc: Accumulator,
        agg_id: int,
        verify_key: bytes,
        parts: list[tuple[bytes, bytes, bytes]],
        negate: bool,
    ) -> tuple[list[bytes], list[int], list[int], list[int]]:
        """Every key expanded once: the digests, the totals (the helper's as
        1 − its share, so that the two servers' lists are equal for a valid
        report), each key's index share, and each item's second payload's
        total (0 where the items carry none: a multi-hot item's key is folded
        as it is)."""
        digests, totals, index, payloads = [], [], [], []
        scratch = {id(s): s.accumulator() for s in set(self.keys[self.r :])}
        for k, (scheme, (sub_nonce, sub_public, sub_key)) in enumerate(
            zip(self.keys, parts, strict=True)
        ):
            item = k < self.r  # an item's key folds; a digit's only checks
            public, payload2 = self._item_share(sub_public) if item else (sub_public, b"")
            dg, total, w, total2 = scheme.evaluate(
                acc if item else scratch[id(scheme)], agg_id, verify_key, sub_nonce,
                public, sub_key, negate, fold=item, weighted=True, payload2=payload2,
            )  # fmt: skip
            digests.append(dg)
            totals.append(total if agg_id == 0 else (1 - total) % P)
            index.append(w)
            if item:
                payloads.append(total2)
        return digests, totals, index, payloads

    def _item_share(self, part: bytes) -> tuple[bytes, bytes]:
        """An item key's public share and its second payload's correction
        (none: a multi-hot item's key carries only its unit)."""
        return part, b""

    def _checks(self, index: list[int], payloads: list[int], one: int) -> list[int]:
        """This server's shares of the linear checks that must be 0: each gap
        adds up (`one`: 1 on the leader, 0 on the helper, for the constants)."""
        r, b = self.r, self.base
        return [
            (index[i + 1] - index[i] - one - b * index[r + 2 * i] - index[r + 2 * i + 1]) % P
            for i in range(r - 1)
        ]

    def expand(
        self, agg_id: int, verify_key: bytes, nonce: bytes, public: bytes, key: bytes
    ) -> tuple[Vec, bytes]:
        """This server's output shares on [0, d) and its prep share."""
        acc = self.accumulator()
        share = self.expand_into(acc, agg_id, verify_key, nonce, public, key)
        return acc.value(), share

    def expand_batch(
        self,
        agg_id: int,
        verify_key: bytes,
        reports: Sequence[tuple[bytes, bytes, bytes]],
        threads: int = 1,
    ) -> tuple[Accumulator, list[bytes | None]]:
        """`SparseOnehot.expand_batch` for these reports."""
        return _expand_batch(self, agg_id, verify_key, reports, threads)

    @staticmethod
    def decide(leader: bytes, helper: bytes) -> bool:
        """Valid iff the two servers' hashes are equal."""
        if len(leader) != PREP_SHARE_SIZE or len(helper) != PREP_SHARE_SIZE:
            raise SparseError(f"a prep share is {PREP_SHARE_SIZE} bytes")
        return hmac.compare_digest(leader, helper)


#: A weight's digits: base 16, one-hot keys over [0, 16).
DIGIT_BASE = 16


class SparseRange(SparseMultihot):
    """Sparse reports of values: at most r items of [0, d), each with a value
    in [0, 1] on the task's grid (an integer w in [0, 2^F]) — the
    `sparse-range:r` circuit, what `range` proves of a row with at most r
    nonzero coordinates.

    The items are placed and proved distinct as `SparseMultihot`'s (sorted,
    padded past d, the gaps as digit keys), and each item's key carries a
    second payload on the same leaf: the unit (checked as before) and the
    weight w (its own output tweak and correction, `SparseOnehot.gen(second=)`),
    so both are live at the item's leaf.  The weight, not the unit, is folded.
    w ∈ [0, 2^F] by two linear checks on small keys: w = Σ_j 16^j·a_j and
    2^F − w = Σ_j 16^j·b_j with each digit a one-hot key over [0, 16), m =
    ⌈(F + 1)/4⌉ digits each (both sums non-negative integers below p).
    Padding items carry weight 0.  Each server expands an item's tree once:
    the native core hashes each leaf once more for the weight, and the
    digest's key binds the weight's correction with the key's public share
    (two servers handed different corrections disagree)."""

    def __init__(self, d: int, r: int, frac_bits: int) -> None:
        if not 0 <= frac_bits <= 32:
            raise SparseError(f"a sparse range task's precision F is in [0, 32], got {frac_bits}")
        super().__init__(d, r)
        self.frac_bits = frac_bits
        self.top = 1 << frac_bits
        self.digits = -(-(frac_bits + 1) // 4)
        self.digit = SparseOnehot(DIGIT_BASE)
        self.keys = self.keys + [self.digit] * (2 * self.digits * r)
        self.count = len(self.keys)
        # an item's public share also carries its weight's output correction
        self._sizes = [
            k.public_share_bytes() + (16 if i < r else 0) for i, k in enumerate(self.keys)
        ]

    def _check_part(self, k: int, scheme: SparseOnehot, part: bytes) -> None:
        """An item's share also carries its weight's output correction."""
        if k >= self.r:
            scheme._split_public(part)
            return
        scheme._split_public(part[:-16])
        if int.from_bytes(part[-16:], "little") >= P:
            raise SparseError("a weight's output correction is not below the Field128 modulus")

    def _digits(self, v: int) -> list[int]:
        return [(v >> (4 * j)) & (DIGIT_BASE - 1) for j in range(self.digits)]

    def entries(self, items: Sequence[int], weights: Sequence[int]) -> tuple[list[int], list[int]]:
        """The one-hot points of a report holding `weights[i]` at `items[i]`
        (distinct items of [0, d), weights in [0, 2^F], at most r), and the
        items' weights padded with zeros: the items' points, the gaps' digits,
        then each item's w digits and 2^F − w digits."""
        if len(items) != len(weights):
            raise SparseError("one weight per item")
        pairs = sorted(zip((int(x) for x in items), (int(w) for w in weights), strict=True))
        if any(not 0 <= w <= self.top for _, w in pairs):
            raise SparseError(f"weights on the grid [0, {self.top}]")
        points = self.points([x for x, _ in pairs])
        ws = [w for _, w in pairs] + [0] * (self.r - len(pairs))
        for w in ws:
            points += self._digits(w) + self._digits(self.top - w)
        return points, ws

    def gen_weighted(
        self, items: Sequence[int], weights: Sequence[int], nonce: bytes, rand: bytes
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """The encoded public share and the two seeds for a report holding
        `weights[i]` at `items[i]`; `rand`: RAND_SIZE CSPRNG bytes."""
        points, ws = self.entries(items, weights)
        return self.gen_payloads(points, ws, nonce, rand)

    def gen_measurement(
        self, row: Any, nonce: bytes, rand: bytes
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """`gen_weighted` of a measurement as `Validity.measurements` gives it:
        a row of values on the grid."""
        values = np.asarray(row)
        at = np.flatnonzero(values)
        return self.gen_weighted(at.tolist(), values[at].astype(np.int64).tolist(), nonce, rand)

    def gen(
        self, items: Sequence[int], nonce: bytes, rand: bytes
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """A report of weight 2^F (a value of 1) at each item."""
        return self.gen_weighted(items, [self.top] * len(items), nonce, rand)

    def gen_payloads(
        self,
        points: Sequence[int],
        payloads: Sequence[int],
        nonce: bytes,
        rand: bytes,
        weights: Sequence[int] | None = None,
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """A report of the given points, the items' second payloads and the
        keys' weights (1 each by default), unchecked: `gen_weighted`'s encoder
        and tests' forgeries (a weight past 2^F, digits that do not add up)."""
        return self._encode(points, payloads, nonce, rand, weights)

    def _item_share(self, part: bytes) -> tuple[bytes, bytes]:
        """An item's share: its key's, then its weight's output correction."""
        return part[:-16], part[-16:]

    def _checks(self, index: list[int], payloads: list[int], one: int) -> list[int]:
        """The gaps' checks, then per item w − Σ 16^j·a_j and
        (2^F − w) − Σ 16^j·b_j from the digits' index shares."""
        checks = super()._checks(index, payloads, one)
        at, m = self.r + 2 * (self.r - 1), self.digits
        for i, w in enumerate(payloads):
            a = index[at + 2 * m * i : at + 2 * m * i + m]
            b = index[at + 2 * m * i + m : at + 2 * m * (i + 1)]
            checks.append((w - sum(v << (4 * j) for j, v in enumerate(a))) % P)
            checks.append((one * self.top - w - sum(v << (4 * j) for j, v in enumerate(b))) % P)
        return checks


def _expand_batch(
    scheme: SparseOnehot | SparseMultihot,
    agg_id: int,
    verify_key: bytes,
    reports: Sequence[tuple[bytes, bytes, bytes]],
    threads: int,
) -> tuple[Accumulator, list[bytes | None]]:
    """`SparseOnehot.expand_batch` for either scheme."""
    shares: list[bytes | None] = [None] * len(reports)

    def run(lo: int, hi: int) -> Accumulator:
        acc = scheme.accumulator()
        for i in range(lo, hi):
            nonce, public, key = reports[i]
            try:
                shares[i] = scheme.expand_into(acc, agg_id, verify_key, nonce, public, key)
            except SparseError:
                pass
        return acc

    n = len(reports)
    # below 2^12 leaves a report's Python work (under the GIL) is most of
    # its cost, and threads only contend for the GIL
    parts = max(1, min(threads, n // 8)) if scheme.bits >= 12 else 1
    # threads only where the native core expands (the reference code holds the GIL)
    if parts == 1 or _core is None or native.active() != "native":
        return run(0, n), shares
    bounds = [n * k // parts for k in range(parts + 1)]
    with ThreadPoolExecutor(parts) as pool:
        accs = list(pool.map(lambda k: run(bounds[k], bounds[k + 1]), range(parts)))
    total = accs[0]
    for other in accs[1:]:
        total.add(other)
    return total, shares
