"""The robust-aggregate pass: g(S) = min(tri(S), N) re-shared, checked against the
plaintext reference on boundary and random sums, in the plaintext backend and
through the garbled protocol."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from svtagg.mpc.circuits import (
    bit_planes,
    clamp_reshare_circuit,
    plain_clamp,
    planes,
    ring_from_bits,
)
from svtagg.mpc.garble import PlainBackend
from svtagg.mpc.protocol import connected_pair

M64 = 1 << 64


def boundary_sums(bound: int) -> list[int]:
    """Sums at every edge of g: 0, N, the sign boundary ±2^63, and around −N."""
    edges = [
        0,
        1,
        bound - 1,
        bound,
        bound + 1,
        2 * bound,
        (1 << 63) - 1,
        1 << 63,
        (1 << 63) + 1,
        M64 - 1,
        M64 - bound,
        M64 - bound - 1,
        M64 - bound + 1,
    ]
    return [e % M64 for e in edges]


@pytest.mark.parametrize("bound", [0, 1, 1000 << 16, (1 << 62) + 12345, (1 << 63) - 1])
def test_plain_circuit_matches_reference(bound: int) -> None:
    rng = np.random.default_rng(bound % 1000)
    s = np.array(boundary_sums(bound), dtype=np.uint64)
    s = np.concatenate([s, rng.integers(0, M64, 200, dtype=np.uint64, endpoint=False)])
    a = rng.integers(0, M64, s.size, dtype=np.uint64, endpoint=False)
    b = s - a
    r = rng.integers(0, M64, s.size, dtype=np.uint64, endpoint=False)
    garbler_bits = bit_planes(np.concatenate([a, np.uint64(0) - r]))
    out = clamp_reshare_circuit(PlainBackend(), garbler_bits, planes(bit_planes(b)), s.size, bound)
    y = ring_from_bits(list(out))
    np.testing.assert_array_equal(y + r, plain_clamp(s, bound))
    # The reference itself, on values worked out by hand.
    assert plain_clamp(np.array([M64 - 5], dtype=np.uint64), 100)[0] == 5
    assert plain_clamp(np.array([1 << 63], dtype=np.uint64), bound)[0] == min(1 << 63, bound)


def test_protocol_reshares_clamped_sums() -> None:
    bound = 5000 << 16

    async def run() -> None:
        rng = np.random.default_rng(3)
        s = np.array(boundary_sums(bound) * 400, dtype=np.uint64)  # > one lane batch
        a = rng.integers(0, M64, s.size, dtype=np.uint64, endpoint=False)
        b = s - a
        g, e = await connected_pair()
        new_a, new_b = await asyncio.gather(g.clamp_reshare(a, bound), e.clamp_reshare(b, bound))
        np.testing.assert_array_equal(new_a + new_b, plain_clamp(s, bound))
        # Fresh shares: the garbler's new share is independent of its old one.
        assert not np.array_equal(new_a, a)
        again_a, again_b = await asyncio.gather(
            g.clamp_reshare(a, bound), e.clamp_reshare(b, bound)
        )
        assert not np.array_equal(again_a, new_a)
        np.testing.assert_array_equal(again_a + again_b, plain_clamp(s, bound))
        assert e.last_stats.and_gates < 320 * s.size

    asyncio.run(run())
