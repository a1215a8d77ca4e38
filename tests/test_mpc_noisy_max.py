"""Report-noisy-max's circuit: the index of the largest signed w-bit z_L + z_H,
ties to the smaller index, by a knock-out tournament.  Checked against the
plaintext argmax at the edges (ties, all equal, the maximum first or last or
the odd one out, ±2^(w−1)), on random vectors, for its AND count, through the
protocol on both engines and across them, for byte-identical tables from the
two engines, with negative controls: a circuit that breaks ties toward the
larger index, or that ignores the sign bit, fails the same checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from conftest import cross_engine_pair

from svtagg.mpc import circuits, native
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.circuits import (
    LANE_BATCH,
    argmax_and_gates,
    argmax_circuit,
    argmax_index,
    bit_planes,
    index_bits,
    plain_argmax,
    planes,
)
from svtagg.mpc.garble import Backend, EvalBackend, GarbleBackend, PlainBackend, Wires
from svtagg.mpc.protocol import (
    _parse_argmax,
    connected_pair,
    noisy_max_spec,
)

M64 = 1 << 64
WIDTHS = [8, 13, 16, 33, 40, 64]  # any width in bits, not only whole bytes
SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 31, 33, 100, 257]
needs_native = pytest.mark.skipif(not native.available(), reason="native core not built")


def share(z: list[int] | np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniform shares a, b with a + b = z mod 2^64 (z as signed integers)."""
    zu = np.array([int(v) % M64 for v in z], dtype=np.uint64)
    a = rng.integers(0, M64, zu.size, dtype=np.uint64, endpoint=False)
    return a, zu - a


def edge_vectors(k: int, w: int, rng: np.random.Generator) -> list[list[int]]:
    """Value vectors at every edge of the argmax: all equal (at 0, at both ends
    of the w-bit range), one maximum at each end and at the last lane (the odd
    one out of every round when k is odd), ties at the maximum in the two halves,
    the extremes ±2^(w−1) side by side, and small values with many ties."""
    lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
    out = [[0] * k, [lo] * k, [hi] * k]
    for j in {0, k // 2, k - 1}:
        v = [lo] * k
        v[j] = hi
        out.append(v)
        v = [0] * k
        v[j] = 1
        out.append(v)
        v = [hi] * k
        v[j] = lo
        out.append(v)
    if k >= 2:
        v = [-1] * k
        v[k - 1] = v[max(0, k // 2 - 1)] = 5  # tied maxima, the earlier must win
        out.append(v)
        out.append([lo if j % 2 else hi for j in range(k)])  # hi at even lanes
        out.append([hi if j % 2 else lo for j in range(k)])
    if 2 <= k <= 1 << (w - 1):
        out.append([hi - j for j in range(k)])  # strictly decreasing
        out.append([lo + j for j in range(k)])  # strictly increasing
    out.append([int(v) for v in rng.integers(-2, 3, k)])
    return out


def run_plain(a: np.ndarray, b: np.ndarray, w: int) -> tuple[int, int, int]:
    """(index, AND gates, output wires) of the circuit in the plaintext backend."""
    be = PlainBackend()
    out = argmax_circuit(be, bit_planes(a), planes(bit_planes(b)), a.size, w)
    return argmax_index(list(out)), be.and_gates, len(out)


def mismatches(k: int, w: int, seed: int = 0) -> int:
    """Edge and random vectors on which the circuit and `plain_argmax` disagree."""
    rng = np.random.default_rng(seed)
    vectors = edge_vectors(k, w, rng)
    vectors.append(list(rng.integers(-(1 << (w - 1)), 1 << (w - 1), k, dtype=np.int64)))
    bad = 0
    for z in vectors:
        a, b = share(z, rng)
        bad += run_plain(a, b, w)[0] != plain_argmax(a, b, w)
    return bad


# ---------------------------------------------------------------- the reference
def test_reference_by_hand() -> None:
    def ref(z: list[int], w: int = 64) -> int:
        a, b = share(z, np.random.default_rng(0))
        return plain_argmax(a, b, w)

    assert ref([3, 9, 9, 1]) == 1  # the first of tied maxima
    assert ref([-5, -2, -9]) == 1
    assert ref([7]) == 0 and ref([4, 4, 4]) == 0
    assert ref([-(1 << 63), (1 << 63) - 1]) == 1
    assert ref([127, -128, 0], 8) == 0 and ref([128, 0], 8) == 1  # 128 is −128 in 8 bits
    assert ref([1 << 8, 1], 8) == 1  # only the low w bits count


# ---------------------------------------------------------------- the circuit
@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("k", SIZES)
def test_circuit_at_the_edges(k: int, w: int) -> None:
    rng = np.random.default_rng(k * 100 + w)
    for z in edge_vectors(k, w, rng):
        a, b = share(z, rng)
        got, ands, wires = run_plain(a, b, w)
        assert got == plain_argmax(a, b, w) == int(np.argmax(np.array(z, dtype=object)))
        assert ands == argmax_and_gates(k, w) and wires == index_bits(k)


@pytest.mark.parametrize("w", [16, 64])
@pytest.mark.parametrize("k", [1000, 2999, LANE_BATCH, LANE_BATCH + 1, 2 * LANE_BATCH + 5])
def test_circuit_on_random_vectors(k: int, w: int) -> None:
    """Uniform w-bit values, and small ones (many ties), up to three lane
    batches (the batch winners meet in a second tournament)."""
    rng = np.random.default_rng(k + w)
    half = 1 << (w - 1)
    for z in (rng.integers(-half, half, k, dtype=np.int64), rng.integers(-50, 50, k)):
        a, b = share(z, rng)
        got, ands, _ = run_plain(a, b, w)
        assert got == plain_argmax(a, b, w) == int(np.argmax(z))
        assert ands == argmax_and_gates(k, w) <= 3 * w * k


def test_edges_across_lane_batches() -> None:
    """The maximum, or a tie, in the short last batch or at a batch's edge."""
    k, w = 2 * LANE_BATCH + 3, 40
    rng = np.random.default_rng(1)
    for spots in (
        [0],
        [k - 1],
        [LANE_BATCH - 1],
        [LANE_BATCH],
        [k - 1, LANE_BATCH],
        [k - 2, k - 1],
    ):
        z = rng.integers(-1000, 1000, k)
        z[spots] = 5000
        a, b = share(z, rng)
        assert run_plain(a, b, w)[0] == min(spots)


@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("m", [1, 3, 6, 12])
def test_and_gates_for_a_whole_tree(m: int, w: int) -> None:
    """k = 2^m in one lane batch: (w − 1)·k for the sums, 2w per match but w in
    the final, and Σ_L L·2^(m−1−L) = k − m − 1 for the index muxes — about 3w
    ANDs per candidate (docs/mpc.md)."""
    k = 1 << m
    a, b = share(list(range(k)), np.random.default_rng(m))
    _, ands, _ = run_plain(a, b, w)
    assert ands == (w - 1) * k + 2 * w * (k - 1) - w + (k - m - 1)


def test_and_gates_per_candidate() -> None:
    """The figures docs/mpc.md quotes, at 10^3 and 10^4 candidates."""
    for k in (1000, 10_000):
        rng = np.random.default_rng(k)
        a, b = share(rng.integers(-9, 9, k), rng)
        for w, per in ((40, 120), (64, 192)):
            if k == 10_000 and w == 64:
                continue  # the formula, checked against the circuit above, suffices
            ands = run_plain(a, b, w)[1]
            assert ands == argmax_and_gates(k, w) and abs(ands / k - per) < 1


def test_width_is_checked() -> None:
    with pytest.raises(ValueError, match="width"):
        noisy_max_spec(1)
    with pytest.raises(ValueError, match="width"):
        run_plain(*share([1, 2], np.random.default_rng(0)), 72)


def test_the_result_message_is_checked() -> None:
    assert _parse_argmax((3).to_bytes(8, "little"), 4) == 3
    for bad in ((-1).to_bytes(8, "little", signed=True), (4).to_bytes(8, "little"), b"\x00"):
        with pytest.raises(ValueError):
            _parse_argmax(bad, 4)


# ---------------------------------------------------------------- negative controls
def _ties_to_the_right(be: Backend, x: Wires, y: Wires) -> Wires:
    """Broken on purpose: [x > y] where [x ≥ y] belongs, so a tie goes right."""
    return be.not_(_ORIGINAL(be, y, x))


def _unsigned(be: Backend, x: Wires, y: Wires) -> Wires:
    """Broken on purpose: [x ≥ y] as unsigned numbers (the sign bit not flipped),
    so every negative value beats every non-negative one."""
    w = x.shape[0]
    c = be.not_(be.and_(be.not_(x[0]), y[0]))
    for i in range(1, w):
        c = be.xor(c, be.and_(be.xor(x[i], c), be.xor(be.not_(y[i]), c)))
    return c


_ORIGINAL = circuits._signed_ge


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[..., Wires]], None]]:
    def install(compare: Callable[..., Wires]) -> None:
        monkeypatch.setattr(circuits, "_signed_ge", compare)

    yield install


@pytest.mark.parametrize("wrong", [_ties_to_the_right, _unsigned], ids=["ties-right", "unsigned"])
@pytest.mark.parametrize("w", [8, 64])
def test_a_wrong_circuit_is_caught(
    w: int, wrong: Callable[..., Wires], broken: Callable[..., None]
) -> None:
    """The edge checks pass the real circuit and reject each broken variant."""
    sizes = (2, 3, 9, 100)
    assert sum(mismatches(k, w) for k in sizes) == 0
    broken(wrong)
    assert all(mismatches(k, w) > 0 for k in sizes)


async def test_the_protocol_catches_a_wrong_circuit(broken: Callable[..., None]) -> None:
    broken(_ties_to_the_right)
    rng = np.random.default_rng(2)
    a, b = share([4, 9, 9, -3], rng)
    g, e = await connected_pair()
    got = await asyncio.gather(g.noisy_max(a), e.noisy_max(b))
    assert got == [2, 2] != [plain_argmax(a, b)] * 2


# ---------------------------------------------------------------- the protocol
async def test_protocol_finds_the_noisy_max(mpc_engine: str) -> None:
    """Both parties learn the plaintext argmax, for one candidate to more than
    two lane batches (streamed), at widths 8 to 64; each message fits the
    announced bound; no candidates give None."""
    rng = np.random.default_rng(5)
    g, e = await connected_pair()
    assert g.engine == e.engine == mpc_engine
    cases = [(1, 64), (2, 8), (3, 40), (7, 16), (5, 33), (1000, 35), (2 * LANE_BATCH + 17, 40)]
    for k, w in cases:
        for z in edge_vectors(k, w, rng)[:4] + [list(rng.integers(-(1 << 20), 1 << 20, k))]:
            a, b = share(z, rng)
            got = await asyncio.gather(g.noisy_max(a, w), e.noisy_max(b, w))
            assert got == [plain_argmax(a, b, w)] * 2
        spec = noisy_max_spec(w)
        assert e.last_stats.and_gates == g.last_stats.and_gates == argmax_and_gates(k, w)
        assert e.last_stats.messages == 2 + spec.parts(k)
        assert max(e.last_stats.bytes_received, g.last_stats.bytes_received) <= spec.max_message(k)
    assert spec.parts(2 * LANE_BATCH + 17) == 4  # three streamed batches, then the rest
    none = np.zeros(0, dtype=np.uint64)
    assert await asyncio.gather(g.noisy_max(none), e.noisy_max(none)) == [None, None]
    # The chunk counters still agree after the empty chunk.
    a, b = share([1, 2], rng)
    assert await asyncio.gather(g.noisy_max(a), e.noisy_max(b)) == [1, 1]


@needs_native
@pytest.mark.parametrize("engines", [("native", "numpy"), ("numpy", "native")])
async def test_engines_interoperate(engines: tuple[str, str]) -> None:
    """A native garbler with a numpy evaluator and the reverse: one wire format."""
    g, e = await cross_engine_pair(*engines, b"rnm-cross")
    rng = np.random.default_rng(6)
    for k, w in ((5, 64), (300, 40), (LANE_BATCH + 3, 16)):
        a, b = share(rng.integers(-1000, 1000, k), rng)
        assert (
            await asyncio.gather(g.noisy_max(a, w), e.noisy_max(b, w))
            == [plain_argmax(a, b, w)] * 2
        )


@needs_native
@pytest.mark.parametrize(("k", "w"), [(37, 64), (LANE_BATCH + 300, 40)])
def test_engines_garble_the_same_bytes(k: int, w: int) -> None:
    """Numpy and native garblers given the same Δ, input labels and garbler
    bits write the same tables and hold the same output labels; both
    evaluators reach the same active labels, which decode to the argmax."""
    rng = np.random.default_rng(k)
    a, b = share(rng.integers(-(1 << 30), 1 << 30, k), rng)
    d = rng.integers(0, M64, 2, dtype=np.uint64, endpoint=False)
    d[0] |= np.uint64(1)
    labels0 = rng.integers(0, M64, (w, k, 2), dtype=np.uint64, endpoint=False)
    gb = [
        GarbleBackend(d, TweakableHash(), 91),
        native.NativeGarbleBackend(d, native.NativeHash(), 91),
    ]
    outs = [argmax_circuit(be, bit_planes(a), planes(labels0), k, w) for be in gb]
    assert gb[0].table_bytes() == gb[1].table_bytes()
    assert len(gb[0].table_bytes()) == 16 * (2 * argmax_and_gates(k, w) - k)  # one half-gate a lane
    assert all(np.array_equal(x, y) for x, y in zip(outs[0], outs[1], strict=True))
    bw = bit_planes(b)[:w].astype(np.uint64)
    active = labels0 ^ ((-bw)[..., None] & d)
    tables = gb[0].table_bytes()
    eb = [
        EvalBackend(TweakableHash(), 91, tables),
        native.NativeEvalBackend(native.NativeHash(), 91, tables),
    ]
    act = [argmax_circuit(be, None, planes(active), k, w) for be in eb]
    for be in eb:
        be.done()
    assert all(np.array_equal(x, y) for x, y in zip(act[0], act[1], strict=True))
    bits = [eb[0].decode(x, gb[0].decoding(x0)) for x, x0 in zip(act[0], outs[0], strict=True)]
    assert argmax_index(bits) == plain_argmax(a, b, w)


@pytest.mark.heavy
async def test_protocol_on_a_large_vector(mpc_engine: str) -> None:
    """10^5 candidates in one chunk (25 lane batches), ties at the maximum."""
    rng = np.random.default_rng(17)
    z = rng.integers(-(1 << 30), 1 << 30, 100_000)
    z[[70_001, 99_999, 4096 * 7]] = 1 << 31
    a, b = share(z, rng)
    g, e = await connected_pair()
    assert await asyncio.gather(g.noisy_max(a, 40), e.noisy_max(b, 40)) == [4096 * 7] * 2
