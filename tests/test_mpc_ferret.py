"""Ferret silent OT (`svtagg.mpc.ferret`): the COT correlation after the
single-point COTs alone and after full extensions, the two engines byte for
byte, the pool (order, no reuse, refills exactly when short, one bit per OT in
a chunk), the garbler's view, broken controls, malformed messages, and the
comparison protocol on top."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import test_mpc_protocol as protocol_tests
from scipy import stats

from svtagg.mpc import ferret, native
from svtagg.mpc.aes import Blocks
from svtagg.mpc.channel import MemoryChannel
from svtagg.mpc.ferret import (
    LPN_D,
    LPN_SETS,
    FerretReceiver,
    FerretSender,
    LpnSet,
    lpn_expand,
    lpn_indices,
    lpn_seed,
)
from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler, connected_pair
from svtagg.mpc.softspoken import bytes_per_ot, extension_bound, parse_ot

ENGINES = ["numpy", "native"] if native.available() else ["numpy"]
SID = b"ferret-test-session"


@pytest.fixture
def engine_restore() -> Iterator[None]:
    before = native.active()
    yield
    native.use(before)


def _delta() -> Blocks:
    d = np.frombuffer(os.urandom(16), dtype=np.uint64).copy()
    d[0] |= np.uint64(1)
    return d


def _times(bits: np.ndarray, delta: Blocks) -> Blocks:
    return (np.uint64(0) - bits.astype(np.uint64))[:, None] & delta[None, :]


def _seeded(name: str, delta: Blocks | None = None) -> tuple[FerretSender, FerretReceiver]:
    """A sender and receiver whose first reserve is dealt directly (random COTs under Δ)."""
    d = _delta() if delta is None else delta
    tx, rx = FerretSender(SID, d, name), FerretReceiver(SID, name)
    m = tx.current().base
    q = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(m, 2).copy()
    r = np.frombuffer(os.urandom(m), dtype=np.uint8) & 1
    tx.seed_reserve(q)
    rx.seed_reserve(r, q ^ _times(r, d))
    return tx, rx


def _extend(tx: FerretSender, rx: FerretReceiver) -> None:
    msg, alphas = rx.request()
    rx.finish(tx.reply(msg), alphas)


def _check_pools(tx: FerretSender, rx: FerretReceiver) -> None:
    assert tx.available() == rx.available()
    q, t, r = tx.pool_q[tx.pos :], rx.pool_t[rx.pos :], rx.pool_r[rx.pos :]
    assert np.array_equal(t, q ^ _times(r, tx.delta))
    assert np.array_equal(rx.res_t, tx.res_q ^ _times(rx.res_r, tx.delta))


# ---------------------------------------------------------------- correlation


@pytest.mark.parametrize("name", ["tiny", "test", "b10"])
def test_spcot_alone_gives_unit_vectors_times_delta(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the LPN matrix taken as zero, an extension's outputs are the SPCOTs':
    the garbler's leaves v, the evaluator's v ⊕ e_α·Δ, one noise position per bin."""

    def no_lpn(
        seed: bytes, first: int, base: Blocks, noise: Blocks, out: Blocks, bits: Any = None
    ) -> Any:
        np.copyto(out, noise)
        return None if bits is None else bits[1].copy()

    monkeypatch.setattr(ferret, "lpn_expand", no_lpn)
    s = ferret.first_set(name)
    tx, rx = _seeded(name)
    alphas = np.frombuffer(os.urandom(4 * s.t), "<u4").astype(np.int64) % (1 << s.depth)
    alphas[0], alphas[-1] = 0, (1 << s.depth) - 1  # both ends of a bin
    rx.fixed_alphas = alphas
    _extend(tx, rx)
    nxt = LPN_SETS[name]
    q = np.concatenate([tx.res_q, tx.pool_q])
    t = np.concatenate([rx.res_t, rx.pool_t])
    r = np.concatenate([rx.res_r, rx.pool_r])
    assert q.shape[0] == s.n and nxt.base < s.n
    e = np.zeros((s.t, 1 << s.depth), dtype=np.uint8)
    e[np.arange(s.t), alphas] = 1
    assert np.array_equal(r, e.reshape(-1))
    assert np.array_equal(t, q ^ _times(r, tx.delta))
    # The punctured leaf is not the garbler's leaf: it is that leaf ⊕ Δ.
    assert not np.array_equal(t[alphas[0]], q[alphas[0]])


@pytest.mark.parametrize("name", ["tiny", "test", "b10"])
@pytest.mark.parametrize("engine", ENGINES)
def test_full_extensions_keep_the_correlation(name: str, engine: str, engine_restore: None) -> None:
    native.use(engine)
    tx, rx = _seeded(name)
    for i in range(3 if name != "b10" else 2):
        _extend(tx, rx)
        _check_pools(tx, rx)
        assert tx.extensions == rx.extensions == i + 1
    if name == "b10":  # choice bits are A·r_k ⊕ e: balanced
        assert abs(float(rx.pool_r.mean()) - 0.5) < 0.01


def test_parameter_sets() -> None:
    """The published sets (emp-ot tuning.h) and their derived sizes."""
    assert LPN_SETS["b10"].n == 870_400 and LPN_SETS["b11"].n == 2_396_160
    assert LPN_SETS["b12"].n == 6_225_920 and LPN_SETS["b13"].n == 15_564_800
    for s in LPN_SETS.values():
        assert s.base < s.n and s.k & (s.k - 1) == 0
        assert s.base + LPN_SETS["b10"].base < s.n or s.name in ("test", "tiny")
    assert LPN_SETS["b10"].base == 65_536 + 8_500
    assert ferret.first_set("b13").name == ferret.first_set("b11").name == "b10"
    assert LPN_SETS["b10"].reply_bytes() == 4 + 16 * 850 * 21
    assert LPN_SETS["b10"].request_bytes() == 4 + (850 * 10 + 7) // 8


# ---------------------------------------------------------------- the two engines


@pytest.mark.skipif(not native.available(), reason="native core not built")
@pytest.mark.parametrize(
    ("k", "first", "count"), [(16, 0, 2), (256, 6, 100), (1 << 16, 1024, 4096)]
)
def test_native_lpn_matches_the_reference(
    k: int, first: int, count: int, engine_restore: None
) -> None:
    seed = os.urandom(16)
    base = np.frombuffer(os.urandom(16 * k), np.uint64).reshape(k, 2).copy()
    noise = np.frombuffer(os.urandom(16 * count), np.uint64).reshape(count, 2).copy()
    bb = np.frombuffer(os.urandom(k), np.uint8) & 1
    nb = np.frombuffer(os.urandom(count), np.uint8) & 1
    outs = {}
    for engine in ("numpy", "native"):
        native.use(engine)
        out = np.empty_like(noise)
        bits = lpn_expand(seed, first, base, noise, out, (bb, nb))
        outs[engine] = (out.tobytes(), bytes(np.asarray(bits)))
    assert outs["numpy"] == outs["native"]
    idx = lpn_indices(seed, first, count, k)
    assert idx.shape == (count, LPN_D) and int(idx.max()) < k


@pytest.mark.skipif(not native.available(), reason="native core not built")
def test_native_lpn_refuses_bad_shapes() -> None:
    core, sched = native.core(), native.core().expand_keys(bytes(16))
    base, noise = np.zeros((16, 2), np.uint64), np.zeros((4, 2), np.uint64)
    for args in ((sched, 1, 4, 15), (sched, 0, 3, 15), (sched, 0, 4, 14), (sched[:16], 0, 4, 15)):
        with pytest.raises(ValueError):
            core.fr_lpn(*args, base, noise, np.empty_like(noise))
    with pytest.raises(ValueError):  # base shorter than k
        core.fr_lpn(sched, 0, 4, 31, base, noise, np.empty_like(noise))
    with pytest.raises(ValueError):  # output too short
        core.fr_lpn(sched, 0, 4, 15, base, noise, np.empty((2, 2), np.uint64))


@pytest.mark.skipif(not native.available(), reason="native core not built")
@pytest.mark.parametrize("name", ["tiny", "test", "b10"])
def test_engines_give_the_same_extension(
    name: str, engine_restore: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same reserve, seeds and noise give the same messages and pools on both engines."""
    d = _delta()
    base = _seeded(name, d)
    runs = []
    for engine in ("numpy", "native"):
        native.use(engine)
        tx, rx = FerretSender(SID, d, name), FerretReceiver(SID, name)
        tx.seed_reserve(base[0].res_q)
        rx.seed_reserve(base[1].res_r, base[1].res_t)
        stream = np.random.default_rng(7)
        monkeypatch.setattr(ferret.os, "urandom", lambda n, s=stream: s.bytes(n))
        msg, alphas = rx.request()
        reply = tx.reply(msg)
        rx.finish(reply, alphas)
        runs.append((msg, reply, tx.pool_q.tobytes(), rx.pool_t.tobytes(), rx.pool_r.tobytes()))
    assert runs[0] == runs[1]


# ---------------------------------------------------------------- the pool and the protocol


@pytest.fixture
async def ferret_pair() -> tuple[ComparisonGarbler, ComparisonEvaluator]:
    return await connected_pair(b"test-session", ot="ferret:test")


@pytest.mark.parametrize(
    "test",
    [
        protocol_tests.test_boundaries_each_as_its_own_chunk,
        protocol_tests.test_many_chunks_one_session,
        protocol_tests.test_garbler_input_labels_match_evaluator_view,
        protocol_tests.test_tweaks_unique_across_chunks,
        protocol_tests.test_compare_to_thresholds_matches_plaintext,
        protocol_tests.test_mismatched_lengths_are_refused,
        protocol_tests.test_streamed_chunks_match_plaintext_and_cost_the_same,
    ],
    ids=lambda f: f.__name__,
)
async def test_the_protocol_tests_pass_on_ferret(
    test: Callable[[Any], Any], ferret_pair: tuple[ComparisonGarbler, ComparisonEvaluator]
) -> None:
    await test(ferret_pair)


@pytest.mark.parametrize("engine", ENGINES)
async def test_comparisons_on_a_published_set(engine: str, engine_restore: None) -> None:
    native.use(engine)
    rng = np.random.default_rng(11)
    z = rng.integers(-(2**30), 2**30, size=3000)
    z[:2000] = -np.abs(z[:2000]) - 1
    zl = rng.integers(0, 2**63, size=3000, dtype=np.uint64)
    zh = z.astype(np.int64).view(np.uint64) - zl
    g, e = await connected_pair(ot="ferret:b10")
    a, b = await asyncio.gather(g.first_yes(zl, 40), e.first_yes(zh, 40))
    assert a == b == int(np.argmax(z >= 0))
    # No extension ran in the chunk: the evaluator sent w·K bits and the result.
    assert e.last_stats.bytes_sent == 3000 * 40 // 8 + 8
    assert g._ext.extensions == e._ext.extensions == 1


async def test_pools_draw_in_order_and_never_reuse() -> None:
    g, e = await connected_pair(b"reuse", ot="ferret:test")
    g.input_labels_log, e.input_labels_log = [], []
    rng = np.random.default_rng(3)
    drawn = 0
    for k in (1, 5, 40, 200, 3):
        z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
        z_h = rng.integers(0, 2**64, k, dtype=np.uint64)
        before = (g._ext.consumed, e._ext.consumed)
        await asyncio.gather(g.first_yes(z_l, 16), e.first_yes(z_h, 16))
        assert g._ext.consumed - before[0] == e._ext.consumed - before[1] == 16 * k
        drawn += 16 * k
        assert g._ext.pos == e._ext.pos and g._ext.available() == e._ext.available()
    assert g._ext.consumed == e._ext.consumed == drawn
    q = np.concatenate(g.input_labels_log)
    t = np.concatenate(e.input_labels_log)
    assert q.shape[0] == drawn
    # Every garbler 0-label (q ⊕ d·Δ) and every evaluator label is fresh.
    assert np.unique(q, axis=0).shape[0] == drawn
    assert np.unique(t, axis=0).shape[0] == drawn


async def test_extensions_run_exactly_when_the_pool_is_short() -> None:
    g, e = await connected_pair(b"refill", ot="ferret:test")
    s = LPN_SETS["test"]
    per = s.n - s.base  # COTs each later extension adds to the pool
    rng = np.random.default_rng(9)
    for k in (1, 3, 50, 120, 7, 64, 200):
        need, have, ext0 = 8 * k, e._ext.available(), e._ext.extensions
        want = 0 if have >= need else -(-(need - have) // per)
        z = rng.integers(0, 2**64, k, dtype=np.uint64)
        await asyncio.gather(g.first_yes(z, 8), e.first_yes(z, 8))
        assert e._ext.extensions - ext0 == g._ext.extensions - ext0 == want, (k, have)
        assert e._ext.available() == have + want * per - need
        extra = 0 if want == 0 else want * s.request_bytes()
        assert e.last_stats.bytes_sent == need // 8 + extra + 8  # d bits, requests, result
    assert ferret_reply_bound_ok()


async def test_widths_that_are_not_whole_bytes_draw_padded_batches() -> None:
    """At a width that is not a whole number of bytes a chunk draws its w·k OTs
    padded to whole bytes, the pool refills exactly when that many are short,
    and the answers are the plaintext's."""
    g, e = await connected_pair(b"odd-width", ot="ferret:test")
    s = LPN_SETS["test"]
    per = s.n - s.base
    rng = np.random.default_rng(13)
    for k, w in ((1, 13), (3, 13), (50, 33), (120, 13), (7, 35), (200, 33)):
        need, have, ext0 = 8 * -(-w * k // 8), e._ext.available(), e._ext.extensions
        want = 0 if have >= need else -(-(need - have) // per)
        z = rng.integers(-(1 << (w - 2)), 1 << (w - 2), k).astype(np.int64)
        z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
        got = await asyncio.gather(g.first_yes(z_l, w), e.first_yes(z.view(np.uint64) - z_l, w))
        expect = next((i for i in range(k) if z[i] >= 0), None)
        assert got == [expect, expect], (k, w)
        assert e._ext.extensions - ext0 == g._ext.extensions - ext0 == want, (k, w)
        assert e._ext.available() == g._ext.available() == have + want * per - need


async def test_a_chunk_that_fits_only_unpadded_refills_first() -> None:
    """On a published set a refill adds a number of COTs that is not a multiple
    of 8, so the pool can hold w·k COTs but fewer than the chunk's byte-padded
    count: that chunk must refill first (asking for w·k alone, it ran short)."""
    from svtagg.mpc.protocol import _ot_widths

    g, e = await connected_pair(b"padded-refill", ot="ferret:b10")
    have = e._ext.available()
    fits = [
        (w, k)
        for w in range(9, 40)
        for k in range(have // w - 8, have // w + 1)
        if w * k <= have < 8 * sum(_ot_widths(k, w))
    ]
    assert fits, have  # b10's pool after its first extension has such a chunk
    w, k = fits[0]
    z = np.full(k, -3, dtype=np.int64)
    z[-1] = 5
    z_l = np.zeros(k, dtype=np.uint64)
    got = await asyncio.gather(g.first_yes(z_l, w), e.first_yes(z.view(np.uint64), w))
    assert got == [k - 1, k - 1]
    assert e._ext.extensions == g._ext.extensions == 2  # the bootstrap's and this refill


def ferret_reply_bound_ok() -> bool:
    spec = parse_ot("ferret:test")
    return extension_bound(spec) == LPN_SETS["test"].reply_bytes() and bytes_per_ot(spec) == 1 / 8


async def test_the_session_limit_admits_the_extensions() -> None:
    """A chunk's message bound covers a refill's reply; the setup raises its own bound."""

    class Bounded(MemoryChannel):
        limit = 1 << 62

        def limit_messages(self, n: int) -> None:
            self.limit = n

        async def recv(self) -> bytes:
            msg = await super().recv()
            assert len(msg) <= self.limit
            return msg

    cg, ce = Bounded.pair()
    g, e = (
        ComparisonGarbler(cg, b"bound", ot="ferret:b10"),
        ComparisonEvaluator(ce, b"bound", ot="ferret:b10"),
    )
    await asyncio.gather(g.setup(), e.setup())
    z = np.zeros(1, np.uint64)
    e._ext.pos = g._ext.pos = e._ext.pool_t.shape[0]  # empty both pools: the chunk must refill
    assert await asyncio.gather(g.first_yes(z, 8), e.first_yes(z, 8)) == [0, 0]
    assert g._ext.extensions == e._ext.extensions == 2


# ---------------------------------------------------------------- views and broken controls


class _SendsAlphaBits(FerretReceiver):
    """Broken: corrections without the random choice bits (¬α in the clear)."""

    def request(self) -> tuple[bytes, np.ndarray]:
        s = self.current()
        alphas = self._alphas(s)
        bits = 1 - ferret.alpha_bits(alphas, s.depth)
        return ferret._REQ + np.packbits(bits, bitorder="little").tobytes(), alphas


def _correction_bits(cls: type[FerretReceiver], runs: int) -> np.ndarray:
    out = []
    for _ in range(runs):
        tx, rx0 = _seeded("test")
        rx = cls(SID, "test")
        rx.seed_reserve(rx0.res_r, rx0.res_t)
        rx.fixed_alphas = np.zeros(LPN_SETS["test"].t, dtype=np.int64)  # α fixed
        msg, _ = rx.request()
        out.append(np.unpackbits(np.frombuffer(msg, np.uint8, offset=4), bitorder="little"))
    return np.concatenate(out)


def _uniform(bits: np.ndarray) -> bool:
    counts = np.bincount(bits, minlength=2)
    return bool(stats.chisquare(counts).pvalue > 1e-4)


@pytest.mark.parametrize(("cls", "uniform"), [(FerretReceiver, True), (_SendsAlphaBits, False)])
def test_garbler_view_of_the_corrections(cls: type[FerretReceiver], uniform: bool) -> None:
    """With the noise positions fixed, the corrections the garbler sees are uniform
    bits over fresh reserves; sending ¬α's bits unmasked is not."""
    assert _uniform(_correction_bits(cls, 40)) is uniform


class _UnmaskedSums(FerretSender):
    """Broken: the level sums go out without the hash masks."""

    def reply(self, request: bytes) -> bytes:
        saved = self.h
        real = saved

        class NoMask:
            def __call__(self, x: Blocks, tw: Blocks, out: Any = None) -> Blocks:
                if int(tw[0, 1]) & 0xFFFF_FFFF_0000_0000 == ferret.MASK_TWEAK:
                    return np.zeros_like(x)
                return real(x, tw, out)  # type: ignore[no-any-return]

        self.h = NoMask()
        try:
            return super().reply(request)
        finally:
            self.h = saved


def _delta_from_reply(s: LpnSet, reply: bytes) -> Blocks:
    """What an evaluator learns when both level-1 sums of tree 0 arrive in the
    clear: the two children of the root, hence every leaf, hence Δ from φ."""
    body = np.frombuffer(reply, dtype=np.uint64, offset=4)
    m = body[: s.t * s.depth * 4].reshape(s.t, s.depth, 2, 2)
    phi = body[s.t * s.depth * 4 :].reshape(s.t, 2)
    h = ferret._hasher()
    nodes = np.ascontiguousarray(m[0, 0])  # level 1: left and right child of the root
    for level in range(2, s.depth + 1):
        nodes = ferret._expand(h, nodes[None], level).reshape(-1, 2)
    return phi[0] ^ np.bitwise_xor.reduce(nodes, axis=0)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("cls", "leaks"), [(FerretSender, False), (_UnmaskedSums, True)])
def test_unmasked_level_sums_give_delta_away(cls: type[FerretSender], leaks: bool) -> None:
    d = _delta()
    tx0, rx = _seeded("test", d)
    tx = cls(SID, d, "test")
    tx.seed_reserve(tx0.res_q)
    msg, alphas = rx.request()
    reply = tx.reply(msg)
    assert np.array_equal(_delta_from_reply(LPN_SETS["test"], reply), d) is leaks
    if not leaks:
        rx.finish(reply, alphas)
        _check_pools(tx, rx)


def _indices_fresh(seed_of: Callable[[bytes, int], bytes]) -> bool:
    """Do two extensions of one session, and two sessions, use different matrices?"""
    k = 1 << 16
    a = lpn_indices(seed_of(SID, 0), 0, 64, k)
    b = lpn_indices(seed_of(SID, 1), 0, 64, k)
    c = lpn_indices(seed_of(SID + b"x", 0), 0, 64, k)
    return not (np.array_equal(a, b) or np.array_equal(a, c))


def test_lpn_matrices_are_fresh_per_extension() -> None:
    assert _indices_fresh(lpn_seed)
    assert not _indices_fresh(lambda sid, counter: lpn_seed(sid, 0))  # broken: reused
    # and the parties really use the counter: the seed changes with each extension
    tx, rx = _seeded("tiny")
    seeds = []
    for _ in range(3):
        seeds.append(lpn_seed(SID, rx.extensions))
        _extend(tx, rx)
    assert len(set(seeds)) == 3


def test_malformed_messages_are_refused() -> None:
    tx, rx = _seeded("test")
    msg, alphas = rx.request()
    for bad in (msg[:-1], msg + b"\0", b"XXXX" + msg[4:]):
        with pytest.raises(ValueError):
            tx.reply(bad)
    reply = tx.reply(msg)
    for bad in (reply[:-16], reply + bytes(16), b"XXXX" + reply[4:]):
        with pytest.raises(ValueError):
            rx.finish(bad, alphas)
    with pytest.raises(ValueError):
        list(tx.labels(b"\0" * 3, [4], 0))
    with pytest.raises(RuntimeError):  # more than the pool holds
        rx.u_message([np.zeros(rx.available() // 8 + 1, np.uint8)], 0)


def test_ot_specs() -> None:
    assert parse_ot("ferret") == ("ferret", ferret.SET_NAMES.index(ferret.DEFAULT_SET))
    assert parse_ot("ferret:b13") == ("ferret", ferret.SET_NAMES.index("b13"))
    for bad in ("ferret:b9", "ferret:B10", "ferrets"):
        with pytest.raises(ValueError):
            parse_ot(bad)


async def test_parties_on_different_sets_fail() -> None:
    """A garbler and an evaluator on different sets refuse the first extension."""
    cg, ce = MemoryChannel.pair()
    g, e = (
        ComparisonGarbler(cg, b"mix", ot="ferret:test"),
        ComparisonEvaluator(ce, b"mix", ot="ferret:tiny"),
    )
    task = asyncio.ensure_future(e.setup())
    with pytest.raises(ValueError):
        await asyncio.wait_for(g.setup(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    ("servers", "announced", "accepted"),
    [("ferret", "ferret", True), ("ferret", "ferret:b10", True), ("ferret", "softspoken:4", False),
     (None, "ferret", False), ("ferret:b11", "ferret", False)],
)  # fmt: skip
async def test_servers_choose_ferret_by_environment(
    servers: str | None, announced: str, accepted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SVTAGG_OT sets both servers' extension; the helper refuses a leader on another."""
    from conftest import helper_accepts_open

    from svtagg.dp.errors import InvalidArgument
    from svtagg.mpc.softspoken import DEFAULT_OT, server_ot

    if servers is None:
        monkeypatch.delenv("SVTAGG_OT", raising=False)
    else:
        monkeypatch.setenv("SVTAGG_OT", servers)
    assert server_ot() == (servers or DEFAULT_OT)
    if accepted:
        assert await helper_accepts_open(announced) == (b"s" * 16, None)
    else:
        with pytest.raises(InvalidArgument, match="OT extension"):
            await helper_accepts_open(announced)


def test_an_unknown_server_extension_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from svtagg.mpc.softspoken import server_ot

    monkeypatch.setenv("SVTAGG_OT", "ferret:b99")
    with pytest.raises(ValueError):
        server_ot()
