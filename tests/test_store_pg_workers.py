"""Leased comparison work on PostgreSQL (servers/work.py).

The queue alone: two workers never lease the same job (SKIP LOCKED); a job is
answered once (a finished job's state is final, a result is written only under
the writer's own live lease); a lost worker's job fails and names its stream;
a job nobody takes is withdrawn unrun; one queued chunk per stream.

The processes: a leader front end (`--lease-work`), leader workers paired with
the helper's main process and with a helper worker; uploads, a validating
close whose passes run on the workers, streams that answer as in process.  A
leader worker or a helper worker is killed (SIGKILL) mid-chunk: the analyst
gets an error, never the bit, the stream is failed closed on both servers,
nothing is refunded, and the next stream answers.  Skips without a reachable
server (SVTAGG_TEST_POSTGRES)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import postgres_unavailable
from test_reliability import (
    CLEAR,
    EPS,
    D,
    budgets,
    closed_task,
    create_task,
    stream_through_kill,
)
from test_store_pg_reliability import PgProcessDeployment

from svtagg.analyst.oracle import Query
from svtagg.deploy.jobs import task_spec
from svtagg.dp.errors import FailedPrecondition
from svtagg.dp.task import TaskParams
from svtagg.mpc.sharing import share
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.work import Unclaimed, WorkerLost

pytestmark = pytest.mark.skipif(bool(postgres_unavailable()), reason="no PostgreSQL")


@pytest.fixture
def pg_schema(pg_url: tuple[str, str]) -> tuple[str, str]:
    return pg_url[0], f"w_{pg_url[1]}"


@pytest.fixture
async def queues(pg_schema: tuple[str, str]) -> AsyncIterator[tuple[Any, Any, Any]]:
    """A store and two queues on it (a front end's and a worker's connections)."""
    from svtagg.servers.store.postgres import PgStore
    from svtagg.servers.work import WorkQueue

    store = PgStore(pg_schema[0], schema=pg_schema[1])
    a = await WorkQueue.connect(store)
    b = await WorkQueue.connect(store)
    try:
        yield store, a, b
    finally:
        await a.close()
        await b.close()
        store.close()


async def test_two_workers_never_lease_the_same_job(queues: tuple[Any, Any, Any]) -> None:
    _, a, b = queues
    for i in range(40):
        await a._exec("INSERT INTO work (kind, payload) VALUES ('robust', %s)", (bytes([i]),))

    async def drain(q: Any, owner: str) -> list[int]:
        got = []
        while (job := await q.lease(owner)) is not None:
            got.append(job.job_id)
            await asyncio.sleep(0)
        return got

    x, y = await asyncio.gather(drain(a, "wa"), drain(b, "wb"))
    assert not set(x) & set(y)
    assert len(x) + len(y) == 40 and x and y


async def test_a_job_is_answered_once(queues: tuple[Any, Any, Any]) -> None:
    import psycopg

    _, front, q = queues
    await q.heartbeat("w1", "leader")
    waiting = asyncio.ensure_future(front.run("robust", b"p"))
    job = None
    while job is None:
        job = await q.lease("w1")
        await asyncio.sleep(0.01)
    assert not await q.finish(job, "intruder", b"forged")  # not its lease
    assert await q.finish(job, "w1", b"answer")
    assert not await q.finish(job, "w1", b"again")  # finished: no second answer
    assert await waiting == b"answer"
    # A finished job's state is final whatever the writer (trigger).
    await front._exec("INSERT INTO work (kind, payload, state) VALUES ('robust', '', 'done')")
    with pytest.raises(psycopg.errors.RaiseException, match="final"):
        await front._exec("UPDATE work SET state='pending'")


async def test_refusal_travels_back(queues: tuple[Any, Any, Any]) -> None:
    _, front, q = queues
    await q.heartbeat("w1", "leader")
    waiting = asyncio.ensure_future(front.run("robust", b"p"))
    while (job := await q.lease("w1")) is None:
        await asyncio.sleep(0.01)
    await q.finish(job, "w1", None, FailedPrecondition("stream s is failed"))
    with pytest.raises(FailedPrecondition, match="stream s is failed"):
        await waiting


async def test_lost_worker_fails_the_stream(queues: tuple[Any, Any, Any]) -> None:
    _, front, q = queues
    await q.heartbeat("w1", "leader")
    lost: list[str] = []

    async def on_lost(sid: str) -> None:
        lost.append(sid)

    waiting = asyncio.ensure_future(front.run("ask", b"p", "s1", on_lost))
    while (job := await q.lease("w1", seconds=0.5)) is None:
        await asyncio.sleep(0.01)
    # The worker goes silent: no renewal, no result.
    with pytest.raises(WorkerLost, match="lost; the stream is failed closed"):
        await asyncio.wait_for(waiting, 10)
    assert lost == ["s1"]
    assert not await q.renew(job, "w1")  # taken away
    assert not await q.finish(job, "w1", b"late")  # its late answer is never used


async def test_unclaimed_job_is_withdrawn_unrun(queues: tuple[Any, Any, Any]) -> None:
    _, front, q = queues
    from svtagg.proto.vocab import Role
    from svtagg.servers.edge.metrics import Metrics

    front.metrics = Metrics(Role.LEADER)
    with pytest.raises(Unclaimed, match="no comparison worker is running"):
        await front.run("ask", b"p", "s1")
    await q.heartbeat("w1", "leader")  # alive, but never leases
    with pytest.raises(Unclaimed, match="nothing ran"):
        await front.run("ask", b"p", "s1", pickup=0.5)
    jobs = front.metrics.jobs.labels(kind="ask", outcome="unclaimed")
    assert jobs._value.get() == 2 and front.metrics.workers_alive._value.get() == 1
    assert await q.lease("w1") is None  # withdrawn, not left for a worker
    assert (await front._exec("SELECT count(*) FROM work"))[0][0] == 0


async def test_abandoned_job_is_withdrawn(queues: tuple[Any, Any, Any]) -> None:
    """The caller gives up (an analyst's deadline) before any worker took the
    job: it is withdrawn, so no worker ever runs it."""
    _, front, q = queues
    await q.heartbeat("w1", "leader")
    waiting = asyncio.ensure_future(front.run("ask", b"p", "s1"))
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    while front._abandoned:
        await asyncio.sleep(0.01)
    assert await q.lease("w1") is None
    assert (await front._exec("SELECT count(*) FROM work"))[0][0] == 0


async def test_one_chunk_per_stream_in_the_queue(queues: tuple[Any, Any, Any]) -> None:
    _, front, q = queues
    await q.heartbeat("w1", "leader")
    first = asyncio.ensure_future(front.run("ask", b"p", "s1"))
    await asyncio.sleep(0.2)
    with pytest.raises(FailedPrecondition, match="one at a time"):
        await front.run("ask", b"q", "s1")
    while (job := await q.lease("w1")) is None:
        await asyncio.sleep(0.01)
    await q.finish(job, "w1", b"ok")
    assert await first == b"ok"


def test_staged_robust_shares_cover_every_coordinate(pg_schema: tuple[str, str]) -> None:
    """The helper's staged shares (any of its processes may stage a piece) are
    complete only when every coordinate of the same report set is staged by
    the same pass."""
    from svtagg.servers.store.postgres import PgStore

    store = PgStore(pg_schema[0], schema=pg_schema[1])
    p = b"P" * 16
    try:
        store.create_task(TaskParams("t", 6, 16, 100, 1, Fraction(1), Fraction(0), Fraction(1)))
        store.stage_robust("t", p, b"D1", 0, np.arange(4, dtype=np.uint64))
        assert store.staged_robust("t", p, b"D1", 6) is None
        store.stage_robust("t", p, b"D2", 4, np.array([7, 8], dtype=np.uint64))  # another set
        assert store.staged_robust("t", p, b"D1", 6) is None
        store.stage_robust("t", p, b"D2", 0, np.arange(4, dtype=np.uint64))
        assert list(store.staged_robust("t", p, b"D2", 6)) == [0, 1, 2, 3, 7, 8]
        store.clear_staged("t")
        assert store.staged_robust("t", p, b"D2", 6) is None
    finally:
        store.close()


# ---------------------------------------------------------------- processes
class WorkerDeployment(PgProcessDeployment):
    """Leader front end with --lease-work, and workers: `leaders` leader workers,
    the first paired with a helper worker, the others with the helper's main
    process.  Workers are armed, killed and restarted by name like the roles."""

    def __init__(self, root: Path, url: str, tag: str, leaders: int = 1) -> None:
        super().__init__(root, url, tag)
        self.dep.role_args = {"leader": ["--lease-work"]}
        self.leaders = leaders

    def worker_env(self, name: str) -> dict[str, str]:
        role = name.split("-")[0]
        self.control[name] = self.root / f"{name}.crash"
        self.control[name].write_text("")
        return {
            **self.env,
            "SVTAGG_CRASH_CONTROL": str(self.control[name]),
            "PGOPTIONS": f"-csearch_path={self.schemas[role]}",
        }

    def start(self) -> WorkerDeployment:
        super().start()
        helper = self.dep.start_worker("helper", self.url, env=self.worker_env("helper-worker-0"))
        for i in range(self.leaders):
            self.dep.start_worker(
                "leader",
                self.url,
                helper=helper if i == 0 else None,
                args=["--lease", "1"],
                env=self.worker_env(f"leader-worker-{i}"),
            )
        return self

    def start_role(self, role: str) -> None:
        if "-worker-" in role:
            self.dep.restart_extra(role, env=self.worker_env(role))
        else:
            super().start_role(role)


def _raw_report(values: list[int]) -> pb.UploadBatch:
    """The leader's half of one report of arbitrary ring values, without a proof."""
    explicit, _ = share(np.array([v % 2**64 for v in values], dtype=np.uint64))
    lead = pb.UploadBatch(task_id="v")
    lead.reports.add(report_id=os.urandom(16), explicit_share=explicit.astype("<u8").tobytes())
    return lead


def test_workers_answer_streams_and_run_the_close(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    """Two leader workers: reports proved valid at ingest (raw shares, as a
    malicious client sends them, are refused), the close's field-to-ring passes
    run as parallel jobs, and streams (Ask and noisy-max chunks) answer as in
    process."""
    pd = WorkerDeployment(tmp_path, *pg_url, leaders=2).start()
    try:
        spec = task_spec("v", D, 100_000, "1000", validity="range")
        pd.stub().CreateTask(spec, timeout=30)
        values = np.ones((1200, D))
        with pd.uploader() as up:
            up.upload("v", values)
        # Two reports out of range, sent as a malicious client would (raw shares).
        for bad in ([2**63 - 5] + [0] * (D - 1), [0] * (D - 1) + [-1]):
            lb = _raw_report(bad)
            with pytest.raises(grpc.RpcError) as refused:
                pd.stub("client", "Ingest", "leader").Upload(lb, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = pd.stub().CloseCollection(pb.TaskRef(task_id="v"), timeout=300)
        assert info.n == 1200 and info.dropped_reports == 0
        with pd.oracle("v") as o:
            assert o.open_stream(EPS).ask([(Query(1), 10**4), (Query(0), -1000.0)]) == 1
            assert o.open_stream(EPS).ask([(Query(0), 10**4)]) is None
            # A report-noisy-max chunk is a leased job too: n − S_0 = 0 against S_1 = 1200.
            assert o.noisy_max([Query(0, complement=True), Query(1)], EPS) == 1
            # Chunks of one tournament, each leased on its own (any worker): the
            # carried winner is each server's row in the shared database.
            zero = Query(0, complement=True)
            assert o.noisy_max([zero, zero, Query(1), zero], EPS, chunk_size=1) == 2
        assert budgets(pd, "v")[0] == budgets(pd, "v")[1]
    finally:
        pd.stop()


def test_workers_answer_joint_noise_from_the_front_ends_pool(
    tmp_path: Path, pg_url: tuple[str, str]
) -> None:
    """A joint-noise task under leased work: the front end fills each stream's
    pool (its own sessions, the helper's main process), the workers' chunks
    consume it from the shared stores (a helper worker's included), the answers
    are right, and both servers' counters say the same samples were used."""
    from svtagg.servers.store.postgres import PgStore

    pd = WorkerDeployment(tmp_path, *pg_url).start()
    try:
        pd.stub().CreateTask(task_spec("j", D, 10_000, "100", delta="1/1000", noise="joint"))
        values = np.zeros((40, D))
        values[:, 1] = 1.0
        with pd.uploader() as up:
            up.upload("j", values)
        pd.stub().CloseCollection(pb.TaskRef(task_id="j"), timeout=300)
        with pd.oracle("j") as o:
            stream = o.open_stream(4)
            for _ in range(3):  # every coordinate far below τ: NO
                assert stream.ask([(Query(0), 30.0)] * 50) is None
            assert stream.ask([(Query(0), 20.0), (Query(1), 20.0)]) == 1
            sid = stream.stream_id
        used = []
        for role in ("leader", "helper"):
            store = PgStore(pg_url[0], schema=pd.schemas[role])
            try:
                pool = store.joint_pool(sid)
                used.append(pool.used)
                assert pool.gamma_ready and pool.runs == ()  # closed: leftovers deleted
            finally:
                store.close()
        assert used[0] == used[1] > 0
    finally:
        pd.stop()


def test_worker_killed_mid_chunk_fails_the_stream_closed(
    tmp_path: Path, pg_url: tuple[str, str]
) -> None:
    """SIGKILL of the leader worker or of the helper worker it pairs with, at
    each chunk crash point: an error (never the bit), the stream failed on both
    servers, the charge kept on both ledgers, and the next stream answers (an
    answer only when the leader recorded it first: `answered_first`)."""
    pd = WorkerDeployment(tmp_path, *pg_url).start()
    try:
        closed_task(pd, "s")
        for point, role in [
            ("chunk.after_mark", "leader-worker-0"),
            ("chunk.after_result", "leader-worker-0"),
            ("chunk.after_mark", "helper-worker-0"),
            ("chunk.after_result", "helper-worker-0"),
        ]:
            stream_through_kill(pd, "s", role, point)
        assert sum(pd.kills.values()) == 4
        # Nothing left in the leader's work table: every job was answered or failed.
        import psycopg

        with psycopg.connect(pd.url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{pd.schemas["leader"]}"')
            row = conn.execute("SELECT count(*) FROM work WHERE state IN ('pending', 'leased')")
            assert row.fetchone() == (0,)
    finally:
        pd.stop()


def test_front_end_without_workers_refuses_fast(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    pd = WorkerDeployment(tmp_path, *pg_url, leaders=0)
    pd.start_role("helper")
    pd.start_role("leader")
    try:
        closed_task_refused = None
        create_task(pd, "s")
        with pd.uploader() as up:
            up.upload("s", np.ones((20, D)))
        try:
            pd.stub().CloseCollection(pb.TaskRef(task_id="s"), timeout=60)
        except Exception as exc:  # noqa: BLE001 - inspected below
            closed_task_refused = exc
        assert closed_task_refused is not None
        assert "no comparison worker is running" in str(closed_task_refused)
        assert CLEAR in str(closed_task_refused)
    finally:
        pd.stop()


@pytest.mark.heavy
def test_worker_kills_heavy(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    """Each (point, worker) kill KILLS_HEAVY times; the invariants hold after each."""
    from test_reliability import KILLS_HEAVY

    pd = WorkerDeployment(tmp_path, *pg_url).start()
    try:
        closed_task(pd, "s")
        for _ in range(KILLS_HEAVY):
            for point in ("chunk.after_mark", "chunk.after_result"):
                for role in ("leader-worker-0", "helper-worker-0"):
                    stream_through_kill(pd, "s", role, point)
        assert sum(pd.kills.values()) == 4 * KILLS_HEAVY
    finally:
        pd.stop()


def test_worker_whose_database_fails_exits(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    """A worker that loses its queue connection stops (exit status 1, the cause
    logged) instead of idling while it looks alive, so a supervisor restarts it."""
    import psycopg

    pd = WorkerDeployment(tmp_path, *pg_url).start()
    try:
        proc = pd.dep.procs["leader-worker-0"]
        with psycopg.connect(pd.url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (f"svtagg-work-{proc.pid}",),
            )
        assert proc.wait(30) == 1
        pd.dep.procs.pop("leader-worker-0")
        log = (tmp_path / "leader-worker-0.log").read_text()
        assert "taking work failed" in log
    finally:
        pd.stop()
