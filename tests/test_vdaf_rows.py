"""Prio3 over batches as matrices (vdaf/rows.py) and what it runs on: the XOF
over many rows (xof.shake_rows and its pieces; the native core's SHAKE128 at
every width it has, against hashlib), the batch codecs, the batch encoders
of the circuits and Validity, and the native kernels added for them — each
byte for byte against the per-report algorithms and the Python reference."""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

import numpy as np
import pytest

from svtagg.vdaf import native, xof
from svtagg.vdaf.circuits import Histogram, MeasurementError, SumVec
from svtagg.vdaf.field import (
    FIELD64,
    FIELD128,
    DecodeError,
    Field,
    bit_check_at,
    bits_value,
    ntt,
    pair_products,
    poly_eval_at_roots,
)
from svtagg.vdaf.flp import Mul, ParallelSum, _mul_gadget_poly, gadget_poly
from svtagg.vdaf.prio3 import (
    NONCE_SIZE,
    PrepShare,
    Prio3,
    prio3_count,
    prio3_histogram,
    prio3_multihot,
    prio3_range_vec,
    prio3_sum,
    prio3_sum_vec,
)
from svtagg.vdaf.ranged import MultiHot, RangeVec
from svtagg.vdaf.rows import PrepRows, ReportRows
from svtagg.vdaf.validity import Validity

CASES: dict[str, tuple[Prio3, Any]] = {
    "count": (prio3_count(), lambda i: i % 2),
    "sum": (prio3_sum(8), lambda i: (37 * i) % 256),
    "sumvec3": (prio3_sum_vec(5, 2, 3, shares=3), lambda i: [(i * k) % 4 for k in range(5)]),
    "histogram": (prio3_histogram(10, 3), lambda i: (3 * i) % 10),
    "rangevec": (prio3_range_vec(7, 4, 5), lambda i: [(i * k) % 17 for k in range(7)]),
    "multihot": (prio3_multihot(9, 3, 4), lambda i: [int(k in (i % 9, 2)) for k in range(9)]),
}

needs_native = pytest.mark.skipif(not native.available(), reason=native.describe())


def widths() -> list[int]:
    """The SHAKE128 widths this CPU runs (1 always; 4 and 8 with AVX2 / AVX-512F)."""
    core = native.core()
    best = core.keccak_width(0)
    return [w for w in (1, 4, 8) if w <= best]


# -- the XOF over rows --------------------------------------------------------------


def random_pieces(rng: random.Random, rows: int) -> tuple[list[xof.Piece], list[bytes]]:
    """Pieces of every kind (shared, per row with gaps between rows, offsets, empty)
    and the messages they make."""
    pieces: list[xof.Piece] = []
    msgs = [b""] * rows
    for _ in range(rng.randrange(0, 5)):
        width = rng.choice([0, 1, 16, 167, 168, 169, 335, 336, 1000])
        if rng.random() < 0.3:
            data = os.urandom(width + 3)
            pieces.append((data, 3, width, 0))
            msgs = [m + data[3 : 3 + width] for m in msgs]
        else:
            stride, offset = width + rng.randrange(0, 3), rng.randrange(0, 3)
            buf = bytearray(os.urandom(offset + stride * rows + 2))
            pieces.append((buf, offset, width, stride))
            msgs = [
                m + bytes(buf[offset + r * stride : offset + r * stride + width])
                for r, m in enumerate(msgs)
            ]
    return pieces, msgs


@needs_native
def test_native_shake_rows_is_hashlib_at_every_width() -> None:
    """Every width of the native SHAKE128 (and the short tails of a batch, which go
    through narrower ones) gives hashlib's bytes, for messages and outputs around
    the 168-byte rate."""
    core = native.core()
    rng = random.Random(5)
    try:
        for width in widths():
            assert core.keccak_width(width) == width
            for _ in range(120):
                rows = rng.choice([0, 1, 2, 3, 4, 5, 7, 8, 9, 17])
                pieces, msgs = random_pieces(rng, rows)
                length = rng.choice([0, 1, 16, 167, 168, 169, 500, 3000])
                out = bytearray(rows * length)
                core.shake_rows(tuple(pieces), rows, out)
                assert bytes(out) == b"".join(hashlib.shake_128(m).digest(length) for m in msgs)
    finally:
        core.keccak_width(0)


@needs_native
def test_native_shake_rows_refuses_bad_pieces() -> None:
    core = native.core()
    with pytest.raises(ValueError, match="past its buffer"):
        core.shake_rows(((b"abc", 0, 2, 2),), 2, bytearray(32))
    with pytest.raises(ValueError, match="rows x length"):
        core.shake_rows(((b"ab", 0, 1, 1),), 2, bytearray(3))
    with pytest.raises(ValueError, match="not available"):
        core.keccak_width(3)
    assert core.keccak_width() in (1, 4, 8)


@pytest.mark.usefixtures("vdaf_backend")
def test_shake_rows_seed_and_expansion_rows_are_the_streams() -> None:
    """shake_rows, derive_seed_rows and expand_rows_into (with and without `out`)
    are the per-report XofShake128 streams, on either backend."""
    rng = random.Random(9)
    rows = 11
    pieces, msgs = random_pieces(rng, rows)
    got = xof.shake_rows(pieces, rows, 200)
    assert got.tobytes() == b"".join(hashlib.shake_128(m).digest(200) for m in msgs)
    seeds = os.urandom(16 * rows)
    binders = os.urandom(5 * rows)
    dst = xof.format_dst(0, 3, 1)
    seed_piece, binder = xof.per_row(seeds, 16), [xof.shared(b"\x01"), xof.per_row(binders, 5)]
    derived = xof.derive_seed_rows(seed_piece, dst, binder, rows)
    for f in (FIELD64, FIELD128):
        out = f.zeros(rows, 9)
        into = xof.expand_rows_into(f, seed_piece, dst, binder, rows, 9, out)
        fresh = xof.expand_rows_into(f, seed_piece, dst, binder, rows, 9)
        assert into is out and f.encode_vec(into) == f.encode_vec(fresh)
        for r in range(rows):
            binder_r = b"\x01" + binders[5 * r : 5 * r + 5]
            stream = xof.XofShake128(seeds[16 * r : 16 * r + 16], dst, binder_r)
            assert f.encode_vec(fresh[r]) == f.encode_vec(stream.next_vec(f, 9))
            if f is FIELD64:
                assert derived[r].tobytes() == xof.XofShake128.derive_seed(
                    seeds[16 * r : 16 * r + 16], dst, binder_r
                )
    with pytest.raises(ValueError, match="16 bytes"):
        xof.derive_seed_rows(xof.per_row(seeds, 8), dst, [], rows)


@pytest.mark.usefixtures("vdaf_backend")
def test_expansion_rows_fall_back_to_streams_into_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """An element ≥ p (forced) sends a batch's expansion to the streams, which
    skip it, also when the result goes into `out`."""
    f = FIELD128
    seeds = os.urandom(16 * 3)
    dst = xof.format_dst(0, 3, 2)
    fast = xof.expand_rows_into(f, xof.per_row(seeds, 16), dst, [], 3, 6)

    def refuse(*args: Any) -> Any:
        raise DecodeError("forced")

    monkeypatch.setattr(type(f), "decode_vec", refuse)
    monkeypatch.setattr(xof, "_all_below_p", lambda f, out: False)
    out = f.zeros(3, 6)
    slow = xof.expand_rows_into(f, xof.per_row(seeds, 16), dst, [], 3, 6, out)
    assert slow is out and f.encode_vec(slow) == f.encode_vec(fast)


# -- the rows API against the per-report algorithms ----------------------------------


def shard_encoded(vdaf: Prio3, make: Any, rows: int) -> tuple[list[bytes], list[Any]]:
    nonces = [os.urandom(NONCE_SIZE) for _ in range(rows)]
    rands = [os.urandom(vdaf.rand_size) for _ in range(rows)]
    batch = vdaf.shard_batch_encoded([make(i) for i in range(rows)], nonces, rands)
    for i, (public, inputs) in enumerate(batch):
        want_public, want_inputs = vdaf.shard(make(i), nonces[i], rands[i])
        assert public == vdaf.encode_public_share(want_public)
        assert inputs == [vdaf.encode_input_share(s) for s in want_inputs]
    return nonces, batch


@pytest.mark.usefixtures("vdaf_backend")
@pytest.mark.parametrize("name", list(CASES))
def test_rows_are_the_per_report_algorithms_byte_for_byte(name: str) -> None:
    """shard_batch_encoded, decode_report_rows, prep_init_rows, the prep share
    codecs, prep_shares_to_prep_rows and prep_next_rows give, row by row, the
    bytes of shard, decode_*, prep_init, encode_prep_share, prep_shares_to_prep
    and prep_next."""
    vdaf, make = CASES[name]
    rows, key = 9, os.urandom(16)
    nonces, batch = shard_encoded(vdaf, make, rows)
    publics = [p for p, _ in batch]
    preps: list[PrepRows] = []
    encoded: list[list[bytes]] = []
    for j in range(vdaf.shares):
        ok, reports = vdaf.decode_report_rows(j, nonces, publics, [ins[j] for _, ins in batch])
        assert ok == list(range(rows))
        prep = vdaf.prep_init_rows(key, j, reports)
        shares = vdaf.encode_prep_share_rows(prep)
        for i in range(rows):
            public = vdaf.decode_public_share(publics[i])
            share = vdaf.decode_input_share(j, batch[i][1][j])
            state, ps = vdaf.prep_init(key, j, nonces[i], public, share)
            assert shares[i] == vdaf.encode_prep_share(ps)
            assert vdaf.field.encode_vec(prep.out_shares[i]) == vdaf.field.encode_vec(
                state.out_share
            )
            seed = None if prep.seeds is None else prep.seeds[i].tobytes()
            assert seed == state.corrected_joint_rand_seed
        preps.append(prep)
        encoded.append(shares)
    decoded = [vdaf.decode_prep_share_rows(e) for e in encoded]
    for (v, p), prep in zip(decoded, preps, strict=True):
        assert vdaf.field.encode_vec(v) == vdaf.field.encode_vec(prep.verifiers)
        assert (p is None) == (prep.parts is None)
        assert p is None or p.tobytes() == prep.parts.tobytes()  # type: ignore[union-attr]
    accepted, msgs = vdaf.prep_shares_to_prep_rows([v for v, _ in decoded], [p for _, p in decoded])
    assert accepted.all()
    for i in range(rows):
        ps = [vdaf.decode_prep_share_rows([encoded[j][i]]) for j in range(vdaf.shares)]
        msg = vdaf.prep_shares_to_prep(
            [PrepShare(v[0], None if p is None else p[0].tobytes()) for v, p in ps]
        )
        assert msg == (None if msgs is None else msgs[i].tobytes())
    for prep in preps:
        assert vdaf.prep_next_rows(prep, msgs).all()
        picked = None if msgs is None else msgs[[3, 1]]
        assert vdaf.prep_next_rows(prep, picked, [3, 1]).tolist() == [True, True]


@pytest.mark.usefixtures("vdaf_backend")
def test_decode_report_rows_drops_what_does_not_decode() -> None:
    """A report with a share of the wrong length, a public share of the wrong
    length or a Leader share holding an element ≥ p is left out — by index —
    and the rest are prepared as if alone; a prep share that does not decode
    is refused naming it."""
    vdaf, make = CASES["histogram"]
    f, key = vdaf.field, os.urandom(16)
    nonces, batch = shard_encoded(vdaf, make, 6)
    publics = [p for p, _ in batch]
    leader = [ins[0] for _, ins in batch]
    leader[1] = leader[1][:-1]
    leader[3] = (f.modulus).to_bytes(16, "little") + leader[3][16:]  # meas[0] = p
    publics[4] = publics[4] + b"\0"
    ok, reports = vdaf.decode_report_rows(0, nonces, publics, leader)
    assert ok == [0, 2, 5]
    alone = vdaf.prep_init_rows(
        key, 0, vdaf.decode_report_rows(0, [nonces[2]], [publics[2]], [leader[2]])[1]
    )
    prep = vdaf.prep_init_rows(key, 0, reports)
    assert vdaf.encode_prep_share_rows(prep)[1] == vdaf.encode_prep_share_rows(alone)[0]
    helper = [ins[1] for _, ins in batch]
    helper[0] = helper[0] + b"x"
    ok_h, _ = vdaf.decode_report_rows(1, nonces, publics, helper)
    assert ok_h == [1, 2, 3, 5]
    shares = vdaf.encode_prep_share_rows(prep)
    with pytest.raises(ValueError, match="prep share 1"):
        vdaf.decode_prep_share_rows([shares[0], shares[1][:-1]])
    with pytest.raises(DecodeError, match="prep share 0"):
        vdaf.decode_prep_share_rows([f.modulus.to_bytes(16, "little") + shares[0][16:]])
    with pytest.raises(ValueError, match="one nonce"):
        vdaf.decode_report_rows(0, nonces[:2], publics, leader)
    short = ReportRows(reports.nonces, reports.publics, reports.meas[:, :5], reports.proof)  # type: ignore[index]
    with pytest.raises(ValueError, match=r"meas of shape \(3, 5\)"):
        vdaf.prep_init_rows(key, 0, short)
    with pytest.raises(ValueError, match="lack their seeds"):
        vdaf.prep_init_rows(key, 1, reports)


@pytest.mark.usefixtures("vdaf_backend")
def test_a_rejected_row_is_rejected_alone() -> None:
    """An invalid measurement's row fails prep_shares_to_prep_rows; a forged joint
    randomness part fails its row's prep_next_rows; the other rows pass."""
    vdaf, make = CASES["multihot"]
    key = os.urandom(16)
    rows = 5
    nonces = [os.urandom(NONCE_SIZE) for _ in range(rows)]
    meas = vdaf.flp.valid.encode_batch([make(i) for i in range(rows)])  # type: ignore[attr-defined]
    bad = np.array(meas, copy=True)
    bad[2, 0] = vdaf.field.vec([2])[0]  # not a bit
    rands = np.frombuffer(os.urandom(vdaf.rand_size * rows), dtype=np.uint8).reshape(rows, -1)
    sharded = vdaf.shard_rows(
        bad, np.frombuffer(b"".join(nonces), dtype=np.uint8).reshape(rows, -1), rands
    )
    batch = vdaf.shard_encode_rows(sharded)
    publics = [p for p, _ in batch]
    publics[4] = bytes(b ^ 1 for b in publics[4][:16]) + publics[4][16:]
    preps = []
    for j in range(vdaf.shares):
        _, reports = vdaf.decode_report_rows(j, nonces, publics, [ins[j] for _, ins in batch])
        preps.append(vdaf.prep_init_rows(key, j, reports))
    accepted, msgs = vdaf.prep_shares_to_prep_rows(
        [p.verifiers for p in preps], [p.parts for p in preps]
    )
    passed = accepted & vdaf.prep_next_rows(preps[0], msgs) & vdaf.prep_next_rows(preps[1], msgs)
    assert passed.tolist() == [True, True, False, True, False]


# -- encoding a batch of measurements -------------------------------------------------


@pytest.mark.usefixtures("vdaf_backend")
def test_encode_batch_is_encode_of_each_and_refuses_alike() -> None:
    cases: list[tuple[Any, list[Any], list[Any]]] = [
        (Histogram(12, 4), [0, 11, 5, np.int64(3)], [12, -1, True, 2.0]),
        (SumVec(3, 4, 2), [[0, 15, 3], np.array([1, 2, 3])], [[16, 0, 0], [0, True, 1], [1, 2]]),
        (RangeVec(4, 3, 3), [[0, 8, 7, 1], [8, 8, 8, 8]], [[9, 0, 0, 0], [0, 0, 0, 1.0]]),
        (MultiHot(5, 2, 2), [[0, 1, 0, 1, 0], [0] * 5], [[1, 1, 1, 0, 0], [2, 0, 0, 0, 0]]),
    ]
    for valid, good, bads in cases:
        f = valid.field
        want = b"".join(f.encode_vec(valid.encode(m)) for m in good)
        assert f.encode_vec(valid.encode_batch(good)) == want
        if not isinstance(valid, Histogram):
            assert f.encode_vec(valid.encode_batch(np.array([list(m) for m in good]))) == want
        for bad in bads:
            with pytest.raises(MeasurementError) as per_item:
                valid.encode(bad)
            with pytest.raises(MeasurementError) as batched:
                valid.encode_batch([good[0], bad])
            assert str(batched.value) == str(per_item.value)


@pytest.mark.usefixtures("vdaf_backend")
@pytest.mark.parametrize("name", ["onehot", "multihot", "range"])
def test_validity_reads_a_grid_matrix_as_its_rows(name: str) -> None:
    """Validity.measurements of a matrix is `measurement` of each row; shard of the
    matrix gives the bytes of shard of the list; the first bad row is refused
    with the per-row message."""
    frac = 3
    unit = 1 << frac
    v = Validity(name, 6, frac, 2 if name == "multihot" else 0)
    rng = random.Random(2)
    rows = []
    for i in range(7):
        if name == "range":
            rows.append([rng.randrange(unit + 1) for _ in range(6)])
        elif name == "onehot":
            rows.append([unit if k == i % 6 else 0 for k in range(6)])
        else:
            rows.append([unit if k in (i % 6, 0) else 0 for k in range(6)])
    grid = np.array(rows, dtype=np.uint64)
    assert [np.asarray(m).tolist() for m in v.measurements(grid)] == [
        np.asarray(v.measurement(r)).tolist() for r in rows
    ]
    nonces = [os.urandom(16) for _ in rows]
    rands = [os.urandom(v.prio3.rand_size) for _ in rows]
    assert v.shard(grid, nonces, rands) == v.shard(rows, nonces, rands)
    if name != "range":
        broken = grid.copy()
        broken[3, 1] = unit - 1
        broken[5, :] = 0
        with pytest.raises(MeasurementError) as batched:
            v.measurements(broken)
        with pytest.raises(MeasurementError) as per_row:
            v.measurement(broken[3].tolist())
        assert str(batched.value) == str(per_row.value)


# -- the native kernels ---------------------------------------------------------------


def edge_draw(f: Field, rng: random.Random, *shape: int) -> Any:
    p = f.modulus
    edges = [0, 1, 2, p - 1, p - 2, (p + 1) // 2, 2**64 - 1, 2**63, 2**127 % p, (2**128 - 1) % p]
    flat = [
        rng.choice(edges) % p if rng.random() < 0.3 else rng.randrange(p)
        for _ in range(int(np.prod(shape)))
    ]
    return np.array(flat, dtype=object).reshape(shape)


@needs_native
@pytest.mark.parametrize("f", [FIELD64, FIELD128], ids=lambda f: f.name)
def test_new_kernels_are_byte_identical_to_the_reference(f: Field) -> None:
    """sums along the last axis, bits read as numbers, polynomials folded to the
    roots of unity, ParallelSum(Mul) on inputs in rows, NTTs both ways in place,
    the batch prover's gadget polynomial, and the chunked bit check at t with
    and without the IFMA path — natively and on Python integers."""
    rng = random.Random(f.encoded_size)
    a = edge_draw(f, rng, 5, 37)
    bits = np.array([[rng.randrange(2) for _ in range(40)] for _ in range(3)], dtype=object)
    wires = edge_draw(f, rng, 2 * 5, 3, 8)  # (arity, reports, P)
    meas, r, lam = edge_draw(f, rng, 3, 61), edge_draw(f, rng, 3), edge_draw(f, rng, 3, 20)

    def run() -> list[bytes]:
        def v(x: Any) -> Any:
            return f.vec(x.tolist())

        out = [
            f.sum(v(a), axis=-1),
            bits_value(f, v(bits), 8, 5),
            bits_value(f, v(a), 37, 37 if f is FIELD64 else 20),
            poly_eval_at_roots(f, v(a), 16),
            pair_products(f, v(wires).transpose(1, 2, 0).copy().transpose(2, 0, 1), 5),
            ntt(f, v(a)[:, :32], inverse=True, in_place=True),
            ntt(f, v(a)[:, :16].copy(), in_place=True),
            gadget_poly(f, ParallelSum(Mul(), 5), v(wires)),
        ]
        if f is FIELD128:
            out.append(bit_check_at(f, v(meas), v(r), f.inv(2), v(lam), 7, 9))
        return [f.encode_vec(x) for x in out]

    with native.using("python"):
        ref = run()
    core = native.core()
    simd = core.simd()
    try:
        for on in sorted({0, int(simd)}):
            core.simd(on)
            with native.using("native"):
                assert run() == ref
    finally:
        core.simd(int(simd))
    if f is FIELD128:
        with native.using("native"):
            native_wires = f.vec(wires.tolist())
            rows_layout = np.ascontiguousarray(native_wires.transpose(1, 2, 0))
            got = _mul_gadget_poly(f, ParallelSum(Mul(), 5), rows_layout)
            assert f.encode_vec(got) == ref[7]


@needs_native
def test_copy_rows_and_in_place_sampling() -> None:
    core = native.core()
    blobs = [os.urandom(40) for _ in range(5)]
    out = bytearray(5 * 16)
    core.copy_rows(blobs, 7, 16, out)
    assert bytes(out) == b"".join(b[7:23] for b in blobs)
    with pytest.raises(ValueError, match="blob 2 is too short"):
        core.copy_rows([blobs[0], blobs[1], b"short"], 7, 16, out[:48])
    f = FIELD128
    values = np.array([3, f.modulus - 1, f.modulus, 5, f.modulus + 9, 7], dtype=object)
    raw = bytearray(b"".join(int(x).to_bytes(16, "little") for x in values))
    arr = np.frombuffer(raw, dtype=f._dtype())
    kept = core.sample(f.fid, arr, arr)  # in place: rejected elements drop out
    assert kept == 4 and f.to_ints(arr[:kept]) == [3, f.modulus - 1, 5, 7]
