"""Chunked report-noisy-max tournaments (`mpc.tournament`): the carry circuit
against its plaintext reference at the edges (ties across a chunk boundary,
the winner in the first or the last chunk, negative values, ±2^(w−1), indices
at the top of the 32-bit range, lane-batch boundaries), a whole stream in
chunks against the one-tournament argmax, its AND count, the carried winner
hidden from the evaluator by the garbler's masks, through the protocol on
both engines and across them, byte-identical tables from the two engines, and
negative controls: a carry that loses ties, or that reveals the chunk's
winner unmasked, fails the same checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import cross_engine_pair

from svtagg.dp.queries import MAX_TOURNAMENT
from svtagg.mpc import native, tournament
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.circuits import LANE_BATCH, argmax_index, bit_planes, plain_argmax, planes
from svtagg.mpc.garble import Backend, Bits, EvalBackend, GarbleBackend, PlainBackend, Wires
from svtagg.mpc.protocol import ComparisonGarbler, connected_pair, noisy_max_chunk_spec
from svtagg.mpc.tournament import (
    CARRY_INDEX_BITS,
    TournamentChunk,
    carry_bits,
    carry_lanes,
    carry_value_index,
    carry_words,
    noisy_max_chunk_and_gates,
    noisy_max_chunk_circuit,
    plain_noisy_max_chunk,
)

M64 = 1 << 64
WIDTHS = [8, 13, 16, 33, 40, 64]  # any width in bits, not only whole bytes
needs_native = pytest.mark.skipif(not native.available(), reason="native core not built")


def share(z: list[int] | np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniform shares a, b with a + b = z mod 2^64 (z as signed integers)."""
    zu = np.array([int(v) % M64 for v in z], dtype=np.uint64)
    a = rng.integers(0, M64, zu.size, dtype=np.uint64, endpoint=False)
    return a, zu - a


def carry_bits_of(value: int, index: int, w: int) -> Bits:
    """The carry_bits(w) plain bits of a winner (value mod 2^w, then index)."""
    v = value % (1 << w)
    return np.array(
        [(v >> i) & 1 for i in range(w)] + [(index >> i) & 1 for i in range(CARRY_INDEX_BITS)],
        dtype=np.uint8,
    )


def xor_shared(value: int, index: int, w: int, rng: np.random.Generator) -> tuple[Bits, Bits]:
    """(garbler's mask lanes, evaluator's masked lanes) of a carried winner."""
    mask = rng.integers(0, 2, carry_bits(w), dtype=np.uint8)
    return carry_words(mask, w), carry_words(carry_bits_of(value, index, w) ^ mask, w)


def run_chunk(
    z: list[int] | np.ndarray,
    w: int,
    where: TournamentChunk,
    carried: tuple[int, int] | None,
    rng: np.random.Generator,
) -> tuple[int | tuple[int, int], int]:
    """One chunk in the plaintext backend: (the index, or the unmasked new
    carry (value, index); AND gates)."""
    a, b = share(z, rng)
    if carried is not None:
        ga, eb = xor_shared(*carried, w, rng)
        a, b = np.concatenate([ga, a]), np.concatenate([eb, b])
    mask = rng.integers(0, 2, carry_bits(w), dtype=np.uint8)
    be = PlainBackend()
    out = noisy_max_chunk_circuit(be, bit_planes(a), planes(bit_planes(b)), a.size, w, where, mask)
    if where.final:
        assert len(out) == CARRY_INDEX_BITS
        return argmax_index(list(out)), be.and_gates
    assert len(out) == 1 and out[0].shape == (carry_bits(w),)
    return carry_value_index(carry_words(out[0] ^ mask, w), w), be.and_gates


def reference(
    z: list[int] | np.ndarray, w: int, where: TournamentChunk, carried: tuple[int, int] | None
) -> int | tuple[int, int]:
    a, b = share(z, np.random.default_rng(0))
    v, j = plain_noisy_max_chunk(a, b, where.offset, carried, w)
    return j if where.final else (v, j)


def edge_cases(w: int) -> Iterator[tuple[list[int], tuple[int, int] | None, int]]:
    """(chunk values, carried (value, index) or None, offset) at every edge."""
    lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
    top = MAX_TOURNAMENT - 9  # the chunk's indices reach 2^32 − 2
    for k in (1, 2, 3, 8, 9):
        yield [0] * k, None, 0
        yield [lo] * k, None, 0
        yield [hi - j for j in range(k)], None, 0
        for carried in ((5, 3), (lo, 0), (hi, 7), (-1, top - 1), (0, (1 << 31) + 5)):
            off = max(carried[1] + 1, 11)
            yield [carried[0]] * k, carried, off  # ties across the boundary: the carry keeps it
            yield [min(carried[0] + 1, hi)] * k, carried, off  # one above: the first of the chunk
            yield [lo] * (k - 1) + [hi], carried, off  # the chunk's last candidate
            yield [-3 - j for j in range(k)], carried, off  # negative values
        yield [hi] * k, (hi, 0), 1  # all at the top, the carry from the first index
        yield [lo] * k, (lo, top), top + 1  # all at the bottom, at the top of the index range
    yield [lo, hi, hi, lo], (hi - 1, 4), 9  # the tie inside the chunk goes to the earlier


# ---------------------------------------------------------------- the carry circuit
@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("final", [False, True], ids=["carry", "final"])
def test_carry_circuit_at_the_edges(w: int, final: bool) -> None:
    rng = np.random.default_rng(w)
    for z, carried, offset in edge_cases(w):
        if carried is None and offset:
            continue
        where = TournamentChunk(offset if carried else 0, carried is not None, final)
        got, ands = run_chunk(z, w, where, carried, rng)
        assert got == reference(z, w, where, carried), (z, carried, offset)
        assert ands == noisy_max_chunk_and_gates(len(z), w, where)


@pytest.mark.parametrize("w", [16, 64])
@pytest.mark.parametrize(
    "k", [LANE_BATCH - 5, LANE_BATCH - 1, LANE_BATCH, LANE_BATCH + 1, 2 * LANE_BATCH + 3]
)
def test_carry_circuit_across_lane_batches(k: int, w: int) -> None:
    """The carry lanes sit in batch 0 with its first candidates, so batch 0's
    indices are shifted; the maximum at a batch's edge, the carry tied with it."""
    rng = np.random.default_rng(k)
    for spot in (0, LANE_BATCH - carry_lanes(w) - 1, LANE_BATCH - carry_lanes(w), k - 1):
        if spot >= k:
            continue
        z = rng.integers(-1000, 1000, k)
        z[spot] = 5000
        for carried in (None, (4999, 12), (5000, 12)):
            where = TournamentChunk(100 if carried else 0, carried is not None, final=False)
            got, ands = run_chunk(z, w, where, carried, rng)
            assert got == reference(z, w, where, carried)
            assert got == (carried if carried == (5000, 12) else (5000, where.offset + spot))
            assert ands == noisy_max_chunk_and_gates(k, w, where)


def stream_in_chunks(
    z: np.ndarray, sizes: list[int], w: int, rng: np.random.Generator
) -> tuple[int, list[Bits]]:
    """A whole stream chunk by chunk in the plaintext backend, each carry
    re-masked by fresh garbler masks: (the final index, what the evaluator
    decoded after each chunk but the last)."""
    a, b = share(z, rng)
    seen: list[Bits] = []
    carry: tuple[np.ndarray, np.ndarray] | None = None
    off = 0
    for c, k in enumerate(sizes):
        final = c == len(sizes) - 1
        za, zb = a[off : off + k], b[off : off + k]
        if carry is not None:
            za, zb = np.concatenate([carry[0], za]), np.concatenate([carry[1], zb])
        mask = rng.integers(0, 2, carry_bits(w), dtype=np.uint8)
        where = TournamentChunk(off, carry is not None, final)
        be = PlainBackend()
        out = noisy_max_chunk_circuit(
            be, bit_planes(za), planes(bit_planes(zb)), za.size, w, where, mask
        )
        if final:
            return argmax_index(list(out)), seen
        seen.append(out[0])
        carry = carry_words(mask, w), carry_words(out[0], w)
        off += k
    raise AssertionError("no final chunk")


@pytest.mark.parametrize("w", [8, 33, 40, 64])
def test_a_stream_in_chunks_is_one_tournament(w: int) -> None:
    """Any split of the candidates gives the one-tournament argmax: the
    maximum in the first, a middle or the last chunk, tied maxima across
    chunks (the earliest wins), chunks of one candidate."""
    rng = np.random.default_rng(w + 1)
    half = 1 << (w - 1)
    for sizes in ([1, 1], [3, 4], [1, 5, 1], [7, 1, 1, 2], [50, 50, 50], [2, 300, 9]):
        d = sum(sizes)
        vectors = [
            rng.integers(-half, half, d, dtype=np.int64),
            rng.integers(-3, 3, d),
            np.full(d, -half),
        ]
        for spots in ([0], [d - 1], [sizes[0]], [sizes[0] - 1, d - 1], [d - 1, sizes[0]]):
            z = rng.integers(-half // 2, 0, d, dtype=np.int64)
            z[spots] = half - 1
            vectors.append(z)
        for z in vectors:
            got, _ = stream_in_chunks(z, sizes, w, rng)
            a, b = share(z, rng)
            assert got == plain_argmax(a, b, w) == int(np.argmax(np.asarray(z, dtype=object)))


def test_the_carry_hides_behind_the_masks() -> None:
    """What the evaluator decodes from a non-final chunk is the winner XOR the
    garbler's mask: with fresh masks, the same stream twice gives the same
    answer but carried bits that differ."""
    rng = np.random.default_rng(3)
    z = rng.integers(-50, 50, 30)
    first = stream_in_chunks(z, [10, 10, 10], 40, rng)
    again = stream_in_chunks(z, [10, 10, 10], 40, rng)
    assert first[0] == again[0]
    assert not any(np.array_equal(x, y) for x, y in zip(first[1], again[1], strict=True))


def test_carry_encoding() -> None:
    for w in WIDTHS:
        assert carry_lanes(w) == 1 + -(-CARRY_INDEX_BITS // w)
        for value, index in (
            (0, 0),
            (-1, 2**32 - 1),
            (-(1 << (w - 1)), 5),
            ((1 << (w - 1)) - 1, 1),
        ):
            words = carry_words(carry_bits_of(value, index, w), w)
            assert words.shape == (carry_lanes(w),)
            assert carry_value_index(words, w) == (value, index)
    assert MAX_TOURNAMENT < 1 << CARRY_INDEX_BITS
    with pytest.raises(ValueError, match="fewer than"):
        TournamentChunk(1 << CARRY_INDEX_BITS, True)
    with pytest.raises(ValueError, match="carried into every chunk but the first"):
        TournamentChunk(0, True)
    with pytest.raises(ValueError, match="carried into every chunk but the first"):
        TournamentChunk(5, False)


def test_the_garbler_must_mask_a_carry() -> None:
    a, b = share([1, 2], np.random.default_rng(0))
    with pytest.raises(ValueError, match="masks"):
        noisy_max_chunk_circuit(
            PlainBackend(),
            bit_planes(a),
            planes(bit_planes(b)),
            2,
            64,
            TournamentChunk(final=False),
        )
    with pytest.raises(ValueError, match="at least one candidate"):
        noisy_max_chunk_circuit(
            PlainBackend(), bit_planes(a), planes(bit_planes(b)), 2, 64, TournamentChunk(9, True)
        )


def test_and_gates_per_candidate() -> None:
    """About 3w ANDs per candidate, as one tournament, plus < 2w + 100 per chunk."""
    for w in (40, 64):
        k = 1000
        for where in (TournamentChunk(final=False), TournamentChunk(5000, True, False)):
            per = noisy_max_chunk_and_gates(k, w, where) / k
            assert 3 * w - 1 < per < 3 * w + 1.3, per
        one = noisy_max_chunk_and_gates(1, w, TournamentChunk(7, True, False))
        assert one - (w - 1) == 31 + 2 * w + 32 < 2 * w + 100  # beyond the candidate's sum


# ---------------------------------------------------------------- negative controls
def _ties_to_the_challenger(be: Backend, x: Wires, y: Wires) -> Wires:
    """Broken on purpose: [x > y] where [x ≥ y] belongs, so a tie goes to the
    later candidate — across a chunk boundary, to the chunk over the carry."""
    return be.not_(_ORIGINAL(be, y, x))


_ORIGINAL = tournament._signed_ge


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, object], None]]:
    def install(name: str, value: object) -> None:
        monkeypatch.setattr(tournament, name, value)

    yield install


def edge_mismatches(w: int) -> int:
    rng = np.random.default_rng(w)
    bad = 0
    for z, carried, offset in edge_cases(w):
        if carried is None:
            continue
        where = TournamentChunk(offset, True, False)
        bad += run_chunk(z, w, where, carried, rng)[0] != reference(z, w, where, carried)
    return bad


@pytest.mark.parametrize("w", [8, 64])
def test_a_carry_that_loses_ties_is_caught(w: int, broken: Callable[[str, object], None]) -> None:
    assert edge_mismatches(w) == 0
    broken("_signed_ge", _ties_to_the_challenger)
    assert edge_mismatches(w) > 0


# ---------------------------------------------------------------- the protocol
async def run_stream(
    g: Any, e: Any, z: np.ndarray, sizes: list[int], w: int, rng: np.random.Generator
) -> list[int]:
    """A whole stream through a garbler/evaluator pair; both parties' answers."""
    a, b = share(z, rng)
    cg = ce = None
    off = 0
    for c, k in enumerate(sizes):
        za, zb = a[off : off + k], b[off : off + k]
        if c == len(sizes) - 1:
            return list(
                await asyncio.gather(
                    g.noisy_max(za, w, cg, off),
                    e.noisy_max(zb, w, ce, off),
                )
            )
        cg, ce = await asyncio.gather(
            g.noisy_max_carry(za, cg, off, w),
            e.noisy_max_carry(zb, ce, off, w),
        )
        spec = noisy_max_chunk_spec(w, TournamentChunk(off, c > 0, final=False))
        lanes = k + (carry_lanes(w) if c else 0)
        assert g.last_stats.bytes_received <= spec.max_message(lanes)
        assert e.last_stats.bytes_received <= spec.max_message(lanes)
        off += k
    raise AssertionError("no final chunk")


async def test_protocol_runs_a_stream_in_chunks(mpc_engine: str) -> None:
    """Both parties learn the one-tournament argmax, and only at the end: a
    non-final chunk sends the garbler an empty result; chunks span lane
    batches (streamed) and single candidates."""
    rng = np.random.default_rng(5)
    g, e = await connected_pair()
    assert g.engine == e.engine == mpc_engine
    streams = [([3, 4], 8), ([1, 1, 1], 64), ([5000, LANE_BATCH, 3], 40), ([4091, 10], 16)]
    streams += [([7, 2, 5], 13), ([LANE_BATCH + 5, 9], 33)]  # widths that are not whole bytes
    for sizes, w in streams:
        d = sum(sizes)
        z = rng.integers(-100, 100, d)
        z[rng.integers(0, d)] = 100  # a tie or two at the top, at random places
        got = await run_stream(g, e, z, sizes, w, rng)
        a, b = share(z, rng)
        assert got == [plain_argmax(a, b, w)] * 2
    # A non-final chunk: the evaluator's last message is empty.
    a, b = share([4, 9], rng)
    before = g.channel.bytes_received
    cg, ce = await asyncio.gather(
        g.noisy_max_carry(a, None, 0, 64), e.noisy_max_carry(b, None, 0, 64)
    )
    assert g.channel.bytes_received - before == g.last_stats.bytes_received
    assert cg.shape == ce.shape == (carry_lanes(64),)
    assert carry_value_index(cg ^ ce, 64) == (9, 1)


async def evaluator_views(z: np.ndarray, w: int, runs: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The carry lanes the evaluator holds after a first chunk of z, over
    `runs` fresh pairs, and the winner's own lanes (the unmasked carry)."""
    rng = np.random.default_rng(8)
    views = []
    for _ in range(runs):
        g, e = await connected_pair()
        a, b = share(z, rng)
        cg, ce = await asyncio.gather(
            g.noisy_max_carry(a, None, 0, w), e.noisy_max_carry(b, None, 0, w)
        )
        views.append(ce)
    v, j = plain_noisy_max_chunk(a, b, 0, None, w)
    return views, carry_words(carry_bits_of(v, j, w), w)


def leaks(views: list[np.ndarray], winner: np.ndarray) -> bool:
    """The evaluator's view gives the winner away: it equals the winner's
    lanes, or repeats across runs (a fixed mask: one known run unmasks all)."""
    seen = {v.tobytes() for v in views}
    return winner.tobytes() in seen or len(seen) < len(views)


async def test_the_garbler_masks_each_carry_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the protocol: the evaluator's share of the carried winner is
    never the winner and never repeats; a garbler whose masks are all zero
    (broken on purpose) is caught by the same check."""
    z = np.array([3, -7, 12, 12, 0])
    views, winner = await evaluator_views(z, 16, 4)
    assert carry_value_index(views[0] ^ views[0], 16) == (0, 0)
    assert not leaks(views, winner)
    monkeypatch.setattr(
        ComparisonGarbler, "_carry_mask", lambda self, w: np.zeros(carry_bits(w), np.uint8)
    )
    views, winner = await evaluator_views(z, 16, 4)
    assert leaks(views, winner) and carry_value_index(views[0], 16) == (12, 2)


@needs_native
@pytest.mark.parametrize("engines", [("native", "numpy"), ("numpy", "native")])
async def test_engines_interoperate(engines: tuple[str, str]) -> None:
    g, e = await cross_engine_pair(*engines, b"tourney-cross")
    rng = np.random.default_rng(6)
    for sizes, w in (([5, 6], 64), ([300, LANE_BATCH + 3, 2], 16)):
        z = rng.integers(-1000, 1000, sum(sizes))
        a, b = share(z, rng)
        assert (
            await run_stream(g, e, z, sizes, w, np.random.default_rng(0))
            == [plain_argmax(*share(z, np.random.default_rng(0)), w)] * 2
        )


@needs_native
@pytest.mark.parametrize(
    ("k", "w", "final"),
    [(37, 64, False), (LANE_BATCH + 300, 40, False), (LANE_BATCH - 1, 16, True), (99, 33, False)],
)
def test_engines_garble_the_same_bytes(k: int, w: int, final: bool) -> None:
    """Numpy and native garblers given the same Δ, input labels, garbler bits
    and masks write the same tables of a carry chunk and hold the same output
    labels; both evaluators reach the same active labels, which decode to the
    reference's carry (or index)."""
    rng = np.random.default_rng(k)
    carried = (1 << (w - 3), 77)
    z = rng.integers(-(1 << (w - 2)), 1 << (w - 2), k)
    a, b = share(z, rng)
    ga, eb = xor_shared(*carried, w, rng)
    a, b = np.concatenate([ga, a]), np.concatenate([eb, b])
    n = a.size
    where = TournamentChunk(100, True, final)
    mask = rng.integers(0, 2, carry_bits(w), dtype=np.uint8)
    d = rng.integers(0, M64, 2, dtype=np.uint64, endpoint=False)
    d[0] |= np.uint64(1)
    labels0 = rng.integers(0, M64, (w, n, 2), dtype=np.uint64, endpoint=False)
    gb = [
        GarbleBackend(d, TweakableHash(), 92),
        native.NativeGarbleBackend(d, native.NativeHash(), 92),
    ]
    outs = [
        noisy_max_chunk_circuit(be, bit_planes(a), planes(labels0), n, w, where, mask) for be in gb
    ]
    assert gb[0].table_bytes() == gb[1].table_bytes()
    assert len(gb[0].table_bytes()) <= 16 * 2 * noisy_max_chunk_and_gates(k, w, where)
    assert all(np.array_equal(x, y) for x, y in zip(outs[0], outs[1], strict=True))
    bw = bit_planes(b)[:w].astype(np.uint64)
    active = labels0 ^ ((-bw)[..., None] & d)
    tables = gb[0].table_bytes()
    eb_ = [
        EvalBackend(TweakableHash(), 92, tables),
        native.NativeEvalBackend(native.NativeHash(), 92, tables),
    ]
    act = [noisy_max_chunk_circuit(be, None, planes(active), n, w, where) for be in eb_]
    for be in eb_:
        be.done()
    assert all(np.array_equal(x, y) for x, y in zip(act[0], act[1], strict=True))
    bits = [eb_[0].decode(x, gb[0].decoding(x0)) for x, x0 in zip(act[0], outs[0], strict=True)]
    want = plain_noisy_max_chunk(a[carry_lanes(w) :], b[carry_lanes(w) :], 100, carried, w)
    if final:
        assert argmax_index(bits) == want[1]
    else:
        assert carry_value_index(carry_words(bits[0] ^ mask, w), w) == want


@pytest.mark.heavy
async def test_protocol_beyond_one_chunk(mpc_engine: str) -> None:
    """2.5·10^5 candidates, more than a chunk holds, in three chunks of at most
    10^5 (each 25 lane batches), tied maxima in the first and the last chunk:
    the first wins."""
    rng = np.random.default_rng(18)
    z = rng.integers(-(1 << 30), 1 << 30, 250_000)
    z[[99_999, 150_000, 249_999]] = 1 << 31
    g, e = await connected_pair()
    got = await run_stream(g, e, z, [100_000, 100_000, 50_000], 40, rng)
    assert got == [99_999] * 2
