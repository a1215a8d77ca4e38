"""The fields, the NTT and XofShake128 of svtagg.vdaf against draft-irtf-cfrg-vdaf-07:
the draft's XofShake128 test vector, and field arithmetic against plain integers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from svtagg.vdaf.field import (
    FIELD64,
    FIELD128,
    DecodeError,
    Field,
    next_power_of_2,
    ntt,
    poly_eval,
    poly_eval_at_roots,
)
from svtagg.vdaf.xof import XofShake128, format_dst

VECTORS = Path(__file__).parent / "vectors" / "vdaf" / "07"
FIELDS = [FIELD64, FIELD128]


#: Every test here runs on the native field core and on the Python reference.
pytestmark = pytest.mark.usefixtures("vdaf_backend")


def test_xof_shake128_vector() -> None:
    v = json.loads((VECTORS / "XofShake128.json").read_text())
    seed, dst, binder = (bytes.fromhex(v[k]) for k in ("seed", "dst", "binder"))
    assert XofShake128.derive_seed(seed, dst, binder).hex() == v["derived_seed"]
    vec = XofShake128.expand_into_vec(FIELD128, seed, dst, binder, v["length"])
    assert len(vec) == v["length"]
    assert FIELD128.encode_vec(vec).hex() == v["expanded_vec_field128"]


def test_xof_stream_is_the_same_however_it_is_read() -> None:
    seed, dst, binder = bytes(range(16)), format_dst(0, 1, 2), b"binder"
    whole = XofShake128(seed, dst, binder).next(700)
    xof = XofShake128(seed, dst, binder)
    assert b"".join(xof.next(7) for _ in range(100)) == whole


def test_next_vec_rejects_values_at_or_above_the_modulus() -> None:
    # A tiny field makes rejection frequent: each accepted element must be the
    # next in-range 8-byte word of the stream, in order, none skipped or reused.
    tiny = Field("tiny", (1 << 62) + 135, 8, 1, 1)  # not NTT-friendly; only sampling is used
    seed, dst = bytes(16), b"t"
    out = XofShake128(seed, dst, b"").next_vec(tiny, 50)
    stream = XofShake128(seed, dst, b"")
    mask = (1 << 63) - 1  # next_power_of_2(p) - 1: p is just above 2^62
    expected: list[int] = []
    rejected = 0
    while len(expected) < 50:
        x = int.from_bytes(stream.next(8), "little") & mask
        if x < tiny.modulus:
            expected.append(x)
        else:
            rejected += 1
    assert rejected > 0  # the test exercised the rejection branch
    assert list(out) == expected


def test_format_dst_layout() -> None:
    assert format_dst(0, 0x01020304, 0x0506) == bytes([7, 0, 1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_arithmetic_matches_integers(f: Field) -> None:
    rng = random.Random(7)
    p = f.modulus
    xs = [rng.randrange(p) for _ in range(200)] + [0, 1, p - 1]
    ys = [rng.randrange(p) for _ in range(200)] + [p - 1, p - 1, p - 1]
    a, b = f.vec(xs), f.vec(ys)
    assert f.to_ints(f.add(a, b)) == [(x + y) % p for x, y in zip(xs, ys, strict=True)]
    assert f.to_ints(f.sub(a, b)) == [(x - y) % p for x, y in zip(xs, ys, strict=True)]
    assert f.to_ints(f.mul(a, b)) == [(x * y) % p for x, y in zip(xs, ys, strict=True)]
    assert f.to_ints(f.neg(a)) == [(-x) % p for x in xs]
    for x in xs[:20]:
        if x:
            assert x * f.inv(x) % p == 1
    with pytest.raises(ZeroDivisionError):
        f.inv(0)
    assert f.to_ints(f.powers(3, 10, first=2)) == [pow(3, k, p) for k in range(2, 12)]


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_encoding_round_trip_and_refusals(f: Field) -> None:
    rng = random.Random(11)
    vec = f.vec([rng.randrange(f.modulus) for _ in range(33)] + [f.modulus - 1, 0])
    data = f.encode_vec(vec)
    assert len(data) == f.encoded_size * vec.size
    # little-endian, element by element, as the draft encodes
    assert data[: f.encoded_size] == f.to_int(vec[0]).to_bytes(f.encoded_size, "little")
    assert f.to_ints(f.decode_vec(data)) == f.to_ints(vec)
    with pytest.raises(DecodeError):
        f.decode_vec(data[:-1])
    with pytest.raises(DecodeError):
        f.decode_vec(f.modulus.to_bytes(f.encoded_size, "little"))


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_generator_has_the_stated_order(f: Field) -> None:
    p = f.modulus
    assert pow(f.generator, f.gen_order, p) == 1
    assert pow(f.generator, f.gen_order // 2, p) == p - 1  # primitive: order exactly gen_order


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_ntt_is_evaluation_at_roots_and_inverts(f: Field, n: int) -> None:
    rng = random.Random(n)
    coeffs = f.vec([[rng.randrange(f.modulus) for _ in range(n)] for _ in range(3)])
    w = f.root(n)
    evals = ntt(f, coeffs)
    for r in range(3):
        for k in range(n):
            want = sum(c * pow(w, j * k, f.modulus) for j, c in enumerate(f.to_ints(coeffs[r])))
            assert f.to_int(evals[r, k]) == want % f.modulus
    assert f.to_ints(ntt(f, evals, inverse=True)) == f.to_ints(coeffs)


def test_poly_helpers() -> None:
    f = FIELD128
    rng = random.Random(5)
    coeffs = f.vec([rng.randrange(f.modulus) for _ in range(13)])
    t = rng.randrange(f.modulus)
    want = sum(c * pow(t, j, f.modulus) for j, c in enumerate(f.to_ints(coeffs))) % f.modulus
    assert f.to_int(poly_eval(f, coeffs, t)) == want
    at_roots = poly_eval_at_roots(f, coeffs, 4)  # longer than the NTT: folded mod x^4 - 1
    w = f.root(4)
    want_roots = [f.to_int(poly_eval(f, coeffs, pow(w, k, f.modulus))) for k in range(4)]
    assert f.to_ints(at_roots) == want_roots
    assert [next_power_of_2(n) for n in (1, 2, 3, 64, 65)] == [1, 2, 4, 64, 128]
