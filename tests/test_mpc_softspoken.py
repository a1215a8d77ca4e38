"""SoftSpoken OT extension (`svtagg.mpc.softspoken`): the IKNP correlation,
the punctured leaf, the garbler's view, stream separation, malformed input,
the numpy and native engines byte for byte, and the protocol on top."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator

import numpy as np
import pytest
from scipy import stats

from svtagg.mpc import native
from svtagg.mpc.ot import KAPPA
from svtagg.mpc.protocol import connected_pair
from svtagg.mpc.softspoken import (
    SOFTSPOKEN_KS,
    SoftSpokenReceiver,
    SoftSpokenSender,
    fold,
    message_bytes,
    parse_ot,
    setup_message_bytes,
)

ENGINES = ["numpy", "native"] if native.available() else ["numpy"]


@pytest.fixture
def engine_restore() -> Iterator[None]:
    before = native.active()
    yield
    native.use(before)


def _base_ots() -> tuple[list[tuple[bytes, bytes]], list[int], list[bytes]]:
    """Stand-ins for the base OTs: random key pairs, the garbler's choice s (s_0 = 1)."""
    keys = [(os.urandom(16), os.urandom(16)) for _ in range(KAPPA)]
    s = [secrets.randbits(1) for _ in range(KAPPA)]
    s[0] = 1
    return keys, s, [p[c] for p, c in zip(keys, s, strict=True)]


def _pair(k: int) -> tuple[SoftSpokenReceiver, SoftSpokenSender, list[int]]:
    keys, s, chosen = _base_ots()
    receiver, sender = SoftSpokenReceiver(keys, k), SoftSpokenSender(s, chosen, k)
    sender.receive_setup(receiver.setup_message())
    return receiver, sender, s


def _expected(r: np.ndarray, delta: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(r, bitorder="little").astype(bool)
    return np.where(bits[:, None], delta[None, :], np.uint64(0))


def _delta_blocks(s: list[int], k: int) -> list[int]:
    return [sum(s[i * k + b] << b for b in range(k)) for i in range(KAPPA // k)]


@pytest.mark.parametrize("k", SOFTSPOKEN_KS)
@pytest.mark.parametrize("engine", ENGINES)
def test_correlation_q_xor_t_is_r_delta(k: int, engine: str, engine_restore: None) -> None:
    native.use(engine)
    receiver, sender, s = _pair(k)
    assert sender.delta[0] & 1 == 1  # Δ keeps its point-and-permute bit
    for nonce, width in enumerate([1, 3, 16, 17, 255, 4096 + 5]):
        for r in (
            np.frombuffer(os.urandom(width), np.uint8),
            np.zeros(width, np.uint8),
            np.full(width, 0xFF, np.uint8),
        ):
            msg, t = receiver.extend(r, nonce)
            assert len(msg) == message_bytes([width], k) == (KAPPA // k) * width
            q = sender.extend(msg, 8 * width, nonce)
            assert np.array_equal(q ^ t, _expected(r, sender.delta))


@pytest.mark.parametrize("engine", ENGINES)
def test_one_ot_and_many_pieces(engine: str, engine_restore: None) -> None:
    """ℓ = 1 (one meaningful bit of a byte) and a multi-piece extension."""
    native.use(engine)
    receiver, sender, _ = _pair(4)
    r = np.array([1], np.uint8)
    msg, t = receiver.extend(r, 7)
    q = sender.extend(msg, 8, 7)
    assert np.array_equal(q[0] ^ t[0], sender.delta)
    widths = [640, 3, 20480, 17]
    rs = [np.frombuffer(os.urandom(w), np.uint8) for w in widths]
    msg = bytes(receiver.u_message(rs, 9))
    ts = [b.copy() for b in receiver.labels(widths, 9)]
    qs = [b.copy() for b in sender.labels(msg, widths, 9)]
    for r, t, q in zip(rs, ts, qs, strict=True):
        assert np.array_equal(q ^ t, _expected(r, sender.delta))


def test_pieces_continue_one_stream() -> None:
    """Pieces of whole AES blocks read consecutive counter blocks: the labels
    of pieces [16, 32] are those of one piece of 48 bytes."""
    receiver, _, _ = _pair(4)
    r = np.frombuffer(os.urandom(48), np.uint8)
    receiver.u_message([r[:16], r[16:]], 3)
    two = np.concatenate([b.copy() for b in receiver.labels([16, 32], 3)])
    _, one = receiver.extend(r, 3)
    assert np.array_equal(two, one)


@pytest.mark.parametrize("k", SOFTSPOKEN_KS)
def test_garbler_knows_every_leaf_but_delta_i(k: int) -> None:
    receiver, sender, s = _pair(k)
    n = KAPPA // k
    assert receiver.leaves is not None and sender.leaves is not None
    theirs = receiver.leaves.reshape(n, 1 << k, 2)
    for i, d in enumerate(_delta_blocks(s, k)):
        mine = {x: sender.leaves[i, x ^ d] for x in range(1 << k)}
        differ = [x for x in range(1 << k) if not np.array_equal(mine[x], theirs[i, x])]
        assert differ == [d]
        # the punctured seed is nowhere among the garbler's
        assert not any(np.array_equal(theirs[i, d], v) for v in sender.leaves[i])
    assert len({bytes(x) for x in receiver.leaves}) == n << k  # no repeated seed


def test_a_wrong_base_ot_key_breaks_the_rebuild() -> None:
    """The garbler rebuilds through its base-OT keys: with one wrong key its
    leaves under that level are wrong (the masks are what hide the sums)."""
    keys, s, chosen = _base_ots()
    receiver = SoftSpokenReceiver(keys, 4)
    chosen[5] = os.urandom(16)
    sender = SoftSpokenSender(s, chosen, 4)
    sender.receive_setup(receiver.setup_message())
    theirs = receiver.leaves.reshape(32, 16, 2)
    d = _delta_blocks(s, 4)[1]  # bit 5 is bit 1 of block 1
    wrong = [y for y in range(1, 16) if not np.array_equal(sender.leaves[1, y], theirs[1, y ^ d])]
    assert wrong


def _chi_square_p(bits: np.ndarray) -> float:
    """p-value of 'every column of a (trials, positions) 0/1 matrix is fair'."""
    n = bits.shape[0]
    ones = bits.sum(axis=0)
    return float(stats.chi2.sf((((2 * ones - n) ** 2) / n).sum(), bits.shape[1]))


class _SendsChoices(SoftSpokenReceiver):
    """Negative control: sends r unmasked (c_i = r)."""

    def u_message(self, choices: list[np.ndarray], nonce: int) -> memoryview:
        super().u_message(choices, nonce)
        return memoryview(np.concatenate([np.tile(c, KAPPA // self.k) for c in choices]).tobytes())


class _SendsU(SoftSpokenReceiver):
    """Negative control: sends u_i without adding r."""

    def u_message(self, choices: list[np.ndarray], nonce: int) -> memoryview:
        zero = [np.zeros_like(c) for c in choices]
        msg = bytes(super().u_message(zero, nonce))
        super().u_message(choices, nonce)  # keep t for labels()
        return memoryview(msg)


class _FixedNonce(SoftSpokenReceiver):
    """Negative control: one PRG stream for every extension."""

    def u_message(self, choices: list[np.ndarray], nonce: int) -> memoryview:
        return super().u_message(choices, 0)

    def labels(self, widths: list[int], nonce: int) -> Iterator[np.ndarray]:
        return super().labels(widths, 0)


def _views(cls: type[SoftSpokenReceiver], r1: np.ndarray, r2: np.ndarray, trials: int) -> tuple:
    """The garbler's view of two extensions (nonces 1 and 2) over fresh setups."""
    one, both = [], []
    for _ in range(trials):
        keys, _, _ = _base_ots()
        receiver = cls(keys, 4)
        receiver.setup_message()
        c1 = np.frombuffer(bytes(receiver.u_message([r1], 1)), np.uint8)
        c2 = np.frombuffer(bytes(receiver.u_message([r2], 2)), np.uint8)
        one.append(np.unpackbits(c1))
        both.append(np.unpackbits(c1 ^ c2))
    return np.array(one), np.array(both)


@pytest.mark.parametrize("cls", [SoftSpokenReceiver, _SendsChoices, _FixedNonce])
def test_garbler_view_looks_uniform_and_hides_r(cls: type[SoftSpokenReceiver]) -> None:
    """For fixed r (all ones, and r2 = 0 for the second chunk) the messages
    over fresh seeds have fair bits, and so does the XOR of two chunks'
    messages.  Sending r unmasked fails the first; reusing the PRG stream
    (the XOR is then r1 ⊕ r2) fails the second."""
    r1, r2 = np.full(4, 0xFF, np.uint8), np.zeros(4, np.uint8)
    one, both = _views(cls, r1, r2, trials=300)
    ok = _chi_square_p(one) > 1e-4 and _chi_square_p(both) > 1e-4
    assert ok == (cls is SoftSpokenReceiver)


def test_message_does_not_depend_on_r_in_distribution() -> None:
    """Per-position frequencies for r = 0 and r = all ones agree (two-sample)."""
    zeros, _ = _views(SoftSpokenReceiver, np.zeros(4, np.uint8), np.zeros(4, np.uint8), 300)
    ones, _ = _views(SoftSpokenReceiver, np.full(4, 0xFF, np.uint8), np.zeros(4, np.uint8), 300)
    table = np.array(
        [[zeros.sum(), zeros.size - zeros.sum()], [ones.sum(), ones.size - ones.sum()]]
    )
    assert stats.chi2_contingency(table).pvalue > 1e-4


def test_sending_u_alone_breaks_the_correlation() -> None:
    keys, s, chosen = _base_ots()
    receiver, sender = _SendsU(keys, 4), SoftSpokenSender(s, chosen, 4)
    sender.receive_setup(receiver.setup_message())
    r = np.full(8, 0xA5, np.uint8)
    msg, t = receiver.extend(r, 1)
    assert not np.array_equal(sender.extend(msg, 64, 1) ^ t, _expected(r, sender.delta))


def test_chunks_never_share_a_stream() -> None:
    """Distinct nonces give unrelated messages and labels for the same r."""
    receiver, _, _ = _pair(4)
    r = np.frombuffer(os.urandom(64), np.uint8)
    m1, t1 = receiver.extend(r, 1)
    m2, t2 = receiver.extend(r, 2)
    m1b, t1b = receiver.extend(r, 1)
    assert m1 != m2 and not np.array_equal(t1, t2)
    assert m1 == m1b and np.array_equal(t1, t1b)  # a stream is a function of the nonce
    x = np.unpackbits(np.frombuffer(m1, np.uint8) ^ np.frombuffer(m2, np.uint8))
    assert 0.4 < x.mean() < 0.6


async def test_protocol_chunks_use_distinct_nonces() -> None:
    seen: list[int] = []
    g, e = await connected_pair()
    ext = e._ext
    real = ext.u_message

    def spy(choices: list[np.ndarray], nonce: int) -> memoryview:
        seen.append(nonce)
        return real(choices, nonce)

    ext.u_message = spy  # type: ignore[method-assign]
    for _ in range(3):
        z = np.arange(10, dtype=np.int64) - 3
        await asyncio.gather(g.first_yes(np.zeros(10, np.uint64), 40), e.first_yes(z, 40))
    assert seen == [0, 1, 2]


def test_malformed_messages_are_refused() -> None:
    keys, s, chosen = _base_ots()
    receiver = SoftSpokenReceiver(keys, 4)
    setup = receiver.setup_message()
    assert len(setup) == setup_message_bytes(4)
    for bad in (setup[:-1], setup + b"\0", b"XXXX" + setup[4:], b"", setup[:5]):
        with pytest.raises(ValueError, match="malformed"):
            SoftSpokenSender(s, chosen, 4).receive_setup(bad)
    with pytest.raises(ValueError, match="k mismatch"):
        SoftSpokenSender(s, chosen, 2).receive_setup(setup)
    sender = SoftSpokenSender(s, chosen, 4)
    with pytest.raises(RuntimeError):
        sender.extend(bytes(32 * 8), 64, 0)
    sender.receive_setup(setup)
    msg, _ = receiver.extend(np.zeros(8, np.uint8), 0)
    for bad in (msg[:-1], msg + b"\0", bytes(16 * 64)):  # the last: an IKNP-sized message
        with pytest.raises(ValueError, match="bytes"):
            sender.extend(bad, 64, 0)
    with pytest.raises(ValueError):
        list(receiver.labels([8], 1))  # not the nonce of the last message
    with pytest.raises(ValueError):
        list(receiver.labels([16], 0))  # not its widths
    for k in (0, 3, 16, 128):
        with pytest.raises(ValueError):
            SoftSpokenReceiver(keys, k)
    with pytest.raises(ValueError):
        SoftSpokenReceiver(keys[:-1], 4)


def test_ot_specs() -> None:
    assert parse_ot(None) == ("softspoken", 4)
    assert parse_ot("iknp") == ("iknp", 0)
    assert parse_ot("softspoken") == ("softspoken", 4)
    assert parse_ot("softspoken:8") == ("softspoken", 8)
    for bad in ("iknp:2", "softspoken:3", "softspoken:x", "ot", ""):
        if bad == "":
            continue  # empty is the default
        with pytest.raises(ValueError):
            parse_ot(bad)


@pytest.mark.skipif(not native.available(), reason="native core not built")
@pytest.mark.parametrize("k", SOFTSPOKEN_KS)
@pytest.mark.parametrize("skip0", [False, True])
@pytest.mark.parametrize("nblk", [0, 1, 3, 64, 65, 130])
@pytest.mark.parametrize("vaes", [True, False])
def test_native_expansion_matches_the_reference(k: int, skip0: bool, nblk: int, vaes: bool) -> None:
    """Both native paths (VAES where the CPU has it, and AES-NI) against OpenSSL + `fold`."""

    before = native.core().features()["active_vaes"]
    native.set_vaes(vaes)
    try:
        _check_native_expansion(k, skip0, nblk)
    finally:
        native.set_vaes(before)


def _check_native_expansion(k: int, skip0: bool, nblk: int) -> None:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    n, leaves = KAPPA // k, 1 << k
    per = leaves - int(skip0)
    raw = os.urandom(16 * n * per)
    stride = 16 * nblk + 48
    v = np.full((KAPPA, stride), 0xEE, np.uint8)
    u = np.full((n, stride), 0xEE, np.uint8)
    nonce, first = 2**40 + 3, 2**33 + 5
    native.core().ss_expand(native.core().expand_keys(raw), k, skip0, nonce, first, nblk,
                            v, stride, u, stride)  # fmt: skip
    ctr = np.empty((nblk, 2), ">u8")
    ctr[:, 0], ctr[:, 1] = nonce, np.arange(first, first + nblk, dtype=np.uint64)
    g = np.zeros((n, leaves, 16 * nblk), np.uint8)
    for i in range(n):
        for x in range(int(skip0), leaves):
            key = raw[16 * (i * per + x - int(skip0)) :][:16]
            enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
            g[i, x] = np.frombuffer(enc.update(ctr.tobytes()), np.uint8)
    v_ref = np.empty((KAPPA, 16 * nblk), np.uint8)
    u_ref = fold(g, k, v_ref)
    assert np.array_equal(v[:, : 16 * nblk], v_ref)
    assert np.array_equal(u[:, : 16 * nblk], u_ref)
    assert (v[:, 16 * nblk :] == 0xEE).all() and (u[:, 16 * nblk :] == 0xEE).all()


@pytest.mark.skipif(not native.available(), reason="native core not built")
def test_native_expansion_refuses_bad_shapes() -> None:
    core = native.core()
    sch = core.expand_keys(os.urandom(16 * 32 * 16))
    v, u = np.empty((128, 64), np.uint8), np.empty((32, 64), np.uint8)
    core.ss_expand(sch, 4, 0, 1, 0, 4, v, 64, u, 64)
    with pytest.raises(ValueError):
        core.ss_expand(sch, 3, 0, 1, 0, 4, v, 64, u, 64)  # k
    with pytest.raises(ValueError):
        core.ss_expand(sch, 4, 1, 1, 0, 4, v, 64, u, 64)  # schedules for 16 leaves, not 15
    with pytest.raises(ValueError):
        core.ss_expand(sch, 4, 0, 1, 0, 5, v, 64, u, 64)  # stride < 16·nblk
    with pytest.raises(ValueError):
        core.ss_expand(sch, 4, 0, 1, 0, 4, v[:100], 64, u, 64)  # short rows
    with pytest.raises(ValueError):
        core.ss_expand(sch, 4, 0, 1, 0, 4, v, 64, u[:10], 64)
    with pytest.raises(ValueError):
        core.ss_expand(sch, 4, 0, 1, 0, -1, v, 64, None, 0)


@pytest.mark.parametrize("k", SOFTSPOKEN_KS)
@pytest.mark.parametrize("vaes", [True, False])
def test_engines_give_the_same_bytes(k: int, vaes: bool, engine_restore: None) -> None:
    """The native one-pass labels (`_gc.ss_labels`, tiles of 1 KiB, both AES
    paths) against the numpy reference: message and labels on both sides."""
    if not native.available():
        pytest.skip("native core not built")
    before = native.core().features()["active_vaes"]
    native.set_vaes(vaes)
    try:
        _engines_give_the_same_bytes(k)
    finally:
        native.set_vaes(before)


def _engines_give_the_same_bytes(k: int) -> None:
    keys, s, chosen = _base_ots()
    out = {}
    for engine in ("native", "numpy"):
        native.use(engine)
        receiver, sender = SoftSpokenReceiver(keys, k), SoftSpokenSender(s, chosen, k)
        setup = receiver.setup_message()
        sender.receive_setup(setup)
        out[engine] = (receiver, sender)
    rn, sn = out["native"]
    ry, sy = out["numpy"]
    # the same trees: give the numpy receiver the native one's (fresh roots differ)
    ry.leaves, sy.leaves = rn.leaves, sn.leaves
    from svtagg.mpc.softspoken import _LeafPRG

    ry._prg = _LeafPRG(rn.leaves, k, skip0=False)
    sy._prg = _LeafPRG(sn.leaves[:, 1:].reshape(-1, 2), k, skip0=True)
    widths = [5, 4096, 37, 2500, 1024, 1040]
    rs = [np.frombuffer(os.urandom(w), np.uint8) for w in widths]
    res = {}
    for engine, (rcv, snd) in (("native", (rn, sn)), ("numpy", (ry, sy))):
        native.use(engine)
        msg = bytes(rcv.u_message(rs, 11))
        ts = [b.copy() for b in rcv.labels(widths, 11)]
        qs = [b.copy() for b in snd.labels(msg, widths, 11)]
        res[engine] = (msg, ts, qs)
    assert res["native"][0] == res["numpy"][0]
    for a, b in zip(
        res["native"][1] + res["native"][2], res["numpy"][1] + res["numpy"][2], strict=True
    ):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("engine", ENGINES)
def test_ggm_setup_is_engine_independent(engine: str, engine_restore: None) -> None:
    """The GGM tree hashes with the engine's fixed-key AES hash: a setup message
    from one engine rebuilds the same leaves on the other."""
    keys, s, chosen = _base_ots()
    native.use(engine)
    receiver = SoftSpokenReceiver(keys, 4)
    setup = receiver.setup_message()
    native.use("numpy" if engine == "native" and native.available() else engine)
    sender = SoftSpokenSender(s, chosen, 4)
    sender.receive_setup(setup)
    theirs = receiver.leaves.reshape(32, 16, 2)
    for i, d in enumerate(_delta_blocks(s, 4)):
        for y in range(1, 16):
            assert np.array_equal(sender.leaves[i, y], theirs[i, y ^ d])


@pytest.mark.parametrize("ot", ["iknp", "softspoken:1", "softspoken:2", None, "softspoken:8"])
async def test_protocol_runs_on_every_extension(ot: str | None) -> None:
    rng = np.random.default_rng(5)
    z = rng.integers(-(2**30), 2**30, size=3000)
    z[:2000] = -np.abs(z[:2000]) - 1
    zl = rng.integers(0, 2**63, size=3000, dtype=np.uint64)
    zh = z.astype(np.int64).view(np.uint64) - zl
    g, e = await connected_pair(ot=ot)
    a, b = await asyncio.gather(g.first_yes(zl, 40), e.first_yes(zh, 40))
    assert a == b == int(np.argmax(z >= 0))
    k = parse_ot(ot)[1] or 1
    assert e.last_stats.bytes_sent == 3000 * 40 * (16 // k) + 8


async def test_parties_on_different_extensions_fail() -> None:
    """Both parties must run the same extension: a garbler on another k, or on
    SoftSpoken against an IKNP evaluator, refuses the setup (fails closed)."""
    from svtagg.mpc.channel import MemoryChannel
    from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler

    for g_ot, e_ot in (("softspoken:4", "softspoken:2"), ("softspoken", "iknp")):
        sid = secrets.token_bytes(16)
        cg, ce = MemoryChannel.pair()
        g, e = ComparisonGarbler(cg, sid, ot=g_ot), ComparisonEvaluator(ce, sid, ot=e_ot)

        async def evaluator(e: ComparisonEvaluator = e) -> None:
            await e.setup()
            await e.first_yes(np.zeros(4, np.uint64), 8)

        task = asyncio.ensure_future(evaluator())
        with pytest.raises(ValueError):
            await asyncio.wait_for(g.setup(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("announced", "accepted"),
    [("", True), ("softspoken:4", True), ("softspoken", True), ("iknp", False),
     ("softspoken:8", False), ("quantum", False)],
)  # fmt: skip
async def test_helper_checks_the_leaders_ot_extension(announced: str, accepted: bool) -> None:
    """SessionOpen names the leader's extension; the helper refuses another one
    before any OT runs (empty: a leader that does not announce, not checked)."""
    from conftest import helper_accepts_open

    from svtagg.dp.errors import InvalidArgument

    if accepted:
        assert await helper_accepts_open(announced) == (b"s" * 16, None)
    else:
        with pytest.raises(InvalidArgument, match="OT extension"):
            await helper_accepts_open(announced)


async def test_the_leader_announces_the_default_extension() -> None:
    from svtagg.mpc.softspoken import DEFAULT_OT
    from svtagg.proto import svtagg_pb2 as pb
    from svtagg.servers.exchange.session import LeaderSession

    sent: list[pb.PeerFrame] = []

    async def write(frame: pb.PeerFrame) -> None:
        sent.append(frame)
        raise ConnectionResetError("stop after the SessionOpen")

    async def read() -> pb.PeerFrame | None:
        return None

    with pytest.raises(ConnectionResetError):
        await LeaderSession.open(write, read, lambda: None, lambda: False, lambda *a: None)  # type: ignore[arg-type,return-value]
    assert sent[0].open.ot_extension == DEFAULT_OT == "softspoken:4"
