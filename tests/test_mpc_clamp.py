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


def test_any_per_group_reveals_one_bit_per_group() -> None:
    """Report validation's circuit: the OR of each group's sign tests, in the
    plaintext backend and through the protocol (both parties get the bits)."""
    from svtagg.mpc.circuits import any_per_group_circuit

    rng = np.random.default_rng(9)
    for group in (1, 2, 6, 7):
        m = 50
        s = (np.zeros(m * group, dtype=np.int64) - 1).view(np.uint64)  # all NO
        hits = rng.random(m) < 0.3
        for r in np.flatnonzero(hits):
            s[r * group + rng.integers(group)] = np.uint64(5)  # one YES in the group
        a = rng.integers(0, M64, s.size, dtype=np.uint64, endpoint=False)
        b = s - a
        out = any_per_group_circuit(
            PlainBackend(), bit_planes(a), planes(bit_planes(b)), s.size, group
        )
        assert out.astype(bool).tolist() == hits.tolist()

        got = asyncio.run(_any_per_group(a, b, group))
        assert got[0] == got[1] == hits.tolist()


async def _any_per_group(a: np.ndarray, b: np.ndarray, group: int) -> list[list[bool]]:
    g, e = await connected_pair()
    return list(await asyncio.gather(g.any_per_group(a, group), e.any_per_group(b, group)))
