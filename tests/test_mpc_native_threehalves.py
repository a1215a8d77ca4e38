"""The native core's three-halves gates against the numpy reference, byte for
byte: single AND layers of every width around the 16-lane groups, the fused
carry chain against the gate-by-gate one (several lane batches, any thread
count), and the protocol with the garbler on one engine and the evaluator on
the other.  The garbler's coins come from one deterministic stream here, so
both engines draw the same ρ."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest

from svtagg.mpc import native
from svtagg.mpc import threehalves as th
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.channel import MemoryChannel
from svtagg.mpc.circuits import bit_planes, first_yes_circuit, planes, sign_yes
from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler

pytestmark = pytest.mark.skipif(not native.available(), reason="native core not built")
RNG = np.random.default_rng(20261203)


class CoinStream:
    """ρ from a fixed byte stream, read in order whatever the call sizes."""

    def __init__(self, seed: bytes) -> None:
        self.raw = np.frombuffer(hashlib.shake_256(seed).digest(1 << 22), np.uint8) & np.uint8(3)
        self.at = 0

    def __call__(self, n: int) -> np.ndarray:
        out = self.raw[self.at : self.at + n]
        assert out.shape[0] == n, "coin stream exhausted"
        self.at += n
        return out


def _labels(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.integers(0, 2**64, (*shape, 2), dtype=np.uint64)


def _delta() -> np.ndarray:
    d = RNG.integers(0, 2**64, 2, dtype=np.uint64)
    d[0] |= np.uint64(1)
    return d


def _pair(
    d: np.ndarray, seed: bytes, tweak_hi: int = 99
) -> tuple[th.ThreeHalvesGarbleBackend, ...]:
    ref = th.ThreeHalvesGarbleBackend(d, TweakableHash(), tweak_hi)
    nat = native.NativeThreeHalvesGarbleBackend(d, native.NativeHash(), tweak_hi)
    ref.coins, nat.coins = CoinStream(seed), CoinStream(seed)  # type: ignore[method-assign]
    return ref, nat


@pytest.mark.parametrize("n", [1, 2, 5, 8, 15, 16, 17, 31, 32, 33, 300, 4096 + 7])
def test_and_layers_match_numpy_bytes(n: int) -> None:
    d = _delta()
    a0, b0 = _labels((n,)), _labels((n,))
    bits = RNG.integers(0, 2, n).astype(np.uint8)
    ref, nat = _pair(d, b"layers%d" % n)
    for be in (ref, nat):
        be.and_layers = 3  # a later layer: the layer part of the tweak
    outs_ref = [ref.and_(a0, b0), ref.and_const(bits, b0), ref.and_(b0, a0)]
    outs_nat = [nat.and_(a0, b0), nat.and_const(bits, b0), nat.and_(b0, a0)]
    assert ref.table_bytes() == nat.table_bytes()
    for x, y in zip(outs_ref, outs_nat, strict=True):
        assert np.array_equal(x, y)
    av, bv = RNG.integers(0, 2, n), RNG.integers(0, 2, n)
    a = a0 ^ ((-(av.astype(np.uint64)))[:, None] & d)
    b = b0 ^ ((-(bv.astype(np.uint64)))[:, None] & d)
    tables = ref.table_bytes()
    er = th.ThreeHalvesEvalBackend(TweakableHash(), 99, tables)
    en = native.NativeThreeHalvesEvalBackend(native.NativeHash(), 99, tables)
    got = []
    for be in (er, en):
        be.and_layers = 3
        got.append((be.and_(a, b), be.and_const(None, b), be.and_(b, a)))
        be.done()
    for x, y in zip(got[0], got[1], strict=True):
        assert np.array_equal(x, y)
    expect = (av & bv).astype(np.uint64)
    assert np.array_equal(got[1][0], outs_ref[0] ^ ((-expect)[:, None] & d))


def test_native_evaluator_refuses_nonzero_padding() -> None:
    d = _delta()
    _, nat = _pair(d, b"pad")
    a0, b0 = _labels((3,)), _labels((3,))
    nat.and_(a0, b0)
    raw = bytearray(nat.table_bytes())
    raw[24 * 3 + 1] |= 0x80  # past the 15 control bits
    en = native.NativeThreeHalvesEvalBackend(native.NativeHash(), 99, bytes(raw))
    with pytest.raises(ValueError, match="padding"):
        en.and_(a0, b0)


@pytest.mark.parametrize("width", [8, 16, 40, 64])
@pytest.mark.parametrize("n", [1, 17, 4096 + 33])
def test_fused_carry_chain_matches_gate_by_gate(width: int, n: int) -> None:
    lim = 2 ** (width - 1)
    sums = RNG.integers(-lim + 1, lim, n)
    sums[: min(n, 4)] = [lim - 1, -lim + 1, 0, -1][: min(n, 4)]
    z_l = RNG.integers(0, 2**64, n, dtype=np.uint64)
    z_h = sums.astype(np.int64).view(np.uint64) - z_l
    d = _delta()
    b0 = _labels((width, n))
    ref, nat = _pair(d, b"chain%d-%d" % (width, n), 5)
    yes_ref = sign_yes(ref, bit_planes(z_l), planes(b0), n, width)
    yes_nat = sign_yes(nat, bit_planes(z_l), planes(b0), n, width)
    assert ref.table_bytes() == nat.table_bytes()
    assert np.array_equal(yes_ref, yes_nat) and ref.and_layers == nat.and_layers
    hb = bit_planes(z_h)[:width].astype(np.uint64)
    b_act = b0 ^ ((-hb)[..., None] & d)
    outs = []
    for ev in (
        th.ThreeHalvesEvalBackend(TweakableHash(), 5, nat.table_bytes()),
        native.NativeThreeHalvesEvalBackend(native.NativeHash(), 5, nat.table_bytes()),
    ):
        outs.append(sign_yes(ev, None, planes(b_act), n, width))
        ev.done()
    assert np.array_equal(outs[0], outs[1])
    got = (outs[1][:, 0] & np.uint64(1)).astype(np.uint8) ^ nat.decoding(yes_nat)
    assert np.array_equal(got, (sums >= 0).astype(np.uint8))


def test_first_yes_circuit_bytes_match() -> None:
    n = 3000
    z_l = RNG.integers(0, 2**64, n, dtype=np.uint64)
    d = _delta()
    b0 = _labels((64, n))
    ref, nat = _pair(d, b"first-yes", 6)
    out_r = first_yes_circuit(ref, bit_planes(z_l), planes(b0), n, 40)
    out_n = first_yes_circuit(nat, bit_planes(z_l), planes(b0), n, 40)
    assert ref.table_bytes() == nat.table_bytes() and np.array_equal(out_r, out_n)


@pytest.mark.parametrize("threads", [2, 3])
def test_thread_count_does_not_change_a_byte(threads: int) -> None:
    n, width = 4096 + 33, 40
    d = _delta()
    a_bits = bit_planes(RNG.integers(0, 2**64, n, dtype=np.uint64))
    b0 = _labels((width, n))
    before = native.threads()
    outs = []
    try:
        for t in (1, threads):
            native.set_threads(t)
            _, g = _pair(d, b"threads")
            yes = sign_yes(g, a_bits, planes(b0), n, width)
            e = native.NativeThreeHalvesEvalBackend(native.NativeHash(), 99, g.table_bytes())
            act = sign_yes(e, None, planes(b0), n, width)
            outs.append((g.table_bytes(), yes, act))
    finally:
        native.set_threads(before)
    assert outs[0][0] == outs[1][0]
    assert np.array_equal(outs[0][1], outs[1][1]) and np.array_equal(outs[0][2], outs[1][2])


async def _cross(garbler: str, evaluator: str) -> tuple[ComparisonGarbler, ComparisonEvaluator]:
    before = native.active()
    cg, ce = MemoryChannel.pair()
    try:
        native.use(garbler)
        g = ComparisonGarbler(cg, b"cross-3h", "threehalves")
        native.use(evaluator)
        e = ComparisonEvaluator(ce, b"cross-3h", "threehalves")
    finally:
        native.use(before)
    await asyncio.gather(g.setup(), e.setup())
    return g, e


@pytest.mark.parametrize("engines", [("native", "numpy"), ("numpy", "native")])
@pytest.mark.parametrize("width", [16, 40, 64])
async def test_engines_interoperate_under_three_halves(
    engines: tuple[str, str], width: int
) -> None:
    g, e = await _cross(*engines)
    lim = 2 ** (width - 1)
    for s in [lim - 1, -(lim - 1), 0, -1, 1]:
        sums = np.array([-5] * 4500 + [s, 3], dtype=np.int64)  # two lane batches
        z_l = RNG.integers(0, 2**64, sums.size, dtype=np.uint64)
        z_h = sums.view(np.uint64) - z_l
        got = await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))
        want = 4500 if s >= 0 else 4501
        assert got == [want, want]


def test_os_coins_differ_between_calls() -> None:
    assert th.os_coins(64).tobytes() != th.os_coins(64).tobytes()
