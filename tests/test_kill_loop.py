"""The external-kill loop: the leader or the helper process is killed with SIGKILL
from outside, at moments the servers do not choose, while an analyst and a
client work through the five phases of a task's life: plan reservation, stream
open, chunks, close and upload.  The named crash points (tests/test_reliability.py)
only stop a server where the code says it may stop; this loop stops it anywhere,
including between two RPCs of one analyst operation.

Each round picks a phase, a victim and a moment from a seeded schedule: a random
delay after the phase's client starts, or right after the leader logs the
phase's line ("plan … reserved", "stream … opened", "collection closed on the
leader").  The victim is killed and restarted on its store and port (a helper
sometimes only after the client's deadline has passed), the client finishes
what a client would (an interrupted EndPlan or close is sent again), and then,
on the stores and through the API:

* ledgers: the helper never shows more spent than the leader (the leader
  charges first and refunds last), and once reconciled the two are equal; the
  spend never exceeds what the analyst asked for and never shrinks except by a
  plan's refund;
* the task stays usable: a fresh stream answers, and a fresh plan reserves,
  admits a stream and ends with the expected refund;
* every acknowledged report is counted once: it is on both servers, n equals
  the number of distinct ids, and after the close both hold one report set
  whose S_L + S_H is the plaintext sum of exactly those reports;
* no stream answers twice: none is left opening or mid-chunk; a stream open on
  one server only, one whose chunk was cut off (not ended on both servers) and
  one that answered YES each refuse the next chunk; every answer the analyst
  gets is the right one.

A violation is recorded with its round and the loop goes on (on a fresh query
task when the ledgers drifted), so one run lists every kind found.  The schedule
is replayable: SVTAGG_KILL_SEED=<seed> with the same number of kills (the seed
is printed); the interleaving with the servers' threads is not, so a replay
reproduces the schedule, not always the exact race.  SVTAGG_KILL_VALIDITY names
a validity circuit for the upload tasks (e.g. sparse-onehot): the uploads then
carry proofs, verified at ingest by both servers.  SVTAGG_KILL_NOISE=joint makes
the query tasks joint-noise tasks: every stream's noise is drawn in the garbled
sampler (in its chunks, and ahead of them into the stream's pool by the
leader's background batches, which the kills then cut too), and each plan
group holds the δ its stream is charged.

Default run: KILLS_DEFAULT kills (every (phase, role) pair twice, one of them
timed by the log where the phase has a line).  `pytest -m heavy`: KILLS_HEAVY
on SQLite and KILLS_HEAVY_PG on PostgreSQL stores.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from conftest import ProcessDeployment
from test_reliability import Collection, D, F, check_reports, closed_task, create_task
from test_store_pg_reliability import PgProcessDeployment

from svtagg.analyst.remote_oracle import RemoteOracle, RemoteStream
from svtagg.client.upload import UploadError
from svtagg.dp.errors import PeerUnavailable, Refusal
from svtagg.dp.jointsvt import joint_group_delta
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Query, encode_thresholds
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.servers.store.sqlite import SqliteStore

T = TypeVar("T")

PHASES = ("plan", "open", "chunk", "close", "upload")
ROLES = ("leader", "helper")
KILLS_DEFAULT = 20
KILLS_HEAVY = 200
KILLS_HEAVY_PG = 60
SEED_ENV = "SVTAGG_KILL_SEED"
VALIDITY_ENV = "SVTAGG_KILL_VALIDITY"
NOISE_ENV = "SVTAGG_KILL_NOISE"
DEFAULT_SEED = 19
#: Leader log lines a kill may be timed right after; other phases use delays.
LOG_TRIGGERS = {
    "plan": r"plan \S+ reserved",
    "open": r"stream \S+ opened",
    "close": r"collection closed on the leader",
}
#: Longest random delay (s) between the start of a phase's client and the kill.
WINDOW = {"plan": 0.3, "open": 0.3, "chunk": 0.4, "close": 0.25, "upload": 0.4}
#: Pauses (s) a round's client may take between operations (an algorithm thinks);
#: after a log-timed kill's line the client pauses at least a little, so the kill
#: lands before its next call.
THINK = (0.0, 0.003, 0.03)
#: The deadline of every call the round's client makes (s), and how long a killed
#: helper may stay down before its restart: either no time, or longer than the
#: deadline, so that calls the leader holds for it (the leader waits for its peer)
#: time out.  A killed leader is restarted at once: its clients fail at once.
CLIENT_DEADLINE = 1.5
DOWNTIMES = (0.0, 2.0)
EPS = Fraction(1, 2)
#: A threshold far beyond every score (n ≤ a few hundred, ε = 1/2): a chunk at
#: -FAR says YES at its first query and one at +FAR says NO, whatever the noise.
FAR = 10**5
#: Queries per chunk of the chunk phase.
CHUNK = 8
#: How long the client keeps retrying UNAVAILABLE right after a restart.
SETTLE = 15.0
#: A query task is replaced before its ledger nears the budget (create_task: 1000).
ROTATE_AT = 800
ANSWERING = "open"
UNSETTLED = ("opening", "in_chunk")


@dataclass(frozen=True)
class Kill:
    """One scheduled kill: the phase the client is in, the victim, and when."""

    round: int
    phase: str
    role: str
    trigger: str  # "log": right after the phase's leader log line; "delay": after `delay`
    delay: float
    think: float
    downtime: float

    def __str__(self) -> str:
        when = (
            f"after the log line /{LOG_TRIGGERS[self.phase]}/"
            if self.trigger == "log"
            else f"{self.delay:.3f}s in"
        )
        down = f", down {self.downtime:g}s" if self.downtime else ""
        return f"round {self.round}: {self.role} killed during {self.phase}, {when}{down}"


def schedule(rng: random.Random, kills: int) -> list[Kill]:
    """`kills` kills covering every (phase, role) pair as evenly as `kills` allows;
    where a phase has a log line, every other kill of the pair is timed by it;
    a killed helper stays down for the long downtime in every other kill of its
    pair, alternating so that both timings meet both downtimes."""
    pairs = [(p, r) for p in PHASES for r in ROLES]
    reps = -(-kills // len(pairs))
    todo = [(p, r, i) for p, r in pairs for i in range(reps)]
    rng.shuffle(todo)
    kills_: list[Kill] = []
    for n, (p, r, i) in enumerate(todo[:kills]):
        by_log = i % 2 == 0 and p in LOG_TRIGGERS
        think = rng.choice(THINK)
        kills_.append(
            Kill(
                n,
                p,
                r,
                "log" if by_log else "delay",
                round(rng.uniform(0.0, WINDOW[p]), 3),
                max(think, THINK[1]) if by_log else think,
                DOWNTIMES[1] if r == "helper" and i % 4 in (0, 3) else DOWNTIMES[0],
            )
        )
    return kills_


@dataclass
class StreamRecord:
    """What the analyst knows of one stream: chunks answered, and how it ended."""

    acked: int = 0
    closed: bool = False  # answered YES
    interrupted: bool = False  # a chunk call failed


@dataclass
class RoundRecord:
    """What the client did in one round, for the checks after the restart."""

    error: BaseException | None = None
    streams: list[str] = field(default_factory=list)
    #: Plans to end after the restart: an EndPlan sent and not answered, or a
    #: plan the client left (EndPlan is idempotent).
    ending: set[str] = field(default_factory=set)
    #: The charges of plans whose end was attempted (the most the ledger may drop).
    refundable: Fraction = Fraction(0)


def retry_unavailable(fn: Callable[[], T], deadline: float = SETTLE) -> T:
    """What a client does right after a restart: retry while the servers say
    UNAVAILABLE (the peer channel reconnecting), then give up with the error."""
    end = time.monotonic() + deadline
    while True:
        try:
            return fn()
        except (PeerUnavailable, grpc.RpcError) as exc:
            code = exc.code() if isinstance(exc, grpc.RpcError) else None  # type: ignore[attr-defined]
            if code not in (None, grpc.StatusCode.UNAVAILABLE) or time.monotonic() > end:
                raise
            time.sleep(0.2)


def stream_rows(pd: ProcessDeployment, role: str, task_id: str) -> dict[str, tuple[str, int]]:
    """{stream id: (state, chunks begun)} of a task in one server's store."""
    query = "SELECT stream_id, state, chunks FROM streams WHERE task_id=?"
    if isinstance(pd, PgProcessDeployment):
        import psycopg

        with psycopg.connect(pd.url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{pd.schemas[role]}"')
            rows = conn.execute(query.replace("?", "%s"), (task_id,)).fetchall()
    else:
        db = sqlite3.connect(f"file:{pd.root / f'{role}.sqlite'}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(query, (task_id,)).fetchall()
        finally:
            db.close()
    return {r[0]: (r[1], int(r[2])) for r in rows}


def wait_for_line(path: Path, offset: int, pattern: str, timeout: float) -> bool:
    """Whether a line matching `pattern` appears in `path` after byte `offset`."""
    regex = re.compile(pattern.encode())
    seen = b""
    end = time.monotonic() + timeout
    with open(path, "rb") as f:
        f.seek(offset)
        while time.monotonic() < end:
            seen += f.read()
            if regex.search(seen):
                return True
            time.sleep(0.001)
    return False


class KillLoop:
    """Runs the schedule on a started deployment and collects the violations."""

    def __init__(self, pd: ProcessDeployment, seed: int, label: str) -> None:
        self.pd = pd
        self.seed = seed
        self.label = label
        self.violations: list[str] = []
        self.kills: Counter[str] = Counter()
        self.victims: Counter[str] = Counter()
        self.checks = 0
        self.log_misses = 0
        self.interrupted = 0  # rounds in which the kill cut one of the client's calls
        #: Streams a kill left open on one server only (which one), each probed once.
        self.one_sided: dict[str, str] = {}
        self.lost_replies = 0  # chunks both servers ended whose answer never came back
        self.analyst: pb_grpc.AnalystStub  # a fresh channel each round, after the restart
        self.acked_reports = 0
        self.dropped = 0
        self._tasks = 0
        self._new_query_task()
        self._new_upload_task()

    # ------------------------------------------------------------ bookkeeping
    def _name(self, prefix: str) -> str:
        self._tasks += 1
        return f"{prefix}{self._tasks}"

    def _new_query_task(self) -> None:
        """A closed task of 20 rows of ones that the analyst queries; the ceiling
        is the most its ledger may show: every charge asked for, less every
        refund the servers acknowledged."""
        self.q = self._name("q")
        closed_task(self.pd, self.q, os.environ.get(NOISE_ENV, ""))
        self.ceiling = Fraction(0)
        self.streams: dict[str, StreamRecord] = {}

    def _new_upload_task(self) -> None:
        # SVTAGG_KILL_VALIDITY=range|sparse-onehot|...: the uploads carry proofs
        # (verified by both servers at ingest) instead of plain shares.
        validity = os.environ.get(VALIDITY_ENV, "")
        self.col = Collection(self._name("u"), validity)
        create_task(self.pd, self.col.task, validity)
        with self.pd.uploader() as up:
            b = self.col.batch(5)
            up.send(b)
            self.col.ack(b)

    def check(self, ok: bool, kill: Kill, what: str) -> bool:
        self.checks += 1
        if not ok:
            self.violations.append(f"{kill} [seed {self.seed}]: {what}")
        return ok

    def oracle(self, timeout: float = SETTLE) -> RemoteOracle:
        return RemoteOracle.from_certs(
            self.pd.address("leader"), self.q, self.pd.certs, timeout=timeout
        )

    # ------------------------------------------------------------ analyst operations
    def open(
        self, o: RemoteOracle, rec: RoundRecord, plan: tuple[str, int] | None = None
    ) -> RemoteStream:
        if plan is None:
            self.ceiling += EPS  # counted before the call: a failed open may stay spent
        s = o.open_stream(EPS, plan=plan)
        self.streams[s.stream_id] = StreamRecord()
        rec.streams.append(s.stream_id)
        return s

    def ask(self, kill: Kill, s: RemoteStream, yes: bool) -> None:
        """One chunk, all thresholds at -FAR (YES at 0) or +FAR (NO)."""
        known = self.streams[s.stream_id]
        tau = -FAR if yes else FAR
        try:
            got = s.ask([(Query(j % D), tau) for j in range(CHUNK)])
        except Refusal:
            known.interrupted = True
            raise
        known.acked += 1
        want = 0 if yes else None
        self.check(got == want, kill, f"stream {s.stream_id} answered {got}, not {want}")
        known.closed = known.closed or yes

    def reserve(self, o: RemoteOracle, groups: int) -> str:
        self.ceiling += groups * EPS
        # A joint-noise stream is charged its sampler's δ: the group holds it.
        delta = (
            joint_group_delta([(StreamKind.LAP24, EPS)], F)
            if os.environ.get(NOISE_ENV) == "joint"
            else 0
        )
        plan_id, charge = o.reserve_plan([(EPS, delta)] * groups)
        assert charge.epsilon == groups * EPS  # basic composition: nothing to gain
        return plan_id

    @staticmethod
    def leave(rec: RoundRecord, plan_id: str, groups: int) -> None:
        """The plan is to be ended after the restart if the round does not end it."""
        if plan_id not in rec.ending:
            rec.ending.add(plan_id)
            rec.refundable += groups * EPS

    def end(self, o: RemoteOracle, rec: RoundRecord, plan_id: str, groups: int) -> Fraction:
        self.leave(rec, plan_id, groups)
        refund, _ = o.end_plan(plan_id)
        rec.ending.discard(plan_id)
        self.ceiling -= refund
        return refund

    # ------------------------------------------------------------ the five phases' clients
    def client_plan(self, kill: Kill, rec: RoundRecord, stop: threading.Event) -> None:
        """An algorithm under a two-group plan: reserve, one stream in group 0,
        one chunk, end (group 1 unused comes back)."""
        with self.oracle(CLIENT_DEADLINE) as o:
            while not stop.is_set():
                plan_id = self.reserve(o, 2)
                stop.wait(kill.think)
                s = self.open(o, rec, (plan_id, 0))
                stop.wait(kill.think)
                self.ask(kill, s, yes=False)
                stop.wait(kill.think)
                refund = self.end(o, rec, plan_id, 2)
                self.check(refund == EPS, kill, f"plan {plan_id} refunded {refund}, not {EPS}")

    def client_open(self, kill: Kill, rec: RoundRecord, stop: threading.Event) -> None:
        """Streams opened one after another, every other one under a plan's next group."""
        groups = 4
        plan: tuple[str, int] | None = None
        with self.oracle(CLIENT_DEADLINE) as o:
            try:
                while not stop.is_set():
                    if plan is None or plan[1] == groups:
                        if plan is not None:
                            self.end(o, rec, plan[0], groups)
                        plan = (self.reserve(o, groups), 0)
                    self.open(o, rec)
                    stop.wait(kill.think)
                    self.open(o, rec, plan)
                    plan = (plan[0], plan[1] + 1)
                    stop.wait(kill.think)
            finally:
                if plan is not None:
                    self.leave(rec, plan[0], groups)

    def client_chunk(self, kill: Kill, rec: RoundRecord, stop: threading.Event) -> None:
        """Chunks one after another; one in five says YES and a new stream opens."""
        rng = random.Random(f"{self.seed}/{kill.round}")
        with self.oracle(CLIENT_DEADLINE) as o:
            s: RemoteStream | None = None
            while not stop.is_set():
                if s is None or self.streams[s.stream_id].closed:
                    s = self.open(o, rec)
                self.ask(kill, s, yes=rng.random() < 0.2)
                stop.wait(kill.think)

    def client_close(self, kill: Kill, rec: RoundRecord, stop: threading.Event) -> None:
        self.pd.stub().CloseCollection(pb.TaskRef(task_id=self.col.task), timeout=CLIENT_DEADLINE)

    def client_upload(self, kill: Kill, rec: RoundRecord, stop: threading.Event) -> None:
        """Batches of 5 reports; half the rounds the SDK retries through the
        restart, half it gives up at the first failure (an abandoned batch)."""
        retries = 0 if kill.round % 2 else 8
        with self.pd.uploader(retries=retries, backoff=0.05, timeout=CLIENT_DEADLINE) as up:
            while not stop.is_set():
                b = self.col.batch(5)
                up.send(b)
                self.col.ack(b)
                stop.wait(kill.think)

    # ------------------------------------------------------------ one round
    def run(self, kills: list[Kill]) -> None:
        for kill in kills:
            try:
                self.round(kill)
            except Exception as exc:  # noqa: BLE001 - e.g. a server that cannot restart
                self.violations.append(f"{kill} [seed {self.seed}]: the loop stopped: {exc!r}")
                return

    def round(self, kill: Kill) -> None:
        t0 = time.monotonic()
        before = self.pd.store_view("leader", self.q).epsilon_spent
        rec = RoundRecord()
        stop = threading.Event()
        client: Callable[[Kill, RoundRecord, threading.Event], None] = getattr(
            self, f"client_{kill.phase}"
        )

        def work() -> None:
            try:
                client(kill, rec, stop)
            except BaseException as exc:  # noqa: BLE001 - judged below
                rec.error = exc

        log = self.pd.root / "leader.log"
        offset = log.stat().st_size
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        if kill.trigger == "log":
            if not wait_for_line(log, offset, LOG_TRIGGERS[kill.phase], 5.0):
                self.log_misses += 1
        else:
            time.sleep(kill.delay)
        self.kill(kill)
        time.sleep(kill.downtime)
        self.pd.restart(kill.role)
        stop.set()
        # One fresh analyst channel per round: an old one may sit in reconnect backoff.
        with self.pd.channel() as channel:
            self.analyst = pb_grpc.AnalystStub(channel)
            self.judge(kill, rec, thread, t0, before)

    def judge(
        self, kill: Kill, rec: RoundRecord, thread: threading.Thread, t0: float, before: Fraction
    ) -> None:
        thread.join(60)
        if not self.check(
            not thread.is_alive(), kill, "the client is stuck 60 s after the restart"
        ):
            return
        self.check(
            rec.error is None or isinstance(rec.error, (Refusal, UploadError, grpc.RpcError)),
            kill,
            f"the client got {rec.error!r}, not a refusal",
        )
        self.kills[kill.phase] += 1
        self.victims[kill.role] += 1
        if rec.error is not None:
            self.interrupted += 1
        print(f"{kill}: the client saw {_outcome(rec.error)} ({time.monotonic() - t0:.1f}s)")
        self.check_order(kill)
        self.recover(kill, rec)
        if self.check_ledgers(kill, before, rec.refundable):
            self.check_streams(kill, rec)
            self.check_usable(kill)
            self.check_ledgers(kill, before, rec.refundable + EPS)
        if kill.phase == "close":
            self.check_close(kill)
        else:
            self.check_uploads(kill)
        if self.pd.store_view("leader", self.q).epsilon_spent > ROTATE_AT:
            self._new_query_task()

    def kill(self, kill: Kill) -> None:
        """SIGKILL from outside; the victim must still have been running."""
        proc = self.pd.dep.procs.pop(kill.role)
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGKILL)
        rc = proc.wait(30)
        self.check(alive, kill, f"the {kill.role} had exited by itself (status {rc})")
        self.pd.kills[kill.role] = self.pd.kills.get(kill.role, 0) + 1

    # ------------------------------------------------------------ after the restart
    def recover(self, kill: Kill, rec: RoundRecord) -> None:
        """Finish what the client left half done: end the plans whose EndPlan was
        interrupted or that it left (EndPlan is idempotent)."""
        if not rec.ending:
            return
        with self.oracle() as o:
            for plan_id in sorted(rec.ending):

                def again(p: str = plan_id) -> Fraction:
                    return self.end(o, rec, p, 0)

                try:
                    retry_unavailable(again)
                except Refusal as exc:
                    self.check(False, kill, f"EndPlan {plan_id} retried after the restart: {exc}")

    def check_order(self, kill: Kill) -> None:
        """Before any reconciliation: the leader charges first and refunds last, so
        the helper's ledger is never above the leader's."""
        lead = self.pd.store_view("leader", self.q)
        help_ = self.pd.store_view("helper", self.q)
        self.check(
            (help_.epsilon_spent, help_.delta_spent) <= (lead.epsilon_spent, lead.delta_spent),
            kill,
            f"helper ledger above the leader's before reconciliation: leader "
            f"{lead.epsilon_spent}/{lead.delta_spent}, helper {help_.epsilon_spent}/"
            f"{help_.delta_spent}",
        )

    def check_ledgers(self, kill: Kill, before: Fraction, refundable: Fraction) -> bool:
        """Reconciled (Budget does it), both ledgers equal, in the API and in the
        stores, within what the analyst asked for.  After drift the query task is
        replaced, so later rounds are judged on ledgers that agreed."""
        try:
            info = retry_unavailable(self.both_budgets)
        except (Refusal, grpc.RpcError) as exc:
            self.check(False, kill, f"Budget fails after the restart: {exc}")
            self._new_query_task()
            return False
        api = [
            (Fraction(b.epsilon_spent), Fraction(b.delta_spent))
            for b in (info.budget, info.helper_budget)
        ]
        views = [self.pd.store_view(r, self.q) for r in ROLES]
        stores = [(v.epsilon_spent, v.delta_spent) for v in views]
        equal = self.check(
            api[0] == api[1] == stores[0] == stores[1],
            kill,
            f"ledgers differ after reconciliation: leader {_fmt(stores[0])}, helper "
            f"{_fmt(stores[1])} (Budget answered {_fmt(api[0])} vs {_fmt(api[1])})",
        )
        spent = stores[0][0]
        self.check(
            spent <= self.ceiling,
            kill,
            f"leader ledger {spent} above the {self.ceiling} the analyst asked for",
        )
        self.check(
            spent >= before - refundable,
            kill,
            f"leader ledger shrank from {before} to {spent} (refunds possible: {refundable})",
        )
        if not equal:
            self._new_query_task()
        return equal

    def both_budgets(self) -> pb.TaskInfo:
        """Budget with the helper's ledger (the leader answers without it, and
        without reconciling, while its peer channel still reconnects)."""
        info: pb.TaskInfo = self.analyst.Budget(pb.TaskRef(task_id=self.q), timeout=SETTLE)
        if not info.HasField("helper_budget"):
            raise PeerUnavailable("Budget answered without the helper's ledger")
        return info

    def check_streams(self, kill: Kill, rec: RoundRecord) -> None:
        """No stream left half-way; a stream open on one server only, a stream
        whose chunk was cut off and a stream that answered YES each refuse the
        next chunk.

        A chunk the analyst got no answer for was cut off on the servers unless
        both recorded its end (both hold the stream open, at the same chunk):
        then only the reply was lost, and the stream may go on (counted).  The
        servers mark a chunk in parallel, so a kill can leave one holding the
        stream failed and the other open; such a stream is counted and must
        refuse its next chunk (the refusal fails it on the other server)."""
        if not isinstance(self.pd, PgProcessDeployment):
            # An idle SQLite server writes a chunk's record within RECORD_WAIT
            # of the chunk (D2 in servers/exchange/machine.py: it waits in
            # memory for the stream's next mark): read the stores after it.
            time.sleep(3 * SqliteStore.RECORD_WAIT)
        lead = stream_rows(self.pd, "leader", self.q)
        help_ = stream_rows(self.pd, "helper", self.q)
        for role, rows in (("leader", lead), ("helper", help_)):
            stuck = sorted(sid for sid, (state, _) in rows.items() if state in UNSETTLED)
            self.check(not stuck, kill, f"{role} holds streams {stuck} half-way while idle")
        probed: set[str] = set()
        for sid in sorted(set(lead) | set(help_)):
            l_state, h_state = lead.get(sid, ("missing", 0))[0], help_.get(sid, ("missing", 0))[0]
            if (l_state == ANSWERING) == (h_state == ANSWERING) or sid in self.one_sided:
                continue
            side = "leader" if l_state == ANSWERING else "helper"
            self.one_sided[sid] = side
            probed.add(sid)
            self.check(
                not self.probe(sid),
                kill,
                f"stream {sid}: open on the {side} only ({l_state} on the leader, {h_state} "
                "on the helper), and it answered",
            )
        for sid in rec.streams:
            known = self.streams[sid]
            l_state, l_chunks = lead.get(sid, ("missing", 0))
            h_state, h_chunks = help_.get(sid, ("missing", 0))
            ended = l_state == h_state == ANSWERING and l_chunks == h_chunks
            if known.interrupted and ended and l_chunks > known.acked:
                self.lost_replies += 1
                known.acked = l_chunks
            if not (known.interrupted or known.closed) or sid in probed or len(probed) >= 4:
                continue
            probed.add(sid)
            answered = self.probe(sid)
            if known.closed or not ended:
                self.check(
                    not answered,
                    kill,
                    f"stream {sid} answered again (answered YES before: {known.closed}; "
                    f"chunks begun: leader {l_chunks} ({l_state}), helper {h_chunks} "
                    f"({h_state}); answered to the analyst: {known.acked})",
                )
            elif answered:
                known.acked += 1
                known.closed = True

    def probe(self, stream_id: str) -> bool:
        """Send one more chunk (τ = -FAR: an answering stream says YES); whether it answered."""
        request = pb.AskRequest(
            stream_id=stream_id,
            queries=pb.Queries(index=[0]),
            tau=encode_thresholds([-FAR], F).tolist(),
        )
        try:
            self.analyst.Ask(request, timeout=SETTLE)
        except grpc.RpcError:
            return False
        return True

    def check_usable(self, kill: Kill) -> None:
        """A fresh stream answers, and a fresh plan reserves, admits a stream and
        ends with what its unused group held."""
        rec = RoundRecord()
        try:
            with self.oracle() as o:
                s = retry_unavailable(lambda: self.open(o, rec))
                self.ask(kill, s, yes=True)
                plan_id = retry_unavailable(lambda: self.reserve(o, 2))
                s = retry_unavailable(lambda: self.open(o, rec, (plan_id, 0)))
                self.ask(kill, s, yes=False)
                refund = retry_unavailable(lambda: self.end(o, rec, plan_id, 2))
                self.check(refund == EPS, kill, f"a fresh plan refunded {refund}, not {EPS}")
        except Refusal as exc:
            self.check(False, kill, f"the task is not usable after the restart: {exc}")

    def check_uploads(self, kill: Kill) -> None:
        """Every acknowledged report of the open collection is on both servers,
        each once; and the collection takes a further batch."""
        try:
            with self.pd.uploader(timeout=SETTLE) as up:
                b = self.col.batch(5)
                retry_unavailable(lambda: up.send(b))
                self.col.ack(b)
        except UploadError as exc:
            self.check(False, kill, f"a batch after the restart is refused: {exc}")
        for role in ROLES:
            v = self.pd.store_view(role, self.col.task)
            missing = len(self.col.acked - v.report_ids)
            self.check(missing == 0, kill, f"{role} lacks {missing} acknowledged reports")
            self.check(
                v.n == len(v.report_ids), kill, f"{role} n={v.n} for {len(v.report_ids)} ids"
            )

    def check_close(self, kill: Kill) -> None:
        """The interrupted close is retried until it goes through; then one report
        set on both servers holding every acknowledged report, S_L + S_H its
        plaintext sum.  Then a new collection."""
        try:
            retry_unavailable(
                lambda: self.analyst.CloseCollection(
                    pb.TaskRef(task_id=self.col.task), timeout=SETTLE
                )
            )
            check_reports(self.pd, self.col)
            self.checks += 1
            self.acked_reports += len(self.col.acked)
            # Sent, never acknowledged, and not counted: stored by one server only
            # (taken out at the close) or by neither.
            self.dropped += len(self.col.rows) - self.pd.store_view("leader", self.col.task).n
        except (AssertionError, grpc.RpcError) as exc:
            self.check(False, kill, f"the close of {self.col.task} after the restart: {exc!r}")
        self._new_upload_task()

    # ------------------------------------------------------------ report
    def summary(self) -> str:
        per_phase = ", ".join(f"{p}={self.kills[p]}" for p in PHASES)
        per_role = ", ".join(f"{r}={self.victims[r]}" for r in ROLES)
        sides = Counter(self.one_sided.values())
        return (
            f"kill loop ({self.label}): {sum(self.kills.values())} kills ({per_phase}; "
            f"{per_role}), invariants checked {self.checks}, violations {len(self.violations)}; "
            f"{self.interrupted} kills cut a client call; {self.acked_reports} acked reports "
            f"counted once at {self.kills['close']} closes, {self.dropped} unacked not counted; "
            f"chunk replies lost after both servers ended the chunk: {self.lost_replies}; "
            f"streams left open on one server only (each refused its next chunk): leader "
            f"{sides['leader']}, helper {sides['helper']}; "
            f"log-timed kills whose line never came: {self.log_misses}; seed {self.seed} "
            f"({SEED_ENV} replays the schedule)"
        )


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"[:160]  # type: ignore[attr-defined]
    return f"{type(error).__name__}: {error}"[:160]


def _fmt(ledger: tuple[Fraction, Fraction]) -> str:
    return f"ε {ledger[0]} δ {ledger[1]}"


def seed_for(default: int | None) -> int:
    """The schedule's seed: SVTAGG_KILL_SEED, else `default`, else a fresh one."""
    given = os.environ.get(SEED_ENV)
    if given:
        return int(given)
    return default if default is not None else random.SystemRandom().randrange(1 << 32)


def kill_loop(pd: ProcessDeployment, kills: int, seed: int, label: str) -> None:
    """Run `kills` scheduled kills on a started deployment (stopped at the end),
    print the summary line, and fail listing every violation."""
    try:
        loop = KillLoop(pd, seed, label)
        loop.run(schedule(random.Random(seed), kills))
    finally:
        pd.stop()
    print("\n" + "\n".join(loop.violations))
    print(loop.summary())
    assert not loop.violations, (
        f"{len(loop.violations)} violations (replay: {SEED_ENV}={seed}):\n"
        + "\n".join(loop.violations)
    )
    assert sum(loop.kills.values()) == kills


def test_kill_loop(tmp_path: Path) -> None:
    """KILLS_DEFAULT external kills on SQLite stores, every invariant after each."""
    kill_loop(ProcessDeployment(tmp_path).start(), KILLS_DEFAULT, seed_for(DEFAULT_SEED), "sqlite")


@pytest.mark.heavy
def test_kill_loop_heavy(tmp_path: Path) -> None:
    """KILLS_HEAVY external kills on SQLite stores, on a fresh seed each run."""
    kill_loop(ProcessDeployment(tmp_path).start(), KILLS_HEAVY, seed_for(None), "sqlite")


@pytest.mark.heavy
def test_kill_loop_heavy_on_postgres(tmp_path: Path, pg_url: tuple[str, str]) -> None:
    """KILLS_HEAVY_PG external kills with both servers on PostgreSQL stores."""
    url, tag = pg_url
    pd = PgProcessDeployment(tmp_path, url, tag).start()
    kill_loop(pd, KILLS_HEAVY_PG, seed_for(None), "postgresql")
