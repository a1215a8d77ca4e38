"""Oblivious transfer: Chou–Orlandi base OTs in the prime-order subgroup of
Ed25519 (libsodium, the default) or of the RFC 3526 3072-bit MODP group (the
reference), with no branch on secret bits, and IKNP OT extension producing
correlated OTs (Δ-OT) with a bit-matrix transpose (numpy, or the native core).

Roles in this package: the evaluator is the IKNP *receiver* (its choice bits
are its circuit inputs) and therefore the base-OT *sender*; the garbler is the
IKNP sender, whose base-OT choice string s becomes the free-XOR offset Δ.
Semi-honest security only.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.mpc import native
from svtagg.mpc.aes import Blocks, TweakableHash, make_tweaks
from svtagg.mpc.channel import Channel

KAPPA = 128
#: RFC 3526 group 15 (3072-bit MODP, ~128-bit security, matching κ): p = 2q + 1
#: with q prime, p = 2^3072 − 2^3008 − 1 + 2^64·(⌊2^2942·π⌋ + 1690314); g = 2
#: generates the order-q subgroup (p ≡ 7 mod 8, so 2 is a quadratic residue).
#: tests/test_mpc_ot.py recomputes p from that formula and checks it is a safe prime.
P = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22"
    "514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6"
    "F44C42E9A637ED6B0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3D"
    "C2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB"
    "9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3BE39E772C180E8603"
    "9B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AAAC42DAD33170D04507A33A85521ABDF1CBA64ECFB850458DBEF0A8AEA71575D060C7D"
    "B3970F85A6E1E4C7ABF5AE8CDB0933D71E8C94E04A25619DCEE3D2261AD2EE6BF12FFA06D98A0864"
    "D87602733EC86A64521F2B18177B200CBBE117577A615D6C770988C0BAD946E208E24FA074E5AB31"
    "43DB5BFCE0FD108E4B82D120A93AD2CAFFFFFFFFFFFFFFFF",
    16,
)
Q = (P - 1) // 2
G = 2
ELEMENT_BYTES = 384
#: The longest base-OT message: KAPPA group elements (Ed25519 points are smaller).
MAX_SETUP_MESSAGE = KAPPA * ELEMENT_BYTES
#: Short exponents (2× the 128-bit security level, as RFC 3526 advises) keep the
#: variable-base exponentiations of the base-OT sender cheap.
EXPONENT_BITS = 256


class InvalidGroupElement(ValueError):
    """A received value is not an element of the order-q subgroup."""


def _jacobi(a: int, n: int) -> int:
    """Jacobi symbol (a/n) for odd n > 0, by the binary reciprocity algorithm."""
    a %= n
    t = 1
    while a:
        z = (a & -a).bit_length() - 1
        if z:
            a >>= z
            if z & 1 and n & 7 in (3, 5):
                t = -t
        a, n = n, a
        if a & 3 == 3 and n & 3 == 3:
            t = -t
        a %= n
    return t if n == 1 else 0


def check_group_element(y: int) -> int:
    """Reject y unless 1 < y < p−1 and y^q ≡ 1 (mod p).

    For a safe prime, y^q ≡ 1 exactly when y is a quadratic residue, i.e. when the
    Legendre symbol (y/p) is 1; the Jacobi algorithm computes it ~60× faster than
    the exponentiation.  Excluding 1 and p−1 also excludes the small subgroup.
    """
    if not isinstance(y, int) or not 1 < y < P - 1:
        raise InvalidGroupElement("group element out of range")
    if _legendre(y) != 1:
        raise InvalidGroupElement("group element not in the prime-order subgroup")
    return y


try:  # GMP through gmpy2: ~10x faster modular arithmetic at 3072 bits
    import gmpy2 as _gmp

    def _num(x: int) -> Any:
        return _gmp.mpz(x)

    def _powmod_secret(base: Any, e: int) -> Any:
        """base^e mod p for a secret e: GMP's side-channel-hardened powm."""
        return _gmp.powmod_sec(base, e, P)

    def _legendre(y: int) -> int:
        return int(_gmp.jacobi(y, P))

except ImportError:  # pure Python: the same values, slower

    def _num(x: int) -> Any:
        return x

    def _powmod_secret(base: Any, e: int) -> Any:
        return pow(base, e, P)

    def _legendre(y: int) -> int:
        return _jacobi(y, P)


class _FixedBase:
    """base^e for many 256-bit exponents e with a 4-bit fixed-window table
    (64 multiplications per power instead of ~300 for pow)."""

    def __init__(self, base: int) -> None:
        self.table: list[list[Any]] = []
        b = _num(base)
        p = _num(P)
        for _ in range(EXPONENT_BITS // 4):
            row = [_num(1), b]
            for _ in range(14):
                row.append(row[-1] * b % p)
            self.table.append(row)
            b = row[-1] * b % p
        self._p = p
        # row[d] = base^(d·16^w)

    def pow(self, e: int) -> Any:
        # Every window multiplies (row[0] = 1): no branch on the secret digits.
        acc = _num(1)
        p = self._p
        for row in self.table:
            acc = acc * row[e & 15] % p
            e >>= 4
        return acc


_G_TABLE: _FixedBase | None = None


def _g_pow(e: int) -> Any:
    global _G_TABLE
    if _G_TABLE is None:
        _G_TABLE = _FixedBase(G)
    return _G_TABLE.pow(e)


def _exponent() -> int:
    return secrets.randbits(EXPONENT_BITS) | 1


def _kdf(session_id: bytes, index: int, a: int, b: int, shared: int) -> bytes:
    h = hashlib.sha256()
    h.update(b"svtagg-base-ot" + len(session_id).to_bytes(2, "big") + session_id)
    h.update(index.to_bytes(4, "big"))
    for v in (a, b, shared):
        h.update(int(v).to_bytes(ELEMENT_BYTES, "big"))
    return h.digest()[:16]


def _elements(data: bytes, count: int) -> list[int]:
    if len(data) != count * ELEMENT_BYTES:
        raise InvalidGroupElement(f"expected {count} group elements, got {len(data)} bytes")
    return [
        check_group_element(int.from_bytes(data[i : i + ELEMENT_BYTES], "big"))
        for i in range(0, len(data), ELEMENT_BYTES)
    ]


async def _modp_send(channel: Channel, count: int, session_id: bytes) -> list[tuple[bytes, bytes]]:
    """Chou–Orlandi sender: returns `count` random key pairs (k0, k1); the
    receiver learns exactly k_c for its choice c of each pair. Two messages."""
    a = _exponent()
    big_a = _g_pow(a)
    await channel.send(int(big_a).to_bytes(ELEMENT_BYTES, "big"))
    bs = _elements(await channel.recv(), count)
    a_pow_a_inv = pow(int(_powmod_secret(_num(big_a), a)), -1, P)
    keys = []
    for i, b in enumerate(bs):
        shared0 = _powmod_secret(_num(b), a)
        # (B/A)^a = B^a · (A^a)^-1: one exponentiation per OT instead of two.
        shared1 = shared0 * a_pow_a_inv % P
        keys.append(
            (_kdf(session_id, i, big_a, b, shared0), _kdf(session_id, i, big_a, b, shared1))
        )
    return keys


async def _modp_receive(channel: Channel, choices: list[int], session_id: bytes) -> list[bytes]:
    """Chou–Orlandi receiver: returns k_{c_i} for each choice bit c_i."""
    big_a = _elements(await channel.recv(), 1)[0]
    a_table = _FixedBase(big_a)
    out_b: list[int] = []
    keys: list[bytes] = []
    for i, c in enumerate(choices):
        b = _exponent()
        # B = g^b · A^c, selected arithmetically (A^c = 1 + c·(A − 1)), so the
        # code takes the same path for both values of the secret bit c.
        big_b = _g_pow(b) * (1 + (c & 1) * (big_a - 1)) % P
        out_b.append(big_b)
        keys.append(_kdf(session_id, i, big_a, big_b, a_table.pow(b)))
    await channel.send(b"".join(int(v).to_bytes(ELEMENT_BYTES, "big") for v in out_b))
    return keys


# ---------------------------------------------------------------- Ed25519 base OT
#
# The same Chou–Orlandi protocol in the prime-order subgroup of Ed25519
# (order ℓ = 2^252 + …, about 128-bit security), through libsodium (PyNaCl):
# every received point must pass `crypto_core_ed25519_is_valid_point` —
# canonical, on the curve, in the prime-order subgroup, not of small order —
# so the cofactor gives the peer nothing.  Scalars are uniform mod ℓ (64
# CSPRNG bytes reduced).  About 30x cheaper than the 3072-bit group.

POINT_BYTES = 32


def _nacl() -> Any:
    import nacl.bindings as sodium

    return sodium


def _scalar() -> bytes:
    return bytes(_nacl().crypto_core_ed25519_scalar_reduce(secrets.token_bytes(64)))


def _points(data: bytes, count: int) -> list[bytes]:
    if len(data) != count * POINT_BYTES:
        raise InvalidGroupElement(f"expected {count} curve points, got {len(data)} bytes")
    pts = [bytes(data[i : i + POINT_BYTES]) for i in range(0, len(data), POINT_BYTES)]
    for pt in pts:
        if not _nacl().crypto_core_ed25519_is_valid_point(pt):
            raise InvalidGroupElement("point not in the prime-order subgroup of Ed25519")
    return pts


def _kdf_points(session_id: bytes, index: int, a: bytes, b: bytes, shared: bytes) -> bytes:
    h = hashlib.sha256()
    h.update(b"svtagg-base-ot-ed25519" + len(session_id).to_bytes(2, "big") + session_id)
    h.update(index.to_bytes(4, "big") + a + b + shared)
    return h.digest()[:16]


def _select(bit: int, p0: bytes, p1: bytes) -> bytes:
    """p1 if bit else p0, by masking rather than branching on the secret bit.
    (No branch, but not constant-time: CPython's integer operations take time
    that depends on the values, e.g. a zero mask.)"""
    x0, x1 = int.from_bytes(p0, "little"), int.from_bytes(p1, "little")
    mask = -(bit & 1) & ((1 << (8 * POINT_BYTES)) - 1)
    return (x0 ^ (mask & (x0 ^ x1))).to_bytes(POINT_BYTES, "little")


async def _ed25519_send(
    channel: Channel, count: int, session_id: bytes
) -> list[tuple[bytes, bytes]]:
    na = _nacl()
    a = _scalar()
    big_a = bytes(na.crypto_scalarmult_ed25519_base_noclamp(a))
    await channel.send(big_a)
    bs = _points(await channel.recv(), count)
    a_a = bytes(na.crypto_scalarmult_ed25519_noclamp(a, big_a))
    keys = []
    for i, b in enumerate(bs):
        s0 = bytes(na.crypto_scalarmult_ed25519_noclamp(a, b))
        s1 = bytes(na.crypto_core_ed25519_sub(s0, a_a))  # a·(B − A) = a·B − a·A
        keys.append(
            (_kdf_points(session_id, i, big_a, b, s0), _kdf_points(session_id, i, big_a, b, s1))
        )
    return keys


async def _ed25519_receive(channel: Channel, choices: list[int], session_id: bytes) -> list[bytes]:
    na = _nacl()
    big_a = _points(await channel.recv(), 1)[0]
    out_b: list[bytes] = []
    keys: list[bytes] = []
    for i, c in enumerate(choices):
        b = _scalar()
        p0 = bytes(na.crypto_scalarmult_ed25519_base_noclamp(b))
        big_b = _select(c, p0, bytes(na.crypto_core_ed25519_add(p0, big_a)))  # b·G + c·A
        out_b.append(big_b)
        shared = bytes(na.crypto_scalarmult_ed25519_noclamp(b, big_a))
        keys.append(_kdf_points(session_id, i, big_a, big_b, shared))
    await channel.send(b"".join(out_b))
    return keys


#: The base-OT group: "ed25519" (default) or "modp3072" (RFC 3526 group 15,
#: the reference, kept for comparison and for machines without libsodium).
#: Both parties must use the same one.
BASE_OT_GROUPS = ("ed25519", "modp3072")


def default_group() -> str:
    try:
        _nacl()
    except ImportError:
        return "modp3072"
    return "ed25519"


def _group(group: str | None) -> str:
    g = group or default_group()
    if g not in BASE_OT_GROUPS:
        raise ValueError(f"unknown base-OT group {g!r}")
    return g


async def base_ot_send(
    channel: Channel, count: int, session_id: bytes, group: str | None = None
) -> list[tuple[bytes, bytes]]:
    """Chou–Orlandi sender: returns `count` random key pairs (k0, k1); the
    receiver learns exactly k_c for its choice c of each pair. Two messages."""
    send = _ed25519_send if _group(group) == "ed25519" else _modp_send
    return await send(channel, count, session_id)


async def base_ot_receive(
    channel: Channel, choices: list[int], session_id: bytes, group: str | None = None
) -> list[bytes]:
    """Chou–Orlandi receiver: returns k_{c_i} for each choice bit c_i."""
    receive = _ed25519_receive if _group(group) == "ed25519" else _modp_receive
    return await receive(channel, choices, session_id)


# ---------------------------------------------------------------- transposition

_M1 = np.uint64(0x00AA00AA00AA00AA)
_M2 = np.uint64(0x0000CCCC0000CCCC)
_M3 = np.uint64(0x00000000F0F0F0F0)
_S7, _S14, _S28 = np.uint64(7), np.uint64(14), np.uint64(28)
_TRANSPOSE_STEP = 4096  # byte columns per slice: keeps the working set in L2


def _transpose8(x: npt.NDArray[np.uint64], t: npt.NDArray[np.uint64]) -> None:
    """In place: transpose each uint64 as an 8×8 bit matrix (bit 8k+l ↔ 8l+k)
    with three delta swaps (Hacker's Delight 7-3)."""
    for mask, sh in ((_M1, _S7), (_M2, _S14), (_M3, _S28)):
        np.right_shift(x, sh, out=t)
        np.bitwise_xor(t, x, out=t)
        np.bitwise_and(t, mask, out=t)
        np.bitwise_xor(x, t, out=x)
        np.left_shift(t, sh, out=t)
        np.bitwise_xor(x, t, out=x)


def transpose_rows(mat: npt.NDArray[np.uint8], out: Blocks | None = None) -> Blocks:
    """Transpose a 128 × m bit matrix (128 rows of m/8 bytes, bit j of a row at
    byte j//8, bit j%8) into m 128-bit blocks: bit i of block j = bit j of row i.
    Rows may be strided; `out` (m, 2) may be given to reuse a buffer."""
    rows, nb = mat.shape
    if rows != KAPPA:
        raise ValueError(f"expected {KAPPA} rows, got {rows}")
    res = np.empty((nb * 8, 2), dtype=np.uint64) if out is None else out
    if native.active() == "native":
        return native.transpose_rows_native(mat, res)
    res8 = res.reshape(-1).view(np.uint8).reshape(nb, 8, 16)
    step = _TRANSPOSE_STEP
    blk = np.empty((min(step, nb), 16, 8), dtype=np.uint8)
    tmp = np.empty((min(step, nb), 16), dtype=np.uint64)
    grouped = mat.reshape(16, 8, nb)
    for lo in range(0, nb, step):
        hi = min(lo + step, nb)
        n = hi - lo
        b = blk[:n]
        # b[c, g, k] = row 8g+k, byte c: one 8×8 bit block per (c, g).
        np.copyto(b, grouped[:, :, lo:hi].transpose(2, 0, 1))
        x = b.reshape(n, 128).view(np.uint64)
        _transpose8(x, tmp[:n])
        # Now byte l of block (c, g) holds bits of position 8c+l for rows 8g..8g+7.
        np.copyto(res8[lo:hi], b.transpose(0, 2, 1))
    return res


# ---------------------------------------------------------------- IKNP extension
#
# An extension covers m = 8·Σ widths OT positions split into pieces (the
# protocol uses one piece per lane batch); piece p spans widths[p] bytes of each
# of the 128 rows. The receiver's message u is the concatenation over pieces of
# the row-major 128 × widths[p] matrices. Working piece by piece keeps the
# matrices in cache instead of materializing 128 × m bits at once.


def _bits_to_block(bits: list[int]) -> Blocks:
    packed = np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little")
    return packed.view(np.uint64).reshape(1, 2).copy()


class _RowPRG:
    """The 128 PRG rows G(k_i) of an IKNP party: AES-128 in counter mode, built
    from one ECB context per key made once (making 128 cipher contexts per
    chunk cost more than the AES at small K). Extension `nonce` uses counter
    blocks nonce‖0, nonce‖1, … (big-endian), consumed piece by piece.  With the
    native core, the 128 key schedules are expanded once and one call fills
    every row (the same bytes; 128 OpenSSL calls per piece dominate small chunks)."""

    def __init__(self, keys: list[bytes]) -> None:
        self._enc = [Cipher(algorithms.AES(k), modes.ECB()).encryptor() for k in keys]
        self._schedules = native.core().expand_keys(b"".join(keys)) if native.available() else None
        self._buf = np.empty((KAPPA, 0), dtype=np.uint8)

    def stream(self, nonce: int, max_width: int) -> _RowStream:
        """Rows for extension `nonce`; one stream at a time (the buffer is reused)."""
        need = 16 * ((max_width + 15) // 16) + 16
        if self._buf.shape[1] < need:
            self._buf = np.empty((KAPPA, need), dtype=np.uint8)
        fast = self._schedules if native.active() == "native" else None
        return _RowStream(self._enc, nonce, max_width, self._buf, fast)


class _RowStream:
    def __init__(
        self,
        encs: list[Any],
        nonce: int,
        max_width: int,
        buf: npt.NDArray[np.uint8],
        schedules: bytes | None = None,
    ) -> None:
        self._enc = encs
        self._next = 0
        self._nonce = nonce
        self._schedules = schedules
        nblk = (max_width + 15) // 16
        self._ctr = np.empty((nblk, 2), dtype=">u8")
        self._ctr[:, 0] = nonce
        self._steps = np.arange(nblk, dtype=np.uint64)
        self._buf = buf

    def read(self, width: int) -> npt.NDArray[np.uint8]:
        """The next `width` bytes of every row, as a (128, width) view (reused)."""
        nblk = (width + 15) // 16
        if self._schedules is not None:
            native.core().prg_rows(
                self._schedules, self._nonce, self._next, nblk, self._buf, self._buf.shape[1]
            )
            self._next += nblk
            return self._buf[:, :width]
        ctr = self._ctr[:nblk]
        ctr[:, 1] = self._steps[:nblk] + np.uint64(self._next)
        self._next += nblk
        src = ctr.data.cast("B")
        for enc, row in zip(self._enc, self._buf, strict=True):
            enc.update_into(src, row.data)
        return self._buf[:, :width]


def _label_buffer(owner: Any, rows: int) -> Blocks:
    """A per-party reusable (rows, 2) output buffer for transposed labels."""
    buf: Blocks | None = getattr(owner, "_labels_buf", None)
    if buf is None or buf.shape[0] < rows:
        buf = np.empty((rows, 2), dtype=np.uint64)
        owner._labels_buf = buf
    return buf[:rows]


def _check_widths(widths: list[int]) -> None:
    if not widths or min(widths) <= 0:
        raise ValueError("an extension needs positive piece widths")


class IKNPReceiver:
    """The IKNP receiver (the evaluator): holds both base-OT keys of each row."""

    def __init__(self, keys: list[tuple[bytes, bytes]]) -> None:
        if len(keys) != KAPPA:
            raise ValueError(f"need {KAPPA} base OTs")
        self._g0 = _RowPRG([k[0] for k in keys])
        self._g1 = _RowPRG([k[1] for k in keys])
        self._u_buf = np.empty(0, dtype=np.uint8)  # reused: fresh pages cost faults

    def u_message(self, choices: list[npt.NDArray[np.uint8]], nonce: int) -> memoryview:
        """The message u = G(k0) ⊕ G(k1) ⊕ r for packed choice bits r given piece
        by piece (bit j of a piece at byte j//8, bit j%8). `nonce` must be fresh
        for every extension under the same base OTs.  The result is a view of a
        buffer the next call overwrites: send it before extending again."""
        widths = [c.shape[0] for c in choices]
        _check_widths(widths)
        t = self._g0.stream(nonce, max(widths))
        g1 = self._g1.stream(nonce, max(widths))
        if self._u_buf.shape[0] < KAPPA * sum(widths):
            self._u_buf = np.empty(KAPPA * sum(widths), dtype=np.uint8)
        out = self._u_buf[: KAPPA * sum(widths)]
        pos = 0
        for r in choices:
            w = r.shape[0]
            u = out[pos : pos + KAPPA * w].reshape(KAPPA, w)
            np.bitwise_xor(t.read(w), g1.read(w), out=u)
            np.bitwise_xor(u, r[None, :], out=u)
            pos += KAPPA * w
        return out.data

    def labels(self, widths: list[int], nonce: int) -> Iterator[Blocks]:
        """The receiver's blocks t_j = q_j ⊕ r_j·Δ, piece by piece. Each yielded
        array is overwritten by the next one."""
        _check_widths(widths)
        t = self._g0.stream(nonce, max(widths))
        out = _label_buffer(self, 8 * max(widths))
        for w in widths:
            yield transpose_rows(t.read(w), out[: 8 * w])

    def extend(self, choice_bytes: npt.NDArray[np.uint8], nonce: int) -> tuple[bytes, Blocks]:
        """One-piece convenience: (u, t) for packed choice bits."""
        u = bytes(self.u_message([choice_bytes], nonce))
        return u, next(self.labels([choice_bytes.shape[0]], nonce)).copy()


class IKNPSender:
    """The IKNP sender (the garbler): holds s and k_{s_i}; its Δ is s."""

    def __init__(self, s_bits: list[int], keys: list[bytes]) -> None:
        if len(keys) != KAPPA or len(s_bits) != KAPPA:
            raise ValueError(f"need {KAPPA} base OTs")
        self._s = np.flatnonzero(np.asarray(s_bits, dtype=bool))
        self._prg = _RowPRG(keys)
        self.delta = _bits_to_block(s_bits)[0]

    def labels(self, u_msg: bytes, widths: list[int], nonce: int) -> Iterator[Blocks]:
        """Blocks q_j = G(k_{s_i}) ⊕ s_i·u, transposed, piece by piece. Each
        yielded array is overwritten by the next one."""
        _check_widths(widths)
        if len(u_msg) != KAPPA * sum(widths):
            raise ValueError(
                f"OT extension message has {len(u_msg)} bytes, want {KAPPA * sum(widths)}"
            )
        u_all = np.frombuffer(u_msg, dtype=np.uint8)
        q = self._prg.stream(nonce, max(widths))
        out = _label_buffer(self, 8 * max(widths))
        pos = 0
        for w in widths:
            u = u_all[pos : pos + KAPPA * w].reshape(KAPPA, w)
            pos += KAPPA * w
            rows = q.read(w)
            rows[self._s] ^= u[self._s]
            yield transpose_rows(rows, out[: 8 * w])

    def extend(self, u_msg: bytes, m: int, nonce: int) -> Blocks:
        """One-piece convenience: q_j for j < m."""
        if m % 8:
            raise ValueError("m must be a multiple of 8")
        return next(self.labels(u_msg, [m // 8], nonce)).copy()


@dataclass(frozen=True)
class RandomOTs:
    """Random 1-out-of-2 OTs from correlated ones by the CCR hash (tests, API)."""

    m0: Blocks
    m1: Blocks


def random_ots_sender(q: Blocks, delta: Blocks, tweak_hi: int, hasher: TweakableHash) -> RandomOTs:
    """m_b,j = H(q_j ⊕ b·Δ, j): breaks the Δ correlation, giving independent messages."""
    tw = make_tweaks(tweak_hi, 0, q.shape[0])
    return RandomOTs(hasher(q, tw), hasher(q ^ delta, tw))


def random_ots_receiver(t: Blocks, tweak_hi: int, hasher: TweakableHash) -> Blocks:
    """The receiver's m_{r_j},j = H(t_j, j)."""
    return hasher(t, make_tweaks(tweak_hi, 0, t.shape[0]))
