"""Oblivious transfer: base OTs (both choice bits, group-element validation),
IKNP correlated and random OTs, and the bit-matrix transpose."""

from __future__ import annotations

import asyncio
import secrets

import numpy as np
import pytest

from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.channel import MemoryChannel
from svtagg.mpc.ot import (
    ELEMENT_BYTES,
    KAPPA,
    IKNPReceiver,
    IKNPSender,
    InvalidGroupElement,
    P,
    base_ot_receive,
    base_ot_send,
    check_group_element,
    random_ots_receiver,
    random_ots_sender,
    transpose_rows,
)


@pytest.mark.parametrize("nbytes", [1, 8, 24, 5000])
def test_transpose_matches_unpackbits(nbytes: int) -> None:
    mat = np.random.default_rng(nbytes).integers(0, 256, (KAPPA, nbytes), dtype=np.uint8)
    bits = np.unpackbits(mat, axis=1, bitorder="little")
    ref = np.packbits(np.ascontiguousarray(bits.T), axis=1, bitorder="little")
    assert np.array_equal(transpose_rows(mat), np.ascontiguousarray(ref).view(np.uint64))


@pytest.mark.parametrize("group", ["ed25519", "modp3072"])
async def test_base_ot_both_choice_bits(group: str) -> None:
    cs, cr = MemoryChannel.pair()
    choices = [i % 2 for i in range(KAPPA)]
    pairs, got = await asyncio.gather(
        base_ot_send(cs, KAPPA, b"sid", group), base_ot_receive(cr, choices, b"sid", group)
    )
    for (k0, k1), c, k in zip(pairs, choices, got, strict=True):
        assert k0 != k1
        assert k == (k1 if c else k0)
    assert len({k for pr in pairs for k in pr}) == 2 * KAPPA


@pytest.mark.parametrize(
    "bad",
    [0, 1, P - 1, P, P + 5, -3, P - 2],  # P−2 ≡ −2: a non-residue for p ≡ 7 mod 8
)
def test_invalid_group_elements_rejected(bad: int) -> None:
    with pytest.raises(InvalidGroupElement):
        check_group_element(bad)


def test_subgroup_check_agrees_with_exponentiation() -> None:
    q = (P - 1) // 2
    for _ in range(20):
        y = secrets.randbelow(P - 3) + 2
        residue = pow(y, q, P) == 1
        try:
            check_group_element(y)
            accepted = True
        except InvalidGroupElement:
            accepted = False
        assert accepted == residue


async def test_base_ot_sender_rejects_non_subgroup_element() -> None:
    cs, cr = MemoryChannel.pair()
    task = asyncio.create_task(base_ot_send(cs, 2, b"sid", "modp3072"))
    await cr.recv()  # A
    bad = (P - 2).to_bytes(ELEMENT_BYTES, "big") + (4).to_bytes(ELEMENT_BYTES, "big")
    await cr.send(bad)
    with pytest.raises(InvalidGroupElement):
        await task


async def test_base_ot_receiver_rejects_bad_a() -> None:
    cs, cr = MemoryChannel.pair()
    await cs.send((1).to_bytes(256, "big"))
    with pytest.raises(InvalidGroupElement):
        await base_ot_receive(cr, [0, 1], b"sid", "modp3072")


def _small_order_and_mixed_points() -> list[bytes]:
    """Encodings a peer might send to exploit the cofactor: the identity, a
    point of order 2, a non-canonical encoding, an off-curve value, and a
    valid point plus a point of order 8 (on the curve, not in the subgroup)."""
    import nacl.bindings as na

    identity = (1).to_bytes(32, "little")
    order2 = ((1 << 255) - 20).to_bytes(32, "little")  # (0, −1)
    noncanonical = ((1 << 255) - 19 + 1).to_bytes(32, "little")  # y = p + 1
    off_curve = (2).to_bytes(32, "little")
    order8 = bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a")
    g = bytes(na.crypto_scalarmult_ed25519_base_noclamp((5).to_bytes(32, "little")))
    mixed = bytes(na.crypto_core_ed25519_add(g, order8))
    return [identity, order2, noncanonical, off_curve, order8, mixed]


@pytest.mark.parametrize("bad", _small_order_and_mixed_points())
async def test_ed25519_base_ot_rejects_points_outside_the_subgroup(bad: bytes) -> None:
    """Both sides: a received point must be canonical, on the curve, in the
    prime-order subgroup and not of small order."""
    import nacl.bindings as na

    assert not na.crypto_core_ed25519_is_valid_point(bad)
    cs, cr = MemoryChannel.pair()
    await cs.send(bad)  # as the sender's A
    with pytest.raises(InvalidGroupElement):
        await base_ot_receive(cr, [0, 1], b"sid", "ed25519")
    cs, cr = MemoryChannel.pair()
    task = asyncio.create_task(base_ot_send(cs, 2, b"sid", "ed25519"))
    await cr.recv()  # A
    good = bytes(na.crypto_scalarmult_ed25519_base_noclamp((7).to_bytes(32, "little")))
    await cr.send(good + bad)  # as the receiver's B_1
    with pytest.raises(InvalidGroupElement):
        await task


def test_ed25519_is_the_default_base_ot_group() -> None:
    from svtagg.mpc.ot import default_group

    assert default_group() == "ed25519"


def _iknp_pair() -> tuple[IKNPSender, IKNPReceiver]:
    keys = [(secrets.token_bytes(16), secrets.token_bytes(16)) for _ in range(KAPPA)]
    s = [secrets.randbits(1) for _ in range(KAPPA)]
    s[0] = 1
    return IKNPSender(s, [k[c] for k, c in zip(keys, s, strict=True)]), IKNPReceiver(keys)


def test_iknp_correlated_ot_both_choice_bits() -> None:
    sender, receiver = _iknp_pair()
    m = 1024
    r = np.random.default_rng(3).integers(0, 2, m).astype(np.uint8)
    r[:2] = [0, 1]
    u, t = receiver.extend(np.packbits(r, bitorder="little"), nonce=5)
    q = sender.extend(u, m, nonce=5)
    delta = sender.delta
    expect = q ^ (-(r.astype(np.uint64)))[:, None] & delta
    assert np.array_equal(t, expect)
    other = q ^ (-((1 - r).astype(np.uint64)))[:, None] & delta
    assert not np.any(np.all(t == other, axis=1))
    # A fresh nonce gives fresh, unrelated blocks.
    u2, t2 = receiver.extend(np.packbits(r, bitorder="little"), nonce=6)
    assert not np.any(np.all(t2 == t, axis=1))


def test_iknp_pieces_match_one_shot() -> None:
    sender, receiver = _iknp_pair()
    rng = np.random.default_rng(4)
    pieces = [rng.integers(0, 256, w, dtype=np.uint8) for w in (16, 40, 8)]
    u = receiver.u_message(pieces, nonce=1)
    ts = [t.copy() for t in receiver.labels([16, 40, 8], nonce=1)]
    qs = [q.copy() for q in sender.labels(u, [16, 40, 8], nonce=1)]
    for r, t, q in zip(pieces, ts, qs, strict=True):
        bits = np.unpackbits(r, bitorder="little").astype(np.uint64)
        assert np.array_equal(t, q ^ ((-bits)[:, None] & sender.delta))


def test_random_ots_from_correlated() -> None:
    sender, receiver = _iknp_pair()
    m = 256
    r = np.random.default_rng(5).integers(0, 2, m).astype(np.uint8)
    u, t = receiver.extend(np.packbits(r, bitorder="little"), nonce=0)
    q = sender.extend(u, m, nonce=0)
    h = TweakableHash()
    ots = random_ots_sender(q, sender.delta, 99, h)
    got = random_ots_receiver(t, 99, h)
    chosen = np.where(r[:, None] == 1, ots.m1, ots.m0)
    unchosen = np.where(r[:, None] == 1, ots.m0, ots.m1)
    assert np.array_equal(got, chosen)
    assert not np.any(np.all(got == unchosen, axis=1))
    # The hash breaks the correlation: m0 ⊕ m1 is not a constant.
    assert len({bytes(v) for v in (ots.m0 ^ ots.m1)}) == m


def _pi_times_2_to(bits: int) -> int:
    """⌊π·2^bits⌋ by Machin's formula in integer arithmetic (64 guard bits)."""
    one = 1 << (bits + 64)

    def atan_inv(x: int) -> int:
        total, term, n, sign = 0, one // x, 1, 1
        while term:
            total += sign * (term // n)
            term //= x * x
            n += 2
            sign = -sign
        return total

    return (16 * atan_inv(5) - 4 * atan_inv(239)) >> 64


def _probable_prime(n: int, rounds: int = 16) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)[:rounds]:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_base_ot_group_is_rfc3526_group15() -> None:
    """The prime is RFC 3526's 3072-bit MODP prime, recomputed from its defining
    formula, and it is a safe prime with 2 in the order-q subgroup."""
    assert P == 2**3072 - 2**3008 - 1 + 2**64 * (_pi_times_2_to(2942) + 1690314)
    assert P.bit_length() == 3072 and ELEMENT_BYTES == 384
    assert _probable_prime(P) and _probable_prime((P - 1) // 2)
    assert pow(2, (P - 1) // 2, P) == 1
