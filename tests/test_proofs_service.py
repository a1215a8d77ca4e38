"""Validity proofs as users meet them: through the gRPC services (a client's
upload, an analyst's task), the servers' and the client's policy, and a close
whose last reply is lost.  The mechanism itself: tests/test_proofs.py."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import Deployment, encoded_sum, off_loop

from svtagg.client.upload import make_batch
from svtagg.dp.errors import InvalidArgument, PeerUnavailable
from svtagg.dp.task import TaskSpec, parse_task_params
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange.values import Agreement, TaskInfo
from svtagg.servers.reference import reference_pair
from svtagg.servers.store.sqlite import SqliteStore

D, F = 5, 12


def proof_task(task_id: str = "p", validity: str = "range", d: int = D) -> pb.TaskSpec:
    return pb.TaskSpec(
        task_id=task_id,
        d=d,
        frac_bits=F,
        n_max=10_000,
        min_batch=1,
        epsilon_total="10",
        delta_total="0",
        epsilon_min="1/100",
        validity=validity,
    )


async def test_a_client_uploads_proved_reports_through_both_servers(
    deployment: Deployment,
) -> None:
    """The SDK shards with the task's circuit, sends the helper its half first;
    the leader's answer counts the batch; plain shares to such a task are
    refused; the analyst sees n and no refusals."""
    dep = deployment
    values = np.random.default_rng(8).random((300, D))

    def run() -> None:
        stub = dep.analyst_stub()
        stub.CreateTask(proof_task(), timeout=10)
        with dep.uploader() as up:
            stats = up.upload("p", values, batch_size=128, require_validation=True)
        assert (stats.reports, stats.held, stats.rejected) == (300, [300, 300], {})
        plain = make_batch("p", values[:2], F)  # no proof
        ingest = pb_grpc.IngestStub(dep.uploader()._channels[0])
        with pytest.raises(grpc.RpcError) as refused:
            ingest.Upload(plain.leader, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "validity proof" in refused.value.details()
        info = stub.CloseCollection(pb.TaskRef(task_id="p"), timeout=60)
        assert (info.n, dict(info.rejected), info.spec.validity) == (300, {}, "range")

    await off_loop(run)


def test_a_server_and_a_client_can_insist_on_proofs(tmp_path: Path) -> None:
    """A server that requires validation refuses a task without a circuit, and
    a bad circuit name; the retired garbled range check is refused outright."""
    strict = ServerCore("helper", SqliteStore(tmp_path / "h.sqlite"), require_validation=True)
    plain = TaskSpec("a", 4, 16, 10, 1, "1", "0", "1")
    with pytest.raises(InvalidArgument, match="validity"):
        strict.check_budget_policy(parse_task_params(plain))
    proved = TaskSpec("b", 4, 16, 10, 1, "1", "0", "1", validity="multihot:2")
    strict.check_budget_policy(parse_task_params(proved))
    with pytest.raises(InvalidArgument, match="does not fit embedding sparse_mean"):
        strict.check_budget_policy(
            parse_task_params(
                TaskSpec("c", 4, 16, 10, 1, "1", "0", "1", False, "sparse_mean", "onehot")
            )
        )
    with pytest.raises(InvalidArgument, match="retired"):
        parse_task_params(TaskSpec("d", 4, 16, 10, 1, "1", "0", "1", True))
    with pytest.raises(InvalidArgument, match="multihot:r"):
        parse_task_params(TaskSpec("e", 4, 16, 10, 1, "1", "0", "1", validity="range:3"))


async def test_the_client_refuses_a_task_without_proofs(deployment: Deployment) -> None:
    dep = deployment

    def run() -> None:
        spec = proof_task("u", validity="")
        dep.analyst_stub().CreateTask(spec, timeout=10)
        with dep.uploader() as up, pytest.raises(ValueError, match="without a validity proof"):
            up.upload("u", np.zeros((3, D)), require_validation=True)

    await off_loop(run)


async def test_a_lost_mark_agreed_reply_does_not_wedge_the_close(tmp_path: Path) -> None:
    """The helper agrees (and drops its seeds) but its MarkAgreed reply is lost:
    the retried close completes on the same report set, and the stored ring
    shares add up to the proved reports' sums."""
    async with reference_pair(tmp_path, frac_bits=F) as pair:
        from svtagg.servers.edge import wire

        await pair.leader.create_task(wire.TASK_SPEC.from_pb(proof_task("v")))
        values = np.random.default_rng(3).random((30, D))
        await pair.upload_proofs("v", values)
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


async def test_a_keyed_upload_sent_twice_counts_once(deployment: Deployment) -> None:
    """A resumable (keyed) upload derives each report's id and its Prio3
    randomness from the key and the row: sent again, the very same reports
    arrive, both servers read them as already held, and nobody counts twice."""
    from svtagg.client.upload import Resumable, UploadKey

    dep = deployment
    values = np.random.default_rng(9).random((90, D))
    key = UploadKey.new()

    def run() -> tuple[int, int, list[int]]:
        dep.analyst_stub().CreateTask(proof_task("k"), timeout=10)
        with dep.uploader() as up:
            blocks = [values[i : i + 40] for i in range(0, 90, 40)]
            up.upload_blocks("k", blocks, resume=Resumable(key))
            again = up.upload_blocks("k", blocks, resume=Resumable(key))
        info = dep.analyst_stub().DescribeTask(pb.TaskRef(task_id="k"), timeout=10)
        return info.n, again.reports, again.held

    assert await off_loop(run) == (90, 90, [90, 90])


def test_the_demo_counts_a_malicious_client_once_and_refuses_its_forgery(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`svtagg demo --scenario heavy-hitters --malicious 1`, small: the reports
    are sparse DPF keys and the demo says so; the worst valid report is
    counted like any user's, the forged one (10^6 on the rarest category, made
    honestly for that count) is refused."""
    from svtagg.deploy.cli import main

    argv = ["demo", "--scenario", "heavy-hitters", "--users", "600", "--d", "40", "--k", "2",
            "--malicious", "1", "--epsilon", "2"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "reports: sparse-onehot, each a verifiable DPF key of" in err
    assert "1 worst valid reports counted" in err
    assert "1 forged reports refused (invalid_proof 1)" in err
    assert "collection closed: n=601 on both servers" in err
