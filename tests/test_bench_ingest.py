"""The ingest benchmark's figures at a tiny size (benchmarks/bench_ingest.py):
not its timings, but that what it measures is what it says — the upload bytes
equal the lengths the circuits prescribe, the servers hold every report, the
storage it reports sees the plain shares until the close and only ids after,
and the old garbled range check flags exactly the out-of-range reports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from svtagg.benchmarks import bench_ingest as bi
from svtagg.mpc.ring import encode

F = bi.FRAC_BITS
ID = 16
SEED = 16


def field_bytes(inst: bi.Instance) -> tuple[int, int, int]:
    """(leader input share, helper input share, public share) in bytes from the
    circuit's lengths: the leader sends its measurement and proof shares as
    16-byte Field128 elements plus a blind, the helper three 16-byte seeds, the
    public share one joint-randomness part per aggregator."""
    v = inst.circuit
    assert v is not None
    prio = v.prio3
    blind = SEED if prio.uses_joint_rand else 0
    leader = 16 * (prio.flp.meas_len + prio.flp.proof_len) + blind
    return leader, 2 * SEED + blind, (2 * SEED if prio.uses_joint_rand else 0)


@pytest.mark.parametrize(
    "inst",
    [
        bi.Instance("range d=6", "range", 6),
        bi.Instance("onehot d=12", "onehot", 12),
        bi.Instance("multihot:3 d=12", "multihot:3", 12),
        bi.Instance("plain d=6", "", 6),
    ],
    ids=lambda i: i.label,
)
def test_client_figures_and_upload_bytes(inst: bi.Instance) -> None:
    data = bi.shard_reports(inst, bi.valid_values(inst, 7, seed=3), block=3)
    assert len(data) == 7 and len(set(data.ids)) == 7
    assert len(data.ms_per_report) == 3 and all(ms > 0 for ms in data.ms_per_report)
    got = bi.upload_bytes(inst, data)
    if inst.validity:
        leader, helper, public = field_bytes(inst)
        assert (got["leader"], got["helper"], got["public"]) == (
            leader + public + ID,
            helper + public + ID,
            public,
        )
    else:
        assert (got["leader"], got["helper"], got["public"]) == (8 * inst.d + ID, SEED + ID, 0)
    # the protobuf message adds its field tags and lengths, a few bytes per report
    for role in ("leader", "helper"):
        assert got[role] < got["pb_" + role] < got[role] + 16


def test_multihot_rows_carry_the_most_ones_allowed() -> None:
    inst = bi.Instance("multihot:3 d=12", "multihot:3", 12)
    values = bi.valid_values(inst, 20)
    assert set(np.unique(values)) == {0.0, 1.0}
    assert (values.sum(axis=1) == 3).all()


def test_reference_run_holds_every_report_and_stores_ids_only(tmp_path: Path) -> None:
    """Plain shares at d = 256: before the close the leader's store grows by at
    least its 8·d-byte shares per report; after the close only the ids stay.
    A proof task grows by far less than a plain share per report."""
    n = 60
    plain = bi.Instance("plain d=256", "", 256)
    data = bi.shard_reports(plain, bi.valid_values(plain, n), block=25)
    (tmp_path / "p").mkdir()
    run = asyncio.run(bi.reference_run(plain, tmp_path / "p", data, batch=25))
    assert run.n == (n, n)
    assert 0 < run.rate[1] <= run.rate[0] <= run.rate[2]
    leader, helper = run.storage["leader"], run.storage["helper"]
    assert leader.open[1] >= 8 * plain.d  # the shares are in `.shares`
    assert helper.open[1] >= SEED  # the seeds are
    assert leader.closed[1] < 8 * plain.d / 2  # dropped at the agreement
    assert run.peer_bytes == 0  # plain shares: no exchange at ingest
    # the close's robust pass garbles 64-bit lanes: well over 64 bytes per coordinate
    assert run.close_s > 0 and run.close_bytes > 64 * plain.d
    for s in (leader, helper):
        assert s.open[0] >= s.open[1] >= s.open[2] >= 0
        assert s.closed[1] >= s.closed[2] >= 0

    proof = bi.Instance("range d=4", "range", 4)
    n = 300
    data = bi.shard_reports(proof, bi.valid_values(proof, n), block=100)
    (tmp_path / "r").mkdir()
    run = asyncio.run(bi.reference_run(proof, tmp_path / "r", data, batch=100))
    assert run.n == (n, n) and run.cpu_ms > 0
    # per report: its id, then each server's prep share (verifier and joint-
    # randomness part), plus a verdict byte and the messages' framing
    prio = proof.circuit.prio3  # type: ignore[union-attr]
    prep = 16 * prio.flp.verifier_len + SEED
    assert ID + 2 * prep < run.peer_bytes < ID + 2 * prep + 16
    for s in run.storage.values():
        # ids and 16-byte seeds (open) in 4 KiB pages: far below any share
        assert 0 < s.open[1] < 400 and 0 < s.closed[1] < 400


def test_the_old_check_flags_exactly_the_out_of_range_reports() -> None:
    d, top = 4, 1 << F
    grid = encode(bi.valid_values(bi.Instance("plain", "", d), 9, seed=5), F)
    grid[0] = [0, top, 0, top]  # the bounds are valid
    bad = {2: (1, top + 1), 5: (3, np.uint64(2**64 - 1)), 8: (0, np.uint64(2**63))}
    for i, (j, value) in bad.items():
        grid[i, j] = value
    z_l, z_h = bi.gc_lanes(grid)
    assert z_l.shape == z_h.shape == (9 * 2 * d,)
    # chunks of 2 reports: the chunking must not move a report's bit
    run = asyncio.run(bi.gc_check(z_l, z_h, d, lanes=4 * d))
    assert run.invalid == [i in bad for i in range(9)]
    # 2d comparisons of width 64 per report: thousands of bytes each
    assert run.bytes_per_report > 2 * d * 64 * 16
    assert run.rate[0] > 0


def test_two_server_processes(tmp_path: Path) -> None:
    inst = bi.Instance("onehot d=4", "onehot", 4)
    data = bi.shard_reports(inst, bi.valid_values(inst, 20), block=10)
    run = bi.process_run(inst, data, batch=10)
    assert run.n == (20, 20)
    assert run.rate[0] > 0 and set(run.cpu_ms) == {"leader", "helper"}
    assert all(ms >= 0 for ms in run.cpu_ms.values())


def test_the_table_marks_each_figure_against_its_target() -> None:
    def col(kind: str, client_ms: float, rate: float) -> bi.Column:
        inst = bi.parse_instance({"range": "range@100", "onehot": "onehot@1000"}[kind])
        storage = {
            r: bi.Storage((90.0, 90.0, 80.0), (120.0, 101.0, 60.0)) for r in ("leader", "helper")
        }
        ref = bi.ServerRun((rate, rate, rate), 1.0, storage, (1, 1))
        upload = {"leader": 1.0, "helper": 1.0, "public": 0.0, "pb_leader": 1.0, "pb_helper": 1.0}
        return bi.Column(inst, (client_ms, client_ms, client_ms), upload, ref)

    lines = {
        name: cells
        for name, cells, _ in bi.rows([col("range", 4.9, 5_000), col("onehot", 0.6, 19_999)])
    }
    client = next(c for n, c in lines.items() if n.startswith("client"))
    server = next(c for n, c in lines.items() if n.startswith("servers, reference"))
    assert client[0].endswith(" met") and client[1].endswith(" MISSED")
    assert server[0].endswith(" met") and server[1].endswith(" MISSED")
    stored = [c for n, c in lines.items() if n.startswith("storage")]
    # open: kept 90 ≤ 100; closed: kept 101 > 100
    assert [cells[0].rsplit(" ", 1)[1] for cells in stored] == ["met", "MISSED"] * 2


def test_instances_by_name_and_targets_only_where_they_apply() -> None:
    assert bi.parse_instance("range@10000/8") == bi.Instance("range d=10000 F=8", "range", 10000, 8)
    assert bi.parse_instance("multihot:10@1000").circuit.max_weight == 10  # type: ignore[union-attr]
    plain = bi.parse_instance("plain@100")
    assert (plain.validity, plain.kind, plain.circuit) == ("", "plain", None)
    with pytest.raises(ValueError):
        bi.parse_instance("range:3@100")
    assert bi.parse_instance("range@100").target(bi.CLIENT_MS) == 5.0
    assert bi.parse_instance("range@100/8").target(bi.CLIENT_MS) is None
    assert bi.parse_instance("onehot@10000").target(bi.SERVER_RATE) is None
    assert plain.target(bi.GC_RATE) == 5_000.0
