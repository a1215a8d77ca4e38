"""Sparse one-hot reports through the servers (servers/ingest/batches.py's
sparse kind): a `sparse-onehot` task counts honest reports into the same sums
a dense `onehot` task would, refuses hostile ones by reason, keeps the retry
rule (a batch sent again with edited shares is refused), takes out on the
helper a batch the leader never recorded, and goes through the SDK and the
services (a resumable upload sent twice counts once).  The retry rule, the
take-out and one id under two reports run on `sparse-multihot:3` and
`sparse-range:3` too.  The
mechanisms themselves: tests/test_vdaf_sparse.py, tests/test_sparse_multihot.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import Deployment, encoded_sum, off_loop
from test_proofs import closed_totals
from test_proofs_service import proof_task

from svtagg.client.upload import REPORT_ID_BYTES
from svtagg.dp.errors import FailedPrecondition
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.edge import wire
from svtagg.servers.ingest.batches import ProofReport, helper_receive, verify_upload
from svtagg.servers.ingest.validity import task_validity
from svtagg.servers.reference import reference_pair
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.sparse import PublicShare
from svtagg.vdaf.validity import parse_validity

D, F = 300, 12
#: The sparse circuits the shared tests below run on, with three rows each
#: ("first"), two more ("more") and one other ("other"), as item lists.
SPARSE = {
    "sparse-onehot": ([[1], [2], [3]], [[8], [100]], [[20]]),
    "sparse-multihot:3": ([[1, 2], [3], []], [[8, 100, 299], [1]], [[20, 21]]),
    "sparse-range:3": ([[1, 2], [3], []], [[8, 100, 299], [1]], [[20, 21]]),
}


def spec(task_id: str, validity: str = "sparse-onehot", d: int = D) -> pb.TaskSpec:
    return proof_task(task_id, validity, d)


async def closed_sums_equal(pair, task_id: str, items: list[int] | list[list[int]]) -> bool:  # type: ignore[no-untyped-def]
    """Close the task; whether the two servers' robust sums add up to the
    plaintext sum of the rows of `items` (one item a row, or a list a row)."""
    totals = await closed_totals(pair, task_id)
    return bool(np.array_equal(totals, encoded_sum(item_rows(items), F)))


def onehot_rows(items: list[int], d: int = D) -> np.ndarray:
    return item_rows([[x] for x in items], d)


def item_rows(items: list[int] | list[list[int]], d: int = D) -> np.ndarray:
    """0/1 rows holding `items`: one item a row, or a list of items a row."""
    rows = np.zeros((len(items), d))
    for i, row in enumerate(items):
        rows[i, row] = 1.0
    return rows


def test_the_circuit_and_its_sizes() -> None:
    v = parse_validity("sparse-onehot", 10_000, 16, "heavy_hitters")
    assert v is not None and v.sparse and v.counts
    assert v.public_share_bytes() + v.input_share_bytes(0) == 276
    assert v.input_share_bytes(1) == 16
    dense = parse_validity("onehot", 10_000, 16)
    assert dense is not None and dense.input_share_bytes(0) > 160_000
    assert v.batch_limit(10_000, 64 << 20, 256 << 20) == 1024  # 256 MiB / (16 · 2^14)


async def test_sparse_reports_count_as_dense_ones_would(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    items = [int(x) for x in rng.zipf(1.5, 200) % D]
    values = onehot_rows(items)
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("s")))
        for block in (values[:120], values[120:]):
            got = await pair.upload_proofs("s", block)
            assert (got.accepted, got.rejected) == (len(block), {})
        assert await closed_sums_equal(pair, "s", items)
        task = pair.leader.core.task("s")
        assert task.agreed and task.n == 200


def _shards(pair, task_id: str, items: list[int] | list[list[int]]):  # type: ignore[no-untyped-def]
    v = task_validity(pair.leader.core.task(task_id))
    ids = [os.urandom(REPORT_ID_BYTES) for _ in items]
    grid = (item_rows(items) * (1 << F)).astype(np.int64)
    return v, ids, v.shard(grid.tolist(), ids)


def _doubled(v, shard):  # type: ignore[no-untyped-def]
    """The report with its output correction doubled: a weight of 2."""
    public, lead, help_ = shard
    ps = v.scheme.decode_public_share(public)
    bad = PublicShare(ps.seeds, ps.ctrl, ps.proof, (2 * ps.output) % FIELD128.modulus)
    return v.scheme.encode_public_share(bad), lead, help_


async def test_hostile_reports_are_refused_by_reason(tmp_path: Path) -> None:
    """A weight of two, a key changed for the leader, a leader key that does not
    decode, and a public share that differs between the servers: refused,
    counted by reason, and nothing of them in the sums."""
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("h")))
        v, ids, shards = _shards(pair, "h", [3, 5, 7, 11, 13, 17])
        shards[1] = _doubled(v, shards[1])
        p, lead, help_ = shards[2]
        shards[2] = (p, bytes([lead[0] ^ 1]) + lead[1:], help_)
        helper_receive(
            pair.helper.core,
            "h",
            [ProofReport(r, h, p) for r, (p, _, h) in zip(ids, shards, strict=True)],
        )
        other, _ = v.scheme.gen(9, ids[4], os.urandom(32))  # the leader's public share of #4
        reports = [ProofReport(r, ld, p) for r, (p, ld, _) in zip(ids, shards, strict=True)]
        reports[3] = ProofReport(ids[3], reports[3].input_share[:-1], reports[3].public_share)
        reports[4] = ProofReport(ids[4], reports[4].input_share, other)
        got = await verify_upload(pair.leader.core, pair.port, "h", reports)
        assert got.accepted == 2
        assert got.rejected == {"invalid_proof": 3, "malformed_share": 1}
        assert await closed_sums_equal(pair, "h", [3, 17])
        assert pair.leader.core.task("h").n == 2


@pytest.mark.parametrize("validity", list(SPARSE))
async def test_a_retry_with_edited_shares_is_refused_and_the_honest_one_counts_once(
    tmp_path: Path, validity: str
) -> None:
    """The helper records a batch, the leader's answer is lost; the client
    sends the batch again with one leader key changed (a report whose
    unverified share would be folded): refused; the honest retry is answered
    from the record and counted once."""
    first = SPARSE[validity][0]
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("r", validity)))
        v, ids, shards = _shards(pair, "r", first)
        helper_receive(
            pair.helper.core,
            "r",
            [ProofReport(r, h, p) for r, (p, _, h) in zip(ids, shards, strict=True)],
        )
        honest = [ProofReport(r, ld, p) for r, (p, ld, _) in zip(ids, shards, strict=True)]
        real = pair.leader.core.store.add_reports

        def lost(*a, **k):  # type: ignore[no-untyped-def]
            raise ConnectionError("the leader dies before recording")

        pair.leader.core.store.add_reports = lost  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await verify_upload(pair.leader.core, pair.port, "r", honest)
        pair.leader.core.store.add_reports = real  # type: ignore[method-assign]
        edited = list(honest)
        edited[0] = ProofReport(ids[0], os.urandom(16), honest[0].public_share)
        with pytest.raises(FailedPrecondition, match="other leader shares"):
            await verify_upload(pair.leader.core, pair.port, "r", edited)
        got = await verify_upload(pair.leader.core, pair.port, "r", honest)
        assert got.accepted == 3
        assert await closed_sums_equal(pair, "r", first)
        assert pair.leader.core.task("r").n == 3


@pytest.mark.parametrize("validity", list(SPARSE))
async def test_the_close_takes_out_a_batch_the_leader_never_recorded(
    tmp_path: Path, validity: str
) -> None:
    """The helper recorded a batch the leader never did and the client never
    retried: the close takes it out of the helper's sums (re-expanding the
    kept keys), so both servers close on the same reports."""
    first, more, _ = SPARSE[validity]
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("c", validity)))
        await pair.upload_proofs("c", item_rows(first))
        v, ids, shards = _shards(pair, "c", more)
        helper_receive(
            pair.helper.core,
            "c",
            [ProofReport(r, h, p) for r, (p, _, h) in zip(ids, shards, strict=True)],
        )
        real = pair.leader.core.store.add_reports

        def lost(*a, **k):  # type: ignore[no-untyped-def]
            raise ConnectionError("the leader dies before recording")

        pair.leader.core.store.add_reports = lost  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await verify_upload(
                pair.leader.core,
                pair.port,
                "c",
                [ProofReport(r, ld, p) for r, (p, ld, _) in zip(ids, shards, strict=True)],
            )
        pair.leader.core.store.add_reports = real  # type: ignore[method-assign]
        assert await closed_sums_equal(pair, "c", first)
        assert pair.leader.core.task("c").n == 3


async def test_the_sdk_uploads_sparse_reports_and_a_resumed_upload_counts_once(
    deployment: Deployment,
) -> None:
    from svtagg.client.upload import Resumable, UploadKey

    dep = deployment
    items = [int(x) % D for x in np.random.default_rng(2).zipf(1.4, 150)]
    values = onehot_rows(items)
    key = UploadKey.new()

    def run() -> tuple[int, int, list[int], dict[str, int]]:
        dep.analyst_stub().CreateTask(spec("k"), timeout=10)
        with dep.uploader() as up:
            blocks = [values[i : i + 64] for i in range(0, 150, 64)]
            first = up.upload_blocks("k", blocks, resume=Resumable(key))
            again = up.upload_blocks("k", blocks, resume=Resumable(key))
        info = dep.analyst_stub().DescribeTask(pb.TaskRef(task_id="k"), timeout=10)
        return info.n, again.reports, again.held, first.rejected

    n, reports, held, rejected = await off_loop(run)
    assert (n, reports, held, rejected) == (150, 150, [150, 150], {})


@pytest.mark.parametrize("validity", list(SPARSE))
async def test_one_id_with_two_different_reports_counts_once(tmp_path: Path, validity: str) -> None:
    """A report counted under an id; then another report under the same id
    (other items, fresh keys): refused, nothing counted twice."""
    first, _, other_items = SPARSE[validity]
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec("i", validity)))
        v, ids, shards = _shards(pair, "i", first[:1])
        got = await pair.send_proofs("i", ids, shards)
        assert got.accepted == 1
        other = v.shard((item_rows(other_items) * (1 << F)).astype(np.int64).tolist(), ids)
        with pytest.raises(Exception, match="already") as refused:
            await pair.send_proofs("i", ids, other)
        assert type(refused.value).__name__ in ("AlreadyExists", "FailedPrecondition")
        assert await closed_sums_equal(pair, "i", first[:1])
        assert pair.leader.core.task("i").n == 1
