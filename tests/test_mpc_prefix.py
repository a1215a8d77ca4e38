"""The linear prefix OR (`chain.or_chain`) in the first-YES and
CompareToThresholds chunk circuits: against plaintext at the boundaries (no
YES, YES first, YES last, all YES, K = 1, K around the 4,096-lane batches),
the numpy reference and the native core byte for byte under both schemes, the
AND gates and table bytes per comparison, and a tampered table refused."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from svtagg.mpc import native
from svtagg.mpc import threehalves as th
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.chain import or_chain, or_chain_and_gates
from svtagg.mpc.circuits import (
    CLOSE,
    LANE_BATCH,
    bit_planes,
    ctt_circuit,
    ctt_outcomes,
    first_yes_circuit,
    first_yes_index,
    lane_batches,
    plain_compare_to_thresholds,
    plain_first_yes,
    planes,
    prefix_or,
    prefix_or_tree,
)
from svtagg.mpc.garble import PlainBackend

RNG = np.random.default_rng(20261202)
W = 40
ENGINES = ["numpy"] + (["native"] if native.available() else [])
SIZES = [1, 2, 3, 17, 4095, 4096, 4097, 8193]


class Coins:
    """ρ from a fixed byte stream, read in order whatever the call sizes."""

    def __init__(self, seed: bytes) -> None:
        self.raw = np.frombuffer(hashlib.shake_256(seed).digest(1 << 21), np.uint8) & np.uint8(3)
        self.at = 0

    def __call__(self, n: int) -> np.ndarray:
        out = self.raw[self.at : self.at + n]
        self.at += n
        return out


def _values(k: int, yes: list[int]) -> np.ndarray:
    """k sums below 0 but at the lanes `yes` (≥ 0; the first exactly 0), within ±2^30."""
    v = -RNG.integers(1, 2**30, k)
    v[yes] = RNG.integers(0, 2**30, len(yes))
    if yes:
        v[yes[0]] = 0
    return v


def _queries(k: int, close: list[int]) -> np.ndarray:
    """z_high then z_low of k queries: HIGH or LOW at random, CLOSE at `close`."""
    hi = RNG.integers(-(2**30), 2**30, k)
    lo = RNG.integers(0, 2**30, k)  # a query not HIGH is LOW …
    hi[close] = -RNG.integers(1, 2**30, len(close))
    lo[close] = -RNG.integers(1, 2**30, len(close))  # … unless both tests fail
    return np.concatenate([hi, lo])


def _split(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z_l = RNG.integers(0, 2**64, v.shape[0], dtype=np.uint64)
    return z_l, v.astype(np.int64).view(np.uint64) - z_l


def _cases(k: int) -> list[list[int]]:
    cases = [[], [0], [k - 1], list(range(k))]
    for j in (LANE_BATCH - 1, LANE_BATCH, 2 * LANE_BATCH):
        if j < k:
            cases.append([j, k - 1])
    return cases


def _garble(engine: str, scheme: str, circuit: Any, z_l: np.ndarray, z_h: np.ndarray, n: int):
    """Garble and evaluate `circuit` on one engine; (tables, outputs, garbler, evaluator)."""
    gb, eb = native.backends(engine, scheme)
    h = native.NativeHash() if engine == "native" else TweakableHash()
    delta = np.array([0x9E3779B97F4A7C15, 0x243F6A8885A308D3], dtype=np.uint64)
    g = gb(delta, h, 11)
    if scheme == "threehalves":
        g.coins = Coins(b"prefix")  # type: ignore[method-assign]
    lanes = z_h.shape[0]
    b0 = np.random.default_rng(lanes).integers(0, 2**64, (64, lanes, 2), dtype=np.uint64)
    out_g = circuit(g, bit_planes(z_l), planes(b0), n)
    bits = bit_planes(z_h).astype(np.uint64)
    b_act = b0 ^ ((-bits)[..., None] & delta)
    e = eb(h, 11, g.table_bytes())
    out_e = circuit(e, None, planes(b_act), n)
    e.done()
    dec = [e.decode(o, g.decoding(og)) for o, og in zip(out_e, out_g, strict=True)]
    return g.table_bytes(), dec, g, e


def _first_yes(be: Any, a: Any, b: Any, n: int) -> tuple[Any, ...]:
    return (first_yes_circuit(be, a, b, n, W),)


def _ctt(be: Any, a: Any, b: Any, n: int) -> tuple[Any, ...]:
    return ctt_circuit(be, a, b, n, W)


@pytest.mark.parametrize("k", SIZES)
def test_first_yes_plain_at_the_boundaries(k: int) -> None:
    for yes in _cases(k):
        z_l, z_h = _split(_values(k, yes))
        f = first_yes_circuit(PlainBackend(), bit_planes(z_l), planes(bit_planes(z_h)), k, W)
        assert first_yes_index(f) == plain_first_yes(z_l, z_h) == (yes[0] if yes else None)


@pytest.mark.parametrize("k", [1, 2, 5, 4095, 4097])
def test_compare_to_thresholds_plain_at_the_boundaries(k: int) -> None:
    for close in _cases(k):
        z_l, z_h = _split(_queries(k, close))
        m, f = ctt_circuit(PlainBackend(), bit_planes(z_l), planes(bit_planes(z_h)), k, W)
        want = plain_compare_to_thresholds(z_l[:k] + z_h[:k], z_l[k:] + z_h[k:])
        assert ctt_outcomes(m, f) == want
        assert len(want) == (min(close) + 1 if close else k)
        assert (want[-1] == CLOSE) == bool(close)


@pytest.mark.parametrize("scheme", th.SCHEMES)
@pytest.mark.parametrize("k", SIZES)
def test_first_yes_engines_byte_identical_and_counts(scheme: str, k: int) -> None:
    yes = [k - 1] if k % 2 else []
    z_l, z_h = _split(_values(k, yes))
    runs = {eng: _garble(eng, scheme, _first_yes, z_l, z_h, k) for eng in ENGINES}
    tables = {eng: r[0] for eng, r in runs.items()}
    assert len(set(tables.values())) == 1, "engines differ"
    for _, dec, g, e in runs.values():
        assert first_yes_index(dec[0]) == plain_first_yes(z_l, z_h)
        # w − 1 ANDs of the sign test per comparison, and one of the prefix chain (K − 1 in all).
        assert g.and_gates == e.and_gates == (W - 1) * k + or_chain_and_gates(k)
    # Table bytes: the garbler-half gate, w − 2 full layers per lane batch, one chain layer.
    if scheme == "halfgates":
        want = 16 * k + 32 * (W - 2) * k + 32 * (k - 1)
    else:
        full = sum(16 * th.layer_blocks(hi - lo) for lo, hi in lane_batches(k))
        want = 16 * k + (W - 2) * full + (16 * th.layer_blocks(k - 1) if k > 1 else 0)
    assert len(tables[ENGINES[0]]) == want


@pytest.mark.parametrize("scheme", th.SCHEMES)
@pytest.mark.parametrize("k", [1, 2, 33, 2049, 4097])
def test_compare_to_thresholds_engines_byte_identical(scheme: str, k: int) -> None:
    z_l, z_h = _split(_queries(k, [k // 2, k - 1] if k > 1 else []))
    runs = {eng: _garble(eng, scheme, _ctt, z_l, z_h, k) for eng in ENGINES}
    assert len({r[0] for r in runs.values()}) == 1
    want = plain_compare_to_thresholds(z_l[:k] + z_h[:k], z_l[k:] + z_h[k:])
    for _, dec, g, _e in runs.values():
        assert ctt_outcomes(dec[0], dec[1]) == want
        # 2(w − 1) sign ANDs, the CLOSE AND, the chain, and m's K − 1.
        assert g.and_gates == 2 * (W - 1) * k + k + 2 * (k - 1)


@pytest.mark.parametrize("scheme", th.SCHEMES)
@pytest.mark.parametrize("engine", ENGINES)
def test_chain_alone_fused_equals_reference(scheme: str, engine: str) -> None:
    """The native kernel (no logs) against the gate-layer path (logs on), and the
    plaintext semantics, over K = 1..40 and one long chain."""
    for k in [*range(1, 41), 5000]:
        x = RNG.integers(0, 2, k).astype(np.uint8)
        x[: RNG.integers(0, k + 1)] = 0
        plain = or_chain(PlainBackend(), x)
        assert np.array_equal(plain, np.maximum.accumulate(x))
        assert np.array_equal(prefix_or_tree(PlainBackend(), x), plain)
        d = np.array([0x1234567 | 1, 0x7654321], dtype=np.uint64)
        x0 = RNG.integers(0, 2**64, (k, 2), dtype=np.uint64)
        act = x0 ^ ((-(x.astype(np.uint64)))[:, None] & d)
        outs = []
        for logged in (False, True):
            gb, eb = native.backends(engine, scheme)
            h = native.NativeHash() if engine == "native" else TweakableHash()
            g = gb(d, h, 3)
            g.and_layers = 17
            if scheme == "threehalves":
                g.coins = Coins(b"alone")  # type: ignore[method-assign]
            if logged:
                g.label_log = []
            p0 = prefix_or(g, x0)
            e = eb(h, 3, g.table_bytes())
            e.and_layers = 17
            p = prefix_or(e, act)
            e.done()
            assert np.array_equal(p, p0 ^ ((-(plain.astype(np.uint64)))[:, None] & d))
            assert g.and_layers == e.and_layers == 17 + (k > 1)
            outs.append((g.table_bytes(), p0.tobytes()))
        assert outs[0] == outs[1]


@pytest.mark.parametrize("engine", ENGINES)
def test_three_halves_chain_padding_refused(engine: str) -> None:
    k = 6  # 5 gates: 25 control bits, the last byte's high bits and a padding block
    d = np.array([0xABCDEF1, 0x1FEDCBA], dtype=np.uint64)
    x0 = RNG.integers(0, 2**64, (k, 2), dtype=np.uint64)
    gb, eb = native.backends(engine, "threehalves")
    h = native.NativeHash() if engine == "native" else TweakableHash()
    g = gb(d, h, 3)
    prefix_or(g, x0)
    raw = bytearray(g.table_bytes())
    raw[24 * 5 + 3] |= 0x80  # a bit past the 25 control bits
    with pytest.raises(ValueError, match="padding"):
        prefix_or(eb(h, 3, bytes(raw)), x0)


def test_linear_saves_an_and_per_comparison() -> None:
    for k in (1_000, 10_000):
        x = RNG.integers(0, 2, k).astype(np.uint8)
        lin, tree = PlainBackend(), PlainBackend()
        prefix_or(lin, x)
        prefix_or_tree(tree, x)
        assert lin.and_gates == k - 1 < tree.and_gates < 2 * k
        assert tree.and_gates - lin.and_gates > 0.9 * k


@pytest.mark.parametrize("scheme", th.SCHEMES)
@pytest.mark.parametrize("engine", ENGINES)
async def test_streamed_chunks_through_the_protocol(scheme: str, engine: str) -> None:
    """Chunks of 4,097 and 8,193 lanes stream their sign-test batches; the
    chain's table comes last, with the decoding bits.  Both engines, both schemes."""
    from svtagg.mpc.protocol import run_compare_to_thresholds, run_first_yes

    previous = native.active()
    native.use(engine)
    try:
        for k in (4_097, 8_193):
            for yes in ([k - 1], [LANE_BATCH], []):
                z_l, z_h = _split(_values(k, yes))
                assert await run_first_yes(z_l, z_h, scheme) == (yes[0] if yes else None)
        k = 4_097
        z_l, z_h = _split(_queries(k, [k - 1]))
        got = await run_compare_to_thresholds(z_l[:k], z_l[k:], z_h[:k], z_h[k:], scheme)
        assert got == plain_compare_to_thresholds(z_l[:k] + z_h[:k], z_l[k:] + z_h[k:])
    finally:
        native.use(previous)
