"""The Mastic draft's VIDPF (vdaf/vidpf.py), by its properties: the shares of
every prefix at every level sum to β on α's path and to zero elsewhere; the
two aggregators' node proofs agree at every node they visit for honest keys;
a key pair that is not one-hot (a tampered correction word) is caught by the
proofs; and a broken generator (no proof correction) is caught by the same
check — the negative control.  The draft publishes vectors for the whole
Mastic VDAF only (not matched yet: they need draft-13's FLP)."""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import replace

import pytest

from svtagg.vdaf.field import FIELD64, FIELD128
from svtagg.vdaf.vidpf import (
    NONCE_SIZE,
    RAND_SIZE,
    CorrectionWord,
    Vidpf,
    encode_path,
    visited,
)

CTX = b"svtagg vidpf test"


def _bits(x: int, n: int) -> tuple[bool, ...]:
    return tuple(bool(x >> (n - 1 - i) & 1) for i in range(n))


def _keys(v: Vidpf, alpha: tuple[bool, ...], beta: list[int]):  # type: ignore[no-untyped-def]
    nonce = os.urandom(NONCE_SIZE)
    words, keys = v.gen(alpha, beta, CTX, nonce, os.urandom(RAND_SIZE))
    return words, keys, nonce


def _proofs_agree(v: Vidpf, words: list[CorrectionWord], keys, nonce, prefixes) -> bool:  # type: ignore[no-untyped-def]
    trees = [v.eval_prefixes(a, words, keys[a], prefixes, CTX, nonce)[1] for a in (0, 1)]
    nodes = [visited(t) for t in trees]
    assert nodes[0].keys() == nodes[1].keys()
    return all(nodes[0][k].proof == nodes[1][k].proof for k in nodes[0])


@pytest.mark.parametrize("field", [FIELD64, FIELD128], ids=lambda f: f.name)
def test_every_prefix_at_every_level(field) -> None:  # type: ignore[no-untyped-def]
    """All 2 + 4 + ... + 2^5 prefixes of a 5-bit domain: β on α's path, 0 off it."""
    bits = 5
    v = Vidpf(field, bits, 3)
    rng = random.Random(7)
    for _ in range(3):
        alpha = _bits(rng.randrange(2**bits), bits)
        beta = [rng.randrange(field.modulus) for _ in range(3)]
        words, keys, nonce = _keys(v, alpha, beta)
        for level in range(1, bits + 1):
            prefixes = [_bits(x, level) for x in range(2**level)]
            shares = [v.eval_prefixes(a, words, keys[a], prefixes, CTX, nonce)[0] for a in (0, 1)]
            for x, s0, s1 in zip(prefixes, *shares, strict=True):
                total = [(a + b) % field.modulus for a, b in zip(s0, s1, strict=True)]
                assert total == (beta if x == alpha[:level] else [0, 0, 0]), (alpha, x)
        assert _proofs_agree(v, words, keys, nonce, [_bits(x, bits) for x in range(2**bits)])
        shares_of_beta = [v.beta_share(a, words, keys[a], CTX, nonce) for a in (0, 1)]
        assert [(a + b) % field.modulus for a, b in zip(*shares_of_beta, strict=True)] == beta


def test_a_long_input_on_a_few_prefixes() -> None:
    """A 64-bit input: the shares of α itself sum to β, of its sibling to 0,
    and the proofs along both paths agree."""
    v = Vidpf(FIELD64, 64, 1)
    alpha = _bits(random.Random(3).getrandbits(64), 64)
    words, keys, nonce = _keys(v, alpha, [1])
    sibling = (*alpha[:-1], not alpha[-1])
    shares = [v.eval_prefixes(a, words, keys[a], [alpha, sibling], CTX, nonce)[0] for a in (0, 1)]
    sums = [(a[0] + b[0]) % FIELD64.modulus for a, b in zip(*shares, strict=True)]
    assert sums == [1, 0]
    assert _proofs_agree(v, words, keys, nonce, [alpha, sibling])


@pytest.mark.parametrize("part", ["seed", "ctrl", "proof"])
def test_a_key_pair_that_is_not_one_hot_is_caught(part: str) -> None:
    """Tamper with one level's correction word so that the tree is no longer
    one-hot: the two aggregators' node proofs differ at some visited node."""
    bits = 4
    v = Vidpf(FIELD64, bits, 1)
    prefixes = [_bits(x, bits) for x in range(2**bits)]
    caught = 0
    for trial in range(6):
        alpha = _bits(trial % 2**bits, bits)
        words, keys, nonce = _keys(v, alpha, [1])
        level = trial % bits
        w = words[level]
        if part == "seed":
            bad = replace(w, seed=bytes([w.seed[0] ^ 2]) + w.seed[1:])
        elif part == "ctrl":
            bad = replace(w, ctrl=(not w.ctrl[0], not w.ctrl[1]))
        else:
            bad = replace(w, proof=bytes([w.proof[0] ^ 1]) + w.proof[1:])
        words = [*words[:level], bad, *words[level + 1 :]]
        caught += not _proofs_agree(v, words, keys, nonce, prefixes)
    assert caught == 6


def test_the_check_catches_a_generator_without_proof_corrections(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Negative control: a broken VIDPF whose generator leaves every proof
    correction zero fails the proof check on honest evaluation."""
    v = Vidpf(FIELD64, 3, 1)
    real = v.gen

    def broken(*args, **kw):  # type: ignore[no-untyped-def]
        words, keys = real(*args, **kw)
        return [replace(w, proof=bytes(len(w.proof))) for w in words], keys

    monkeypatch.setattr(v, "gen", broken)
    words, keys, nonce = _keys(v, (True, False, True), [1])
    assert not _proofs_agree(v, words, keys, nonce, [_bits(x, 3) for x in range(8)])


def test_inputs_are_checked_and_paths_packed() -> None:
    v = Vidpf(FIELD64, 3, 2)
    nonce, rand = bytes(NONCE_SIZE), bytes(RAND_SIZE)
    with pytest.raises(ValueError):
        v.gen((True, False), [1, 2], CTX, nonce, rand)
    with pytest.raises(ValueError):
        v.gen((True, False, True), [1], CTX, nonce, rand)
    with pytest.raises(ValueError):
        v.gen((True, False, True), [1, FIELD64.modulus], CTX, nonce, rand)
    words, keys = v.gen((True, False, True), [1, 2], CTX, nonce, rand)
    with pytest.raises(ValueError):
        v.eval_prefixes(0, words, keys[0], [(True,), (True, False)], CTX, nonce)
    with pytest.raises(ValueError):
        v.eval_prefixes(0, words, keys[0], [(True,), (True,)], CTX, nonce)
    assert encode_path((True,) * 9) == b"\xff\x80"
    assert encode_path((False, True, False)) == b"\x40"
    assert list(itertools.islice(visited(v.root(keys[0], 0)), 1)) == []
