"""Additive sharing with seed compression: roundtrip, determinism, aggregation."""

from __future__ import annotations

import numpy as np
import pytest

from svtagg.mpc.sharing import aggregate, aggregate_seeds, expand_seed, share


def test_share_roundtrip_wraps() -> None:
    x = np.array([0, 1, 2**63, 2**64 - 1, 12345], dtype=np.uint64)
    explicit, seed = share(x)
    assert len(seed) == 16
    assert np.array_equal(explicit + expand_seed(seed, len(x)), x)


def test_shares_are_fresh() -> None:
    x = np.zeros(8, dtype=np.uint64)
    (e1, s1), (e2, s2) = share(x), share(x)
    assert s1 != s2 and not np.array_equal(e1, e2)


def test_expand_seed_is_deterministic_aes_ctr() -> None:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seed = bytes(range(16))
    a, b = expand_seed(seed, 5), expand_seed(seed, 9)
    assert a.dtype == np.uint64 and np.array_equal(a, b[:5])
    ks = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(bytes(40))
    assert np.array_equal(a, np.frombuffer(ks, "<u8"))
    assert expand_seed(seed, 0).shape == (0,)


def test_aggregate_explicit_and_seeds() -> None:
    rng = np.random.default_rng(7)
    xs = [rng.integers(0, 2**64, 50, dtype=np.uint64) for _ in range(20)]
    parts = [share(x) for x in xs]
    total = aggregate([p[0] for p in parts]) + aggregate_seeds([p[1] for p in parts], 50)
    expect = np.zeros(50, np.uint64)
    for x in xs:
        expect += x
    assert np.array_equal(total, expect)


def test_aggregate_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        aggregate([])
    with pytest.raises(ValueError):
        aggregate([np.zeros(3, np.uint64), np.zeros(4, np.uint64)])
    with pytest.raises(TypeError):
        share(np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        expand_seed(b"short", 3)
