"""Crash safety (issue 6): leader and helper run as processes and SIGKILL
themselves at chosen points (svtagg.servers.faults): mid upload batch, between
the two reservations of a plan, between the two ledger charges when a stream
opens, during a chunk's comparison and just after a YES.  After each kill the
server restarts on the same store, and:

* every acknowledged report is counted exactly once on both servers, and no
  unacknowledged one is half-counted: after the close both servers hold the same
  report set, it contains every acknowledged report, and S_L + S_H equals the
  plaintext encoded sum of exactly those reports (read from the stores: the only
  place the sums exist; no RPC reveals them);
* the two ledgers agree and never show less spent than before the crash;
* a stream interrupted mid-chunk never answers again (fail closed);
* the analyst gets an error (UNAVAILABLE or a clear refusal), never a bit —
  except a bit the leader has recorded: the leader evaluates, records and
  answers without waiting for the helper's record (`answered_first`), and a
  helper that dies before recording fails its copy closed at its restart.

Who wins when the servers disagree after a crash: for reports, the
reconciliation at the close keeps only the reports both servers hold; for the
ledger, the leader (which always charges first) wins and its charge is replayed
on the helper (`LedgerSync.sync` (`servers/reconcile.py`)): see test_leader_ledger_wins.

Default run: one kill per point (9 kills, ~20 s).  `pytest -m heavy`: every
(point, role) pair, repeated (see KILLS_HEAVY), with a summary line.
"""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ProcessDeployment, encoded_sum

from svtagg.client.upload import UploadError, make_batch
from svtagg.dp.errors import Refusal
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.validity import parse_validity

D, F = 6, 16
EPS = Fraction(1, 2)
#: What the analyst may see when a server dies under its call: UNAVAILABLE (the
#: leader died, or reports the helper's death), never a result.
CLEAR = "UNAVAILABLE"
#: Repeats of every (point, role) pair in the heavy run.
KILLS_HEAVY = 3
#: (point, role) pairs the heavy run kills at; open.before_helper and
#: plan.before_helper exist only on the leader.
PAIRS = [
    ("upload.mid_store", "leader"),
    ("upload.mid_store", "helper"),
    ("upload.after_store", "leader"),
    ("upload.after_store", "helper"),
    ("open.after_charge", "leader"),
    ("open.after_charge", "helper"),
    ("open.before_helper", "leader"),
    ("plan.before_helper", "leader"),
    ("chunk.after_mark", "leader"),
    ("chunk.after_mark", "helper"),
    ("chunk.after_result", "leader"),
    ("chunk.after_result", "helper"),
    ("verify.after_record", "helper"),
    ("verify.before_record", "leader"),
]


class Collection:
    """The client side of an upload: which report ids carry which rows, which were acked."""

    def __init__(self, task: str, validity: str = "") -> None:
        self.task = task
        #: The task's validity circuit: the batches are Prio3 reports with proofs.
        self.validity = parse_validity(validity, D, F) if validity else None
        self.rows: dict[bytes, np.ndarray] = {}
        self.acked: set[bytes] = set()
        self.rng = np.random.default_rng(7)

    def batch(self, m: int) -> Any:
        if self.validity is not None and self.validity.one_item:
            values = np.zeros((m, D))
            values[np.arange(m), self.rng.integers(0, D, m)] = 1.0  # one item per report
        elif self.validity is not None and self.validity.max_items:
            values = np.zeros((m, D))  # at most r items per report: ones, or values
            for row in values:
                at = self.rng.choice(D, self.rng.integers(0, self.validity.max_items + 1), False)
                row[at] = 1.0 if self.validity.counts else self.rng.random(at.size)
        else:
            values = self.rng.random((m, D))
        b = make_batch(self.task, values, F, validity=self.validity)
        for r, row in zip(b.leader.reports, values, strict=True):
            self.rows[r.report_id] = row
        return b

    def ack(self, b: Any) -> None:
        self.acked.update(r.report_id for r in b.leader.reports)


def create_task(pd: ProcessDeployment, task: str, validity: str = "", noise: str = "") -> None:
    pd.stub().CreateTask(
        pb.TaskSpec(
            validity=validity,
            noise=noise,
            task_id=task,
            d=D,
            frac_bits=F,
            n_max=100_000,
            min_batch=1,
            epsilon_total="1000",
            delta_total="1/1000",
            epsilon_min="1/100",
        ),
        timeout=30,
    )


def upload_through_kill(
    pd: ProcessDeployment, col: Collection, role: str, point: str, give_up: bool = False
) -> None:
    """Two clean batches, then one during which `role` dies at `point`.  The SDK
    retries through the restart (or, with give_up, the client abandons it)."""
    with pd.uploader(retries=0 if give_up else 8, backoff=0.2, timeout=20) as up:
        for _ in range(2):
            b = col.batch(10)
            up.send(b)
            col.ack(b)
        pd.arm(role, point)
        b = col.batch(10)
        outcome: dict[str, Any] = {}

        def send() -> None:
            try:
                up.send(b)
                outcome["ok"] = True
            except UploadError as exc:
                outcome["error"] = exc

        t = threading.Thread(target=send)
        t.start()
        assert pd.await_kill(role) == -9
        pd.restart(role)
        t.join(60)
        assert not t.is_alive()
        if give_up:
            assert "error" in outcome  # the client saw a failure, not an ack
        else:
            assert outcome.get("ok"), outcome
            col.ack(b)


def check_reports(pd: ProcessDeployment, col: Collection) -> int:
    """After the close: same report set on both servers, every acked report in it,
    nothing half-counted, and S_L + S_H = the plaintext encoded sum of that set."""
    info = pd.stub().CloseCollection(pb.TaskRef(task_id=col.task), timeout=60)
    lead, help_ = pd.store_view("leader", col.task), pd.store_view("helper", col.task)
    assert lead.report_ids == help_.report_ids
    assert lead.n == help_.n == len(lead.report_ids) == info.n
    assert col.acked <= lead.report_ids <= set(col.rows)
    counted = np.array([col.rows[r] for r in sorted(lead.report_ids)])
    if col.validity is None:
        assert np.array_equal(lead.sums + help_.sums, encoded_sum(counted, F))
    else:  # Field128 sums (as words): added mod p
        f = FIELD128
        total = f.add(f.decode_vec(lead.sums.tobytes()), f.decode_vec(help_.sums.tobytes()))
        assert f.to_ints(total) == [int(x) for x in encoded_sum(counted, F)]
    return int(info.dropped_reports)


def budgets(pd: ProcessDeployment, task: str) -> tuple[tuple[Fraction, Fraction], ...]:
    """Both ledgers as the leader reports them (this also triggers reconciliation)."""
    info = pd.stub().Budget(pb.TaskRef(task_id=task), timeout=60)
    return tuple(
        (Fraction(b.epsilon_spent), Fraction(b.delta_spent))
        for b in (info.budget, info.helper_budget)
    )


def answered_first(role: str, point: str) -> bool:
    """The helper (or a helper worker) dies after the chunk's result reached
    it, before recording it: the leader, which evaluates, has recorded the
    result and answered without waiting for the helper's record (one round
    trip per chunk).  The helper's copy is left mid-chunk: failed at the
    helper's restart, or (a helper worker, whose restart fails nothing) refused
    at the stream's next chunk, which fails it on both servers."""
    return role.startswith("helper") and point == "chunk.after_result"


def stream_through_kill(pd: ProcessDeployment, task: str, role: str, point: str) -> None:
    """Open a stream (or reserve a one-group plan of the same ε, or ask a chunk
    that says YES) while `role` dies at `point`."""
    before = budgets(pd, task)
    assert before[0] == before[1]
    with pd.oracle(task) as o:
        if point.startswith(("open.", "plan.")):
            pd.arm(role, point)
            with pytest.raises(Refusal, match=CLEAR):
                if point.startswith("plan."):
                    o.reserve_plan([(EPS, 0)])
                else:
                    o.open_stream(EPS)
            sid = None
        else:
            s = o.open_stream(EPS)
            sid = s.stream_id
            pd.arm(role, point)
            if answered_first(role, point):
                # The leader recorded this answer before the helper died (τ far
                # above every score: NO, so the stream stays open on the leader).
                assert s.ask([(Query(0), 10**4)]) is None
            else:
                # τ far below every score: an honest run would say YES at 0.  The
                # analyst must get an error instead, never the bit.
                with pytest.raises(Refusal, match=CLEAR):
                    s.ask([(Query(0), -1000.0)])
        assert pd.await_kill(role) == -9
        pd.restart(role)
        if sid is not None:
            with pytest.raises(Refusal, match="FAILED_PRECONDITION|failed"):
                s.ask([(Query(0), -1000.0)])  # fail closed: never answers again
        after = budgets(pd, task)
        # The ledgers agree, and the charge of the interrupted stream stays spent.
        assert after[0] == after[1] == (before[0][0] + EPS, before[0][1]), (before, after)
        if sid is not None:
            # Final on both: failed on the leader; on the helper failed, or closed
            # when the leader died after the helper recorded the YES.
            assert pd.store_view("leader", task).streams[sid] == "failed"
            assert pd.store_view("helper", task).streams[sid] in ("failed", "closed")
        # The system still answers right afterwards (n·1 ≫ τ: YES at 0; ≪ τ: none).
        fresh = o.open_stream(EPS)
        assert fresh.ask([(Query(1), 10**4), (Query(0), -1000.0)]) == 1
        assert o.open_stream(EPS).ask([(Query(0), 10**4)]) is None


@pytest.fixture
def procs(tmp_path: Path) -> Any:
    pd = ProcessDeployment(tmp_path).start()
    try:
        yield pd
    finally:
        pd.stop()


def closed_task(pd: ProcessDeployment, task: str, noise: str = "") -> None:
    create_task(pd, task, noise=noise)
    with pd.uploader() as up:
        up.upload(task, np.ones((20, D)))
    pd.stub().CloseCollection(pb.TaskRef(task_id=task), timeout=60)


def test_crash_points(procs: ProcessDeployment):
    """One SIGKILL at each point; the invariants hold after every restart."""
    pd = procs
    col = Collection("up")
    create_task(pd, "up")
    upload_through_kill(pd, col, "leader", "upload.mid_store")
    upload_through_kill(pd, col, "helper", "upload.after_store")
    upload_through_kill(pd, col, "leader", "upload.after_store", give_up=True)
    check_reports(pd, col)
    closed_task(pd, "s")
    for point, role in [
        ("open.before_helper", "leader"),
        ("plan.before_helper", "leader"),
        ("open.after_charge", "helper"),
        ("chunk.after_mark", "leader"),
        ("chunk.after_result", "helper"),
        ("chunk.after_result", "leader"),
    ]:
        stream_through_kill(pd, "s", role, point)
    assert sum(pd.kills.values()) == 9


@pytest.mark.parametrize("validity", ["range", "sparse-onehot"])
def test_crash_points_with_proofs(procs: ProcessDeployment, validity: str):
    """A task whose reports prove their validity (Prio3, or sparse DPF keys):
    one SIGKILL at each point of the batch verification (the helper just after
    recording a batch, the leader just before, and mid-store); the client's
    retry is answered from the helper's recorded verdicts, an abandoned batch
    is taken out on the helper at the close, and every acknowledged report
    counts once on both servers."""
    pd = procs
    task = "pv" if validity == "range" else "ps"
    col = Collection(task, validity=validity)
    create_task(pd, task, validity=validity)
    upload_through_kill(pd, col, "helper", "verify.after_record")
    upload_through_kill(pd, col, "leader", "verify.before_record")
    upload_through_kill(pd, col, "leader", "upload.mid_store")
    upload_through_kill(pd, col, "leader", "verify.before_record", give_up=True)
    assert check_reports(pd, col) == 10  # the abandoned batch, held by the helper only
    assert sum(pd.kills.values()) == 4


def test_leader_ledger_wins(procs: ProcessDeployment):
    """The servers disagree after the leader dies between the two charges: the
    leader has charged, the helper has not.  The leader's ledger wins: its charge
    is replayed on the helper, so both show it (never the smaller, refunded one)."""
    pd = procs
    closed_task(pd, "w")
    with pd.oracle("w") as o:
        pd.arm("leader", "open.after_charge")
        with pytest.raises(Refusal):
            o.open_stream(EPS)
    assert pd.await_kill("leader") == -9
    # Right after the crash the stores disagree: the leader charged, the helper did not.
    assert pd.store_view("leader", "w").epsilon_spent == EPS
    assert pd.store_view("helper", "w").epsilon_spent == 0
    pd.restart("leader")
    assert budgets(pd, "w") == ((EPS, 0), (EPS, 0))
    lead, help_ = pd.store_view("leader", "w"), pd.store_view("helper", "w")
    assert lead.streams == help_.streams and set(lead.streams.values()) == {"failed"}


@pytest.mark.heavy
def test_crash_points_heavy(tmp_path: Path):
    """Every (point, role) pair KILLS_HEAVY times, plus abandoned uploads."""
    crash_loop(ProcessDeployment(tmp_path).start(), "crash safety")


def crash_loop(pd: ProcessDeployment, label: str) -> None:
    """Every (point, role) pair KILLS_HEAVY times on a started deployment (stopped
    at the end), the invariants checked after each kill; prints the counts."""
    survived: dict[str, int] = {}
    try:
        col = Collection("up")
        create_task(pd, "up")
        proved = Collection("pv", validity="range")
        create_task(pd, "pv", validity="range")
        closed_task(pd, "s")
        for rep in range(KILLS_HEAVY):
            for point, role in PAIRS:
                last = rep == KILLS_HEAVY - 1
                if point.startswith("upload."):
                    upload_through_kill(pd, col, role, point, give_up=last)
                elif point.startswith("verify."):
                    upload_through_kill(pd, proved, role, point, give_up=last)
                else:
                    stream_through_kill(pd, "s", role, point)
                key = f"{point}@{role}"
                survived[key] = survived.get(key, 0) + 1
        dropped = check_reports(pd, col) + check_reports(pd, proved)
    finally:
        pd.stop()
    print(f"\n{label}: kills survived per point:", survived)
    print(
        f"{label}: {sum(survived.values())} kills, invariants held after each; "
        f"{len(col.acked) + len(proved.acked)} acked reports all counted once, "
        f"{dropped} unacked dropped at reconciliation"
    )
