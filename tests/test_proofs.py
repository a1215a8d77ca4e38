"""Validity proofs at ingest (servers/ingest/batches.py), through the one-process
reference pair: every report of a task with a validity circuit proves its
values valid, both servers verify each batch in one exchange and fold the valid
reports into field sums, hostile reports are refused, counted and change
nothing, an acknowledged report counts once on each server whatever crashes,
and the close converts the field sums into the ring shares queries read."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from conftest import pg_tagged

from svtagg.dp.errors import AlreadyExists, InvalidArgument
from svtagg.dp.task import TaskSpec
from svtagg.mpc.ring import encode
from svtagg.servers.reference import ReferencePair, reference_pair
from svtagg.servers.store.rules import Store
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.validity import Validity, parse_validity

F = 8
UNIT = 1 << F


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest) -> Iterator[Callable[[], tuple[Store, Store] | None]]:
    """The reference pair's stores: SQLite files (None: the default), or two
    fresh PostgreSQL schemas (skipped without a server; dropped afterwards)."""
    if request.param == "sqlite":
        yield lambda: None
        return
    from svtagg.servers.store.postgres import PgStore

    with pg_tagged() as (url, tag):
        yield lambda: (PgStore(url, schema=f"l_{tag}"), PgStore(url, schema=f"h_{tag}"))


def spec(validity: str, d: int = 6, embedding: str = "") -> TaskSpec:
    return TaskSpec("t", d, F, 100_000, 1, "10", "0", "1/8", False, embedding, validity)


async def closed_totals(ref: ReferencePair, task_id: str = "t") -> np.ndarray:
    """Close, then the aggregates queries read, reconstructed: Σ values × 2^F
    (the robust aggregates clamp at n·2^F, which honest sums never reach)."""
    await ref.leader.close_collection(task_id)
    lead = ref.leader.core.store.robust_sums(task_id)
    help_ = ref.helper.core.store.robust_sums(task_id)
    assert lead is not None and help_ is not None
    return (lead + help_).astype(np.int64)


def grid(values: np.ndarray) -> np.ndarray:
    return encode(np.atleast_2d(values), F).astype(np.int64)


def shards(v: Validity, rows: list[list[int]], ids: Sequence[bytes]) -> list[tuple[bytes, ...]]:
    return [tuple(s) for s in v.shard(rows, list(ids))]


def forged(v: Validity, encoded: list[int], nonce: bytes) -> tuple[bytes, bytes, bytes]:
    """A report of an *encoded* measurement the client chose, proved honestly: the
    proof is well made, but the circuit's output on it is not zero."""
    prio = v.prio3
    seeds = [os.urandom(16) for _ in range(prio.rand_size // 16)]
    public, shares = prio.shard_encoded(FIELD128.vec(encoded), nonce, seeds)
    return (
        prio.encode_public_share(public),
        prio.encode_input_share(shares[0]),
        prio.encode_input_share(shares[1]),
    )


def bits(values: Sequence[int], width: int) -> list[int]:
    return [(x >> i) & 1 for x in values for i in range(width)]


@pytest.mark.parametrize(
    "validity, make",
    [
        ("range", lambda g, n, d: g.random((n, d))),
        ("onehot", lambda g, n, d: np.eye(d)[g.integers(0, d, n)]),
        ("multihot:2", lambda g, n, d: (g.random((n, d)) < 2 / d) * (np.arange(d) < d)),
        ("sparse-onehot", lambda g, n, d: np.eye(d)[g.integers(0, d, n)]),
    ],
)
async def test_verified_reports_add_up_exactly(tmp_path: Path, validity: str, make: object) -> None:
    gen = np.random.default_rng(5)
    values = make(gen, 40, 6)  # type: ignore[operator]
    if validity.startswith("multihot"):  # at most 2 ones per row
        values = np.where(np.cumsum(values, axis=1) <= 2, values, 0)
    async with reference_pair(tmp_path) as ref:
        await ref.leader.create_task(spec(validity))
        got = await ref.upload_proofs("t", values)
        assert (got.accepted, got.n, got.rejected) == (40, 40, {})
        assert ref.helper.core.task("t").n == 40
        totals = await closed_totals(ref)
    assert totals.tolist() == grid(values).sum(axis=0).tolist()


async def test_only_ids_are_kept(tmp_path: Path) -> None:
    """Per report the leader keeps its id; the helper its id and a 16-byte seed
    (to take the report out at the close if the leader never recorded it),
    dropped once both agree."""
    async with reference_pair(tmp_path) as ref:
        await ref.leader.create_task(spec("range", d=50))
        await ref.upload_proofs("t", np.random.default_rng(1).random((20, 50)))
        lengths = [
            {r[0] for r in side.core.store._db.execute("SELECT share_len FROM reports")}  # type: ignore[attr-defined]
            for side in (ref.leader, ref.helper)
        ]
        assert lengths == [{0}, {16}]
        pending = ref.helper.core.store._db.execute("SELECT COUNT(*) FROM pending")  # type: ignore[attr-defined]
        assert pending.fetchone()[0] == 0
        await ref.leader.close_collection("t")
        for side in (ref.leader, ref.helper):
            assert not side.core.store._share_file("t").exists()  # type: ignore[attr-defined]


async def test_hostile_reports_are_refused_counted_and_change_nothing(
    tmp_path: Path, stores: Callable[[], tuple[Store, Store] | None]
) -> None:
    d = 4
    v = parse_validity("range", d, F)
    assert v is not None
    honest = np.random.default_rng(2).random((10, d))
    ids = [os.urandom(16) for _ in range(len(honest))]
    good = shards(v, grid(honest).tolist(), ids)
    bad_ids = [os.urandom(16) for _ in range(5)]
    other = shards(v, [[UNIT] * d], [bad_ids[1]])[0]
    mine = shards(v, [[0] * d], [bad_ids[1]])[0]
    elsewhere = shards(v, [[1] * d], [os.urandom(16)])[0]
    flipped = shards(v, [[2] * d], [bad_ids[3]])[0]
    hostile = [
        # a value above 2^F (2^F + 1: the top bit and a low bit), proved honestly
        forged(v, bits([UNIT + 1] + [0] * (d - 1), F + 1), bad_ids[0]),
        # a proof for other values: the leader's share of one report, the rest of another
        (mine[0], other[1], mine[2]),
        # a report bound to another nonce (another report's id)
        elsewhere,
        # a wrong joint-randomness part in the public share
        (bytes([flipped[0][0] ^ 1]) + flipped[0][1:], flipped[1], flipped[2]),
        # a truncated leader share (an oversized helper share is refused at
        # the helper's upload, below: a pending report holds the circuit's size)
        (good[0][0], good[0][1][:-1], good[0][2]),
    ]
    async with reference_pair(tmp_path, stores=stores()) as ref:
        await ref.leader.create_task(spec("range", d=d))
        got = await ref.send_proofs("t", ids, good)
        assert got.accepted == 10
        bad = await ref.send_proofs("t", bad_ids, hostile)
        assert bad.accepted == 0 and bad.n == 10
        # A proof checked against other shares, another nonce or other joint
        # randomness fails the FLP check or, if that passed, the joint-randomness
        # check (prep_next): either way it is refused.
        proof_failures = bad.rejected.get("invalid_proof", 0) + bad.rejected.get(
            "joint_randomness", 0
        )
        assert (proof_failures, bad.rejected["malformed_share"]) == (4, 1)
        oversized = [(good[1][0], good[1][1], good[1][2] + b"\0")]
        with pytest.raises(InvalidArgument, match="nothing kept"):
            await ref.send_proofs("t", [os.urandom(16)], oversized)
        with pytest.raises(AlreadyExists):  # a replayed batch
            await ref.send_proofs("t", ids, good)
        info = await ref.leader.describe("t")
        assert dict(info.rejected) == bad.rejected
        assert dict(ref.helper.core.task("t").rejected) == bad.rejected
        totals = await closed_totals(ref)
    assert totals.tolist() == grid(honest).sum(axis=0).tolist()


async def test_without_verification_the_poison_gets_in(tmp_path: Path) -> None:
    """The negative control (test-only switch): the same forged report, with
    proofs unchecked, moves the sums — so the check above is what stops it."""
    d = 4
    v = parse_validity("range", d, F)
    assert v is not None
    honest = np.random.default_rng(3).random((10, d))
    poison = forged(v, bits([0, 0, (1 << (F + 1)) - 1, 0], F + 1), b"p" * 16)
    moved = await poisoned_totals(tmp_path, "range", honest, poison)
    assert moved[True] == [0] * d
    assert moved[False] == [0, 0, (1 << (F + 1)) - 1, 0]


async def poisoned_totals(
    tmp_path: Path, validity: str, honest: np.ndarray, poison: tuple[bytes, ...]
) -> dict[bool, list[int]]:
    """How far the closed totals move from the honest rows' when the report
    `poison` (id b"p" * 16) is sent after them, with verification on and off
    (the test-only switch)."""
    moved = {}
    for verify in (True, False):
        root = tmp_path / str(verify)
        root.mkdir()
        async with reference_pair(root, verify_proofs=verify) as ref:
            await ref.leader.create_task(spec(validity, d=honest.shape[1]))
            await ref.upload_proofs("t", honest)
            await ref.send_proofs("t", [b"p" * 16], [poison])
            totals = await closed_totals(ref)
        moved[verify] = (totals - grid(honest).sum(axis=0)).tolist()
    return moved


async def test_sparse_hostile_reports_on_both_stores(
    tmp_path: Path, stores: Callable[[], tuple[Store, Store] | None]
) -> None:
    """Sparse DPF keys on SQLite and PostgreSQL: a weight of 10^6 made
    honestly for that weight, a key of another report, a report bound to
    another id and a truncated key are refused by reason and change nothing;
    a replayed batch is refused."""
    d = 40
    v = parse_validity("sparse-onehot", d, F)
    assert v is not None
    honest = np.eye(d)[np.random.default_rng(7).integers(0, d, 12)]
    ids = [os.urandom(16) for _ in range(len(honest))]
    good = shards(v, grid(honest).tolist(), ids)
    bad_ids = [os.urandom(16) for _ in range(4)]
    heavy_public, heavy_keys = v.scheme.gen(5, bad_ids[0], os.urandom(32), weight=10**6)
    other = shards(v, [[UNIT] + [0] * (d - 1)], [os.urandom(16)])[0]
    mine = shards(v, [[0, UNIT] + [0] * (d - 2)], [bad_ids[1]])[0]
    elsewhere = shards(v, [[0, 0, UNIT] + [0] * (d - 3)], [os.urandom(16)])[0]
    hostile = [
        (heavy_public, *heavy_keys),
        (mine[0], other[1], mine[2]),  # the leader's key from another report
        elsewhere,  # made for another id
        (good[0][0], good[0][1][:-1], good[0][2]),  # a truncated leader key
    ]
    async with reference_pair(tmp_path, stores=stores()) as ref:
        await ref.leader.create_task(spec("sparse-onehot", d=d))
        assert (await ref.send_proofs("t", ids, good)).accepted == 12
        bad = await ref.send_proofs("t", bad_ids, hostile)
        assert (bad.accepted, bad.n) == (0, 12)
        assert bad.rejected == {"invalid_proof": 3, "malformed_share": 1}
        with pytest.raises(AlreadyExists):
            await ref.send_proofs("t", ids, good)
        totals = await closed_totals(ref)
    assert totals.tolist() == grid(honest).sum(axis=0).tolist()


async def test_sparse_without_verification_the_poison_gets_in(tmp_path: Path) -> None:
    """The negative control for the sparse path (test-only switch): a key
    made for a weight of 10^6, with verification off, pushes its count to the
    robust aggregates' clamp; with verification on it is refused and moves
    nothing."""
    d = 8
    v = parse_validity("sparse-onehot", d, F)
    assert v is not None
    honest = np.eye(d)[np.random.default_rng(3).integers(0, d, 10)]
    public, keys = v.scheme.gen(2, b"p" * 16, os.urandom(32), weight=10**6)
    moved = await poisoned_totals(tmp_path, "sparse-onehot", honest, (public, *keys))
    truth = grid(honest).sum(axis=0)
    assert moved[True] == [0] * d
    # unverified, the forged count reaches the robust aggregates' clamp,
    # n·2^F with n = 11: far more than one user's worth
    assert moved[False] == [0, 0, 11 * UNIT - int(truth[2])] + [0] * (d - 3)
    assert moved[False][2] > UNIT


async def test_malicious_clients_move_a_count_by_their_number_at_most(tmp_path: Path) -> None:
    """1% of the clients send their worst valid report (their 3 ones on the 3
    rarest items) and worse ones that are refused: no count moves by more than
    one unit per malicious client, and the true top-5 stays on top."""
    d, honest_n, bad_n = 20, 300, 3
    gen = np.random.default_rng(4)
    weights = 1.0 / np.arange(1, d + 1) ** 1.2
    rows = np.zeros((honest_n, d))
    for i in range(honest_n):
        rows[i, gen.choice(d, size=3, replace=False, p=weights / weights.sum())] = 1
    truth = grid(rows).sum(axis=0)
    rare = np.argsort(truth)[:3]
    worst = np.zeros((bad_n, d))
    worst[:, rare] = 1
    v = parse_validity("multihot:3", d, F)
    assert v is not None
    # every item, with a weight encoding that cannot say 20 (2 bits for r = 3)
    too_many = [forged(v, [1] * d + [1, 1], os.urandom(16)) for _ in range(bad_n)]
    async with reference_pair(tmp_path) as ref:
        await ref.leader.create_task(spec("multihot:3", d=d, embedding="heavy_hitters"))
        await ref.upload_proofs("t", rows)
        assert (await ref.upload_proofs("t", worst)).accepted == bad_n
        refused = await ref.send_proofs("t", [os.urandom(16) for _ in too_many], too_many)
        assert refused.accepted == 0
        totals = await closed_totals(ref)
    moved = (totals - truth) // UNIT
    assert moved.max() <= bad_n and moved.min() >= 0
    assert set(np.argsort(-totals)[:5]) == set(np.argsort(-truth)[:5])


async def test_a_leader_lost_after_the_helper_recorded(
    tmp_path: Path, stores: Callable[[], tuple[Store, Store] | None]
) -> None:
    """The helper records a verified batch first.  A leader that fails before
    its own record never answered the client: the batch sent again is answered
    from the helper's recorded verdicts and counts once; a batch never sent
    again is taken out on the helper at the close (from its 16-byte seeds)."""
    d = 3
    async with reference_pair(tmp_path, stores=stores()) as ref:
        await ref.leader.create_task(spec("range", d=d))
        v = parse_validity("range", d, F)
        assert v is not None
        values = np.random.default_rng(6).random((12, d))
        ids = [os.urandom(16) for _ in range(12)]
        reports = shards(v, grid(values).tolist(), ids)
        store = ref.leader.core.store
        real = store.add_reports

        def fail(*args: object, **kw: object) -> int:
            raise ConnectionError("the leader's store went away")

        store.add_reports = fail  # type: ignore[method-assign]
        for part in (slice(0, 6), slice(6, 12)):
            with pytest.raises(ConnectionError):
                await ref.send_proofs("t", ids[part], reports[part])
        store.add_reports = real  # type: ignore[method-assign]
        assert (ref.leader.core.task("t").n, ref.helper.core.task("t").n) == (0, 12)
        # the client sends the first batch again: the helper already holds it
        with pytest.raises(AlreadyExists):
            await ref.send_proofs("t", ids[:6], reports[:6])
        again = await ref.send_proofs("t", ids[:6], reports[:6], helper_too=False)
        assert (again.accepted, again.n) == (6, 6)
        info = await ref.leader.close_collection("t")
        assert (info.n, info.dropped_reports) == (6, 6)
        lead = ref.leader.core.store.robust_sums("t")
        help_ = ref.helper.core.store.robust_sums("t")
        assert lead is not None and help_ is not None
    assert (lead + help_).astype(np.int64).tolist() == grid(values[:6]).sum(axis=0).tolist()


async def test_the_leader_refuses_what_the_helper_never_received(tmp_path: Path) -> None:
    async with reference_pair(tmp_path) as ref:
        await ref.leader.create_task(spec("onehot", d=3))
        from svtagg.dp.errors import FailedPrecondition

        with pytest.raises(FailedPrecondition, match="upload them to the helper first"):
            await ref.upload_proofs("t", np.eye(3), helper_too=False)
        assert ref.leader.core.task("t").n == ref.helper.core.task("t").n == 0
