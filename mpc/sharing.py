"""Additive sharing in Z_2^64 with seed compression: one party gets an explicit
share, the other a 16-byte seed whose AES-128-CTR expansion is its share."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.mpc.ring import U64

SEED_BYTES = 16
# A fixed counter block is safe because every seed is a fresh random AES key
# used for exactly one expansion stream.
_CTR_NONCE = bytes(16)


def expand_seed(seed: bytes, length: int) -> U64:
    """Expand a 16-byte seed to `length` ring elements: the AES-128-CTR keystream
    under key `seed` (counter block 0), read as little-endian uint64s."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes, got {len(seed)}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    enc = Cipher(algorithms.AES(bytes(seed)), modes.CTR(_CTR_NONCE)).encryptor()
    stream = enc.update(bytes(8 * length))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def share(x: np.ndarray, seed: bytes | None = None) -> tuple[U64, bytes]:
    """Split `x` (uint64) into (explicit_share, seed) with
    explicit_share + expand_seed(seed, len(x)) == x (mod 2^64).

    The seed comes from the OS CSPRNG unless given, so either part alone is
    uniformly random.  A given seed must be as unpredictable to the explicit
    share's holder (e.g. a keyed PRF of a secret key) and serve one vector only.
    """
    arr = np.asarray(x)
    if arr.dtype != np.uint64 or arr.ndim != 1:
        raise TypeError("share expects a 1-D uint64 array")
    if seed is None:
        seed = os.urandom(SEED_BYTES)
    return arr - expand_seed(seed, arr.shape[0]), seed


def aggregate(shares: Sequence[np.ndarray] | Iterable[np.ndarray]) -> U64:
    """Wrapping (mod 2^64) sum of equally long uint64 share vectors."""
    total: U64 | None = None
    for s in shares:
        arr = np.asarray(s)
        if arr.dtype != np.uint64 or arr.ndim != 1:
            raise TypeError("aggregate expects 1-D uint64 arrays")
        if total is None:
            total = arr.copy()
        elif arr.shape != total.shape:
            raise ValueError(f"share length {arr.shape[0]} != {total.shape[0]}")
        else:
            np.add(total, arr, out=total)
    if total is None:
        raise ValueError("aggregate needs at least one share")
    return total


def aggregate_seeds(seeds: Iterable[bytes], length: int) -> U64:
    """The helper's aggregate: the wrapping sum of the expansions of `seeds`."""
    total = np.zeros(length, dtype=np.uint64)
    for seed in seeds:
        np.add(total, expand_seed(seed, length), out=total)
    return total
