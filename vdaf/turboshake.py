"""TurboSHAKE128 (RFC 9861, formerly draft-irtf-cfrg-kangarootwelve) and the two
XOFs of draft-irtf-cfrg-vdaf-13 built on it, XofTurboShake128 and
XofFixedKeyAes128 (draft-13 §6.2.1, §6.2.2).

Why here: the Mastic VDAF (draft-mouris-cfrg-mastic, whose reference code
pins draft-irtf-cfrg-vdaf-13) derives its VIDPF's seeds and node proofs with
these two XOFs, where the rest of `vdaf/` implements draft-07's XofShake128
(`vdaf/xof.py`).  vdaf/vidpf.py and vdaf/mastic.py use them; the servers'
sparse path (vdaf/sparse.py) derives its AES keys with SHAKE128 instead.

TurboSHAKE128(M, D, L) is the sponge over Keccak-p[1600, 12] (the last 12 of
Keccak-f's 24 rounds) with rate 168 bytes: absorb M, then the domain byte D
(0x01–0x7F) and the pad10*1 closing bit 0x80 in the last byte of the block,
then squeeze L bytes.  This is the pure-Python reference (≈ 0.1 ms per
permutation); a native core can follow the one `vdaf/_keccak.c` gives
SHAKE128, checked against this one.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_MASK = (1 << 64) - 1
#: Keccak's round constants ι; Keccak-p[1600, 12] uses the last twelve.
_RC = (
    0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000,
    0x000000000000808B, 0x0000000080000001, 0x8000000080008081, 0x8000000000008009,
    0x000000000000008A, 0x0000000000000088, 0x0000000080008009, 0x000000008000000A,
    0x000000008000808B, 0x800000000000008B, 0x8000000000008089, 0x8000000000008003,
    0x8000000000008002, 0x8000000000000080, 0x000000000000800A, 0x800000008000000A,
    0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008,
)  # fmt: skip
#: ρ rotation offsets, indexed by lane x + 5·y.
_ROT = (
    0, 1, 62, 28, 27,
    36, 44, 6, 55, 20,
    3, 10, 43, 25, 39,
    41, 45, 15, 21, 8,
    18, 2, 61, 56, 14,
)  # fmt: skip
RATE = 168


def _rotl(v: int, n: int) -> int:
    return ((v << n) | (v >> (64 - n))) & _MASK if n else v


def keccak_p12(a: list[int]) -> None:
    """Keccak-p[1600, 12] on 25 lanes (lane x + 5·y), in place."""
    for rc in _RC[12:]:
        # θ
        c = [a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20] for x in range(5)]
        d = [c[(x - 1) % 5] ^ _rotl(c[(x + 1) % 5], 1) for x in range(5)]
        for i in range(25):
            a[i] ^= d[i % 5]
        # ρ and π: B[y, 2x + 3y] = rot(A[x, y], r[x, y])
        b = [0] * 25
        for x in range(5):
            for y in range(5):
                b[y + 5 * ((2 * x + 3 * y) % 5)] = _rotl(a[x + 5 * y], _ROT[x + 5 * y])
        # χ
        for y in range(0, 25, 5):
            row = b[y : y + 5]
            for x in range(5):
                a[y + x] = row[x] ^ (~row[(x + 1) % 5] & _MASK & row[(x + 2) % 5])
        # ι
        a[0] ^= rc


def turboshake128(message: bytes, domain: int, length: int) -> bytes:
    """TurboSHAKE128(M = message, D = domain, L = length)."""
    if not 0x01 <= domain <= 0x7F:
        raise ValueError("the domain byte D is in 0x01..0x7F")
    padded = bytearray(message)
    padded.append(domain)
    padded.extend(bytes(-len(padded) % RATE))
    padded[-1] ^= 0x80
    state = [0] * 25
    for start in range(0, len(padded), RATE):
        block = padded[start : start + RATE]
        for i in range(RATE // 8):
            state[i] ^= int.from_bytes(block[8 * i : 8 * i + 8], "little")
        keccak_p12(state)
    out = bytearray()
    while True:
        out.extend(b"".join(lane.to_bytes(8, "little") for lane in state[: RATE // 8]))
        if len(out) >= length:
            return bytes(out[:length])
        keccak_p12(state)


class XofTurboShake128:
    """draft-13's XofTurboShake128: the stream TurboSHAKE128(M, 1, ·) of
    M = len(dst) (2 bytes LE) ‖ dst ‖ len(seed) (1 byte) ‖ seed ‖ binder."""

    SEED_SIZE = 32

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        if len(seed) > 255:
            raise ValueError("XofTurboShake128 seeds are at most 255 bytes")
        if len(dst) > 65535:
            raise ValueError("XofTurboShake128 takes a dst of at most 65535 bytes")
        self._m = len(dst).to_bytes(2, "little") + dst + bytes([len(seed)]) + seed + binder
        self._used = 0

    def next(self, length: int) -> bytes:
        """The stream's next `length` bytes."""
        # (the reference recomputes the stream; one squeeze state would do)
        self._used += length
        return turboshake128(self._m, 1, self._used)[self._used - length :]

    @classmethod
    def derive_seed(cls, seed: bytes, dst: bytes, binder: bytes) -> bytes:
        return cls(seed, dst, binder).next(cls.SEED_SIZE)


class XofFixedKeyAes128:
    """draft-13's XofFixedKeyAes128: block i of the stream is the hash
    σ-AES(seed ⊕ i) under a fixed AES-128 key derived from dst and binder
    with TurboSHAKE128(·, 2, 16); the hash is AES_k(σ(x)) ⊕ σ(x) with
    σ(lo ‖ hi) = hi ‖ (hi ⊕ lo) (the circular correlation-robust hash of
    Guo, Katz, Wang, Weng, Yu 2020, §4.2)."""

    SEED_SIZE = 16

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        if len(seed) != self.SEED_SIZE:
            raise ValueError("XofFixedKeyAes128 seeds are 16 bytes")
        if len(dst) > 65535:
            raise ValueError("XofFixedKeyAes128 takes a dst of at most 65535 bytes")
        key = _fixed_key(dst, binder)
        self._aes = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        self._seed = int.from_bytes(seed, "little")
        self._used = 0

    def _block(self, i: int) -> bytes:
        x = (self._seed ^ i).to_bytes(16, "little")
        lo, hi = x[:8], x[8:]
        sigma = hi + bytes(a ^ b for a, b in zip(hi, lo, strict=True))
        return bytes(a ^ b for a, b in zip(self._aes.update(sigma), sigma, strict=True))

    def next(self, length: int) -> bytes:
        """The stream's next `length` bytes."""
        first, end = self._used // 16, self._used + length
        blocks = b"".join(self._block(i) for i in range(first, -(-end // 16)))
        offset = self._used % 16
        self._used = end
        return blocks[offset : offset + length]

    @classmethod
    def derive_seed(cls, seed: bytes, dst: bytes, binder: bytes) -> bytes:
        return cls(seed, dst, binder).next(cls.SEED_SIZE)


@lru_cache(maxsize=256)
def _fixed_key(dst: bytes, binder: bytes) -> bytes:
    """TurboSHAKE128(len(dst) ‖ dst ‖ binder, 2, 16): the same AES key for every
    seed of one report (the draft's note: it may be cached across evaluations)."""
    return turboshake128(len(dst).to_bytes(2, "little") + dst + binder, 2, 16)


def next_vec(
    xof: XofTurboShake128 | XofFixedKeyAes128, modulus: int, size: int, n: int
) -> list[int]:
    """draft-13's `next_vec`: n field elements of `size` bytes each, LE,
    masked to the next power of two above p and kept when below p."""
    mask = (1 << (modulus - 1).bit_length()) - 1
    out: list[int] = []
    while len(out) < n:
        x = int.from_bytes(xof.next(size), "little") & mask
        if x < modulus:
            out.append(x)
    return out
