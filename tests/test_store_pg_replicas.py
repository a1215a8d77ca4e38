"""Replicated ingest on PostgreSQL: each server runs its main process and an
ingest replica (`svtagg server --ingest-only`) on the same store.  A client
uploads through the replicas; the leader's replica is killed (SIGKILL) in the
middle of the uploads; the client then sends every batch again through the
main processes.  Every acknowledged report is counted once on both servers,
nothing is counted twice, S_L + S_H is the plaintext sum, and the main
processes' streams are untouched by a replica's start.  Skips without a
reachable server (SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_reliability import Collection, check_reports, create_task
from test_store_pg_reliability import PgProcessDeployment

from svtagg.client.upload import Uploader, UploadError
from svtagg.proto.tls import Identity


def start_replica(pd: PgProcessDeployment, role: str) -> tuple[Any, str]:
    """An ingest-only process of `role` on that role's PostgreSQL schema."""
    address = pd.dep.start_replica(
        role, pd.url, env={"PGOPTIONS": f"-csearch_path={pd.schemas[role]}"}
    )
    return pd.dep.procs[f"{role}-replica-0"], address


def uploader(pd: PgProcessDeployment, leader: str, helper: str) -> Uploader:
    c = Identity.load(pd.certs, "client")
    return Uploader(leader, helper, c.ca, c.cert, c.key, retries=0, timeout=20)


def resend(up: Uploader, b: Any) -> int:
    """Send a batch again to both servers, as a client retrying through another
    process: each server either stores it now or answers ALREADY_EXISTS (it was
    stored before, through any process).  Returns how many servers had it."""
    had = 0
    for i in (0, 1):
        try:
            up._submit(b, (i,))[i].result()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.ALREADY_EXISTS, exc  # type: ignore[attr-defined]
            had += 1
    return had


def kill_mid_upload(
    pd: PgProcessDeployment,
    col: Collection,
    through: tuple[str, str],
    victim: Any,
    batches: int,
    acked: int,
    pause: float = 0.0,
) -> list[Any]:
    """Upload batches of 10 through the (leader, helper) addresses `through`
    on a thread; once `acked` reports are acknowledged, SIGKILL `victim` (a
    replica's process).  The client must see the failure.  Returns the
    batches sent, to be sent again."""
    sent: list[Any] = []
    outcome: dict[str, Any] = {}

    def upload() -> None:
        with uploader(pd, *through) as up:
            try:
                for _ in range(batches):
                    b = col.batch(10)
                    sent.append(b)
                    up.send(b)
                    col.ack(b)
                    time.sleep(pause)
            except UploadError as exc:
                outcome["error"] = exc

    t = threading.Thread(target=upload)
    t.start()
    deadline = time.monotonic() + 60
    while len(col.acked) < acked and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    t.join(60)
    assert not t.is_alive()
    assert "error" in outcome, "the client saw no failure: the replica died too late"
    return sent


def test_replica_killed_mid_upload_loses_and_doubles_nothing(
    tmp_path: Path,
    pg_url: tuple[str, str],
) -> None:
    pd = PgProcessDeployment(tmp_path, *pg_url).start()
    replicas: dict[str, Any] = {}
    try:
        col = Collection("rep")
        create_task(pd, "rep")
        for role in ("leader", "helper"):
            replicas[role] = start_replica(pd, role)
        through = (replicas["leader"][1], replicas["helper"][1])
        sent = kill_mid_upload(pd, col, through, replicas["leader"][0], 400, 100, 0.005)
        acked_before = set(col.acked)
        assert 100 <= len(acked_before) < 10 * len(sent)
        # The client retries everything through the main processes (a replica
        # of the helper stays up and is used for half of it: any mix works).
        already = 0
        with uploader(pd, pd.address("leader"), replicas["helper"][1]) as up:
            for b in sent[: len(sent) // 2]:
                already += resend(up, b)
                col.ack(b)
        with uploader(pd, pd.address("leader"), pd.address("helper")) as up:
            for b in sent[len(sent) // 2 :]:
                already += resend(up, b)
                col.ack(b)
        # Every batch acked through the replicas was already stored on both servers.
        assert already >= 2 * len(acked_before) // 10
        assert check_reports(pd, col) == 0  # nothing to reconcile: both hold every report
        lead = pd.store_view("leader", col.task)
        assert lead.report_ids == set(col.rows) == col.acked >= acked_before
        assert lead.n == len(col.rows)  # each report once, however often it was sent
    finally:
        pd.stop()  # the replicas with the deployment


@pytest.mark.parametrize("validity", ["range", "sparse-onehot", "sparse-range:3"])
def test_replica_pairs_verify_proofs_and_a_killed_one_counts_nothing_twice(
    tmp_path: Path, pg_url: tuple[str, str], validity: str
) -> None:
    """With proofs (the default), a leader replica started with --helper
    verifies its batches with a helper replica: uploads go through the replica
    pair; the leader replica is killed mid-upload; the client sends every batch
    again through the main processes.  Every acknowledged report is counted
    once on both servers and S_L + S_H is the plaintext sum of the counted ones."""
    pd = PgProcessDeployment(tmp_path, *pg_url).start()
    try:
        col = Collection("vr", validity)
        create_task(pd, "vr", validity)
        env = {r: {"PGOPTIONS": f"-csearch_path={pd.schemas[r]}"} for r in ("leader", "helper")}
        helper_replica = pd.dep.start_replica("helper", pd.url, env=env["helper"])
        leader_replica = pd.dep.start_replica(
            "leader", pd.url, env=env["leader"], helper=helper_replica
        )
        victim = pd.dep.procs["leader-replica-0"]
        sent = kill_mid_upload(pd, col, (leader_replica, helper_replica), victim, 300, 60)
        assert len(col.acked) >= 60
        with uploader(pd, pd.address("leader"), pd.address("helper")) as up:
            for b in sent:
                # Sent again as the client's journal sends a batch it made
                # (keyed): a server that answers ALREADY_EXISTS holds this
                # very batch, and the leader's half still goes.  The replica
                # may have died after the helper recorded the batch's
                # verification and before the leader did: the helper then
                # refuses its half as counted, and only the leader's half,
                # answered from the helper's record, completes it.
                up.send(replace(b, keyed=True))
                col.ack(b)
        check_reports(pd, col)
        lead = pd.store_view("leader", col.task)
        assert lead.report_ids == set(col.rows) and lead.n == len(col.rows)
    finally:
        pd.stop()
