"""The native field core (svtagg.vdaf._field) against the Python reference:
byte-identical results on random inputs for every operation it takes over
(field arithmetic with broadcasting, sums, powers, the NTT both ways,
polynomial evaluation, XOF vectors and decoding) and for whole Prio3 reports
(sharding with fixed randomness, every preparation message), plus the
switch's fallback when the core is missing.  The draft-07 vectors run on both
paths in test_vdaf_prio3.py and test_vdaf_field_xof.py."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from svtagg.vdaf import native
from svtagg.vdaf.field import (
    FIELD64,
    FIELD128,
    DecodeError,
    Field,
    Vec,
    ntt,
    poly_eval,
    poly_eval_at_roots,
)
from svtagg.vdaf.prio3 import NONCE_SIZE, Prio3, prio3_count, prio3_histogram, prio3_sum_vec
from svtagg.vdaf.xof import XofShake128

pytestmark = pytest.mark.skipif(not native.available(), reason=native.describe())
FIELDS = [FIELD64, FIELD128]


def both(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """fn() under the Python reference, then under the native core."""
    with native.using("python"):
        ref = fn()
    with native.using("native"):
        nat = fn()
    return ref, nat


def edge_values(f: Field, rng: random.Random, n: int) -> list[int]:
    """Random elements plus the ones where carries and reductions bite."""
    p = f.modulus
    edges = [0, 1, 2, p - 1, p - 2, (p - 1) // 2, (p + 1) // 2, 2**64 - 1, 2**64, 2**63]
    edges += [2**32 - 1, 2**32, 2**127 % p, (2**128 - 1) % p]
    return [e % p for e in edges] + [rng.randrange(p) for _ in range(n)]


def same_bytes(f: Field, ref: Vec, nat: Vec) -> None:
    assert ref.dtype == object and nat.dtype != object
    assert ref.shape == nat.shape
    assert f.encode_vec(ref) == f.encode_vec(nat)


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_elementwise_arithmetic_is_byte_identical(f: Field) -> None:
    rng = random.Random(99)
    xs = edge_values(f, rng, 500)
    ys = list(reversed(edge_values(f, rng, 500)))
    # every pair of edge values as well
    k = 14
    xs += [xs[i] for i in range(k) for _ in range(k)]
    ys += [ys[-1 - j] for _ in range(k) for j in range(k)]
    for op in ("add", "sub", "mul"):
        ref, nat = both(lambda op=op: getattr(f, op)(f.vec(xs), f.vec(ys)))
        same_bytes(f, ref, nat)
        ref, nat = both(lambda op=op: getattr(f, op)(f.vec(xs), 0xDEADBEEF12345))  # scalar
        same_bytes(f, ref, nat)
    ref, nat = both(lambda: f.neg(f.vec(xs)))
    same_bytes(f, ref, nat)
    # numpy broadcasting: (k, m) against (m,), non-contiguous operands
    mat = xs[: 20 * 7]
    row = ys[:7]
    ref, nat = both(lambda: f.mul(f.vec(mat).reshape(20, 7).T.T, f.vec(row)))
    same_bytes(f, ref, nat)
    ref, nat = both(lambda: f.sub(f.vec(mat).reshape(7, 20).T, f.vec(row)))
    same_bytes(f, ref, nat)


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_sums_powers_dot_are_byte_identical(f: Field) -> None:
    rng = random.Random(5)
    xs = edge_values(f, rng, 6 * 35 - 14)
    for axis in (0, 1, 2):
        ref, nat = both(lambda axis=axis: f.sum(f.vec(xs).reshape(5, 6, 7), axis=axis))
        same_bytes(f, ref, nat)
    ref, nat = both(lambda: f.sum(f.vec(xs)))
    assert f.to_int(ref) == f.to_int(nat) == sum(xs) % f.modulus
    for x in (0, 1, f.modulus - 1, rng.randrange(f.modulus)):
        ref, nat = both(lambda x=x: f.powers(x, 300, first=3))
        same_bytes(f, ref, nat)
    ref_d, nat_d = both(lambda: f.dot(f.vec(xs), f.vec(list(reversed(xs)))))
    assert ref_d == nat_d


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
@pytest.mark.parametrize("n", [1, 2, 4, 32, 256])
def test_ntt_and_poly_eval_are_byte_identical(f: Field, n: int) -> None:
    rng = random.Random(n)
    xs = edge_values(f, rng, 3 * n)[: 3 * n]
    for inverse in (False, True):
        ref, nat = both(lambda inv=inverse: ntt(f, f.vec(xs).reshape(3, n), inverse=inv))
        same_bytes(f, ref, nat)
    t = rng.randrange(f.modulus)
    ref, nat = both(lambda: poly_eval(f, f.vec(xs).reshape(3, n), t))
    same_bytes(f, ref, nat)
    ref, nat = both(lambda: poly_eval_at_roots(f, f.vec(xs), n))
    same_bytes(f, ref, nat)


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_xof_vectors_and_decoding_are_byte_identical(f: Field) -> None:
    for _ in range(5):
        seed, binder = os.urandom(16), os.urandom(20)
        ref, nat = both(lambda s=seed, b=binder: XofShake128(s, b"dst", b).next_vec(f, 777))
        same_bytes(f, ref, nat)
    data = f.encode_vec(f.vec(edge_values(f, random.Random(3), 40)))
    ref, nat = both(lambda: f.decode_vec(data))
    same_bytes(f, ref, nat)
    over = f.modulus.to_bytes(f.encoded_size, "little")
    for path in native.BACKENDS:
        with native.using(path), pytest.raises(DecodeError):
            f.decode_vec(data + over)


def test_native_sampling_rejects_at_the_modulus() -> None:
    """Candidates at and just above p are dropped, just below kept, order preserved."""
    for f in FIELDS:
        p, size = f.modulus, f.encoded_size
        cands = [p - 1, p, p + 1, 0, 2 ** (8 * size) - 1, 5]
        raw = b"".join(c.to_bytes(size, "little") for c in cands)
        with native.using("native"):
            out = f.zeros(len(cands))
            kept = native.core().sample(f.fid, raw, out)
        assert f.to_ints(out[:kept]) == [p - 1, 0, 5]


SUMVEC = [(1 << 16) - 3 * i for i in range(20)]
Report = tuple[str, Callable[[], Prio3], object, object]


def reports() -> list[Report]:
    """(name, instance, measurement, the result of aggregating it alone)."""
    return [
        ("count", prio3_count, 1, 1),
        ("sumvec", lambda: prio3_sum_vec(20, 17, 11), SUMVEC, SUMVEC),
        ("sumvec3", lambda: prio3_sum_vec(5, 3, 2, shares=3), [7, 0, 1, 6, 2], [7, 0, 1, 6, 2]),
        ("histogram", lambda: prio3_histogram(100, 10), 42, [int(i == 42) for i in range(100)]),
    ]


@pytest.mark.parametrize("case", reports(), ids=lambda c: c[0])
def test_whole_reports_are_byte_identical(case: Report) -> None:
    """Shard with the same randomness, prepare from the same bytes: every message equal."""
    _, make, measurement, result = case
    vdaf = make()
    nonce, rand, key = os.urandom(NONCE_SIZE), os.urandom(vdaf.rand_size), os.urandom(16)

    def run() -> list[bytes]:
        public, inputs = vdaf.shard(measurement, nonce, rand)
        msgs = [vdaf.encode_public_share(public)] + [vdaf.encode_input_share(s) for s in inputs]
        states, shares = [], []
        for j, s in enumerate(inputs):
            decoded = vdaf.decode_input_share(j, vdaf.encode_input_share(s))
            st, ps = vdaf.prep_init(key, j, nonce, public, decoded)
            states.append(st)
            shares.append(ps)
        msgs += [vdaf.encode_prep_share(ps) for ps in shares]
        msg = vdaf.prep_shares_to_prep(shares)
        msgs.append(vdaf.encode_prep_msg(msg))
        outs = [vdaf.prep_next(st, msg) for st in states]
        msgs += [vdaf.encode_agg_share(vdaf.aggregate([o])) for o in outs]
        msgs.append(repr(vdaf.unshard([vdaf.aggregate([o]) for o in outs], 1)).encode())
        return msgs

    ref, nat = both(run)
    assert ref == nat
    assert ref[-1] == repr(result).encode()


def test_vectors_keep_their_representation_across_a_switch() -> None:
    f = FIELD128
    with native.using("native"):
        a = f.vec([1, 2, 3])
    with native.using("python"):
        assert f.to_ints(f.mul(a, a)) == [1, 4, 9]  # follows the operand, not the switch
        assert f.to_ints(ntt(f, f.zeros_as(a, 4))) == [0, 0, 0, 0]
    assert np.asarray(a).dtype != object


def test_switch_falls_back_and_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_core", None)
    monkeypatch.setattr(native, "_load_error", "no compiler")
    before = native.active()
    try:
        with pytest.raises(RuntimeError, match="no compiler"):
            native.use("native")
        assert native.use("auto") == "python"
        assert "no compiler" in native.describe()
    finally:
        monkeypatch.undo()
        native.use(before)
    with pytest.raises(ValueError):
        native.use("gpu")
