"""Sparse reports of values (vdaf/sparse.py `SparseRange`, the
`sparse-range:r` circuit): at most r items, each with a value on the grid
[0, 2^F], as one-hot DPF keys whose item keys carry the value as a second
payload, proved in range by digit keys.

Honest reports expand to their rows on the native core and the numpy
reference alike (the same bytes); hostile ones are refused — a value past
2^F, a negative value, digits that do not add up, an item twice, a key
changed for one server.  Negative control: without the value's range checks
a value of 10⁶ units is accepted and folded.  Through the servers: the sums
are a dense `range` task's for the same rows, a hostile value is refused and
counted by reason, and the SDK's upload checks a row's nonzero count.  The
retry rule, the close's take-out and one id under two reports:
tests/test_sparse_service.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import encoded_sum
from test_proofs import closed_totals
from test_proofs_service import proof_task
from test_sparse_multihot import batch_of_two

from svtagg.client.records import InputError, check_grid
from svtagg.client.upload import REPORT_ID_BYTES
from svtagg.servers.edge import wire
from svtagg.servers.ingest.batches import ProofReport, helper_receive, verify_upload
from svtagg.servers.ingest.validity import task_validity
from svtagg.servers.reference import reference_pair
from svtagg.vdaf import native
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.sparse import NONCE_SIZE, RAND_SIZE, SparseError, SparseRange
from svtagg.vdaf.validity import parse_validity

P = FIELD128.modulus
VK = os.urandom(32)
BACKENDS = ["python"] + (["native"] if native.available() else [])


def both(m: SparseRange, nonce: bytes, public: bytes, keys: tuple[bytes, bytes]):  # type: ignore[no-untyped-def]
    """The plaintext of both servers' folded shares, and whether they agree."""
    a, b = (m.expand(i, VK, nonce, public, keys[i]) for i in (0, 1))
    total = [
        (x + y) % P for x, y in zip(FIELD128.to_ints(a[0]), FIELD128.to_ints(b[0]), strict=True)
    ]
    return total, m.decide(a[1], b[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("d", "r", "f", "entries"),
    [(2, 1, 0, {1: 1}), (17, 4, 8, {16: 256, 0: 0, 5: 77}), (300, 3, 16, {}),
     (1000, 5, 16, {999: 65536, 3: 1, 500: 40000})],
)  # fmt: skip
def test_honest_reports_are_their_rows_and_verify(
    d: int, r: int, f: int, entries: dict[int, int], backend: str
) -> None:
    m = SparseRange(d, r, f)
    with native.using(backend):
        nonce = os.urandom(NONCE_SIZE)
        public, keys = m.gen_weighted(list(entries), list(entries.values()), nonce, os.urandom(32))
        assert len(public) == m.public_share_bytes()
        total, ok = both(m, nonce, public, keys)
    assert ok
    assert total == [entries.get(x, 0) for x in range(d)]


@pytest.mark.skipif(not native.available(), reason="the native core is not built")
def test_native_and_numpy_are_the_same_bytes() -> None:
    m = SparseRange(100, 3, 8)
    nonce, rand = os.urandom(NONCE_SIZE), os.urandom(RAND_SIZE)
    got = {}
    for backend in ("native", "python"):
        with native.using(backend):
            public, keys = m.gen_weighted([7, 99], [256, 13], nonce, rand)
            shares = [m.expand(i, VK, nonce, public, keys[i]) for i in (0, 1)]
            got[backend] = (public, keys, [(FIELD128.to_ints(v), s) for v, s in shares])
    assert got["native"] == got["python"]


def hostile(m: SparseRange) -> dict[str, tuple[list[int], list[int]]]:
    """Points and item payloads of reports the servers must refuse."""
    points, ws = m.entries([3, 9], [100, 200])
    at, k = m.r + 2 * (m.r - 1), m.digits
    past = list(points)  # a value of 2^F + 1 with its own digits: 2^F − w has none
    past[at : at + k] = m._digits(m.top + 1)
    sums = list(points)
    sums[at] = (sums[at] + 1) % 16  # a digit of w that does not add up
    twice, _ = m.entries([3, 4], [1, 1])
    twice[1] = 3  # item 3 twice (the gap's digits say 0)
    return {
        "past 2^F": (past, [m.top + 1, *ws[1:]]),
        "negative": (points, [P - 1, *ws[1:]]),
        "digits": (sums, ws),
        "item twice": (twice, [1, 1, 0]),
        "huge": (points, [10**6, *ws[1:]]),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["past 2^F", "negative", "digits", "item twice", "huge"])
def test_hostile_reports_are_refused(kind: str, backend: str) -> None:
    m = SparseRange(40, 3, 8)
    points, payloads = hostile(m)[kind]
    with native.using(backend):
        nonce = os.urandom(NONCE_SIZE)
        public, keys = m.gen_payloads(points, payloads, nonce, os.urandom(RAND_SIZE))
        _, ok = both(m, nonce, public, keys)
    assert not ok


def test_a_key_changed_for_one_server_and_bad_entries_are_refused() -> None:
    m = SparseRange(40, 3, 8)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = m.gen_weighted([1], [5], nonce, os.urandom(RAND_SIZE))
    assert not both(m, nonce, public, (keys[0], os.urandom(16)))[1]
    for items, weights in (([1], [257]), ([1], [-1]), ([1, 1], [1, 1]), ([1, 2, 3, 4], [1] * 4)):
        with pytest.raises(SparseError):
            m.gen_weighted(items, weights, nonce, os.urandom(RAND_SIZE))


def test_negative_control_without_the_range_checks_a_huge_value_gets_in(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    m = SparseRange(40, 3, 8)
    points, payloads = hostile(m)["huge"]
    nonce = os.urandom(NONCE_SIZE)
    public, keys = m.gen_payloads(points, payloads, nonce, os.urandom(RAND_SIZE))
    total, ok = both(m, nonce, public, keys)
    assert not ok and total[3] == 10**6
    gaps_only = SparseRange.__mro__[1]._checks  # SparseMultihot's: the gaps alone
    monkeypatch.setattr(
        m, "_checks", lambda index, payloads, one: gaps_only(m, index, payloads, one)
    )
    total, ok = both(m, nonce, public, keys)
    assert ok and total[3] == 10**6  # the broken check folds a million units


def test_the_circuit_and_the_client_rule() -> None:
    v = parse_validity("sparse-range:3", 10_000, 16)
    assert v is not None and v.sparse and not v.counts and v.max_items == 3
    dense = parse_validity("range", 10_000, 16)
    assert dense is not None
    assert dense.input_share_bytes(0) > 100 * (v.input_share_bytes(0) + v.public_share_bytes())
    grid = np.zeros((2, 10_000), np.uint64)
    grid[1, [1, 4, 6, 9]] = 5
    with pytest.raises(InputError, match="row 8 holds 4 nonzero values.*sparse-range:3"):
        check_grid(grid, v, 7)


# ------------------------------------------------------------ through the servers
D, R, F = 200, 3, 12


async def test_the_sums_are_a_dense_range_tasks_and_a_huge_value_is_refused(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(5)
    values = np.zeros((80, D))
    for row in values:
        at = rng.choice(D, size=rng.integers(0, R + 1), replace=False)
        row[at] = rng.random(at.size)
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(
            wire.TASK_SPEC.from_pb(proof_task("s", f"sparse-range:{R}", D))
        )
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(proof_task("dense", "range", D)))
        for task in ("s", "dense"):
            got = await pair.upload_proofs(task, values)
            assert (got.accepted, got.rejected) == (80, {})
        # one client's forged value of 10^6 units on item 3, with honest keys
        v = task_validity(pair.leader.core.task("s"))
        m = v.scheme
        assert isinstance(m, SparseRange)
        rid = os.urandom(REPORT_ID_BYTES)
        points, payloads = hostile(m)["huge"]
        public, keys = m.gen_payloads(points, payloads, rid, os.urandom(RAND_SIZE))
        helper_receive(pair.helper.core, "s", [ProofReport(rid, keys[1], public)])
        got = await verify_upload(
            pair.leader.core, pair.port, "s", [ProofReport(rid, keys[0], public)]
        )
        assert (got.accepted, got.rejected) == (0, {"invalid_proof": 1})
        sparse_totals = await closed_totals(pair, "s")
        assert np.array_equal(sparse_totals, await closed_totals(pair, "dense"))
        assert np.array_equal(sparse_totals, encoded_sum(values, F))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_report_that_does_not_decode_leaves_nothing_in_the_sums(backend: str) -> None:
    """A report whose first item carries 10⁹ and whose second item's weight
    correction does not decode adds nothing (every part is checked before any
    is folded), beside an honest report that counts."""
    m = SparseRange(40, 3, 8)
    points, ws = m.entries([3, 9], [1, 1])
    size = m.unit.public_share_bytes() + 16  # an item's share, with its weight's correction
    with native.using(backend):
        bad_nonce, ok_nonce = os.urandom(NONCE_SIZE), os.urandom(NONCE_SIZE)
        public, keys = m.gen_payloads(points, [10**9, *ws[1:]], bad_nonce, os.urandom(RAND_SIZE))
        bad = public[: 2 * size - 16] + (P + 5).to_bytes(16, "little") + public[2 * size :]
        good, good_keys = m.gen_weighted([7], [200], ok_nonce, os.urandom(RAND_SIZE))
        decoded, total = batch_of_two(m, [(bad_nonce, bad, keys), (ok_nonce, good, good_keys)])
    assert decoded == [False, True]
    assert total == [200 if x == 7 else 0 for x in range(40)]


def test_a_weight_correction_that_differs_between_the_servers_is_refused() -> None:
    """The weight's output correction is bound into the digests' key with
    the item key's public share: a helper handed another correction (which
    would leave unequal weight shares on leaves both servers hold alike)
    disagrees with the leader."""
    m = SparseRange(40, 3, 8)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = m.gen_weighted([5], [9], nonce, os.urandom(RAND_SIZE))
    size = m.unit.public_share_bytes() + 16
    other = public[: size - 16] + (7).to_bytes(16, "little") + public[size:]
    leader = m.expand(0, VK, nonce, public, keys[0])[1]
    assert m.decide(leader, m.expand(1, VK, nonce, public, keys[1])[1])
    assert not m.decide(leader, m.expand(1, VK, nonce, other, keys[1])[1])
