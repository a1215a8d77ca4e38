"""Range validation of client reports at the close (TaskSpec.validate_reports).

A report whose value wraps a sum past 2^63 would reverse comparisons; with
validation on, the servers find every value outside [0, 2^F] with the garbled
first-YES circuit, drop those reports on both servers, and streams see only
valid reports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Deployment, driver_pair, encoded_sum, off_loop
from test_server import channel

from svtagg.client.upload import make_batch
from svtagg.dp.errors import PeerUnavailable
from svtagg.dp.task import TaskParams
from svtagg.mpc.sharing import share
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.servers import wire
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange import Agreement, TaskInfo
from svtagg.servers.store_sqlite import SqliteStore

D, F = 4, 16
#: A task whose reports are range-checked at the close.
VALIDATED = pb.TaskSpec(
    task_id="v",
    d=D,
    frac_bits=F,
    n_max=1000,
    min_batch=1,
    epsilon_total="10",
    delta_total="0",
    epsilon_min="1/100",
    validate_reports=True,
)


def _raw_report(values: list[int]) -> tuple[pb.UploadBatch, pb.UploadBatch]:
    """One report with arbitrary ring values, shared exactly as the SDK shares."""
    explicit, seed = share(np.array([v % 2**64 for v in values], dtype=np.uint64))
    rid = os.urandom(16)
    lead, help_ = pb.UploadBatch(task_id="v"), pb.UploadBatch(task_id="v")
    lead.reports.add(report_id=rid, explicit_share=explicit.astype("<u8").tobytes())
    help_.reports.add(report_id=rid, seed=seed)
    return lead, help_


async def test_close_drops_out_of_range_reports(deployment: Deployment) -> None:
    dep = deployment

    def run() -> tuple[Any, Any, int | None]:
        stub = dep.analyst_stub()
        stub.CreateTask(VALIDATED, timeout=10)
        ident = dep.identity("client")
        lead = pb_grpc.IngestStub(channel(dep.leader_addr, ident, server="leader"))
        help_ = pb_grpc.IngestStub(channel(dep.helper_addr, ident, server="helper"))
        honest = make_batch("v", np.zeros((20, D)), F)  # every value 0: in range
        lead.Upload(honest.leader, timeout=10)
        help_.Upload(honest.helper, timeout=10)
        bad = [
            [2**63 - 5, 0, 0, 0],  # wraps the sum of coordinate 0 past the sign bit
            [0, 0, 0, -1],  # negative
            [0, 2**F + 1, 0, 0],  # just above 1.0
            [0, 0, 2**F, 0],  # exactly 1.0: valid, kept
        ]
        for values in bad:
            lb, hb = _raw_report(values)
            lead.Upload(lb, timeout=10)
            help_.Upload(hb, timeout=10)
        info = stub.CloseCollection(pb.TaskRef(task_id="v"), timeout=120)
        s = stub.OpenStream(
            pb.OpenStreamRequest(task_id="v", kind=pb.LAP24, epsilon="1"), timeout=10
        )
        # Coordinate 0 sums to 0 once the wrapping report is gone, so a threshold
        # of −50 (50 score units below, noise scale 4) answers YES; had the report
        # stayed, the sum would read as ≈ −2^63 and answer NO.
        ask = stub.Ask(
            pb.AskRequest(stream_id=s.stream_id, queries=pb.Queries(index=[0]), tau=[-50 * 2**F]),
            timeout=60,
        )
        return info, ask, None

    info, ask, _ = await off_loop(run)
    assert info.dropped_reports == 3
    assert info.n == 21 and info.agreed
    assert ask.yes and ask.index == 0


def test_validation_inputs_encode_the_range_test(tmp_path: Path) -> None:
    """Leader + helper lanes add up to (−v − 1, v − 2^F − 1) per value."""
    from fractions import Fraction

    values = np.array([0, 2**F, 2**F + 1, 2**64 - 1, 2**63 - 5], dtype=np.uint64)
    explicit, seed = share(values)
    stores = {r: SqliteStore(tmp_path / f"{r}.sqlite") for r in ("leader", "helper")}
    params = TaskParams("t", values.size, F, 10, 1, Fraction(1), Fraction(0), Fraction(1), True)
    lanes = {}
    for role, st in stores.items():
        st.create_task(params)
        core = ServerCore(role, st)  # type: ignore[arg-type]
        data = explicit.astype("<u8").tobytes() if role == "leader" else seed
        core.upload("t", [(b"r" * 16, data)])
        st.close_collection("t")
        lanes[role] = core.validation_inputs(st.task("t"), [b"r" * 16])
    z = (lanes["leader"] + lanes["helper"]).view(np.int64)
    low, high = z[: values.size], z[values.size :]
    out_of_range = (low >= 0) | (high >= 0)
    assert out_of_range.tolist() == [False, False, True, True, True]


def test_policy_and_client_can_insist_on_validation(tmp_path: Path) -> None:
    """The analyst chooses validate_reports; a server (or a client) can refuse a
    task that skips it."""
    import pytest

    from svtagg.dp.errors import InvalidArgument
    from svtagg.dp.task import TaskSpec, parse_task_params

    strict = ServerCore("helper", SqliteStore(tmp_path / "h.sqlite"), require_validation=True)
    with pytest.raises(InvalidArgument, match="validate_reports"):
        strict.check_budget_policy(parse_task_params(TaskSpec("a", 4, 16, 10, 1, "1", "0", "1")))
    strict.check_budget_policy(parse_task_params(TaskSpec("b", 4, 16, 10, 1, "1", "0", "1", True)))


async def test_client_refuses_unvalidated_task(deployment: Deployment) -> None:
    import pytest

    dep = deployment

    def run() -> None:
        dep.analyst_stub().CreateTask(
            pb.TaskSpec(
                task_id="u",
                d=D,
                frac_bits=F,
                n_max=100,
                min_batch=1,
                epsilon_total="1",
                delta_total="0",
                epsilon_min="1/100",
            ),
            timeout=10,
        )
        with dep.uploader() as up, pytest.raises(ValueError, match="does not validate"):
            up.upload("u", np.zeros((3, D)), require_validation=True)

    await off_loop(run)


async def test_a_lost_mark_agreed_reply_does_not_wedge_the_close(tmp_path: Path) -> None:
    """The helper agrees on the validated set (and drops its per-report shares),
    but its MarkAgreed reply is lost.  The retried close sees that the helper
    has agreed on this very set and completes (no second validation, which the
    helper could no longer run); the stored robust shares add up to g(S)."""
    async with driver_pair(tmp_path, frac_bits=F) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(VALIDATED))
        values = np.random.default_rng(3).random((30, D))
        pair.upload("v", values)
        lb, hb = _raw_report([0, 0, -1, 0])  # out of range: dropped at the close
        pair.leader.core.upload("v", [(r.report_id, r.explicit_share) for r in lb.reports])
        pair.helper.core.upload("v", [(r.report_id, r.seed) for r in hb.reports])
        real_mark = pair.port.mark_agreed
        lost: list[int] = []

        async def lossy(agreement: Agreement, timeout: float | None = None) -> TaskInfo:
            reply = await real_mark(agreement, timeout)
            if not lost:
                lost.append(1)
                raise PeerUnavailable("helper: UNAVAILABLE (reply lost)")
            return reply

        pair.port.mark_agreed = lossy  # type: ignore[method-assign]
        with pytest.raises(PeerUnavailable):
            await pair.leader.close_collection("v")
        assert pair.helper.core.store.task("v").agreed
        assert not pair.leader.core.store.task("v").agreed
        info = await pair.leader.close_collection("v")
        assert info.agreed and info.n == 30
        lead = pair.leader.core.store.robust_sums("v")
        helper = pair.helper.core.store.robust_sums("v")
        assert lead is not None and helper is not None
        assert np.array_equal(lead + helper, encoded_sum(values, F))
