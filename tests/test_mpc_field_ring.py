"""The field-to-ring pass: shares of a Prio3 field sum (Field64, Field128) reduced
mod p inside the garbled circuit, clamped to min(tri_p(S), N) and re-shared in
Z_2^64.  Checked against the plaintext reference at every edge of the reduction
and of the clamp, on random vectors, through the protocol on both engines (the
same bytes from each), with negative controls: circuits that forget the
reduction, or the sign, fail the same checks."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from conftest import cross_engine_pair

from svtagg.mpc import circuits, native
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.circuits import (
    FIELD64,
    FIELD128,
    PrimeField,
    bit_planes,
    field_clamp_reshare_circuit,
    field_words,
    plain_field_clamp,
    planes,
    prime_field,
    ring_from_bits,
)
from svtagg.mpc.garble import EvalBackend, GarbleBackend, PlainBackend
from svtagg.mpc.protocol import (
    connected_pair,
    field_clamp_reshare_spec,
)
from svtagg.vdaf import field as vdaf_field

FIELDS = [FIELD64, FIELD128]
M64 = 1 << 64
BOUNDS = [0, 1, 1000 << 16, (1 << 62) + 12345, (1 << 63) - 1]
needs_native = pytest.mark.skipif(not native.available(), reason="native core not built")


def edge_sums(f: PrimeField, bound: int) -> list[int]:
    """Integer sums t = a + b ∈ [0, 2p − 2] at every edge: of the reduction
    (p − 1, p, p + 1, 2p − 2), of the sign on Z_p ((p ± 1)/2, past p too) and of
    the clamp (0, N, N + 1, −N, −N − 1, each below and above p)."""
    p = f.modulus
    half = (p - 1) // 2
    edges = [0, 1, p - 1, p, p + 1, 2 * p - 2, half, half + 1, p + half, p + half + 1]
    for base in (0, p):
        edges += [base + bound, base + bound + 1, base + p - bound, base + p - bound - 1]
        edges += [base + max(bound - 1, 0)]
    return sorted({t for t in edges if 0 <= t <= 2 * p - 2})


def split(t: int, f: PrimeField, rnd: random.Random) -> tuple[int, int]:
    """A pair of shares a, b ∈ [0, p) with a + b = t as integers."""
    p = f.modulus
    a = rnd.randint(max(0, t - (p - 1)), min(t, p - 1))
    return a, t - a


def edge_pairs(f: PrimeField, bound: int, rnd: random.Random) -> tuple[list[int], list[int]]:
    pairs = [split(t, f, rnd) for t in edge_sums(f, bound)]
    pairs += [(f.modulus - 1, f.modulus - 1), (0, 0), (f.modulus - 1, 0), (0, f.modulus - 1)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def random_pairs(f: PrimeField, n: int, rnd: random.Random) -> tuple[list[int], list[int]]:
    """Uniform shares of sums a third uniform on Z_p, a third small (the honest
    case), a third small negatives (−S, which only a dishonest sum can be)."""
    p = f.modulus
    a = [rnd.randrange(p) for _ in range(n)]
    small = [rnd.randrange(1 << 30) for _ in range(n)]
    sums = [(rnd.randrange(p), small[i], p - 1 - small[i])[i % 3] for i in range(n)]
    return a, [(s - x) % p for s, x in zip(sums, a, strict=True)]


Circuit = Callable[..., tuple[np.ndarray, ...]]


def run_plain(
    a: list[int], b: list[int], f: PrimeField, bound: int, circuit: Circuit | None = None
) -> tuple[list[int], int]:
    """(r + y mod 2^64 per coordinate, ANDs) of the circuit in the plaintext backend."""
    k = len(a)
    rnd = np.random.default_rng(k)
    r = rnd.integers(0, M64, k, dtype=np.uint64, endpoint=False)
    neg_r = np.zeros((k, f.words), dtype=np.uint64)
    neg_r[:, 0] = np.uint64(0) - r
    aw = field_words(np.array(a, dtype=object), f).reshape(-1)
    bw = field_words(np.array(b, dtype=object), f).reshape(-1)
    be = PlainBackend()
    garbler_bits = bit_planes(np.concatenate([aw, neg_r.reshape(-1)]))
    out = (circuit or field_clamp_reshare_circuit)(
        be, garbler_bits, planes(bit_planes(bw)), k * f.words, bound, f
    )
    y = ring_from_bits(list(out))
    return [int(v) for v in y + r], be.and_gates


def mismatches(a: list[int], b: list[int], f: PrimeField, bound: int, **kw: Circuit) -> int:
    got, _ = run_plain(a, b, f, bound, kw.get("circuit"))
    return sum(g != w for g, w in zip(got, plain_field_clamp(a, b, f, bound), strict=True))


# ---------------------------------------------------------------- the reference
def test_moduli_are_draft07s() -> None:
    """The pass's moduli are the report layer's (mpc does not import vdaf)."""
    assert FIELD64.modulus == vdaf_field.FIELD64.modulus == 2**64 - 2**32 + 1
    assert FIELD128.modulus == vdaf_field.FIELD128.modulus
    assert FIELD128.modulus.bit_length() == 128 and FIELD64.modulus.bit_length() == 64
    assert prime_field(vdaf_field.FIELD128) is FIELD128 and prime_field("Field64") is FIELD64
    for bad in ("Field32", 7, PrimeField("Field64", 101, 1)):
        with pytest.raises(ValueError):
            prime_field(bad)


def test_reference_by_hand() -> None:
    p = FIELD64.modulus
    # (p−1) + (p−1) = 2p − 2 ≡ p − 2 ≡ −2: tri 2.
    assert plain_field_clamp([p - 1], [p - 1], FIELD64, 100) == [2]
    assert plain_field_clamp([p - 1], [1], FIELD64, 100) == [0]  # exactly p
    assert plain_field_clamp([p - 1], [2], FIELD64, 100) == [1]  # p + 1
    assert plain_field_clamp([5], [p - 10], FIELD64, 100) == [5]  # −5
    assert plain_field_clamp([70], [60], FIELD64, 100) == [100]  # clamped
    assert plain_field_clamp([(p - 1) // 2], [0], FIELD64, (1 << 63) - 1) == [(p - 1) // 2]


# ---------------------------------------------------------------- the circuit
@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
@pytest.mark.parametrize("bound", BOUNDS)
def test_circuit_at_the_edges(f: PrimeField, bound: int) -> None:
    rnd = random.Random(bound ^ f.words)
    a, b = edge_pairs(f, bound, rnd)
    got, _ = run_plain(a, b, f, bound)
    assert got == plain_field_clamp(a, b, f, bound)


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_circuit_on_random_vectors(f: PrimeField) -> None:
    rnd = random.Random(11 * f.words)
    for bound in (1000 << 16, (1 << 62) + 3):
        a, b = random_pairs(f, 400, rnd)
        got, ands = run_plain(a, b, f, bound)
        assert got == plain_field_clamp(a, b, f, bound)
        assert ands <= (6 * f.bits + 120) * len(a)


@pytest.mark.parametrize(("f", "per_coordinate"), [(FIELD64, 504), (FIELD128, 888)])
def test_and_gates_per_coordinate(f: PrimeField, per_coordinate: int) -> None:
    """The documented cost (docs/mpc.md) for an even bound: 6·w_p + 120."""
    a, b = random_pairs(f, 10, random.Random(1))
    _, ands = run_plain(a, b, f, 5000 << 16)
    assert ands == per_coordinate * 10 == (6 * f.bits + 120) * 10


def test_more_than_one_lane_batch() -> None:
    """Field128 lanes are words: a vector over several lane batches keeps its
    words paired (4096 lanes hold 2048 coordinates)."""
    rnd = random.Random(5)
    a, b = random_pairs(FIELD128, 2048 + 37, rnd)
    bound = 1 << 40
    got, _ = run_plain(a, b, FIELD128, bound)
    assert got == plain_field_clamp(a, b, FIELD128, bound)


def test_shares_outside_the_field_are_refused() -> None:
    p = FIELD128.modulus
    with pytest.raises(ValueError, match="not an element"):
        field_words(np.array([0, p], dtype=object), FIELD128)
    with pytest.raises(ValueError, match="not an element"):
        field_words(np.array([-1], dtype=object), FIELD128)
    words = np.array([[p & (M64 - 1), p >> 64]], dtype=np.uint64)  # exactly p, as words
    with pytest.raises(ValueError, match="not an element"):
        field_words(words, FIELD128)
    words[0, 0] -= np.uint64(1)  # p − 1 is fine
    assert field_words(words, FIELD128).shape == (1, 2)
    with pytest.raises(ValueError, match="not an element"):
        field_words(np.array([FIELD64.modulus], dtype=np.uint64), FIELD64)
    with pytest.raises(ValueError, match="words"):
        field_words(np.zeros(3, dtype=np.uint64), FIELD128)
    with pytest.raises(ValueError, match="bound"):
        run_plain([1], [2], FIELD64, 1 << 63)


# ---------------------------------------------------------------- negative controls
def _no_reduction(be, x, share, neg_r, bound, field):  # type: ignore[no-untyped-def]
    """Broken on purpose: a + b mod 2^w read as a signed number, never reduced
    mod p — the ring pass applied to field shares."""
    w = field.bits
    t = circuits._add_const(be, x, share)
    zero = be.xor(t[0], t[0])
    u = circuits._abs(be, t, keep=w - 1)
    return circuits._add_const(be, circuits._min_public(be, u, bound, zero), neg_r)


def _no_sign(be, x, share, neg_r, bound, field):  # type: ignore[no-untyped-def]
    """Broken on purpose: reduced mod p, then min(s, N) — s in (p/2, p) is not
    read as negative, so g is not 1-Lipschitz across 0."""
    p, w = field.modulus, field.bits
    t = circuits._add_const(be, x, share, carry_out=True)
    ge = circuits._ge_public(be, t, p)
    zero = be.xor(ge, ge)
    minus_p = (-p) % (1 << w)
    sub = [ge if (minus_p >> i) & 1 else zero for i in range(w)]
    s = circuits._add_wires(be, t[:w], sub)
    return circuits._add_const(be, circuits._min_public(be, s, bound, zero), neg_r)


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[..., object]], None]]:
    def install(batch: Callable[..., object]) -> None:
        monkeypatch.setattr(circuits, "_field_clamp_batch", batch)

    yield install


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
@pytest.mark.parametrize("wrong", [_no_reduction, _no_sign], ids=["no-mod-p", "no-sign"])
def test_a_wrong_circuit_is_caught(
    f: PrimeField, wrong: Callable[..., object], broken: Callable[..., None]
) -> None:
    """The edge and reconstruction checks above reject each broken variant
    (and still pass the real circuit, checked first on the same inputs)."""
    rnd = random.Random(3)
    bound = 1000 << 16
    a, b = edge_pairs(f, bound, rnd)
    ra, rb = random_pairs(f, 200, rnd)
    assert mismatches(a, b, f, bound) == 0 and mismatches(ra, rb, f, bound) == 0
    broken(wrong)
    assert mismatches(a, b, f, bound) > 0
    assert mismatches(ra, rb, f, bound) > 0


async def test_the_protocol_catches_a_wrong_circuit(broken: Callable[..., None]) -> None:
    broken(_no_reduction)
    p, bound = FIELD64.modulus, 1 << 30
    a, b = [p - 1, 7, p - 3], [5, 9, 1]  # sums p + 4, 16, p − 2
    g, e = await connected_pair()
    r, y = await asyncio.gather(
        g.field_clamp_reshare(a, bound, "Field64"), e.field_clamp_reshare(b, bound, "Field64")
    )
    assert [int(v) for v in r + y] != plain_field_clamp(a, b, FIELD64, bound)


# ---------------------------------------------------------------- the protocol
@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
async def test_protocol_reshares_the_clamped_field_sum(f: PrimeField, mpc_engine: str) -> None:
    """r (leader) + y (helper) = g_p(S) mod 2^64, edges and random sums, over
    more than one lane batch; the leader's r is fresh on each run."""
    rnd = random.Random(f.words)
    bound = 5000 << 16
    a, b = edge_pairs(f, bound, rnd)
    ra, rb = random_pairs(f, 2100 // f.words * f.words, rnd)
    a, b = a + ra, b + rb
    want = plain_field_clamp(a, b, f, bound)
    g, e = await connected_pair()
    assert g.engine == e.engine == mpc_engine
    r, y = await asyncio.gather(
        g.field_clamp_reshare(np.array(a, dtype=object), bound, f.name),
        e.field_clamp_reshare(field_words(np.array(b, dtype=object), f), bound, f),
    )
    assert [int(v) for v in r + y] == want
    assert e.last_stats.and_gates <= (6 * f.bits + 120) * len(a) and e.last_stats.messages == 3
    # Every message fits the length a receiver announces it will accept.
    limit = field_clamp_reshare_spec(bound, f).max_message(len(a) * f.words)
    assert max(e.last_stats.bytes_received, g.last_stats.bytes_received) <= limit
    r2, y2 = await asyncio.gather(
        g.field_clamp_reshare(a, bound, f), e.field_clamp_reshare(b, bound, f)
    )
    assert [int(v) for v in r2 + y2] == want
    assert not np.array_equal(r, r2)  # a fresh mask (CSPRNG) each time
    empty = await asyncio.gather(g.field_clamp_reshare([], 1, f), e.field_clamp_reshare([], 1, f))
    assert [x.shape for x in empty] == [(0,), (0,)]


@needs_native
@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_engines_garble_the_same_bytes(f: PrimeField) -> None:
    """Numpy and native garblers given the same Δ, input labels and garbler
    bits send the same tables and hold the same output labels; both evaluators
    reach the same active labels, which decode to the plaintext result."""
    rnd = random.Random(9)
    bound = 1000 << 16
    a, b = edge_pairs(f, bound, rnd)
    ra, rb = random_pairs(f, 60, rnd)
    a, b = a + ra, b + rb
    k = len(a)
    lanes = k * f.words
    rng = np.random.default_rng(4)
    d = rng.integers(0, M64, 2, dtype=np.uint64, endpoint=False)
    d[0] |= np.uint64(1)
    labels0 = rng.integers(0, M64, (64, lanes, 2), dtype=np.uint64, endpoint=False)
    r = rng.integers(0, M64, k, dtype=np.uint64, endpoint=False)
    neg_r = np.zeros((k, f.words), dtype=np.uint64)
    neg_r[:, 0] = np.uint64(0) - r
    aw = field_words(np.array(a, dtype=object), f).reshape(-1)
    garbler_bits = bit_planes(np.concatenate([aw, neg_r.reshape(-1)]))
    gb = [
        GarbleBackend(d, TweakableHash(), 77),
        native.NativeGarbleBackend(d, native.NativeHash(), 77),
    ]
    outs = [
        field_clamp_reshare_circuit(be, garbler_bits, planes(labels0), lanes, bound, f) for be in gb
    ]
    assert gb[0].table_bytes() == gb[1].table_bytes()
    assert all(np.array_equal(x, y) for x, y in zip(outs[0], outs[1], strict=True))
    bw = bit_planes(field_words(np.array(b, dtype=object), f).reshape(-1)).astype(np.uint64)
    active = labels0 ^ ((-bw)[..., None] & d)
    tables = gb[0].table_bytes()
    eb = [
        EvalBackend(TweakableHash(), 77, tables),
        native.NativeEvalBackend(native.NativeHash(), 77, tables),
    ]
    act = [field_clamp_reshare_circuit(be, None, planes(active), lanes, bound, f) for be in eb]
    for be in eb:
        be.done()
    assert all(np.array_equal(x, y) for x, y in zip(act[0], act[1], strict=True))
    bits = [eb[0].decode(w, gb[0].decoding(w0)) for w, w0 in zip(act[0], outs[0], strict=True)]
    y = ring_from_bits(bits)
    assert [int(v) for v in y + r] == plain_field_clamp(a, b, f, bound)


@needs_native
@pytest.mark.parametrize("engines", [("native", "numpy"), ("numpy", "native")])
async def test_engines_interoperate(engines: tuple[str, str]) -> None:
    """A native garbler with a numpy evaluator and the reverse: one wire format."""
    g, e = await cross_engine_pair(*engines, b"field-cross")
    rnd = random.Random(13)
    for f in FIELDS:
        a, b = edge_pairs(f, 1 << 20, rnd)
        r, y = await asyncio.gather(
            g.field_clamp_reshare(a, 1 << 20, f), e.field_clamp_reshare(b, 1 << 20, f)
        )
        assert [int(v) for v in r + y] == plain_field_clamp(a, b, f, 1 << 20)


@pytest.mark.heavy
@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
async def test_protocol_on_a_large_vector(f: PrimeField, mpc_engine: str) -> None:
    """100,000 coordinates in one chunk (25 to 50 lane batches)."""
    rnd = random.Random(17)
    a, b = random_pairs(f, 100_000, rnd)
    bound = 10_000 << 16
    g, e = await connected_pair()
    r, y = await asyncio.gather(
        g.field_clamp_reshare(a, bound, f), e.field_clamp_reshare(b, bound, f)
    )
    assert [int(v) for v in r + y] == plain_field_clamp(a, b, f, bound)
