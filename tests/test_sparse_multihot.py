"""Sparse multi-hot reports (vdaf/sparse.py `SparseMultihot`, the
`sparse-multihot:r` circuit): at most r distinct items as one-hot DPF keys
(the sorted items, padded past the domain, and each gap between them as two
digits).

Honest reports expand to their 0/1 rows on the native core and the numpy
reference alike (the same bytes); hostile ones are refused — an item twice,
gaps that do not add up, a weight of two, a key or a public share changed for
one server.  Negative control: the same check without the gaps (only each
key's one-hotness, as `SparseOnehot` checks it) accepts an item counted twice.
Through the servers: the sums are a dense `multihot:r` task's, hostile
reports are refused by reason, and the SDK's resumed upload counts once (the
retry rule, the close's take-out and one id under two reports:
tests/test_sparse_service.py, on both sparse circuits)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import Deployment, encoded_sum, off_loop
from test_proofs import closed_totals
from test_proofs_service import proof_task

from svtagg.client.records import InputError, check_grid
from svtagg.client.upload import REPORT_ID_BYTES
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.edge import wire
from svtagg.servers.ingest.batches import ProofReport, helper_receive, verify_upload
from svtagg.servers.reference import reference_pair
from svtagg.vdaf import native
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.sparse import NONCE_SIZE, RAND_SIZE, SparseError, SparseMultihot
from svtagg.vdaf.validity import ValidityError, parse_validity

P = FIELD128.modulus
VK = os.urandom(32)
D, R, F = 300, 3, 12
BACKENDS = ["python"] + (["native"] if native.available() else [])


def expand_both(m: SparseMultihot, nonce: bytes, public: bytes, keys: tuple[bytes, bytes]):  # type: ignore[no-untyped-def]
    """Both servers' (output vector as ints, prep share) and whether they agree."""
    a, b = (m.expand(i, VK, nonce, public, keys[i]) for i in (0, 1))
    total = [
        (x + y) % P for x, y in zip(FIELD128.to_ints(a[0]), FIELD128.to_ints(b[0]), strict=True)
    ]
    return total, (a[1], b[1]), m.decide(a[1], b[1])


def report(m: SparseMultihot, items=None, points=None, weights=None):  # type: ignore[no-untyped-def]
    nonce = os.urandom(NONCE_SIZE)
    if points is None:
        public, keys = m.gen(items, nonce, os.urandom(RAND_SIZE))
    else:
        public, keys = m.gen_points(points, nonce, os.urandom(RAND_SIZE), weights)
    return nonce, public, keys


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("d", "r", "items"),
    [(2, 1, [1]), (2, 2, [0, 1]), (17, 4, [16, 0, 5]), (300, 3, []), (1000, 5, [999, 3, 500])],
)
def test_honest_reports_are_their_rows_and_verify(
    d: int, r: int, items: list[int], backend: str
) -> None:
    m = SparseMultihot(d, r)
    with native.using(backend):
        nonce, public, keys = report(m, items)
        assert len(public) == m.public_share_bytes() and len(keys[0]) == 16
        total, _, ok = expand_both(m, nonce, public, keys)
    assert ok
    assert total == [int(x in items) for x in range(d)]


@pytest.mark.skipif(not native.available(), reason="the native core is not built")
def test_native_and_numpy_are_the_same_bytes() -> None:
    m = SparseMultihot(1000, 4)
    nonce, public, keys = report(m, [7, 999, 0])
    got = {}
    for backend in ("native", "python"):
        with native.using(backend):
            again = m.gen([7, 999, 0], nonce, keys[0] + keys[1])
            total, shares, ok = expand_both(m, nonce, public, keys)
            got[backend] = (again, total, shares, ok)
    assert got["native"] == got["python"]
    assert got["native"][0] == (public, keys)


def test_the_client_refuses_what_the_circuit_does_not_take() -> None:
    m = SparseMultihot(10, 3)
    for items in ([1, 2, 3, 4], [1, 1], [10], [-1]):
        with pytest.raises(SparseError):
            m.gen(items, os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE))
    v = parse_validity("sparse-multihot:2", 10, F)
    assert v is not None
    grid = np.zeros((2, 10), np.uint64)
    grid[1, [1, 4, 6]] = 1 << F
    with pytest.raises(InputError, match="row 1 holds 3 categories.*sparse-multihot:2"):
        check_grid(grid, v, 0)
    with pytest.raises(ValidityError, match="names its bound on a report.s items"):
        parse_validity("sparse-multihot", 10, F)
    with pytest.raises(ValidityError, match="1 <= r <= d"):
        parse_validity("sparse-multihot:11", 10, F)


def test_sizes_at_ten_thousand() -> None:
    v = parse_validity("sparse-multihot:10", 10_000, 16, "heavy_hitters")
    dense = parse_validity("multihot:10", 10_000, 16)
    assert v is not None and dense is not None and v.sparse and v.multihot
    # 10 items over [0, 10,010) (260 bytes each), 9 gaps as two digits in
    # base 101 (keys over [0, 100) and [0, 101): 146 bytes each)
    assert v.public_share_bytes() + v.input_share_bytes(0) == 10 * 260 + 18 * 146 + 16
    assert dense.input_share_bytes(0) > 30 * (v.public_share_bytes() + v.input_share_bytes(0))


def hostile(m: SparseMultihot) -> dict[str, tuple[list[int], list[int] | None]]:
    """Points (and weights) of reports the servers must refuse: r items,
    then each gap's high and low digit in base m.base."""
    r = m.r
    pts = m.points([3, 4])  # items [3, 4, d, …]; first gap 0 = (0, 0)
    twice = list(pts)
    twice[1] = 3  # item 3 twice: its gap would be −1; the digits say 0
    twice[r + 2 : r + 4] = divmod(m.d - 4, m.base)  # the next gap, 3 → d, made to fit
    gap = list(pts)
    gap[r + 1] += 1  # a low digit that does not add up
    over = list(pts)
    over[1] = 3 + m.d  # an item past the padding: beyond [0, d + r)
    unit = [1] * len(pts)
    return {
        "item twice": (twice, None),
        "gap": (gap, None),
        "weight two": (pts, [2] + unit[1:]),
        "weight zero on a digit": (pts, unit[:r] + [0] + unit[r + 1 :]),
        "outside": (over, None),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "kind", ["item twice", "gap", "weight two", "weight zero on a digit", "outside"]
)
def test_hostile_reports_are_refused(kind: str, backend: str) -> None:
    m = SparseMultihot(40, 3)
    points, weights = hostile(m)[kind]
    with native.using(backend):
        try:
            nonce, public, keys = report(m, points=points, weights=weights)
        except SparseError:  # the client-side encoder refuses a point outside
            assert kind == "outside"
            return
        _, _, ok = expand_both(m, nonce, public, keys)
    assert not ok


def test_a_key_or_a_public_share_changed_for_one_server_is_refused() -> None:
    m = SparseMultihot(40, 3)
    nonce, public, keys = report(m, [1, 2])
    a = m.expand(0, VK, nonce, public, keys[0])[1]
    b = m.expand(1, VK, nonce, public, keys[1])[1]
    assert m.decide(a, b)
    assert not m.decide(m.expand(0, VK, nonce, public, os.urandom(16))[1], b)
    other, _ = m.gen([1, 3], nonce, os.urandom(RAND_SIZE))
    assert not m.decide(a, m.expand(1, VK, nonce, other, keys[1])[1])
    with pytest.raises(SparseError):
        m.expand(0, VK, nonce, public[:-1], keys[0])


def test_negative_control_without_the_gaps_an_item_counts_twice(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The check with the gaps' relations left out (each key one-hot only)
    accepts item 3 twice — a coordinate of 2 in the sums; the real check
    refuses it."""
    m = SparseMultihot(40, 3)
    twice, _ = hostile(m)["item twice"]
    nonce, public, keys = report(m, points=twice)
    total, _, ok = expand_both(m, nonce, public, keys)
    assert not ok and total[3] == 2
    real = m.expand_into

    def no_gaps(acc, agg_id, vk, nonce, public, key, negate=False):  # type: ignore[no-untyped-def]
        """Each key's digest and total only, as the check without gaps would."""
        import hashlib

        h = hashlib.blake2b(digest_size=32)
        parts = m._parts(nonce, public, key)
        for k, (scheme, (n, p, s)) in enumerate(zip(m.keys, parts, strict=True)):
            into = acc if k < m.r else scheme.accumulator()
            dg, t, _, _ = scheme.evaluate(into, agg_id, vk, n, p, s, negate, fold=k < m.r)
            h.update(dg + (t if agg_id == 0 else (1 - t) % P).to_bytes(16, "little"))
        return h.digest()

    monkeypatch.setattr(m, "expand_into", no_gaps)
    total, _, ok = expand_both(m, nonce, public, keys)
    assert ok and total[3] == 2  # the broken check lets the double count in
    monkeypatch.setattr(m, "expand_into", real)


# ------------------------------------------------------------ through the servers
def spec(task_id: str, d: int = D) -> pb.TaskSpec:
    return proof_task(task_id, f"sparse-multihot:{R}", d)


def rows(items: list[list[int]], d: int = D) -> np.ndarray:
    out = np.zeros((len(items), d))
    for i, its in enumerate(items):
        out[i, its] = 1.0
    return out


def random_items(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [sorted({int(x) % D for x in rng.zipf(1.4, rng.integers(0, R + 1))}) for _ in range(n)]


def _shards(pair, task_id: str, items: list[list[int]]):  # type: ignore[no-untyped-def]
    from svtagg.servers.ingest.validity import task_validity

    v = task_validity(pair.leader.core.task(task_id))
    ids = [os.urandom(REPORT_ID_BYTES) for _ in items]
    grid = (rows(items) * (1 << F)).astype(np.int64)
    return v, ids, v.shard(grid.tolist(), ids)


async def closed_sums_equal(pair, task_id: str, items: list[list[int]]) -> bool:  # type: ignore[no-untyped-def]
    totals = await closed_totals(pair, task_id)
    return bool(np.array_equal(totals, encoded_sum(rows(items), F)))


async def test_sparse_multihot_reports_count_as_dense_ones_would(tmp_path: Path) -> None:
    items = random_items(120, 5)
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("s")))
        await pair.leader.create_task(
            wire.TASK_SPEC.from_pb(proof_task("dense", f"multihot:{R}", D))
        )
        for block in (rows(items[:70]), rows(items[70:])):
            got = await pair.upload_proofs("s", block)
            assert (got.accepted, got.rejected) == (len(block), {})
            await pair.upload_proofs("dense", block)
        sparse_totals = await closed_totals(pair, "s")
        dense_totals = await closed_totals(pair, "dense")
        assert np.array_equal(sparse_totals, dense_totals)
        assert np.array_equal(sparse_totals, encoded_sum(rows(items), F))


async def test_hostile_reports_are_refused_by_reason(tmp_path: Path) -> None:
    """An item twice, a gap that does not add up, a weight of two, a key
    changed for the leader, a public share that differs between the servers:
    refused, counted by reason, nothing of them in the sums."""
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("h")))
        items = [[3], [5, 6], [7], [9, 10, 11], [13], [17, 1], [2]]
        v, ids, shards = _shards(pair, "h", items)
        m = v.scheme
        assert isinstance(m, SparseMultihot)
        bad = hostile(m)
        for at, kind in ((1, "item twice"), (2, "gap"), (3, "weight two")):
            points, weights = bad[kind]
            public, keys = m.gen_points(points, ids[at], os.urandom(RAND_SIZE), weights)
            shards[at] = (public, keys[0], keys[1])
        p, lead, help_ = shards[4]
        shards[4] = (p, bytes([lead[0] ^ 1]) + lead[1:], help_)
        helper_receive(
            pair.helper.core,
            "h",
            [ProofReport(r, h, p) for r, (p, _, h) in zip(ids, shards, strict=True)],
        )
        other, _ = m.gen([9], ids[5], os.urandom(RAND_SIZE))  # the leader's public share of #5
        reports = [ProofReport(r, ld, p) for r, (p, ld, _) in zip(ids, shards, strict=True)]
        reports[5] = ProofReport(ids[5], reports[5].input_share, other)
        got = await verify_upload(pair.leader.core, pair.port, "h", reports)
        assert got.accepted == 2
        assert got.rejected == {"invalid_proof": 5}
        assert await closed_sums_equal(pair, "h", [[3], [2]])


async def test_the_sdk_uploads_and_a_resumed_upload_counts_once(deployment: Deployment) -> None:
    from svtagg.client.upload import Resumable, UploadKey

    dep = deployment
    values = rows(random_items(100, 7))
    key = UploadKey.new()

    def run() -> tuple[int, int, dict[str, int]]:
        dep.analyst_stub().CreateTask(spec("k"), timeout=10)
        with dep.uploader() as up:
            blocks = [values[i : i + 40] for i in range(0, 100, 40)]
            first = up.upload_blocks("k", blocks, resume=Resumable(key))
            again = up.upload_blocks("k", blocks, resume=Resumable(key))
        info = dep.analyst_stub().DescribeTask(pb.TaskRef(task_id="k"), timeout=10)
        return info.n, again.reports, first.rejected

    assert await off_loop(run) == (100, 100, {})


def test_a_task_whose_one_report_costs_too_much_is_refused_naming_r() -> None:
    """r sets a sparse multi-hot report's cost: a task where one report alone
    would pass the verification bound is refused at creation, saying so."""
    from svtagg.dp.errors import InvalidArgument
    from svtagg.servers.ingest.validity import check_validity

    check_validity("sparse-multihot:50", 10_000, 16, "heavy_hitters")
    with pytest.raises(InvalidArgument, match=r"sparse-multihot:5000 report .* choose a smaller r"):
        check_validity("sparse-multihot:5000", 10_000, 16, "heavy_hitters")


def _corrupt_last(m: SparseMultihot, public: bytes) -> bytes:
    """The public share with its last key's output correction set to p + 5
    (a report that does not decode)."""
    return public[:-16] + (P + 5).to_bytes(16, "little")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_report_that_does_not_decode_leaves_nothing_in_the_sums(backend: str) -> None:
    """Every key's public share is checked before any key is folded: a report
    whose last key does not decode, and whose first key weighs 1000, adds
    nothing, beside an honest report that counts."""
    m = SparseMultihot(40, 3)
    points = m.points([3])
    with native.using(backend):
        bad_nonce, ok_nonce = os.urandom(NONCE_SIZE), os.urandom(NONCE_SIZE)
        public, keys = m.gen_points(
            points, bad_nonce, os.urandom(RAND_SIZE), [1000] + [1] * (m.count - 1)
        )
        bad = _corrupt_last(m, public)
        good, good_keys = m.gen([7], ok_nonce, os.urandom(RAND_SIZE))
        decoded, total = batch_of_two(m, [(bad_nonce, bad, keys), (ok_nonce, good, good_keys)])
    assert decoded == [False, True]
    assert total == [int(x == 7) for x in range(40)]


def batch_of_two(m, reports):  # type: ignore[no-untyped-def]
    """Both servers' `expand_batch` over (nonce, public, keys) reports: which
    reports decoded on both, and the plaintext of the two running sums."""
    sums, decoded = [], [True] * len(reports)
    for i in (0, 1):
        acc, shares = m.expand_batch(i, VK, [(n, p, k[i]) for n, p, k in reports])
        decoded = [ok and share is not None for ok, share in zip(decoded, shares, strict=True)]
        sums.append(FIELD128.to_ints(acc.value()))
    return decoded, [(a + b) % P for a, b in zip(*sums, strict=True)]
