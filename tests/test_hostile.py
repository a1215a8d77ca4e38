"""Hostile input (issue 6): hypothesis property tests against every RPC of every
service (Ingest on both servers, Analyst on the leader, Peer on the helper,
Health), with malformed, truncated, oversized and out-of-range messages: wrong
vector lengths, unknown tasks, ε ≤ 0 / NaN / text, τL > τH, gaps below the
minimum, chunks over the limit, replayed report ids, streams of other kinds or
states, undecodable bytes.  Every call must get a clear refusal status (one of
REFUSALS with a message; never UNKNOWN or INTERNAL: undecodable requests are
INVALID_ARGUMENT, see proto/wire.py), the servers
stay up (health SERVING, processes alive), and nothing is stored: both SQLite
stores are byte-for-byte the same logical state before and after every refused
call.  Also: the size bounds (request size, chunk size) and the per-caller
rate limit answering RESOURCE_EXHAUSTED; the helper's data port against a
peer holding a leader certificate (length headers, one id twice, other roles,
not TLS; heavy: trickled session ids on every handshake slot); a leased worker
that fails or answers a robust chunk short.

Default run: EXAMPLES_DEFAULT inputs per RPC; `pytest -m heavy`: EXAMPLES_HEAVY
and a per-RPC count printed at the end.  Inputs are derandomized (reproducible).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import ProcessDeployment
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from svtagg.client.upload import make_batch
from svtagg.dp.queries import MAX_CHUNK
from svtagg.proto import health_pb2
from svtagg.proto import svtagg_pb2 as pb

Code = grpc.StatusCode
EXAMPLES_DEFAULT = 30
EXAMPLES_HEAVY = 500
D, F = 4, 16
#: The task still collecting: a long name, so random bytes never name it.
OPEN_TASK = "upload-open-task-7f3a"
#: Refusals a hostile input may get; anything else (UNKNOWN, INTERNAL, OK where a
#: refusal is due, UNAVAILABLE) fails the test.
REFUSALS = {
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.ALREADY_EXISTS,
    Code.FAILED_PRECONDITION,
    Code.RESOURCE_EXHAUSTED,
}
TRIED: Counter[str] = Counter()

BAD_RATIONALS = [
    "0",
    "-1",
    "-0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e999",
    "",
    "abc",
    "1/0",
    "0/5",
    "1/-2",
    "--1",
    "1e-400",
    " ",
    "1" * 400,
    "0x10",
    "½",
]


def snapshot(path: Path) -> tuple[Any, ...]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return (
            db.execute("SELECT * FROM tasks ORDER BY task_id").fetchall(),
            db.execute("SELECT * FROM streams ORDER BY stream_id").fetchall(),
            db.execute("SELECT COUNT(*) FROM reports").fetchone(),
        )
    finally:
        db.close()


class Env:
    """Servers, stubs and the objects hostile inputs refer to."""

    def __init__(self, pd: ProcessDeployment) -> None:
        self.pd = pd
        self.analyst = pd.stub()
        self.peer = pd.stub("leader", "Peer", "helper")
        self.ingest = {r: pd.stub("client", "Ingest", r) for r in ("leader", "helper")}
        self.health = {r: pd.stub("analyst", "Health", r) for r in ("leader", "helper")}
        spec = dict(
            d=D,
            frac_bits=F,
            n_max=1000,
            min_batch=1,
            epsilon_total="100",
            delta_total="1/1000",
            epsilon_min="1/100",
        )
        for t in ("h", OPEN_TASK):
            self.analyst.CreateTask(pb.TaskSpec(task_id=t, **spec), timeout=30)
        self.spec = pb.TaskSpec(task_id="new", **spec)
        with pd.uploader() as up:
            up.upload("h", np.random.default_rng(3).random((20, D)))
            up.upload(OPEN_TASK, np.random.default_rng(4).random((5, D)))
        self.analyst.CloseCollection(pb.TaskRef(task_id="h"), timeout=30)
        self.stored_ids = sorted(pd.store_view("leader", "h").report_ids)[:5]
        self.stored_ids_u = sorted(pd.store_view("leader", OPEN_TASK).report_ids)[:5]

        def o(**kw: Any) -> str:
            req = pb.OpenStreamRequest(task_id="h", **kw)
            return str(self.analyst.OpenStream(req, timeout=30).stream_id)

        self.lap = o(kind=pb.LAP24, epsilon="1/2")
        self.ctt = o(kind=pb.CTT, epsilon="1/2", delta="1/10000")
        closed = o(kind=pb.LAP3, epsilon="1/2")
        self.analyst.Ask(
            pb.AskRequest(stream_id=closed, queries=pb.Queries(index=[0]), tau=[-100 * 2**F]),
            timeout=30,
        )
        self.closed = closed
        self.nmax = o(kind=pb.NMAX, epsilon="1/2")
        answered = o(kind=pb.NMAX, epsilon="1/2")
        self.analyst.NoisyMax(
            pb.NoisyMaxRequest(stream_id=answered, queries=pb.Queries(index=[0, 1])), timeout=30
        )
        self.nmax_closed = answered
        self.streams = [self.lap, self.ctt, self.closed, "", "0" * 32, "x" * 1000]
        self.tasks = ["h", OPEN_TASK, "", "nope", "bad id!", "a" * 65, "../../etc", "h\x00", "h\n"]
        self.digest = pb.CollectionDigest(
            task_id="h",
            **{
                k: getattr(self.peer.Digest(pb.TaskRef(task_id="h"), timeout=30), k)
                for k in ("n", "report_digest")
            },
        )

    def spec_of(self, task: str) -> pb.TaskSpec | None:
        if task not in ("h", OPEN_TASK):
            return None
        spec = pb.TaskSpec()
        spec.CopyFrom(self.spec)
        spec.task_id = task
        return spec

    def state(self) -> tuple[Any, ...]:
        return tuple(snapshot(self.pd.root / f"{r}.sqlite") for r in ("leader", "helper"))

    def alive(self) -> None:
        for role in ("leader", "helper"):
            assert self.pd.dep.procs[role].poll() is None, f"{role} died"
            r = self.health[role].Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert r.status == health_pb2.HealthCheckResponse.SERVING

    def refused(self, rpc: str, call: Callable[[], Any], may_succeed: bool = False) -> Code:
        """Run one hostile call: a clear refusal, nothing stored, servers up."""
        before = self.state()
        try:
            call()
            code = Code.OK
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            details = exc.details() or ""  # type: ignore[attr-defined]
            assert code in REFUSALS, (rpc, code, details)
            assert details, (rpc, code)  # a clear status says why
        TRIED[rpc] += 1
        assert code != Code.OK or may_succeed, f"{rpc}: a hostile input was accepted"
        # Refused, or a read / idempotent repeat: either way nothing changed.
        assert self.state() == before, f"{rpc}: the call changed a store"
        return code


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pd = ProcessDeployment(tmp_path_factory.mktemp("hostile")).start()
    try:
        yield Env(pd)
        env_alive = True
    finally:
        pd.stop()
    assert env_alive
    if TRIED:
        print(
            "\nhostile inputs tried per RPC:",
            dict(sorted(TRIED.items())),
            f"(total {sum(TRIED.values())})",
        )


def run_property(examples: int, *strategies: Any) -> Callable[[Callable[..., None]], None]:
    """Run `body` as a hypothesis property with `examples` inputs, now."""

    def deco(body: Callable[..., None]) -> None:
        settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(given(*strategies)(body))()

    return deco


EXAMPLES = [
    pytest.param(EXAMPLES_DEFAULT, id="default"),
    pytest.param(EXAMPLES_HEAVY, id="heavy", marks=pytest.mark.heavy),
]

texts = st.text(max_size=80)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
rationals = st.one_of(
    st.sampled_from(BAD_RATIONALS),
    texts,
    st.floats(allow_nan=True).map(repr),
    st.integers(-10, 0).map(str),
)


# ---------------------------------------------------------------- Ingest
UPLOAD_MUTATIONS = [
    "unknown task",
    "closed task",
    "short share",
    "long share",
    "short id",
    "long id",
    "replayed id",
    "dup in batch",
    "wrong oneof",
    "empty batch",
    "no share",
    "too many reports",
    "bad task id",
]


@pytest.mark.parametrize("examples", EXAMPLES)
def test_upload(env: Env, examples: int):
    @run_property(
        examples,
        st.sampled_from(UPLOAD_MUTATIONS),
        st.sampled_from(["leader", "helper"]),
        st.integers(1, 5),
        st.integers(0, 4),
        st.binary(max_size=40),
    )
    def body(mutation: str, role: str, m: int, which: int, junk: bytes) -> None:
        b = make_batch(OPEN_TASK, np.random.default_rng(which).random((m, D)), F)
        msg = pb.UploadBatch()
        msg.CopyFrom(b.leader if role == "leader" else b.helper)
        r = msg.reports[which % m]
        field = "explicit_share" if role == "leader" else "seed"
        share = getattr(r, field)
        if mutation == "unknown task":
            msg.task_id = "nope"
        elif mutation == "bad task id":
            msg.task_id = "bad id!" + junk.hex()
        elif mutation == "closed task":
            msg.task_id = "h"
        elif mutation == "short share":
            setattr(r, field, share[: max(0, len(share) - 1 - len(junk) % len(share))])
        elif mutation == "long share":
            setattr(r, field, share + b"\0" + junk)
        elif mutation == "short id":
            r.report_id = r.report_id[: len(junk) % 16]
        elif mutation == "long id":
            r.report_id = r.report_id + b"\1" + junk
        elif mutation == "replayed id":
            r.report_id = env.stored_ids_u[which % len(env.stored_ids_u)]
        elif mutation == "dup in batch":
            msg.reports.add().CopyFrom(r)
        elif mutation == "wrong oneof":
            other = "seed" if role == "leader" else "explicit_share"
            r.ClearField(field)
            setattr(r, other, junk or b"x")
        elif mutation == "empty batch":
            del msg.reports[:]
        elif mutation == "no share":
            r.ClearField(field)
        elif mutation == "too many reports":
            template = msg.reports[0]
            for i in range(10_001 - m):
                rep = msg.reports.add()
                rep.CopyFrom(template)
                rep.report_id = i.to_bytes(16, "big")
        env.refused(f"Ingest.Upload@{role}", lambda: env.ingest[role].Upload(msg, timeout=30))

    env.alive()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_get_task(env: Env, examples: int):
    @run_property(
        examples,
        st.one_of(st.sampled_from(env.tasks), texts),
        st.sampled_from(["leader", "helper"]),
    )
    def body(task: str, role: str) -> None:
        env.refused(
            f"Ingest.GetTask@{role}",
            lambda: env.ingest[role].GetTask(pb.TaskRef(task_id=task), timeout=30),
            may_succeed=True,
        )

    env.alive()


# ---------------------------------------------------------------- task specs
def hostile_spec(env: Env) -> Any:
    def build(field: str, value: Any, task: str) -> pb.TaskSpec:
        spec = pb.TaskSpec()
        spec.CopyFrom(env.spec)
        spec.task_id = task
        setattr(spec, field, value)
        return spec

    return st.one_of(
        st.builds(
            build,
            st.just("task_id"),
            st.sampled_from(["h", OPEN_TASK, "", "bad id!", "a" * 65, "x/y", "t\n"]),
            st.just(""),
        ),
        st.builds(build, st.just("d"), st.sampled_from([0, 1_000_001, 2**32 - 1]), st.just("n1")),
        st.builds(
            build, st.just("frac_bits"), st.sampled_from([0, 31, 63, 64, 2**32 - 1]), st.just("n2")
        ),
        st.builds(build, st.just("n_max"), st.sampled_from([0, 2**63, 2**64 - 1]), st.just("n3")),
        st.builds(
            build, st.just("min_batch"), st.sampled_from([0, 1001, 2**64 - 1]), st.just("n4")
        ),
        st.builds(
            build,
            st.sampled_from(["epsilon_total", "epsilon_min"]),
            rationals.filter(_bad_rational),
            st.just("n5"),
        ),
        st.builds(
            build,
            st.just("delta_total"),
            st.sampled_from(["-1", "nan", "inf", "abc", "1/0", "1e999", "--1", "½"]),
            st.just("n8"),
        ),
        st.builds(build, st.just("epsilon_min"), st.just("200"), st.just("n6")),
        st.builds(
            build, st.just("delta_total"), st.sampled_from(["1", "2", "-1/2"]), st.just("n7")
        ),
    ).map(lambda s: s if s.task_id else _named(s))


def _named(spec: pb.TaskSpec) -> pb.TaskSpec:
    return spec


def _bad_rational(s: str) -> bool:
    """True unless `s` parses as a positive rational (which a server may accept)."""
    from fractions import Fraction

    try:
        return Fraction(s.strip()) <= 0
    except (ValueError, ZeroDivisionError, OverflowError):
        return True


@pytest.mark.parametrize("examples", EXAMPLES)
def test_create_task(env: Env, examples: int):
    @run_property(examples, hostile_spec(env), st.booleans())
    def body(spec: pb.TaskSpec, on_helper: bool) -> None:
        if on_helper:  # the leader's own peer call, sent directly
            name, call = "Peer.CreateTask", lambda: env.peer.CreateTask(spec, timeout=30)
        else:
            name, call = "Analyst.CreateTask", lambda: env.analyst.CreateTask(spec, timeout=30)
        # The helper answers a repeat of an existing task's exact spec (the leader's
        # retry) with that task, unchanged.
        env.refused(name, call, may_succeed=on_helper and spec == env.spec_of(spec.task_id))

    # Found by the heavy run: `re.match` with "$" accepted a trailing newline.
    spec = pb.TaskSpec()
    spec.CopyFrom(env.spec)
    spec.task_id = "t\n"
    assert (
        env.refused("Analyst.CreateTask", lambda: env.analyst.CreateTask(spec, timeout=30))
        == Code.INVALID_ARGUMENT
    )
    env.alive()


# ---------------------------------------------------------------- read-only and close
@pytest.mark.parametrize("examples", EXAMPLES)
def test_task_refs(env: Env, examples: int):
    """DescribeTask, Budget, CloseCollection (analyst); Digest, Budget, CloseCollection,
    ListReports (peer): unknown or malformed tasks are refused; the closed task's
    answers are read-only (closing again is idempotent)."""
    methods = [
        ("Analyst", "DescribeTask"),
        ("Analyst", "Budget"),
        ("Analyst", "CloseCollection"),
        ("Peer", "Digest"),
        ("Peer", "Budget"),
        ("Peer", "CloseCollection"),
        ("Peer", "ListReports"),
    ]

    @run_property(
        examples,
        st.one_of(
            st.sampled_from([t for t in env.tasks if t != OPEN_TASK]),
            texts.filter(lambda t: t != OPEN_TASK),
        ),
        st.sampled_from(methods),
    )
    def body(task: str, method: tuple[str, str]) -> None:
        stub = env.analyst if method[0] == "Analyst" else env.peer
        env.refused(
            ".".join(method),
            lambda: getattr(stub, method[1])(
                (pb.ReportPage if method[1] == "ListReports" else pb.TaskRef)(task_id=task),
                timeout=30,
            ),
            may_succeed=task == "h",
        )

    env.refused(
        "Analyst.ListTasks", lambda: env.analyst.ListTasks(pb.Empty(), timeout=30), may_succeed=True
    )
    env.alive()


# ---------------------------------------------------------------- streams
def hostile_open(env: Env) -> Any:
    return st.one_of(
        st.builds(
            pb.OpenStreamRequest,
            task_id=st.sampled_from(env.tasks[1:]) | texts,
            kind=st.just(pb.LAP24),
            epsilon=st.just("1/2"),
        ),
        st.builds(
            pb.OpenStreamRequest,
            task_id=st.just("h"),
            kind=st.sampled_from([0, 6, 99, 2**31 - 1, -1]),
            epsilon=st.just("1/2"),
        ),
        st.builds(
            pb.OpenStreamRequest,
            task_id=st.just("h"),
            kind=st.sampled_from([pb.LAP24, pb.LAP3, pb.EXP3]),
            epsilon=rationals.filter(_bad_rational)
            | st.sampled_from(["1/1000", "1/101", "101", "1e9"]),
        ),
        st.builds(
            pb.OpenStreamRequest,
            task_id=st.just("h"),
            kind=st.sampled_from([pb.LAP24, pb.LAP3, pb.EXP3]),
            epsilon=st.just("1/2"),
            delta=st.sampled_from(["1/100", "1", "x"]),
        ),
        st.builds(
            pb.OpenStreamRequest,
            task_id=st.just("h"),
            kind=st.just(pb.CTT),
            epsilon=st.just("1/2"),
            delta=st.sampled_from(["", "0", "1", "2", "-1/2", "nan", "1/0"]),
        ),
    )


@pytest.mark.parametrize("examples", EXAMPLES)
def test_open_stream(env: Env, examples: int):
    @run_property(examples, hostile_open(env), st.booleans(), st.sampled_from(env.streams))
    def body(req: pb.OpenStreamRequest, on_helper: bool, sid: str) -> None:
        if on_helper:
            prep = pb.PrepareStreamRequest(
                stream_id=sid or "s",
                task_id=req.task_id,
                kind=req.kind,
                epsilon=req.epsilon,
                delta=req.delta,
            )
            env.refused("Peer.PrepareStream", lambda: env.peer.PrepareStream(prep, timeout=30))
        else:
            env.refused("Analyst.OpenStream", lambda: env.analyst.OpenStream(req, timeout=30))

    # A stream id the helper already holds is refused too (no second charge).
    for sid in (env.lap, env.closed):
        env.refused(
            "Peer.PrepareStream",
            lambda sid=sid: env.peer.PrepareStream(
                pb.PrepareStreamRequest(stream_id=sid, task_id="h", kind=pb.LAP24, epsilon="1/2"),
                timeout=30,
            ),
        )
    env.alive()


ASK_MUTATIONS = [
    "empty",
    "oversized",
    "index>=d",
    "tau count",
    "tau bound",
    "complement count",
    "ask on ctt",
    "closed stream",
    "unknown stream",
]


@pytest.mark.parametrize("examples", EXAMPLES)
def test_ask(env: Env, examples: int):
    bound = 4 * 1000 * 2**F

    @run_property(
        examples,
        st.sampled_from(ASK_MUTATIONS),
        st.integers(1, 6),
        st.sampled_from(env.streams[3:]),
        st.integers(1, 2**63 - 1 - bound),
    )
    def body(mutation: str, k: int, unknown: str, extra: int) -> None:
        idx, tau, comp, sid = list(range(k)), [0] * k, [], env.lap
        idx = [i % D for i in idx]
        if mutation == "empty":
            idx, tau = [], []
        elif mutation == "oversized":
            idx, tau = [0] * (MAX_CHUNK + k), [0] * (MAX_CHUNK + k)
        elif mutation == "index>=d":
            idx[-1] = D + extra % (2**32 - D)
        elif mutation == "tau count":
            tau = tau + [0] if extra % 2 else tau[:-1]
        elif mutation == "tau bound":
            tau[-1] = (bound + extra) * (1 if extra % 2 else -1)
        elif mutation == "complement count":
            comp = [True] * (k + 1)
        elif mutation == "ask on ctt":
            sid = env.ctt
        elif mutation == "closed stream":
            sid = env.closed
        else:
            sid = unknown
        req = pb.AskRequest(stream_id=sid, queries=pb.Queries(index=idx, complement=comp), tau=tau)
        env.refused("Analyst.Ask", lambda: env.analyst.Ask(req, timeout=60))

    env.alive()


NMAX_MUTATIONS = [
    "empty",
    "oversized",
    "index>=d",
    "complement count",
    "noisy-max on lap",
    "noisy-max on ctt",
    "ask on nmax",
    "answered stream",
    "unknown stream",
]


@pytest.mark.parametrize("examples", EXAMPLES)
def test_noisy_max(env: Env, examples: int):
    @run_property(
        examples,
        st.sampled_from(NMAX_MUTATIONS),
        st.integers(1, 6),
        st.sampled_from(env.streams[3:]),
        st.integers(0, 2**32 - 1),
    )
    def body(mutation: str, k: int, unknown: str, extra: int) -> None:
        idx, comp, sid = [i % D for i in range(k)], [], env.nmax
        if mutation == "empty":
            idx = []
        elif mutation == "oversized":
            idx = [0] * (MAX_CHUNK + k)
        elif mutation == "index>=d":
            idx[-1] = D + extra % (2**32 - D)
        elif mutation == "complement count":
            comp = [True] * (k + 1)
        elif mutation == "noisy-max on lap":
            sid = env.lap
        elif mutation == "noisy-max on ctt":
            sid = env.ctt
        elif mutation == "answered stream":
            sid = env.nmax_closed
        elif mutation == "ask on nmax":
            ask = pb.AskRequest(stream_id=env.nmax, queries=pb.Queries(index=idx), tau=[0] * k)
            env.refused("Analyst.Ask", lambda: env.analyst.Ask(ask, timeout=60))
            return
        else:
            sid = unknown
        req = pb.NoisyMaxRequest(stream_id=sid, queries=pb.Queries(index=idx, complement=comp))
        env.refused("Analyst.NoisyMax", lambda: env.analyst.NoisyMax(req, timeout=60))

    env.alive()


CMP_MUTATIONS = [
    "low>high",
    "gap",
    "count low",
    "count high",
    "compare on lap",
    "bound",
    "oversized",
    "unknown stream",
]


@pytest.mark.parametrize("examples", EXAMPLES)
def test_compare(env: Env, examples: int):
    bound = 4 * 1000 * 2**F

    @run_property(
        examples, st.sampled_from(CMP_MUTATIONS), st.integers(1, 5), st.integers(0, 2**F * 100)
    )
    def body(mutation: str, k: int, shift: int) -> None:
        idx = [i % D for i in range(k)]
        lo, hi, sid = [0] * k, [bound] * k, env.ctt
        if mutation == "low>high":
            lo, hi = [shift + 1] * k, [0] * k
        elif mutation == "gap":
            lo, hi = [0] * k, [shift % (2**F * 50)] * k  # below the ε = 1/2 gap (≫ 50)
        elif mutation == "count low":
            lo = lo[:-1]
        elif mutation == "count high":
            hi = hi + [bound]
        elif mutation == "compare on lap":
            sid = env.lap
        elif mutation == "bound":
            hi[-1] = bound + 1 + shift
        elif mutation == "oversized":
            idx, lo, hi = [0] * (MAX_CHUNK + 1), [0] * (MAX_CHUNK + 1), [bound] * (MAX_CHUNK + 1)
        else:
            sid = "0" * 32
        req = pb.CompareRequest(
            stream_id=sid, queries=pb.Queries(index=idx), tau_low=lo, tau_high=hi
        )
        env.refused("Analyst.Compare", lambda: env.analyst.Compare(req, timeout=60))

    env.alive()


# ---------------------------------------------------------------- peer-only RPCs
@pytest.mark.parametrize("examples", EXAMPLES)
def test_peer_reconciliation_and_streams(env: Env, examples: int):
    """DropReports with malformed ids or unknown tasks, MarkAgreed with a wrong digest
    or an open task, FailStream of unknown streams, Session with a bad first frame."""

    @run_property(
        examples,
        st.sampled_from(["drop", "agree", "fail"]),
        st.binary(max_size=100),
        st.sampled_from(env.tasks),
        u64,
    )
    def body(which: str, blob: bytes, task: str, n: int) -> None:
        if which == "drop":
            if len(blob) % 16 == 0 and task == "h":
                blob += b"x"  # valid ids on the real task are the leader's to drop
            req = pb.ReportIds(task_id=task, report_ids=blob)
            env.refused("Peer.DropReports", lambda: env.peer.DropReports(req, timeout=30))
        elif which == "agree":
            dg = pb.CollectionDigest(task_id=task, n=n, report_digest=blob)
            if dg.task_id == "h" and (n, blob) == (env.digest.n, env.digest.report_digest):
                dg.n += 1
            env.refused("Peer.MarkAgreed", lambda: env.peer.MarkAgreed(dg, timeout=30))
        else:
            sid = blob.hex() if blob else "nope"
            env.refused(
                "Peer.FailStream",
                lambda: env.peer.FailStream(pb.StreamRef(stream_id=sid), timeout=30),
            )

    @run_property(
        max(3, examples // 5),
        st.sampled_from(["header first", "short id", "status", "fragment", "long id"]),
        st.binary(max_size=40),
    )
    def session(first: str, blob: bytes) -> None:
        frame = {
            "header first": pb.PeerFrame(header=pb.ChunkHeader(stream_id=env.lap, chunk_no=1)),
            "short id": pb.PeerFrame(open=pb.SessionOpen(session_id=blob[:15])),
            "long id": pb.PeerFrame(open=pb.SessionOpen(session_id=b"\0" * 17 + blob)),
            "status": pb.PeerFrame(status=pb.PeerStatus(ok=True)),
            "fragment": pb.PeerFrame(fragment=blob),
        }[first]

        def call() -> None:
            for _ in env.peer.Session(iter([frame]), timeout=30):
                pass

        env.refused("Peer.Session", call)

    env.alive()


# ---------------------------------------------------------------- raw bytes
UNARY = {
    "leader": [
        "/svtagg.v1.Ingest/Upload",
        "/svtagg.v1.Ingest/GetTask",
        "/svtagg.v1.Analyst/CreateTask",
        "/svtagg.v1.Analyst/DescribeTask",
        "/svtagg.v1.Analyst/ListTasks",
        "/svtagg.v1.Analyst/CloseCollection",
        "/svtagg.v1.Analyst/OpenStream",
        "/svtagg.v1.Analyst/Ask",
        "/svtagg.v1.Analyst/Compare",
        "/svtagg.v1.Analyst/NoisyMax",
        "/svtagg.v1.Analyst/Budget",
        "/grpc.health.v1.Health/Check",
    ],
    "helper": [
        "/svtagg.v1.Ingest/Upload",
        "/svtagg.v1.Peer/CreateTask",
        "/svtagg.v1.Peer/Digest",
        "/svtagg.v1.Peer/CloseCollection",
        "/svtagg.v1.Peer/ListReports",
        "/svtagg.v1.Peer/DropReports",
        "/svtagg.v1.Peer/MarkAgreed",
        "/svtagg.v1.Peer/PrepareStream",
        "/svtagg.v1.Peer/FailStream",
        "/svtagg.v1.Peer/Budget",
    ],
}


@pytest.mark.parametrize("examples", EXAMPLES)
def test_undecodable_and_random_bytes(env: Env, examples: int):
    """Random and truncated bytes as the request of every unary RPC: what does not
    parse is INVALID_ARGUMENT, what parses into nonsense is refused by the service;
    the servers stay up and store nothing."""
    chans = {
        r: env.pd.channel({"leader": "analyst", "helper": "leader"}[r], r)
        for r in ("leader", "helper")
    }
    client = {r: env.pd.channel("client", r) for r in ("leader", "helper")}
    valid = make_batch(OPEN_TASK, np.zeros((1, D)), F).leader.SerializeToString()
    close_open_task = pb.TaskRef(task_id=OPEN_TASK).SerializeToString()
    methods = [(r, m) for r in UNARY for m in UNARY[r]]

    @run_property(
        examples * 2,
        st.sampled_from(methods),
        st.one_of(st.binary(max_size=300), st.integers(1, len(valid) - 1).map(lambda k: valid[:k])),
    )
    def body(method: tuple[str, str], blob: bytes) -> None:
        role, path = method
        # The batch's first field is its task id, so one prefix is exactly a valid
        # TaskRef of the open task: closing it is a legitimate request, not a
        # hostile one (it would change the store, as it should).
        assume(not (path.endswith("/CloseCollection") and blob == close_open_task))
        call = chans[role].unary_unary(path)  # bytes in, bytes out
        if path.endswith("/Upload"):
            # Uploads need a client certificate; the other RPCs take the stub's role.
            call = client[role].unary_unary(path)
        env.refused(
            f"raw:{path.rsplit('/', 1)[1]}@{role}", lambda: call(blob, timeout=30), may_succeed=True
        )  # random bytes may parse into a harmless request

    env.alive()


# ---------------------------------------------------------------- size and rate bounds
def test_oversized_request_is_refused(env: Env):
    """A request over the 64 MiB message limit is refused by the server's transport
    (RESOURCE_EXHAUSTED) before any of it is parsed; an upload batch over the 10,000
    reports / 32 MiB batch limit is refused by the service (tested above)."""
    from svtagg.proto.tls import tls_target

    ident = env.pd.identity("client")
    creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
    opts = [("grpc.max_send_message_length", 200 << 20), *tls_target("leader")]
    with grpc.secure_channel(env.pd.address("leader"), creds, options=opts) as ch:
        upload = ch.unary_unary("/svtagg.v1.Ingest/Upload")
        blob = pb.UploadBatch(
            task_id=OPEN_TASK,
            reports=[pb.Report(report_id=b"\1" * 16, explicit_share=b"\0" * (65 << 20))],
        ).SerializeToString()
        assert (
            env.refused("Ingest.Upload@leader(65MiB)", lambda: upload(blob, timeout=60))
            == Code.RESOURCE_EXHAUSTED
        )
    env.alive()


def test_rate_limit_per_caller(tmp_path: Path):
    """A caller over its token bucket gets RESOURCE_EXHAUSTED at once; another
    caller (another certificate) is unaffected; the bucket refills."""
    pd = ProcessDeployment(tmp_path, ["--rate-limit", "5", "--rate-burst", "10"]).start()
    try:
        client = pd.stub("client", "Ingest", "leader")
        analyst = pd.stub()
        ref = pb.TaskRef(task_id="nope")
        codes = Counter()
        for _ in range(30):
            try:
                client.GetTask(ref, timeout=10)
            except grpc.RpcError as exc:
                codes[exc.code()] += 1  # type: ignore[attr-defined]
        assert codes[Code.RESOURCE_EXHAUSTED] >= 15 and codes[Code.NOT_FOUND] >= 10, codes
        try:
            analyst.ListTasks(pb.Empty(), timeout=10)  # other certificate: own bucket
        except grpc.RpcError as exc:  # pragma: no cover - the assertion below reports it
            pytest.fail(f"analyst throttled by the client's bucket: {exc}")
        # The leader's own calls to the helper are exempt: a stream still opens.
        analyst.CreateTask(
            pb.TaskSpec(
                task_id="t",
                d=2,
                frac_bits=8,
                n_max=10,
                min_batch=1,
                epsilon_total="10",
                delta_total="0",
                epsilon_min="1/10",
            ),
            timeout=10,
        )
        time.sleep(0.5)  # refills 2.5 tokens
        with pytest.raises(grpc.RpcError) as info:
            client.GetTask(ref, timeout=10)
        assert info.value.code() == Code.NOT_FOUND  # type: ignore[attr-defined]
        assert pd.dep.procs["leader"].poll() is None
    finally:
        pd.stop()


def test_token_bucket_unit():
    """The limiter itself, on a fake clock: burst, refill at `rate`, separate
    identities, bounded memory."""
    from svtagg.servers.edge.limits import RateLimiter

    now = [0.0]
    lim = RateLimiter(rate=2.0, burst=3.0, max_identities=2, clock=lambda: now[0])
    assert [lim.allow("a") for _ in range(4)] == [True, True, True, False]
    assert lim.allow("b")  # its own bucket
    now[0] += 0.5  # +1 token
    assert lim.allow("a") and not lim.allow("a")
    lim.allow("c")  # evicts the least recently used ("b")
    assert len(lim._buckets) == 2  # noqa: SLF001 - memory bound
    assert RateLimiter(rate=0, burst=0).allow("x")  # disabled


# ---------------------------------------------------------------- leased work
async def test_a_worker_failure_reaches_the_analyst_without_its_text(
    pg_url: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A leased job whose worker fails unexpectedly (an exception whose text holds
    a value) answers "internal server error", as the in-process path does; the
    value is neither in the status nor in the worker's log."""
    import asyncio
    import logging

    from svtagg.dp.errors import PeerUnavailable
    from svtagg.servers.store.postgres import PgStore
    from svtagg.servers.work import Job, Worker, WorkQueue

    secret = "gamma=123456789"

    async def failing(job: Job) -> bytes:
        raise RuntimeError(f"clamped sum out of range: {secret}")

    store = PgStore(pg_url[0], schema=f"wfail_{pg_url[1]}")
    front = await WorkQueue.connect(store, ("done",))
    queue = await WorkQueue.connect(store, ("new",))
    worker = Worker(queue, failing, lease=3.0)
    running = asyncio.ensure_future(worker.run())
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(100):  # until the worker's first heartbeat is in
                if await front.workers_alive():
                    break
                await asyncio.sleep(0.05)
            with pytest.raises(PeerUnavailable) as info:
                await asyncio.wait_for(front.run("robust", b"p"), 20)
        assert "internal server error" in str(info.value)
        assert "123456789" not in str(info.value)
        assert "123456789" not in caplog.text
        assert "RuntimeError" in caplog.text  # the operator still sees what failed
    finally:
        worker.stopping.set()
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        await front.close()
        await queue.close()
        store.close()


async def test_a_leased_robust_job_of_the_wrong_length_fails_the_pass(tmp_path: Path) -> None:
    """A worker's robust-pass result must hold 8 bytes per coordinate of its
    chunk: a short one (here 8 bytes missing from the first of two chunks) fails
    the pass instead of shifting every later coordinate's share."""
    from fractions import Fraction

    from svtagg.dp.errors import PeerUnavailable
    from svtagg.dp.task import TaskParams
    from svtagg.proto.vocab import PASS_ID_BYTES, Role
    from svtagg.servers.core import ServerCore
    from svtagg.servers.leader import ROBUST_LANES, LeaderDriver
    from svtagg.servers.store.sqlite import SqliteStore

    class ShortWork:
        async def run(self, kind: str, payload: bytes, *args: Any, **kw: Any) -> bytes:
            h = pb.ChunkHeader.FromString(payload)
            width = h.coord_hi - h.coord_lo
            return bytes(8 * (width - (1 if h.coord_lo == 0 else 0)))

    d = ROBUST_LANES + 3
    store = SqliteStore(tmp_path / "l.sqlite")
    store.create_task(TaskParams("t", d, 16, 100, 1, Fraction(1), Fraction(0), Fraction(1, 10)))
    leader = LeaderDriver(ServerCore(Role.LEADER, store), None, None)  # type: ignore[arg-type]
    leader.work = ShortWork()  # type: ignore[assignment]
    with pytest.raises(PeerUnavailable, match="robust"):
        await leader.robust_pass(store.task("t"), bytes(PASS_ID_BYTES))


# ---------------------------------------------------------------- the data channel
def _data_port(env: Env) -> int:
    """The helper's data port (ephemeral: announced in its log)."""
    import re

    found = re.findall(
        rb"helper data channel on port (\d+)", (env.pd.root / "helper.log").read_bytes()
    )
    assert found, "the helper offers no data channel"
    return int(found[-1])


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")))


def _data_conn(env: Env, role: str = "leader") -> Any:
    """A blocking TLS connection to the helper's data port with `role`'s certificate."""
    from svtagg.proto.tls import server_name
    from svtagg.proto.vocab import Role
    from svtagg.servers.edge import datachannel

    ctx = datachannel._context(env.pd.identity(role), server=False)
    return datachannel._connect_blocking(
        "127.0.0.1", _data_port(env), ctx, server_name(Role.HELPER), 10
    )


def _dropped(sock: Any, timeout: float = 5.0) -> bool:
    """The helper closed the connection (EOF or reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        sock.close()


def test_data_channel_probes(env: Env):
    """The helper's data port against a peer that holds a leader certificate and
    misbehaves (and against callers without one): a huge length header, a
    session id of the wrong length, a second connection for one id, another
    role's certificate, bytes that are not TLS.  Each connection is dropped at
    once, the helper's memory does not grow by the announced sizes, and the
    servers stay up and answer."""
    import os
    import socket
    import struct

    helper_pid = env.pd.dep.procs["helper"].pid
    rss0 = _rss_kb(helper_pid)
    # A first message announcing 1 GiB (a data connection starts with its 16-byte id).
    for size in (1 << 30, (1 << 64) - 1, 0, 15, 17):
        sock = _data_conn(env)
        sock.sendall(struct.pack("<Q", size))
        assert _dropped(sock), size
        TRIED["DataChannel.length_header"] += 1
    # One session id, two connections: one of them is closed at once, the other
    # kept for its session.  Each admission runs on a thread of its own, so the
    # second connection's may finish first; then it is the first that is closed.
    sid = os.urandom(16)
    first = _data_conn(env)
    first.sendall(struct.pack("<Q", 16) + sid)
    again = _data_conn(env)
    again.sendall(struct.pack("<Q", 16) + sid)
    again_dropped = _dropped(again)
    first_dropped = _dropped(first, 0.5 if again_dropped else 5.0)
    assert again_dropped != first_dropped, (again_dropped, first_dropped)
    TRIED["DataChannel.same_session_id"] += 1
    # Certificates of other roles never get as far as a session id.
    for role in ("analyst", "client"):
        sock = _data_conn(env, role)
        with contextlib.suppress(OSError):
            sock.sendall(struct.pack("<Q", 16) + os.urandom(16))
        assert _dropped(sock), role
        TRIED["DataChannel.other_role"] += 1
    # Not TLS at all.
    raw = socket.create_connection(("127.0.0.1", _data_port(env)), timeout=10)
    raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(64))
    assert _dropped(raw)
    TRIED["DataChannel.not_tls"] += 1
    assert _rss_kb(helper_pid) - rss0 < 64 << 10, "the helper's memory grew by >= 64 MiB"
    env.alive()


@pytest.mark.heavy
def test_data_channel_admission_deadline(env: Env):
    """Leader-certificate peers trickling their session ids (one byte per 2 s)
    on every handshake slot are dropped at the 10 s admission deadline, not
    after their 48 s of trickle."""
    import os
    import struct
    from concurrent.futures import ThreadPoolExecutor

    from svtagg.servers.edge.datachannel import ADMIT_SECONDS, MAX_HANDSHAKES

    def trickle(_: int) -> float:
        sock = _data_conn(env)
        t = time.perf_counter()
        try:
            for byte in struct.pack("<Q", 16) + os.urandom(16):
                sock.sendall(bytes([byte]))
                time.sleep(2.0)
        except OSError:
            pass
        finally:
            sock.close()
        return time.perf_counter() - t

    with ThreadPoolExecutor(MAX_HANDSHAKES) as pool:
        held = list(pool.map(trickle, range(MAX_HANDSHAKES)))
    TRIED["DataChannel.trickled_session_id"] += len(held)
    assert max(held) < ADMIT_SECONDS + 5, held
    env.alive()
