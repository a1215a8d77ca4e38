"""Fixed-key AES as a public random permutation π, the tweakable circular
correlation-robust hash H(x, i) = π(π(x) ⊕ i) ⊕ π(x) built on it, and the
AES-CTR pseudo-random generator, all vectorized over numpy arrays of blocks.

A block (label) is a row of a C-contiguous (n, 2) uint64 array: word 0 holds the
low 64 bits (little-endian bytes 0..7), so the point-and-permute bit of a label
`x` is `x[:, 0] & 1`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

Blocks = npt.NDArray[np.uint64]

#: The public fixed key of π. Security treats AES under it as an ideal permutation.
FIXED_KEY = hashlib.sha256(b"svtagg fixed-key AES permutation v1").digest()[:16]


class FixedKeyAES:
    """π(x) = AES_k(x) for the public key k, over many blocks per call.

    One ECB encryptor is kept for the object's lifetime (ECB has no state
    between calls), and output goes through `update_into` straight into the
    caller's array, avoiding a copy per call.
    """

    def __init__(self, key: bytes = FIXED_KEY) -> None:
        self._cipher = Cipher(algorithms.AES(key), modes.ECB())
        self._enc = self._cipher.encryptor()

    def permute(self, x: Blocks, out: Blocks | None = None) -> Blocks:
        """π applied to every row of the C-contiguous `x`, returned as `out[:n]`.

        `out`, if given, must be a C-contiguous (≥ n + 1, 2) buffer: `update_into`
        wants block_size − 1 bytes of slack after the output."""
        n = x.shape[0]
        if out is None:
            out = np.empty((n + 1, 2), dtype=np.uint64)
        elif out.shape[0] <= n or not out.flags.c_contiguous:
            raise ValueError("output buffer needs n + 1 contiguous rows")
        self._enc.update_into(x.data.cast("B"), out.data.cast("B"))
        return out[:n]

    def inverse(self, x: Blocks) -> Blocks:
        """π^-1: anyone can invert a fixed-key permutation (used by negative-control tests)."""
        dec = self._cipher.decryptor()
        raw = dec.update(np.ascontiguousarray(x).tobytes())
        return np.frombuffer(raw, dtype=np.uint64).reshape(-1, 2).copy()


class TweakableHash:
    """H(x, i) = π(π(x) ⊕ i) ⊕ π(x): tweakable circular correlation-robust hash
    (Guo–Katz–Wang–Yu 2020) when every tweak i is used at most once per Δ.

    Intermediate blocks live in scratch buffers kept across calls: fresh large
    arrays would cost a page fault per 4 KiB on first touch, which measured
    slower than the AES itself.
    """

    def __init__(self, prp: FixedKeyAES | None = None) -> None:
        self.prp = prp if prp is not None else FixedKeyAES()
        self._p = np.empty((1, 2), dtype=np.uint64)
        self._t = np.empty((1, 2), dtype=np.uint64)

    def __call__(self, x: Blocks, tweaks: Blocks, out: Blocks | None = None) -> Blocks:
        """H(x_k, tweaks_k) for every row of the C-contiguous `x`, as `out[:n]`
        if a buffer is given (with a slack row, see `FixedKeyAES.permute`)."""
        n = x.shape[0]
        if self._p.shape[0] < n + 1:
            self._p = np.empty((n + 1, 2), dtype=np.uint64)
            self._t = np.empty((n + 1, 2), dtype=np.uint64)
        p = self.prp.permute(x, self._p)
        t = self._t[:n]
        np.bitwise_xor(p, tweaks, out=t)
        out = self.prp.permute(t, out)
        np.bitwise_xor(out, p, out=out)
        return out


def make_tweaks(hi: int, start: int, n: int, step: int = 1) -> Blocks:
    """Tweaks (start + step·k, hi) for k < n: low word a gate counter, high word
    the session/chunk tag, so tweaks differ across gates and chunks."""
    tw = np.empty((n, 2), dtype=np.uint64)
    tw[:, 0] = np.arange(start, start + step * n, step, dtype=np.uint64)
    tw[:, 1] = np.uint64(hi)
    return tw


def ggm_level(h: Any, nodes: npt.NDArray[np.uint64], tweak_hi: int) -> npt.NDArray[np.uint64]:
    """One level of t GGM trees at once: nodes (t, width, 2 words) → children
    (t, width, 2 sides, 2 words), child `side` = H(node, (side, tweak_hi)) with
    the tweakable hash `h` (numpy or native, the same bytes); SoftSpoken's and
    Ferret's trees put their own tag and the level in `tweak_hi`."""
    t, width = nodes.shape[:2]
    flat = np.ascontiguousarray(nodes.reshape(-1, 2))
    tw = np.empty((flat.shape[0], 2), dtype=np.uint64)
    tw[:, 1] = np.uint64(tweak_hi)
    child = np.empty((t, width, 2, 2), dtype=np.uint64)
    for side in (0, 1):
        tw[:, 0] = np.uint64(side)
        child[:, :, side] = np.asarray(h(flat, tw)).reshape(t, width, 2)
    return child
