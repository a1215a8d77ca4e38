"""The two-party protocol over a MemoryChannel against the plaintext reference:
first-YES and CompareToThresholds, boundaries, several chunks per session, what
each party sees, and costs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from svtagg.mpc.channel import Channel, MemoryChannel
from svtagg.mpc.circuits import plain_compare_to_thresholds, plain_first_yes
from svtagg.mpc.protocol import (
    ComparisonEvaluator,
    ComparisonGarbler,
    connected_pair,
    run_compare_to_thresholds,
    run_first_yes,
)

RNG = np.random.default_rng(4)
M63 = 2**63
BOUNDARY_SUMS = [0, 1, -1, 2**62, -(2**62), M63 - 1, -(M63 - 1), -(2**63)]


def split(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(sums, dtype=np.int64).view(np.uint64)
    z_l = RNG.integers(0, 2**64, z.shape[0], dtype=np.uint64)
    return z_l, z - z_l


@pytest.fixture
async def pair() -> tuple[ComparisonGarbler, ComparisonEvaluator]:
    return await connected_pair(b"test-session")


def test_channel_satisfies_protocol() -> None:
    a, _ = MemoryChannel.pair()
    assert isinstance(a, Channel)


async def test_run_first_yes_random() -> None:
    sums = RNG.integers(-(2**50), 0, 2000)
    sums[1500] = 7
    z_l, z_h = split(sums)
    assert await run_first_yes(z_l, z_h) == plain_first_yes(z_l, z_h) == 1500


async def test_boundaries_each_as_its_own_chunk(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    for s in BOUNDARY_SUMS:
        for z_l0 in (0, 2**63, 2**64 - 1, int(RNG.integers(0, 2**63))):
            z = np.array([s], dtype=np.int64).view(np.uint64)
            z_l = np.array([z_l0], dtype=np.uint64)
            z_h = z - z_l
            got = await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
            expect = 0 if s >= 0 else None
            assert got == [expect, expect], (s, z_l0)


async def test_many_chunks_one_session(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    for k in (1, 7, 100, 4097, 9000):  # crosses the lane-batch boundary
        sums = RNG.integers(-(2**30), -1, k)
        if k > 3:
            sums[RNG.integers(0, k)] = int(RNG.integers(0, 2**30))
        z_l, z_h = split(sums)
        got = await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
        assert got[0] == got[1] == plain_first_yes(z_l, z_h)
    none_l, none_h = split(-np.arange(1, 50))
    assert await asyncio.gather(g.first_yes(none_l), e.first_yes(none_h)) == [None, None]
    assert await asyncio.gather(g.first_yes(none_l[:0]), e.first_yes(none_h[:0])) == [None, None]


async def test_stats_and_wire_cost(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    k = 1000
    z_l, z_h = split(RNG.integers(-100, -1, k))
    await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
    st = g.last_stats
    assert st.messages == 3 and st.comparisons == k
    assert st.and_gates == e.last_stats.and_gates and 63 * k < st.and_gates < 66 * k
    assert st.bytes_sent == e.last_stats.bytes_received
    assert st.bytes_received == e.last_stats.bytes_sent
    per = (st.bytes_sent + st.bytes_received) / k
    assert per < 4096, per
    # Message sizes depend on K only: a chunk whose first YES is early costs the same.
    sums = RNG.integers(-100, -1, k)
    sums[3] = 1
    z_l2, z_h2 = split(sums)
    assert await asyncio.gather(g.first_yes(z_l2), e.first_yes(z_h2)) == [3, 3]
    st2 = g.last_stats
    assert (st2.bytes_sent, st2.bytes_received) == (st.bytes_sent, st.bytes_received)


async def test_garbler_input_labels_match_evaluator_view(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    g.input_labels_log, e.input_labels_log = [], []
    k = 50
    z_l, z_h = split(RNG.integers(-5, 5, k))
    await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
    q, t = g.input_labels_log[0], e.input_labels_log[0]
    bits = ((z_h[None, :] >> np.arange(64, dtype=np.uint64)[:, None]) & np.uint64(1)).reshape(-1)
    assert np.array_equal(t, q ^ ((-bits)[:, None] & g.delta))


async def test_tweaks_unique_across_chunks(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    g.tweak_log = []
    for _ in range(3):
        z_l, z_h = split(RNG.integers(-5, 5, 100))
        await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
        await asyncio.gather(g.compare_to_thresholds(z_l, z_h), e.compare_to_thresholds(z_h, z_l))
    tw = np.concatenate(g.tweak_log)
    assert np.unique(tw, axis=0).shape[0] == tw.shape[0]


async def test_two_sessions_have_different_delta_and_tables() -> None:
    z_l, z_h = split(RNG.integers(-5, 5, 20))
    first_labels = []
    deltas = []
    for sid in (b"s1", b"s2"):
        ga, gb = MemoryChannel.pair()
        g, e = ComparisonGarbler(ga, sid), ComparisonEvaluator(gb, sid)
        await asyncio.gather(g.setup(), e.setup())
        e.label_log = []
        await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
        deltas.append(bytes(g.delta))
        first_labels.append(bytes(e.label_log[0]))
    assert deltas[0] != deltas[1] and first_labels[0] != first_labels[1]


async def test_compare_to_thresholds_matches_plaintext(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    for _ in range(4):
        k = 300
        hi = RNG.integers(-400, 5, k)
        lo = hi + RNG.integers(0, 500, k)
        h_l, h_h = split(hi)
        l_l, l_h = split(lo)
        got = await asyncio.gather(
            g.compare_to_thresholds(h_l, l_l), e.compare_to_thresholds(h_h, l_h)
        )
        assert got[0] == got[1] == plain_compare_to_thresholds(h_l + h_h, l_l + l_h)


@pytest.mark.parametrize("scheme", ["halfgates", "threehalves"])
@pytest.mark.parametrize("ot", ["iknp", "softspoken:2", "softspoken:8", "ferret:test"])
async def test_every_scheme_and_extension_at_widths_that_are_not_whole_bytes(
    scheme: str, ot: str, mpc_engine: str
) -> None:
    """First-YES chunks at 13 and 33 bits give the plaintext answer under both
    garbling schemes and every OT extension (whose batches end in padding bits),
    from one query to more than a lane batch."""
    g, e = await connected_pair(b"odd-" + ot.encode(), scheme=scheme, ot=ot)
    for width in (13, 33):
        half = 1 << (width - 1)
        for k in (1, 7, 5000):
            z = RNG.integers(-(half - 1), half, k).astype(np.int64)
            z[: k // 2] = -np.abs(z[: k // 2]) - 1  # the first YES in the second half
            z_l, z_h = split(z)
            got = await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))
            assert got[0] == got[1] == next((i for i in range(k) if z[i] >= 0), None)


@pytest.mark.parametrize("width", [11, 33])
async def test_compare_to_thresholds_at_widths_that_are_not_whole_bytes(width: int) -> None:
    """CompareToThresholds at w bits: the same codes as in plaintext for sums up to
    ±(2^(w−1) − 1), over more than one lane batch (two inputs per query)."""
    g, e = await connected_pair(b"odd-width")
    half = 1 << (width - 1)
    k = 2500  # 5,000 input lanes: two lane batches, the second one padded
    hi = RNG.integers(-(half - 1), half, k)
    lo = np.where(hi < 0, RNG.integers(0, half, k), hi)  # HIGH or LOW until ...
    hi[:4], lo[:4] = [half - 1, -(half - 1), -1, 0], [half - 1, half - 1, 0, 0]
    hi[k - 3], lo[k - 3] = -(half - 1), -1  # ... the one CLOSE, in the second batch
    h_l, h_h = split(hi)
    l_l, l_h = split(lo)
    got = await asyncio.gather(
        g.compare_to_thresholds(h_l, l_l, width), e.compare_to_thresholds(h_h, l_h, width)
    )
    assert got[0] == got[1] == plain_compare_to_thresholds(h_l + h_h, l_l + l_h)


async def test_ctt_nothing_after_first_close() -> None:
    hi = np.array([0, -5, 3, -9, 10, -1])
    lo = np.array([1, 2, 9, -1, 10, 0])
    expect = [0, 1, 0, 2]
    h_l, h_h = split(hi)
    l_l, l_h = split(lo)
    assert await run_compare_to_thresholds(h_l, l_l, h_h, l_h) == expect
    # Changing queries after the first CLOSE changes nothing either party sees.
    hi2, lo2 = hi.copy(), lo.copy()
    hi2[4:], lo2[4:] = [-7, 8], [-7, 9]
    h_l, h_h = split(hi2)
    l_l, l_h = split(lo2)
    assert await run_compare_to_thresholds(h_l, l_l, h_h, l_h) == expect
    # No CLOSE at all: every outcome is revealed.
    h_l, h_h = split(np.array([5, -5]))
    l_l, l_h = split(np.array([6, 0]))
    assert await run_compare_to_thresholds(h_l, l_l, h_h, l_h) == [0, 1]


async def test_requires_setup_and_valid_inputs() -> None:
    a, b = MemoryChannel.pair()
    g = ComparisonGarbler(a, b"x")
    with pytest.raises(RuntimeError):
        await g.first_yes(np.zeros(3, np.uint64))
    with pytest.raises(ValueError):
        ComparisonEvaluator(b, b"")
    g2, e2 = await connected_pair()
    with pytest.raises(TypeError):
        await g2.first_yes(np.zeros(3, np.float64))
    with pytest.raises(ValueError):
        await e2.compare_to_thresholds(np.zeros(3, np.uint64), np.zeros(2, np.uint64))


async def test_mismatched_lengths_are_refused(pair) -> None:  # type: ignore[no-untyped-def]
    g, e = pair
    z_l, z_h = split(RNG.integers(-5, 5, 16))
    helper = asyncio.create_task(e.first_yes(z_h[:8]))
    with pytest.raises(ValueError):
        await g.first_yes(z_l)
    helper.cancel()  # the helper would wait for tables; the servers' deadlines end it


@pytest.mark.heavy
async def test_large_chunks_match_plaintext() -> None:
    g, e = await connected_pair()
    k = 100_000
    sums = RNG.integers(-(2**60), 0, k)
    sums[k - 3] = 0
    z_l, z_h = split(sums)
    got = await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
    assert got == [k - 3, k - 3]
    hi = RNG.integers(-(2**40), 0, k // 2)
    lo = hi + RNG.integers(0, 2**41, k // 2)
    h_l, h_h = split(hi)
    l_l, l_h = split(lo)
    got2 = await asyncio.gather(
        g.compare_to_thresholds(h_l, l_l), e.compare_to_thresholds(h_h, l_h)
    )
    assert got2[0] == got2[1] == plain_compare_to_thresholds(h_l + h_h, l_l + l_h)


def test_ctt_result_message_has_a_fixed_length() -> None:
    """Where a CompareToThresholds chunk closed must not show in the size of the
    evaluator's result message: a CLOSE at the first query and no CLOSE at all
    send the same number of bytes."""
    import asyncio

    from svtagg.mpc.protocol import connected_pair

    async def run() -> None:
        g, e = await connected_pair()
        k = 16
        far = np.full(k, 1 << 40, dtype=np.uint64)  # z ≥ 0: YES on the high side
        neg = (np.zeros(k, dtype=np.int64) - 5).view(np.uint64)  # z < 0: NO
        zero = np.zeros(k, dtype=np.uint64)
        # all HIGH (no CLOSE)
        out = await asyncio.gather(
            g.compare_to_thresholds(far, neg), e.compare_to_thresholds(zero, zero)
        )
        assert out[0] == out[1] == [0] * k
        sent_open = e.last_stats.bytes_sent
        # CLOSE at once (neither side YES)
        out = await asyncio.gather(
            g.compare_to_thresholds(neg, neg), e.compare_to_thresholds(zero, zero)
        )
        assert out[0] == out[1] == [2]
        assert e.last_stats.bytes_sent == sent_open

    asyncio.run(run())


@pytest.mark.parametrize("width", [2, 3, 8, 13, 16, 33, 35, 40, 63, 64])
def test_narrow_comparisons_at_the_width_boundaries(width: int, mpc_engine: str) -> None:
    """With |z_L + z_H| < 2^(w−1) the w-bit circuit answers exactly as the 64-bit
    one: checked at 0, ±1 and ±(2^(w−1) − 1), on random shares and past a lane
    batch, on both engines and at widths that are not whole bytes (whose OT
    batches end in padding bits).  At ±2^(w−1) the bound is broken and the w-bit
    answer is wrong (+2^(w−1) reads as negative), which shows the bound is tight."""
    import asyncio

    from svtagg.mpc.protocol import connected_pair

    half = 1 << (width - 1)
    rng = np.random.default_rng(width)
    inside = [0, 1, -1, half - 1, -(half - 1), half - 2, -(half - 2)]
    z = np.array(inside * 700, dtype=np.int64)  # 4,900 lanes: two lane batches
    z_l = rng.integers(0, 2**64, z.size, dtype=np.uint64)
    z_h = z.view(np.uint64) - z_l

    async def run() -> None:
        g, e = await connected_pair()
        for j in (0, 3, 4, 1, z.size - 1):
            # Make lane j the only YES: all lanes before it get a negative sum.
            zz = z.copy()
            zz[:j] = -np.abs(zz[:j]) - (zz[:j] == 0)
            hl = zz.view(np.uint64) - z_l
            expect = next((i for i in range(zz.size) if zz[i] >= 0), None)
            got = await asyncio.gather(g.first_yes(z_l, width), e.first_yes(hl, width))
            assert got[0] == got[1] == expect
            assert g.last_stats.bytes_received + g.last_stats.bytes_sent > 0
        # The bound is tight: +2^(w−1) wraps to the negative half in w bits.
        if width < 64:
            over = np.array([half], dtype=np.int64)
            a = rng.integers(0, 2**64, 1, dtype=np.uint64)
            got = await asyncio.gather(
                g.first_yes(a, width), e.first_yes(over.view(np.uint64) - a, width)
            )
            assert got == [None, None]  # wrong on purpose: outside the bound

    asyncio.run(run())
    assert z_h.size == z.size


def test_narrow_width_sends_fewer_bytes() -> None:
    import asyncio

    from svtagg.mpc.protocol import connected_pair

    async def run() -> tuple[int, int]:
        g, e = await connected_pair()
        z = np.zeros(1000, dtype=np.uint64) - np.uint64(5)  # all NO
        sizes = []
        for w in (64, 40):
            await asyncio.gather(g.first_yes(z, w), e.first_yes(np.zeros_like(z), w))
            sizes.append(g.last_stats.bytes_sent + g.last_stats.bytes_received)
        return sizes[0], sizes[1]

    full, narrow = asyncio.run(run())
    # 64-bit: 3,088 B per comparison; 40-bit: (39·2 + ...)·16 + 40·16 ≈ 1.9 KB.
    assert narrow < 0.66 * full, (full, narrow)


async def test_streamed_chunks_match_plaintext_and_cost_the_same(pair) -> None:  # type: ignore[no-untyped-def]
    """A chunk of several lane batches goes out batch by batch: one message per
    batch plus the rest, the same bytes in all, every circuit kind decided right."""
    from svtagg.mpc.circuits import LANE_BATCH
    from svtagg.mpc.protocol import first_yes_spec

    g, e = pair
    k = 2 * LANE_BATCH + 17
    assert first_yes_spec(40).parts(k) == 4 and first_yes_spec(40).parts(LANE_BATCH) == 1
    sums = RNG.integers(-(2**30), 0, k)
    sums[LANE_BATCH + 5] = 0
    z_l, z_h = split(sums)
    got = await asyncio.gather(g.first_yes(z_l, 40), e.first_yes(z_h, 40))
    assert got == [LANE_BATCH + 5] * 2
    st = g.last_stats
    assert st.messages == 2 + 4
    # Validation's grouped OR, streamed: group 8, one invalid group.
    grp = 8
    sums = RNG.integers(-(2**30), 0, 640 * grp)
    sums[grp * 333 + 2] = 7
    z_l, z_h = split(sums)
    bits = await asyncio.gather(g.any_per_group(z_l, grp), e.any_per_group(z_h, grp))
    assert bits[0] == bits[1] == [i == 333 for i in range(640)]
    # Groups of one: no gate after the sign test, the last part is decoding bits alone.
    sums = RNG.integers(-(2**30), 0, LANE_BATCH + 10)
    sums[LANE_BATCH + 4] = 3
    z_l, z_h = split(sums)
    bits = await asyncio.gather(g.any_per_group(z_l, 1), e.any_per_group(z_h, 1))
    assert bits[0] == bits[1] == [i == LANE_BATCH + 4 for i in range(LANE_BATCH + 10)]


async def test_streaming_sends_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same chunk streamed and in one message: equal byte counts both ways."""
    from svtagg.mpc.circuits import LANE_BATCH
    from svtagg.mpc.protocol import ChunkCircuit

    k = 2 * LANE_BATCH + 17
    z_l, z_h = split(RNG.integers(-(2**30), 0, k))
    counts = []
    for streamed in (True, False):
        if not streamed:
            monkeypatch.setattr(ChunkCircuit, "parts", lambda self, k: 1)
        g, e = await connected_pair(b"same-bytes")
        got = await asyncio.gather(g.first_yes(z_l, 40), e.first_yes(z_h, 40))
        assert got == [None, None]
        counts.append((g.last_stats.bytes_sent, g.last_stats.bytes_received))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("fault", ["short part", "connection lost"])
async def test_streamed_chunk_fails_instead_of_hanging(fault: str) -> None:
    """The evaluator pulls parts from a worker thread: a malformed part or a
    channel that ends mid-chunk fails the chunk (and frees the thread)."""
    from svtagg.mpc.circuits import LANE_BATCH

    cg, ce = MemoryChannel.pair()
    g, e = ComparisonGarbler(cg, b"dies"), ComparisonEvaluator(ce, b"dies")
    await asyncio.gather(g.setup(), e.setup())
    k = 3 * LANE_BATCH
    z_l, z_h = split(RNG.integers(-(2**30), 0, k))

    class Dropped(Exception):
        pass

    sent = 0
    real_send, real_recv = cg.send, ce.recv
    dead = asyncio.Event()

    async def send_two_then_die(data: bytes) -> None:
        nonlocal sent
        sent += 1
        if sent > 2:  # the first two table parts go out, then the garbler dies
            if fault == "short part":
                await ce._inbox.put(b"")
            dead.set()
            raise Dropped
        await real_send(data)

    async def recv_until_lost() -> bytes:
        """Like a real channel: a receive fails once the peer is gone."""
        got = asyncio.ensure_future(real_recv())
        gone = asyncio.ensure_future(dead.wait())
        done, _ = await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if got in done:
            return got.result()
        got.cancel()
        raise ConnectionError("peer closed the session")

    cg.send = send_two_then_die  # type: ignore[method-assign]
    if fault == "connection lost":
        ce.recv = recv_until_lost  # type: ignore[method-assign]
    res = await asyncio.wait_for(
        asyncio.gather(g.first_yes(z_l, 40), e.first_yes(z_h, 40), return_exceptions=True), 30
    )
    assert isinstance(res[0], Dropped)
    want = ValueError if fault == "short part" else ConnectionError
    assert isinstance(res[1], want), res[1]
