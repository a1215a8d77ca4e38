"""TurboSHAKE128 and draft-irtf-cfrg-vdaf-13's XofTurboShake128 and
XofFixedKeyAes128 (vdaf/turboshake.py) against the draft's published vectors
(tests/vectors/vdaf/13), plus the properties the vectors do not pin down."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.turboshake import (
    RATE,
    XofFixedKeyAes128,
    XofTurboShake128,
    next_vec,
    turboshake128,
)

VECTORS = Path(__file__).parent / "vectors" / "vdaf" / "13"
XOFS = {"XofTurboShake128": XofTurboShake128, "XofFixedKeyAes128": XofFixedKeyAes128}


def _vector(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(XOFS))
def test_the_drafts_vectors(name: str) -> None:
    """derive_seed and the Field128 vector of 40 elements, byte for byte."""
    v = _vector(name)
    xof = XOFS[name]
    seed, dst, binder = (bytes.fromhex(v[k]) for k in ("seed", "dst", "binder"))
    assert xof.derive_seed(seed, dst, binder).hex() == v["derived_seed"]
    got = next_vec(xof(seed, dst, binder), FIELD128.modulus, FIELD128.encoded_size, v["length"])
    encoded = b"".join(x.to_bytes(FIELD128.encoded_size, "little") for x in got)
    assert encoded.hex() == v["expanded_vec_field128"]


@pytest.mark.parametrize("name", sorted(XOFS))
def test_the_stream_does_not_depend_on_how_it_is_read(name: str) -> None:
    """Reading the stream in pieces of any size gives the same bytes as one read."""
    v = _vector(name)
    seed, dst, binder = (bytes.fromhex(v[k]) for k in ("seed", "dst", "binder"))
    whole = XOFS[name](seed, dst, binder).next(500)
    xof = XOFS[name](seed, dst, binder)
    pieces = b"".join(xof.next(n) for n in (1, 15, 16, 17, 0, 33, 100, 318))
    assert pieces == whole


def test_turboshake_domain_byte_and_block_edges() -> None:
    """The domain byte separates streams; a message of one, one less and one
    more than the rate absorbs (the padding's edge cases); D outside 1..127
    is refused."""
    assert turboshake128(b"", 1, 32) != turboshake128(b"", 2, 32)
    outs = {turboshake128(bytes(n), 7, 200) for n in (RATE - 2, RATE - 1, RATE, RATE + 1)}
    assert len(outs) == 4
    assert turboshake128(b"abc", 1, 300)[:32] == turboshake128(b"abc", 1, 32)
    for bad in (0, 0x80):
        with pytest.raises(ValueError):
            turboshake128(b"", bad, 1)


def test_seed_and_dst_bounds() -> None:
    with pytest.raises(ValueError):
        XofFixedKeyAes128(bytes(15), b"", b"")
    with pytest.raises(ValueError):
        XofTurboShake128(bytes(256), b"", b"")
    with pytest.raises(ValueError):
        XofTurboShake128(bytes(32), bytes(65536), b"")


def test_turboshake128_rfc9861_vector() -> None:
    """RFC 9861 (KangarooTwelve and TurboSHAKE), §5: TurboSHAKE128 of the
    empty message with D = 0x1F, 32 bytes."""
    assert turboshake128(b"", 0x1F, 32).hex() == (
        "1e415f1c5983aff2169217277d17bb538cd945a397ddec541f1ce41af2c1b74c"
    )
