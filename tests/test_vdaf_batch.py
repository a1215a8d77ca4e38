"""Batched preparation (Prio3.prep_init_batch / prep_shares_to_prep_batch) against the
per-report path: the same prep states, prep shares and prep messages byte for byte
on random reports of every Prio3 type, every draft-07 vector through the batched
path, and invalid reports inside a batch rejected one by one."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import numpy as np
import pytest

from svtagg.vdaf import native, xof
from svtagg.vdaf.field import (
    FIELD64,
    FIELD128,
    DecodeError,
    bit_check_at,
    bit_check_pairs,
    dot_last,
    mul_cols,
    pair_products,
    powers_rows,
    weighted_rows,
)
from svtagg.vdaf.prio3 import (
    NONCE_SIZE,
    InputShare,
    PrepShare,
    Prio3,
    VerifyError,
    prio3_count,
    prio3_histogram,
    prio3_sum,
    prio3_sum_vec,
)
from tests.test_vdaf_prio3 import FILES, VECTORS, instance

#: Every test here runs on the native field core and on the Python reference.
pytestmark = pytest.mark.usefixtures("vdaf_backend")

CASES: dict[str, tuple[Prio3, Any]] = {
    "count": (prio3_count(), lambda i: i % 2),
    "count3": (prio3_count(3), lambda i: (i + 1) % 2),
    "sum": (prio3_sum(8), lambda i: (37 * i) % 256),
    "sumvec": (prio3_sum_vec(10, 3, 4), lambda i: [(i + k) % 8 for k in range(10)]),
    "sumvec3": (prio3_sum_vec(5, 2, 3, shares=3), lambda i: [(i * k) % 4 for k in range(5)]),
    "histogram": (prio3_histogram(10, 3), lambda i: (3 * i) % 10),
}

Report = tuple[bytes, Any, list[InputShare]]


def shard_many(vdaf: Prio3, make: Any, count: int) -> list[Report]:
    out = []
    for i in range(count):
        nonce = os.urandom(NONCE_SIZE)
        public, inputs = vdaf.shard(make(i), nonce)
        out.append((nonce, public, inputs))
    return out


def batch_init(vdaf: Prio3, key: bytes, reports: list[Report]) -> list[list[Any]]:
    """Per aggregator, prep_init_batch over the reports."""
    return [
        vdaf.prep_init_batch(
            key, j, [r[0] for r in reports], [r[1] for r in reports], [r[2][j] for r in reports]
        )
        for j in range(vdaf.shares)
    ]


def per_report_init(vdaf: Prio3, key: bytes, reports: list[Report]) -> list[list[Any]]:
    return [
        [vdaf.prep_init(key, j, nonce, public, inputs[j]) for nonce, public, inputs in reports]
        for j in range(vdaf.shares)
    ]


def state_bytes(vdaf: Prio3, state: Any) -> tuple[bytes, bytes | None]:
    return vdaf.field.encode_vec(state.out_share), state.corrected_joint_rand_seed


def msg_or_error(vdaf: Prio3, shares: list[PrepShare]) -> bytes | None | type:
    try:
        return vdaf.prep_shares_to_prep(shares)
    except VerifyError:
        return VerifyError


def outcome(entry: bytes | None | VerifyError) -> bytes | None | type:
    return VerifyError if isinstance(entry, VerifyError) else entry


@pytest.mark.parametrize("name", list(CASES))
def test_batch_equals_per_report_bytes(name: str) -> None:
    vdaf, make = CASES[name]
    key = os.urandom(16)
    reports = shard_many(vdaf, make, 7)
    batched, single = batch_init(vdaf, key, reports), per_report_init(vdaf, key, reports)
    for j in range(vdaf.shares):
        assert len(batched[j]) == len(reports)
        for (bs, bp), (ss, sp) in zip(batched[j], single[j], strict=True):
            assert vdaf.encode_prep_share(bp) == vdaf.encode_prep_share(sp)
            assert state_bytes(vdaf, bs) == state_bytes(vdaf, ss)
    per_report = [[batched[j][i][1] for j in range(vdaf.shares)] for i in range(len(reports))]
    msgs = vdaf.prep_shares_to_prep_batch(per_report)
    assert [outcome(m) for m in msgs] == [msg_or_error(vdaf, ps) for ps in per_report]
    assert not any(isinstance(m, VerifyError) for m in msgs)
    # The output shares add up to the measurements' sum.
    outs = [
        [vdaf.prep_next(batched[j][i][0], m) for i, m in enumerate(msgs)]
        for j in range(vdaf.shares)
    ]
    result = vdaf.unshard([vdaf.aggregate(o) for o in outs], len(reports))
    values = [make(i) for i in range(len(reports))]
    if isinstance(values[0], list):
        expected: Any = [sum(col) for col in zip(*values, strict=True)]
    elif "histogram" in name:
        expected = [values.count(b) for b in range(10)]
    else:
        expected = sum(values)
    assert result == expected


def test_batch_is_chunked_internally_without_changing_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from svtagg.vdaf import rows

    monkeypatch.setattr(rows, "_PREP_BATCH", 3)
    vdaf, make = CASES["histogram"]
    key = os.urandom(16)
    reports = shard_many(vdaf, make, 8)
    batched, single = batch_init(vdaf, key, reports), per_report_init(vdaf, key, reports)
    for j in range(vdaf.shares):
        assert [vdaf.encode_prep_share(p) for _, p in batched[j]] == [
            vdaf.encode_prep_share(p) for _, p in single[j]
        ]


def test_xof_rows_fall_back_to_streams_when_an_element_is_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one-shot decode of a batch's expansions gives way to per-stream sampling
    (which skips rejected elements) when any element is ≥ p; forced here."""
    vdaf, _ = CASES["sumvec"]
    f = vdaf.field
    seeds = [os.urandom(16) for _ in range(4)]
    binders = [bytes([i]) for i in range(4)]
    dst = xof.format_dst(0, 2, 1)
    fast = xof.expand_rows(f, seeds, dst, binders, 9)

    def refuse(*args: Any) -> Any:
        raise DecodeError("forced")

    monkeypatch.setattr(type(f), "decode_vec", refuse)
    monkeypatch.setattr(xof, "_all_below_p", lambda f, out: False)
    slow = xof.expand_rows(f, seeds, dst, binders, 9)
    want = [xof.XofShake128(s, dst, b).next_vec(f, 9) for s, b in zip(seeds, binders, strict=True)]
    assert f.encode_vec(fast) == f.encode_vec(slow) == b"".join(f.encode_vec(w) for w in want)


@pytest.mark.parametrize("name", FILES)
def test_vectors_through_the_batch(name: str) -> None:
    """All of a vector's reports as one batch per aggregator, from the encoded bytes."""
    v = json.loads((VECTORS / name).read_text())
    vdaf = instance(name, v)
    key = bytes.fromhex(v["verify_key"])
    preps = v["prep"]
    nonces = [bytes.fromhex(p["nonce"]) for p in preps]
    publics = [vdaf.decode_public_share(bytes.fromhex(p["public_share"])) for p in preps]
    batched = [
        vdaf.prep_init_batch(
            key,
            j,
            nonces,
            publics,
            [vdaf.decode_input_share(j, bytes.fromhex(p["input_shares"][j])) for p in preps],
        )
        for j in range(vdaf.shares)
    ]
    size = vdaf.field.encoded_size
    for i, p in enumerate(preps):
        shares = [batched[j][i][1] for j in range(vdaf.shares)]
        assert [vdaf.encode_prep_share(s).hex() for s in shares] == p["prep_shares"][0]
    msgs = vdaf.prep_shares_to_prep_batch(
        [[batched[j][i][1] for j in range(vdaf.shares)] for i in range(len(preps))]
    )
    for i, p in enumerate(preps):
        assert [vdaf.encode_prep_msg(msgs[i]).hex()] == p["prep_messages"]  # type: ignore[arg-type]
        for j in range(vdaf.shares):
            out = vdaf.prep_next(batched[j][i][0], msgs[i])  # type: ignore[arg-type]
            ints = vdaf.field.to_ints(out)
            assert [x.to_bytes(size, "little").hex() for x in ints] == p["out_shares"][j]


def _shift_leader(vdaf: Prio3, share: InputShare) -> InputShare:
    """The Leader's measurement share plus one in the first entry (a bit of 2, or a
    Count of 2)."""
    assert share.meas is not None
    f = vdaf.field
    bump = f.zeros_as(share.meas, len(share.meas))
    bump[:1] = f.as_like(share.meas, f.vec([1]))
    return InputShare(meas=f.add(share.meas, bump), proof=share.proof, blind=share.blind)


@pytest.mark.parametrize("name", ["count", "sum", "sumvec", "histogram"])
def test_invalid_reports_in_a_batch_are_rejected_one_by_one(name: str) -> None:
    vdaf, make = CASES[name]
    key = os.urandom(16)
    reports = shard_many(vdaf, make, 8)
    bad_meas, bad_nonce = {1, 6}, {3}
    tampered: list[Report] = []
    for i, (nonce, public, inputs) in enumerate(reports):
        if i in bad_meas:
            inputs = [_shift_leader(vdaf, inputs[0]), *inputs[1:]]
        if i in bad_nonce:
            nonce = os.urandom(NONCE_SIZE)  # prepared under a nonce the proof is not bound to
        tampered.append((nonce, public, inputs))
    batched, single = batch_init(vdaf, key, tampered), per_report_init(vdaf, key, tampered)
    msgs = vdaf.prep_shares_to_prep_batch(
        [[batched[j][i][1] for j in range(vdaf.shares)] for i in range(len(tampered))]
    )
    expected = [
        msg_or_error(vdaf, [single[j][i][1] for j in range(vdaf.shares)])
        for i in range(len(tampered))
    ]
    assert [outcome(m) for m in msgs] == expected
    rejected = {i for i, m in enumerate(msgs) if isinstance(m, VerifyError)}
    if name == "count":
        # Count has no joint randomness: a nonce change only moves the query point,
        # and an honest report is still accepted under it.
        assert rejected == bad_meas
    else:
        assert rejected == bad_meas | bad_nonce
    for i, m in enumerate(msgs):
        if i not in rejected:
            for j in range(vdaf.shares):
                assert vdaf.prep_next(batched[j][i][0], m) is not None  # type: ignore[arg-type]


def test_forged_joint_randomness_part_fails_only_its_report() -> None:
    vdaf, make = CASES["histogram"]
    key = os.urandom(16)
    reports = shard_many(vdaf, make, 5)
    nonce, public, inputs = reports[2]
    forged = [bytes(b ^ 1 for b in public[0]), *public[1:]]
    reports[2] = (nonce, forged, inputs)
    batched = batch_init(vdaf, key, reports)
    msgs = vdaf.prep_shares_to_prep_batch(
        [[batched[j][i][1] for j in range(vdaf.shares)] for i in range(5)]
    )
    failed = set()
    for i, m in enumerate(msgs):
        try:
            if isinstance(m, VerifyError):
                raise m  # the Helper's joint randomness differs: the proof fails …
            for j in range(vdaf.shares):
                vdaf.prep_next(batched[j][i][0], m)  # … or the joint randomness check
        except VerifyError:
            failed.add(i)
    assert failed == {2}


def test_malformed_input_names_the_report() -> None:
    vdaf, make = CASES["sum"]
    key = os.urandom(16)
    reports = shard_many(vdaf, make, 3)
    helper = [r[2][1] for r in reports]
    with pytest.raises(ValueError, match="report 1"):
        vdaf.prep_init_batch(
            key,
            0,
            [r[0] for r in reports],
            [r[1] for r in reports],
            [reports[0][2][0], helper[1], reports[2][2][0]],
        )
    with pytest.raises(ValueError, match="one nonce"):
        vdaf.prep_init_batch(key, 0, [reports[0][0]], [r[1] for r in reports], helper)
    assert vdaf.prep_init_batch(key, 1, [], [], []) == []
    assert vdaf.prep_shares_to_prep_batch([]) == []
    assert np.asarray(vdaf.flp.decide_batch(vdaf.field.zeros(0, vdaf.flp.verifier_len))).size == 0


@pytest.mark.parametrize("fid", [0, 1])
def test_batch_kernels_are_byte_identical_to_the_reference(vdaf_backend: str, fid: int) -> None:
    """powers_rows, dot_last, weighted_rows, bit_check_pairs, pair_products,
    mul_cols and bit_check_at, natively and on
    Python integers, on random elements plus the values where reductions bite."""
    if vdaf_backend != "native":
        pytest.skip("compares the native kernels with the reference once")
    f = [FIELD64, FIELD128][fid]
    rng = random.Random(fid)
    p = f.modulus
    edges = [0, 1, 2, p - 1, p - 2, (p + 1) // 2, 2**64 - 1, 2**63, 2**32 - 1, 2**127 % p]

    def draw(*shape: int) -> list[Any]:
        flat = [
            edges[i] % p if i < len(edges) else rng.randrange(p) for i in range(int(np.prod(shape)))
        ]
        rng.shuffle(flat)
        return np.array(flat, dtype=object).reshape(shape).tolist()  # type: ignore[no-any-return]

    m3, w2, x1, a3, b2, meas = (
        draw(4, 5, 6),
        draw(4, 5),
        draw(4),
        draw(3, 4, 7),
        draw(4, 7),
        draw(4, 9),
    )

    def run() -> list[bytes]:
        return [
            f.encode_vec(powers_rows(f, f.vec(x1), 13, first=1)),
            f.encode_vec(powers_rows(f, f.vec(x1), 13, first=0)),
            f.encode_vec(dot_last(f, f.vec(a3), f.vec(b2))),
            f.encode_vec(weighted_rows(f, f.vec(m3), f.vec(w2))),
            f.encode_vec(bit_check_pairs(f, f.vec(meas), f.vec(x1), f.inv(3), 12)),
            f.encode_vec(pair_products(f, f.vec(a3).reshape(4, 3, 7), 2)),
            f.encode_vec(mul_cols(f, f.vec(a3), f.vec(b2)[0])),
            # 9 elements in 5 calls of 2 (padding in the last call)
            f.encode_vec(bit_check_at(f, f.vec(meas), f.vec(x1), f.inv(3), f.vec(m3)[:, 0], 2, 5)),
        ]

    with native.using("python"):
        ref = run()
    with native.using("native"):
        nat = run()
    assert ref == nat


@pytest.mark.parametrize("name", list(CASES))
def test_shard_batch_equals_shard_bytes(name: str) -> None:
    """shard_batch with each report's randomness reproduces shard byte for byte, and
    its reports prepare and aggregate like any other."""
    vdaf, make = CASES[name]
    rows = 6
    measurements = [make(i) for i in range(rows)]
    nonces = [os.urandom(NONCE_SIZE) for _ in range(rows)]
    rands = [os.urandom(vdaf.rand_size) for _ in range(rows)]
    batch = vdaf.shard_batch(measurements, nonces, rands)
    for i, (public, inputs) in enumerate(batch):
        want_public, want_inputs = vdaf.shard(measurements[i], nonces[i], rands[i])
        assert vdaf.encode_public_share(public) == vdaf.encode_public_share(want_public)
        assert [vdaf.encode_input_share(s) for s in inputs] == [
            vdaf.encode_input_share(s) for s in want_inputs
        ]
    fresh = vdaf.shard_batch(measurements, nonces)  # CSPRNG randomness: new shares
    assert vdaf.encode_input_share(fresh[0][1][0]) != vdaf.encode_input_share(batch[0][1][0])
    reports = [(n, pub, ins) for n, (pub, ins) in zip(nonces, fresh, strict=True)]
    key = os.urandom(16)
    prepared = batch_init(vdaf, key, reports)
    msgs = vdaf.prep_shares_to_prep_batch(
        [[prepared[j][i][1] for j in range(vdaf.shares)] for i in range(rows)]
    )
    assert not any(isinstance(m, VerifyError) for m in msgs)


def test_shard_batch_vectors() -> None:
    """Every draft-07 vector's reports sharded as one batch."""
    for name in FILES:
        v = json.loads((VECTORS / name).read_text())
        vdaf = instance(name, v)
        preps = v["prep"]
        batch = vdaf.shard_batch(
            [p["measurement"] for p in preps],
            [bytes.fromhex(p["nonce"]) for p in preps],
            [bytes.fromhex(p["rand"]) for p in preps],
        )
        for p, (public, inputs) in zip(preps, batch, strict=True):
            assert vdaf.encode_public_share(public).hex() == p["public_share"], name
            assert [vdaf.encode_input_share(s).hex() for s in inputs] == p["input_shares"], name


def test_shard_batch_refuses_mismatched_inputs() -> None:
    vdaf, _ = CASES["sum"]
    with pytest.raises(ValueError, match="one nonce"):
        vdaf.shard_batch([1, 2], [os.urandom(NONCE_SIZE)])
    with pytest.raises(ValueError, match="random bytes"):
        vdaf.shard_batch([1], [os.urandom(NONCE_SIZE)], [b"short"])
    assert vdaf.shard_batch([], []) == []
