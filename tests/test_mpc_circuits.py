"""The comparison circuits on all three backends, and the security invariants a
test can see: the evaluator holds exactly one label per wire, tweaks never
repeat, and — negative control — the untweaked hash π(x) ⊕ x leaks Δ.  The
garbler and evaluator run on both engines, numpy and the native core."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from svtagg.mpc import native
from svtagg.mpc.aes import Blocks, FixedKeyAES, TweakableHash
from svtagg.mpc.circuits import (
    bit_planes,
    ctt_circuit,
    ctt_outcomes,
    first_yes_circuit,
    first_yes_index,
    plain_compare_to_thresholds,
    plain_first_yes,
    planes,
    prefix_or,
    sign_yes,
)
from svtagg.mpc.garble import EvalBackend, GarbleBackend, PlainBackend, lsb

RNG = np.random.default_rng(20261130)
M63 = 2**63

#: Reconstructed sums on every boundary the overflow bound |z| < 2^63 admits.
BOUNDARY_SUMS = [
    0,
    1,
    -1,
    2,
    -2,
    2**62,
    -(2**62),
    2**62 - 1,
    -(2**62) + 1,
    M63 - 1,
    -(M63 - 1),
    M63 - 2,
    -(M63 - 2),
    2**32,
    -(2**32),
]


ENGINES = [
    "numpy",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(not native.available(), reason="native core not built"),
    ),
]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def backends(engine: str, delta: Blocks, hasher: Any, tweak_hi: int) -> tuple[Any, Any]:
    """(garbler, evaluator) of `engine`; the native ones carry their own hash."""
    if engine == "native":
        h = native.NativeHash()
        return native.NativeGarbleBackend(delta, h, tweak_hi), native.NativeEvalBackend(
            h, tweak_hi, b""
        )
    return GarbleBackend(delta, hasher, tweak_hi), EvalBackend(hasher, tweak_hi, b"")


def split(sums: list[int] | np.ndarray, rng: np.random.Generator = RNG) -> tuple[Any, Any]:
    """Random additive shares of signed sums, including edge-valued shares."""
    z = np.asarray(sums, dtype=np.int64).view(np.uint64)
    z_l = rng.integers(0, 2**64, z.shape[0], dtype=np.uint64)
    edge = np.array([0, 2**63, 2**64 - 1, 1], dtype=np.uint64)
    z_l[: min(4, z.shape[0])] = edge[: min(4, z.shape[0])]
    return z_l, z - z_l


class NaiveHash:
    """The broken hash H(x, i) = π(x) ⊕ x: ignores the tweak (negative control)."""

    def __init__(self) -> None:
        self.prp = FixedKeyAES()

    def __call__(self, x: Blocks, tweaks: Blocks, out: Blocks | None = None) -> Blocks:
        h = self.prp.permute(np.ascontiguousarray(x)) ^ x
        if out is not None:
            out[: h.shape[0]] = h
            return out[: h.shape[0]]
        return h


def random_delta(rng: np.random.Generator = RNG) -> Blocks:
    d = rng.integers(0, 2**64, 2, dtype=np.uint64)
    d[0] |= np.uint64(1)
    return d


def garble_and_eval(
    circuit: Callable[..., Any],
    a_bits: np.ndarray,
    b_bits: np.ndarray,
    n: int,
    hasher: Any = None,
    log: bool = False,
    engine: str = "numpy",
) -> dict[str, Any]:
    """Run `circuit` on the plaintext, garbler and evaluator backends."""
    hasher = hasher if hasher is not None else TweakableHash()
    delta = random_delta()
    b0 = RNG.integers(0, 2**64, (64, n, 2), dtype=np.uint64)
    b_act = b0 ^ ((-(b_bits.astype(np.uint64)))[..., None] & delta)
    plain = PlainBackend()
    g, e = backends(engine, delta, hasher, 7)
    if log:
        plain.label_log, g.label_log, e.label_log, g.tweak_log = [], [], [], []
    out_p = circuit(plain, a_bits, planes(b_bits), n)
    out_g = circuit(g, a_bits, planes(b0), n)
    e._tables = np.frombuffer(g.table_bytes(), np.uint64).reshape(-1, 2)
    out_e = circuit(e, None, planes(b_act), n)
    e.done()
    return dict(
        plain=plain,
        g=g,
        e=e,
        delta=delta,
        b0=b0,
        b_act=b_act,
        out_p=out_p,
        out_g=out_g,
        out_e=out_e,
    )


def decode(r: dict[str, Any], i: int | None = None) -> np.ndarray:
    og = r["out_g"] if i is None else r["out_g"][i]
    oe = r["out_e"] if i is None else r["out_e"][i]
    return r["e"].decode(oe, r["g"].decoding(og))


def sign_circuit(be: Any, a: Any, b: Any, n: int) -> Any:
    return sign_yes(be, a, b, n)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64, 100, 1000])
def test_prefix_or_plain(n: int) -> None:
    for density in (0.0, 0.01, 0.3):
        x = (RNG.random(n) < density).astype(np.uint8)
        be = PlainBackend()
        assert np.array_equal(prefix_or(be, x), np.maximum.accumulate(x))
        assert be.and_gates < 2 * n


def test_sign_random_and_boundaries_all_backends(engine: str) -> None:
    sums = np.concatenate(
        [
            np.asarray(BOUNDARY_SUMS, dtype=np.int64),
            np.array([-(2**63)], dtype=np.int64),  # read as negative: NO
            RNG.integers(-(2**62), 2**62, 5000),
            RNG.integers(-1000, 1000, 500),
        ]
    )
    z_l, z_h = split(sums)
    n = sums.shape[0]
    r = garble_and_eval(sign_circuit, bit_planes(z_l), bit_planes(z_h), n, engine=engine)
    expect = ((z_l + z_h).view(np.int64) >= 0).astype(np.uint8)
    assert np.array_equal(r["out_p"], expect)
    assert np.array_equal(decode(r), expect)
    assert r["g"].and_gates == 63 * n == r["e"].and_gates
    assert len(r["g"].table_bytes()) == (1 + 2 * 62) * 16 * n


def test_first_yes_circuit_and_nothing_after_first_yes(engine: str) -> None:
    n = 300
    sums = RNG.integers(-(2**40), -1, n)
    sums[[120, 200, 250]] = [5, 0, 2**40]
    z_l, z_h = split(sums)
    r = garble_and_eval(first_yes_circuit, bit_planes(z_l), bit_planes(z_h), n, engine=engine)
    out = decode(r)
    assert first_yes_index(out) == plain_first_yes(z_l, z_h) == 120
    # The evaluator's decoded view is the one-hot alone: identical for any later inputs.
    sums2 = sums.copy()
    sums2[121:] = RNG.integers(-(2**40), 2**40, n - 121)
    z_l2, z_h2 = split(sums2)
    out2 = decode(
        garble_and_eval(first_yes_circuit, bit_planes(z_l2), bit_planes(z_h2), n, engine=engine)
    )
    onehot = np.zeros(n, np.uint8)
    onehot[120] = 1
    assert np.array_equal(out, onehot) and np.array_equal(out2, onehot)
    # No YES at all: every output is 0.
    z_l3, z_h3 = split(-np.abs(sums) - 1)
    none = decode(
        garble_and_eval(first_yes_circuit, bit_planes(z_l3), bit_planes(z_h3), n, engine=engine)
    )
    assert not none.any()


def test_ctt_circuit_matches_plaintext(engine: str) -> None:
    n = 200
    for _ in range(5):
        hi = RNG.integers(-50, 20, n)
        lo = hi + RNG.integers(0, 60, n)
        z = np.concatenate([hi, lo])
        z_l, z_h = split(z)

        def circ(be: Any, a: Any, b: Any, lanes: int) -> Any:
            return ctt_circuit(be, a, b, lanes // 2)

        r = garble_and_eval(circ, bit_planes(z_l), bit_planes(z_h), 2 * n, engine=engine)
        got = ctt_outcomes(decode(r, 0), decode(r, 1))
        zs = z_l + z_h
        assert got == plain_compare_to_thresholds(zs[:n], zs[n:])
        # Nothing after the first CLOSE: both outputs are 0 there.
        stop = len(got)
        assert not decode(r, 0)[stop:].any() and not decode(r, 1)[stop:].any()


def test_evaluator_holds_exactly_one_label_per_wire(engine: str) -> None:
    n = 64
    z_l, z_h = split(RNG.integers(-(2**20), 2**20, n))
    r = garble_and_eval(
        first_yes_circuit, bit_planes(z_l), bit_planes(z_h), n, log=True, engine=engine
    )
    d = r["delta"]
    # Input wires: the evaluator's label is the garbler's label of the true bit.
    bits = bit_planes(z_h).astype(np.uint64)
    assert np.array_equal(r["b_act"], r["b0"] ^ ((-bits)[..., None] & d))
    # Every wire of the circuit: active label = 0-label ⊕ value·Δ, never the other.
    logs = zip(r["plain"].label_log, r["g"].label_log, r["e"].label_log, strict=True)
    seen: set[bytes] = {bytes(x) for x in r["b_act"].reshape(-1, 2)}
    for v, w0, w in logs:
        assert np.array_equal(w, w0 ^ ((-(v.astype(np.uint64)))[:, None] & d))
        seen.update(bytes(x) for x in w)
    # No two labels in the evaluator's view differ by Δ (that would reveal Δ).
    assert not any(bytes((np.frombuffer(x, np.uint64) ^ d).tobytes()) in seen for x in seen)


def test_tweaks_unique_within_session_and_chunks_differ(engine: str) -> None:
    n = 500
    z_l, z_h = split(RNG.integers(-10, 10, n))
    r = garble_and_eval(
        first_yes_circuit, bit_planes(z_l), bit_planes(z_h), n, log=True, engine=engine
    )
    tw = np.concatenate(r["g"].tweak_log)
    assert np.unique(tw, axis=0).shape[0] == tw.shape[0]
    full = 62 * n + (r["g"].and_gates - 63 * n)
    assert tw.shape[0] == n + 2 * full  # one tweak per half-gate


def _attack(tg: Blocks, a_label: Blocks, te: Blocks, b_label: Blocks, h: Any) -> Blocks | None:
    """The evaluator's attack on one garbled AND with H(x) = π(x) ⊕ x.

    If p_b = 1, T_G ⊕ H(A) = H(A ⊕ Δ) ⊕ Δ = π(A ⊕ Δ) ⊕ A, so
    Δ = A ⊕ π⁻¹(T_G ⊕ π(A)); the candidate is checked against T_E, whose
    definition the evaluator can recompute once it knows Δ.
    """
    prp = FixedKeyAES()
    cand = a_label ^ prp.inverse(tg ^ prp.permute(a_label))
    if int(cand[0, 0]) & 1 != 1:
        return None
    rest = te ^ h(b_label, b_label) ^ h(b_label ^ cand, b_label)  # = A0 if cand = Δ
    consistent = np.array_equal(rest, a_label) or np.array_equal(rest, a_label ^ cand)
    return cand[0] if consistent else None


@pytest.mark.parametrize(
    "hasher,broken,engine",
    [
        (NaiveHash(), True, "numpy"),
        (TweakableHash(), False, "numpy"),
        pytest.param(
            None,
            False,
            "native",
            marks=pytest.mark.skipif(not native.available(), reason="native core not built"),
        ),
    ],
)
def test_negative_control_naive_hash_leaks_delta(hasher: Any, broken: bool, engine: str) -> None:
    """One AND layer of 32 gates; the evaluator holds only its active labels.
    The attack finds Δ in every gate with p_b = 1 under the naive hash (numpy
    engine: the native core has no naive variant to break), and in none under
    the tweakable hash, on either engine."""
    n = 32
    delta = random_delta()
    a0 = RNG.integers(0, 2**64, (n, 2), dtype=np.uint64)
    b0 = RNG.integers(0, 2**64, (n, 2), dtype=np.uint64)
    hasher = hasher if hasher is not None else native.NativeHash()
    g = backends(engine, delta, hasher, 1)[0]
    g.and_(a0, b0)
    tab = np.frombuffer(g.table_bytes(), np.uint64).reshape(2, n, 2)
    av, bv = RNG.integers(0, 2, n), RNG.integers(0, 2, n)
    a = a0 ^ ((-(av.astype(np.uint64)))[:, None] & delta)
    b = b0 ^ ((-(bv.astype(np.uint64)))[:, None] & delta)
    found = [
        _attack(tab[0, k : k + 1], a[k : k + 1], tab[1, k : k + 1], b[k : k + 1], hasher)
        for k in range(n)
    ]
    hits = [c for c in found if c is not None]
    if broken:
        # Every gate with p_b = 1 leaks Δ; P(no such gate among 32) = 2^-32.
        assert hits and all(np.array_equal(c, delta) for c in hits)
        assert len(hits) == int(np.sum(lsb(b0)))
    else:
        assert not hits
        prp = FixedKeyAES()
        raw = a ^ prp.inverse(tab[0] ^ prp.permute(a))  # the same inversion, unverified
        assert not np.any(np.all(raw == delta, axis=1))


@pytest.mark.parametrize("n", [0, 1, 7, 256, 257, 4096, 10_001])  # both sides of _SMALL_PLANES
def test_bit_planes_hold_bit_i_of_every_element_in_row_i(n: int) -> None:
    from svtagg.mpc.circuits import bit_planes

    z = np.random.default_rng(n).integers(0, 2**64, n, dtype=np.uint64)
    got = bit_planes(z)
    assert got.shape == (64, n) and got.dtype == np.uint8 and got.flags.c_contiguous
    want = ((z[None, :] >> np.arange(64, dtype=np.uint64)[:, None]) & np.uint64(1)).astype(np.uint8)
    assert np.array_equal(got, want)
