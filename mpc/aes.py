"""Fixed-key AES as a public random permutation π, the tweakable circular
correlation-robust hash H(x, i) = π(π(x) ⊕ i) ⊕ π(x) built on it, and the
AES-CTR pseudo-random generator, all vectorized over numpy arrays of blocks.

A block (label) is a row of a C-contiguous (n, 2) uint64 array: word 0 holds the
low 64 bits (little-endian bytes 0..7), so the point-and-permute bit of a label
`x` is `x[:, 0] & 1`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

Blocks = npt.NDArray[np.uint64]

#: The public fixed key of π. Security treats AES under it as an ideal permutation.
FIXED_KEY = hashlib.sha256(b"svtagg fixed-key AES permutation v1").digest()[:16]


def empty_blocks(n: int) -> Blocks:
    return np.empty((n, 2), dtype=np.uint64)


class FixedKeyAES:
    """π(x) = AES_k(x) for the public key k, over many blocks per call.

    One ECB encryptor is kept for the process's lifetime (ECB has no state
    between calls), and output goes through `update_into` into a reusable
    scratch buffer, since per-call allocation dominated small batches.
    """

    def __init__(self, key: bytes = FIXED_KEY) -> None:
        self._cipher = Cipher(algorithms.AES(key), modes.ECB())
        self._enc = self._cipher.encryptor()
        self._scratch = np.empty((0, 2), dtype=np.uint64)

    def _buffer(self, n: int) -> Blocks:
        # update_into wants block_size - 1 bytes of slack after the output.
        if self._scratch.shape[0] < n + 1:
            self._scratch = np.empty((max(n + 1, 2 * self._scratch.shape[0]), 2), np.uint64)
        return self._scratch

    def permute(self, x: Blocks, out: Blocks | None = None) -> Blocks:
        """π applied to every row of `x`; written to `out` if given (may not alias x)."""
        n = x.shape[0]
        buf = self._buffer(n)
        src = np.ascontiguousarray(x)
        self._enc.update_into(memoryview(src).cast("B"), memoryview(buf).cast("B"))
        if out is None:
            return buf[:n].copy()
        out[...] = buf[:n]
        return out

    def inverse(self, x: Blocks) -> Blocks:
        """π^-1: anyone can invert a fixed-key permutation (used by negative-control tests)."""
        dec = self._cipher.decryptor()
        raw = dec.update(np.ascontiguousarray(x).tobytes())
        return np.frombuffer(raw, dtype=np.uint64).reshape(-1, 2).copy()


class TweakableHash:
    """H(x, i) = π(π(x) ⊕ i) ⊕ π(x): tweakable circular correlation-robust hash
    (Guo–Katz–Wang–Yu 2020) when every tweak i is used at most once per Δ."""

    def __init__(self, prp: FixedKeyAES | None = None) -> None:
        self.prp = prp if prp is not None else FixedKeyAES()

    def __call__(self, x: Blocks, tweaks: Blocks) -> Blocks:
        p = self.prp.permute(x)
        t = np.bitwise_xor(p, tweaks)
        out = self.prp.permute(t)
        np.bitwise_xor(out, p, out=out)
        return out


def make_tweaks(hi: int, start: int, n: int, step: int = 1) -> Blocks:
    """Tweaks (start + step·k, hi) for k < n: low word a gate counter, high word
    the session/chunk tag, so tweaks differ across gates and chunks."""
    tw = np.empty((n, 2), dtype=np.uint64)
    tw[:, 0] = np.arange(start, start + step * n, step, dtype=np.uint64)
    tw[:, 1] = np.uint64(hi)
    return tw


_ZEROS = np.zeros(0, dtype=np.uint8)


def prg_into(key: bytes, nonce: int, out: npt.NDArray[np.uint8], length: int) -> None:
    """Write `length` bytes of AES-128-CTR(key) keystream, counter starting at
    nonce·2^64, to the start of the 1-D uint8 buffer `out` (which needs at
    least 15 bytes of slack beyond `length` for `update_into`)."""
    global _ZEROS
    if _ZEROS.shape[0] < length:
        _ZEROS = np.zeros(length, dtype=np.uint8)
    enc = Cipher(algorithms.AES(key), modes.CTR((nonce << 64).to_bytes(16, "big"))).encryptor()
    enc.update_into(memoryview(_ZEROS[:length]), memoryview(out).cast("B"))
