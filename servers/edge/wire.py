"""The servers' protobuf edge: every conversion between the wire messages and
the domain values of `servers.exchange.values`, and the one place that knows how a
value is laid out on the wire (a ChunkHeader's flat fields, rationals as exact
text, report ids concatenated).

The gRPC services (`servers.edge.services`), the gRPC and in-memory helper
ports (`servers.edge.peer`, `servers.memory`), the session framing
(`servers.exchange.session`) and the leased work table (`servers.work`)
convert here; the drivers and the core never see a protobuf message.  Each
of the Peer service's unary calls is one `PeerCall`: its RPC name and the
codecs of its request and reply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from svtagg.dp.errors import InvalidArgument
from svtagg.dp.jointsvt import INDEPENDENT
from svtagg.dp.queries import Budget
from svtagg.dp.task import TaskParams, TaskSpec
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import KIND_TO_PB, OUTCOME_TO_PB, kind_from_pb, outcome_from_pb, split_ids
from svtagg.servers.exchange.values import (
    Agreement,
    Ask,
    AskAnswer,
    ChunkHeader,
    ChunkKind,
    Compare,
    CompareAnswer,
    CrawlAnswer,
    CrawlLevel,
    CrawlStep,
    CrawlStepResult,
    JobAnswer,
    JobInputs,
    NoiseBatch,
    NoisyMax,
    NoisyMaxAnswer,
    OpenStream,
    PlanGroup,
    PlanInfo,
    PlanRequest,
    PlanSlot,
    PoolDraw,
    PreparedRef,
    PrepareStream,
    Queries,
    ReportIds,
    ReportPage,
    ReportSet,
    RobustChunk,
    StreamChunk,
    StreamInfo,
    TaskInfo,
    VerifyBatch,
    VerifyResult,
)
from svtagg.servers.store.rules import TaskState
from svtagg.vdaf.crawl import pack_bits, prefixes_from_bytes, prefixes_to_bytes, unpack_bits
from svtagg.vdaf.sparse import SparseError

D = TypeVar("D")
M = TypeVar("M", bound=Message)
Q = TypeVar("Q")
R = TypeVar("R")


@dataclass(frozen=True)
class Codec(Generic[D, M]):
    """A domain value's protobuf message, both ways."""

    message: type[M]
    to_pb: Callable[[D], M]
    from_pb: Callable[[M], D]

    def encode(self, value: D) -> bytes:
        return self.to_pb(value).SerializeToString()

    def decode(self, data: bytes) -> D:
        return self.from_pb(self.message.FromString(data))


def _fraction(text: str) -> Fraction:
    """A rational a server reported ("" as 0)."""
    return Fraction(text) if text else Fraction(0)


def _plan(plan_id: str, group: int) -> PlanSlot | None:
    return (plan_id, group) if plan_id else None


# ---------------------------------------------------------------- tasks
def _spec_to_pb(s: TaskSpec) -> pb.TaskSpec:
    return pb.TaskSpec(
        task_id=s.task_id,
        d=s.d,
        frac_bits=s.frac_bits,
        n_max=s.n_max,
        min_batch=s.min_batch,
        epsilon_total=s.epsilon_total,
        delta_total=s.delta_total,
        epsilon_min=s.epsilon_min,
        validate_reports=s.validate_reports,
        embedding=s.embedding,
        validity=s.validity,
        noise=s.noise,
    )


def _spec_from_pb(m: pb.TaskSpec) -> TaskSpec:
    return TaskSpec(
        m.task_id,
        m.d,
        m.frac_bits,
        m.n_max,
        m.min_batch,
        m.epsilon_total,
        m.delta_total,
        m.epsilon_min,
        m.validate_reports,
        m.embedding,
        m.validity,
        m.noise,
    )


def _params_to_pb(p: TaskParams) -> pb.TaskSpec:
    return pb.TaskSpec(
        task_id=p.task_id,
        d=p.d,
        frac_bits=p.frac_bits,
        n_max=p.n_max,
        min_batch=p.min_batch,
        epsilon_total=str(p.epsilon_total),
        delta_total=str(p.delta_total),
        epsilon_min=str(p.epsilon_min),
        validate_reports=p.validate_reports,
        embedding=p.embedding,
        validity=p.validity,
        # "" on the wire for independent noise: the messages of such tasks are
        # byte for byte what they were before the option (tests/test_transcript.py).
        noise="" if p.noise == INDEPENDENT else p.noise,
    )


def _params_from_pb(m: pb.TaskSpec) -> TaskParams:
    """Parameters a server reported (validated where it created the task)."""
    return TaskParams(
        m.task_id,
        m.d,
        m.frac_bits,
        m.n_max,
        m.min_batch,
        _fraction(m.epsilon_total),
        _fraction(m.delta_total),
        _fraction(m.epsilon_min),
        m.validate_reports,
        m.embedding,
        m.validity,
        m.noise or INDEPENDENT,
    )


def _budget_to_pb(b: Budget) -> pb.BudgetStatus:
    return pb.BudgetStatus(
        epsilon_total=str(b.epsilon_total),
        delta_total=str(b.delta_total),
        epsilon_spent=str(b.epsilon_spent),
        delta_spent=str(b.delta_spent),
    )


def _budget_from_pb(m: pb.BudgetStatus) -> Budget:
    return Budget(
        _fraction(m.epsilon_total),
        _fraction(m.delta_total),
        _fraction(m.epsilon_spent),
        _fraction(m.delta_spent),
    )


def _task_info_to_pb(t: TaskInfo) -> pb.TaskInfo:
    out = pb.TaskInfo(
        spec=_params_to_pb(t.params),
        n=t.n,
        collection_open=t.collection_open,
        budget=_budget_to_pb(t.budget),
        streams=t.streams,
        agreed=t.agreed,
        dropped_reports=t.dropped_reports,
        verify_key=t.verify_key,
        rejected=dict(t.rejected),
    )
    if t.helper_budget is not None:
        out.helper_budget.CopyFrom(_budget_to_pb(t.helper_budget))
    return out


def _task_info_from_pb(m: pb.TaskInfo) -> TaskInfo:
    return TaskInfo(
        _params_from_pb(m.spec),
        m.n,
        m.collection_open,
        _budget_from_pb(m.budget),
        m.streams,
        m.agreed,
        _budget_from_pb(m.helper_budget) if m.HasField("helper_budget") else None,
        m.dropped_reports,
        m.verify_key,
        tuple(sorted(m.rejected.items())),
    )


TASK_SPEC = Codec(pb.TaskSpec, _spec_to_pb, _spec_from_pb)
TASK_INFO = Codec(pb.TaskInfo, _task_info_to_pb, _task_info_from_pb)
TASK_REF: Codec[str, pb.TaskRef] = Codec(
    pb.TaskRef, lambda task_id: pb.TaskRef(task_id=task_id), lambda m: m.task_id
)


def task_list(tasks: list[TaskInfo]) -> pb.TaskList:
    return pb.TaskList(tasks=[_task_info_to_pb(t) for t in tasks])


def task_info(t: TaskState) -> pb.TaskInfo:
    """A stored task as the wire's TaskInfo."""
    return _task_info_to_pb(TaskInfo.of(t))


# ---------------------------------------------------------------- the close
REPORT_SET: Codec[ReportSet, pb.CollectionDigest] = Codec(
    pb.CollectionDigest,
    lambda r: pb.CollectionDigest(n=r.n, report_digest=r.digest, agreed=r.agreed),
    lambda m: ReportSet(m.n, m.report_digest, m.agreed),
)
AGREEMENT: Codec[Agreement, pb.CollectionDigest] = Codec(
    pb.CollectionDigest,
    lambda a: pb.CollectionDigest(
        n=a.n, report_digest=a.digest, task_id=a.task_id, pass_id=a.pass_id
    ),
    lambda m: Agreement(m.task_id, m.n, m.report_digest, m.pass_id),
)
REPORT_PAGE: Codec[ReportPage, pb.ReportPage] = Codec(
    pb.ReportPage,
    lambda p: pb.ReportPage(task_id=p.task_id, after=p.after, limit=p.limit),
    lambda m: ReportPage(m.task_id, m.after, m.limit),
)
REPORT_IDS: Codec[ReportIds, pb.ReportIds] = Codec(
    pb.ReportIds,
    lambda r: pb.ReportIds(task_id=r.task_id, report_ids=b"".join(r.ids), more=r.more),
    lambda m: ReportIds(m.task_id, tuple(split_ids(m.report_ids)), m.more),
)


# ---------------------------------------------------------------- ingest verification
VERIFY_BATCH: Codec[VerifyBatch, pb.VerifyBatch] = Codec(
    pb.VerifyBatch,
    lambda v: pb.VerifyBatch(
        task_id=v.task_id, report_ids=b"".join(v.ids), prep_shares=list(v.prep_shares)
    ),
    lambda m: VerifyBatch(m.task_id, tuple(split_ids(m.report_ids)), tuple(m.prep_shares)),
)
VERIFY_RESULT: Codec[VerifyResult, pb.VerifyResult] = Codec(
    pb.VerifyResult,
    lambda r: pb.VerifyResult(
        prep_shares=list(r.prep_shares), verdicts=r.verdicts, replayed=r.replayed, n=r.n
    ),
    lambda m: VerifyResult(tuple(m.prep_shares), m.verdicts, m.replayed, m.n),
)


# ---------------------------------------------------------------- streams
def _open_stream_from_pb(m: pb.OpenStreamRequest) -> OpenStream:
    return OpenStream(
        m.task_id, kind_from_pb(m.kind), m.epsilon, m.delta, _plan(m.plan_id, m.plan_group)
    )


def _open_stream_to_pb(o: OpenStream) -> pb.OpenStreamRequest:
    plan_id, group = o.plan if o.plan is not None else ("", 0)
    return pb.OpenStreamRequest(
        task_id=o.task_id,
        kind=KIND_TO_PB[o.kind],
        epsilon=o.epsilon,
        delta=o.delta,
        plan_id=plan_id,
        plan_group=group,
    )


def _prepare_to_pb(p: PrepareStream) -> pb.PrepareStreamRequest:
    plan_id, group = p.plan if p.plan is not None else ("", 0)
    return pb.PrepareStreamRequest(
        stream_id=p.stream_id,
        task_id=p.task_id,
        kind=KIND_TO_PB[p.kind],
        epsilon=p.epsilon,
        delta=p.delta,
        plan_id=plan_id,
        plan_group=group,
        replay=p.replay,
    )


def _prepare_from_pb(m: pb.PrepareStreamRequest) -> PrepareStream:
    return PrepareStream(
        m.stream_id,
        m.task_id,
        kind_from_pb(m.kind),
        m.epsilon,
        m.delta,
        _plan(m.plan_id, m.plan_group),
        m.replay,
    )


def _stream_info_to_pb(s: StreamInfo) -> pb.StreamInfo:
    return pb.StreamInfo(
        stream_id=s.stream_id,
        task_id=s.task_id,
        kind=KIND_TO_PB[s.kind],
        epsilon=str(s.epsilon),
        delta=str(s.delta),
        closed=s.closed,
        queries_answered=s.queries_answered,
    )


def _stream_info_from_pb(m: pb.StreamInfo) -> StreamInfo:
    return StreamInfo(
        m.stream_id,
        m.task_id,
        kind_from_pb(m.kind),
        _fraction(m.epsilon),
        _fraction(m.delta),
        m.closed,
        m.queries_answered,
    )


OPEN_STREAM = Codec(pb.OpenStreamRequest, _open_stream_to_pb, _open_stream_from_pb)
PREPARE = Codec(pb.PrepareStreamRequest, _prepare_to_pb, _prepare_from_pb)
STREAM_INFO = Codec(pb.StreamInfo, _stream_info_to_pb, _stream_info_from_pb)
STREAM_REF: Codec[str, pb.StreamRef] = Codec(
    pb.StreamRef, lambda stream_id: pb.StreamRef(stream_id=stream_id), lambda m: m.stream_id
)


# ---------------------------------------------------------------- plans
def _plan_request_to_pb(p: PlanRequest) -> pb.PlanRequest:
    return pb.PlanRequest(
        task_id=p.task_id,
        groups=[pb.PlanGroup(epsilon=g.epsilon, delta=g.delta) for g in p.groups],
        delta_slack=p.delta_slack,
        plan_id=p.plan_id,
    )


def _plan_request_from_pb(m: pb.PlanRequest) -> PlanRequest:
    groups = tuple(PlanGroup(g.epsilon, g.delta) for g in m.groups)
    return PlanRequest(m.task_id, groups, m.delta_slack, m.plan_id)


def _plan_info_to_pb(p: PlanInfo) -> pb.PlanInfo:
    return pb.PlanInfo(
        plan_id=p.plan_id,
        task_id=p.task_id,
        epsilon=str(p.epsilon),
        delta=str(p.delta),
        rule=p.rule,
        state=p.state,
        refunded_epsilon=str(p.refunded_epsilon),
        refunded_delta=str(p.refunded_delta),
    )


def _plan_info_from_pb(m: pb.PlanInfo) -> PlanInfo:
    return PlanInfo(
        m.plan_id,
        m.task_id,
        _fraction(m.epsilon),
        _fraction(m.delta),
        m.rule,
        m.state,
        _fraction(m.refunded_epsilon),
        _fraction(m.refunded_delta),
    )


PLAN_REQUEST = Codec(pb.PlanRequest, _plan_request_to_pb, _plan_request_from_pb)
PLAN_INFO = Codec(pb.PlanInfo, _plan_info_to_pb, _plan_info_from_pb)
PLAN_REF: Codec[str, pb.PlanRef] = Codec(
    pb.PlanRef, lambda plan_id: pb.PlanRef(plan_id=plan_id), lambda m: m.plan_id
)


# ---------------------------------------------------------------- chunks
def _queries_to_pb(q: Queries) -> pb.Queries:
    flags = q.complement.tolist() if q.complement.any() else []
    return pb.Queries(index=q.index.tolist(), complement=flags)


def _queries_from_pb(m: pb.Queries) -> Queries:
    # The record reads the repeated scalar fields into its arrays at C speed
    # (buffer protocol): a chunk of 10^4 queries is never a tuple of Python ints.
    return Queries(m.index, m.complement)


ASK: Codec[Ask, pb.AskRequest] = Codec(
    pb.AskRequest,
    lambda a: pb.AskRequest(
        stream_id=a.stream_id, queries=_queries_to_pb(a.queries), tau=a.tau.tolist()
    ),
    lambda m: Ask(m.stream_id, _queries_from_pb(m.queries), m.tau),
)
COMPARE: Codec[Compare, pb.CompareRequest] = Codec(
    pb.CompareRequest,
    lambda c: pb.CompareRequest(
        stream_id=c.stream_id,
        queries=_queries_to_pb(c.queries),
        tau_low=c.tau_low.tolist(),
        tau_high=c.tau_high.tolist(),
    ),
    lambda m: Compare(m.stream_id, _queries_from_pb(m.queries), m.tau_low, m.tau_high),
)
ASK_ANSWER: Codec[AskAnswer, pb.AskResponse] = Codec(
    pb.AskResponse,
    lambda a: pb.AskResponse(
        yes=a.yes,
        index=a.index or 0,
        closed=a.closed,
        peer_bytes=a.peer_bytes,
        noise_drawn=a.noise_drawn,
    ),
    lambda m: AskAnswer(m.index if m.yes else None, m.closed, m.peer_bytes, m.noise_drawn),
)
COMPARE_ANSWER: Codec[CompareAnswer, pb.CompareResponse] = Codec(
    pb.CompareResponse,
    lambda c: pb.CompareResponse(
        outcomes=[OUTCOME_TO_PB[o] for o in c.outcomes], closed=c.closed, peer_bytes=c.peer_bytes
    ),
    lambda m: CompareAnswer(tuple(outcome_from_pb(o) for o in m.outcomes), m.closed, m.peer_bytes),
)

NOISY_MAX: Codec[NoisyMax, pb.NoisyMaxRequest] = Codec(
    pb.NoisyMaxRequest,
    lambda n: pb.NoisyMaxRequest(
        stream_id=n.stream_id, queries=_queries_to_pb(n.queries), more=n.more
    ),
    lambda m: NoisyMax(m.stream_id, _queries_from_pb(m.queries), m.more),
)
NOISY_MAX_ANSWER: Codec[NoisyMaxAnswer, pb.NoisyMaxResponse] = Codec(
    pb.NoisyMaxResponse,
    lambda a: pb.NoisyMaxResponse(index=a.index or 0, closed=a.closed, peer_bytes=a.peer_bytes),
    lambda m: NoisyMaxAnswer(m.index if m.closed else None, m.closed, m.peer_bytes),
)


# ---------------------------------------------------------------- the prefix crawl
def _prefixes(data: bytes) -> tuple[int, ...]:
    try:
        return prefixes_from_bytes(data)
    except SparseError as exc:
        raise InvalidArgument(str(exc)) from None


def _bits(data: bytes, k: int) -> tuple[bool, ...]:
    try:
        return unpack_bits(data, k)
    except SparseError as exc:
        raise InvalidArgument(str(exc)) from None


CRAWL_LEVEL: Codec[CrawlLevel, pb.CrawlLevelRequest] = Codec(
    pb.CrawlLevelRequest,
    lambda c: pb.CrawlLevelRequest(
        task_id=c.task_id,
        walk_id=c.walk_id,
        parents=prefixes_to_bytes(c.parents),
        depth=c.depth,
        steps=c.steps,
        epsilon=c.epsilon,
        tau=c.tau,
    ),
    lambda m: CrawlLevel(
        m.task_id,
        m.walk_id,
        _prefixes(m.parents),
        m.depth,
        m.steps,
        m.epsilon,
        m.tau,
    ),
)
CRAWL_ANSWER: Codec[CrawlAnswer, pb.CrawlLevelResponse] = Codec(
    pb.CrawlLevelResponse,
    lambda a: pb.CrawlLevelResponse(
        walk_id=a.walk_id,
        stream_id=a.stream_id,
        candidates=len(a.above),
        above=pack_bits(a.above),
        refused=a.refused,
        peer_bytes=a.peer_bytes,
    ),
    lambda m: CrawlAnswer(
        m.walk_id, m.stream_id, _bits(m.above, m.candidates), m.refused, m.peer_bytes
    ),
)
CRAWL_STEP: Codec[CrawlStep, pb.CrawlStepRequest] = Codec(
    pb.CrawlStepRequest,
    lambda c: pb.CrawlStepRequest(
        stream_id=c.stream_id,
        task_id=c.task_id,
        walk_id=c.walk_id,
        parents=prefixes_to_bytes(c.parents),
        depth=c.depth,
        steps=c.steps,
        prep_shares=c.prep_shares,
        reports=c.reports,
    ),
    lambda m: CrawlStep(
        m.stream_id,
        m.task_id,
        m.walk_id,
        _prefixes(m.parents),
        m.depth,
        m.steps,
        m.prep_shares,
        m.reports,
    ),
)
CRAWL_STEP_RESULT: Codec[CrawlStepResult, pb.CrawlStepResult] = Codec(
    pb.CrawlStepResult,
    lambda r: pb.CrawlStepResult(prep_shares=r.prep_shares),
    lambda m: CrawlStepResult(m.prep_shares),
)


def _header_to_pb(h: ChunkHeader) -> pb.ChunkHeader:
    """The flat ChunkHeader: which of its fields are set says the kind."""
    if isinstance(h, RobustChunk):
        return pb.ChunkHeader(
            robust_task_id=h.task_id, coord_lo=h.coord_lo, coord_hi=h.coord_hi, pass_id=h.pass_id
        )
    if isinstance(h, NoiseBatch):
        p = h.prepared
        return pb.ChunkHeader(
            stream_id=h.stream_id,
            joint_batch=True,
            joint_lo=h.lo,
            joint_count=h.count,
            joint_gamma=h.gamma,
            prepared_task_id=p.task_id if p else "",
            prepared_shape=p.shape if p else "",
            prepared_epoch=p.epoch if p else b"",
            prepared_move=h.move,
            prepared_lo=h.source_lo,
        )
    return pb.ChunkHeader(
        stream_id=h.stream_id,
        chunk_no=h.chunk_no,
        compare=h.kind == ChunkKind.COMPARE,
        queries=_queries_to_pb(h.queries),
        noisy_max=h.kind == ChunkKind.NMAX,
        noisy_max_more=h.more,
        crawl=h.kind == ChunkKind.CRAWL,
        joint_lo=h.pool.lo,
        joint_count=h.pool.count,
        joint_gamma=h.pool.gamma,
    )


def _robust_from_pb(m: pb.ChunkHeader) -> RobustChunk:
    return RobustChunk(m.robust_task_id, m.coord_lo, m.coord_hi, m.pass_id)


def _header_from_pb(m: pb.ChunkHeader) -> ChunkHeader:
    """A robust task id makes a robust chunk, `joint_batch` a noise batch,
    else it is a stream's chunk (`compare`: a Compare chunk, `noisy_max`: a
    report-noisy-max chunk, at most one of the two).  A range-validation
    header (the retired garbled range check of an older leader) is refused."""
    if m.validate_task_id:
        raise InvalidArgument(
            "the garbled range check at the close is retired: reports prove their "
            "validity at ingest (upgrade the leader)"
        )
    if m.robust_task_id:
        return _robust_from_pb(m)
    if m.joint_batch:
        if m.compare or m.noisy_max or m.noisy_max_more or m.crawl or m.chunk_no or m.queries.index:
            raise InvalidArgument("a noise batch header carries no chunk")
        prepared = None
        if m.prepared_task_id or m.prepared_shape or m.prepared_epoch:
            prepared = PreparedRef(m.prepared_task_id, m.prepared_shape, m.prepared_epoch)
        if (m.prepared_move or m.prepared_lo) and (prepared is None or not m.stream_id):
            raise InvalidArgument("a prepared-noise move names its pool and its stream")
        if prepared is None and not m.stream_id:
            raise InvalidArgument("a noise batch names a stream or a prepared pool")
        if prepared is not None and m.stream_id and not m.prepared_move:
            raise InvalidArgument("a batch for a stream names a prepared pool only to move from it")
        return NoiseBatch(
            m.stream_id,
            m.joint_lo,
            m.joint_count,
            m.joint_gamma,
            prepared,
            m.prepared_move,
            m.prepared_lo,
        )
    if m.compare + m.noisy_max + m.crawl > 1:
        raise InvalidArgument("a chunk header names two kinds (of compare, noisy_max, crawl)")
    if m.noisy_max_more and not m.noisy_max:
        raise InvalidArgument("only a noisy_max chunk has more to follow")
    kind = (
        ChunkKind.COMPARE
        if m.compare
        else ChunkKind.NMAX
        if m.noisy_max
        else ChunkKind.CRAWL
        if m.crawl
        else ChunkKind.ASK
    )
    pool = PoolDraw(m.joint_lo, m.joint_count, m.joint_gamma)
    queries = _queries_from_pb(m.queries)
    return StreamChunk(kind, m.stream_id, m.chunk_no, queries, m.noisy_max_more, pool)


CHUNK_HEADER: Codec[ChunkHeader, pb.ChunkHeader] = Codec(
    pb.ChunkHeader, _header_to_pb, _header_from_pb
)

#: What a leased job of each kind carries, and what it answers (None: the bytes
#: themselves).
_JOB_INPUTS: dict[ChunkKind, Codec[Any, Any]] = {
    ChunkKind.ASK: ASK,
    ChunkKind.COMPARE: COMPARE,
    ChunkKind.ROBUST: Codec(pb.ChunkHeader, _header_to_pb, _robust_from_pb),
    ChunkKind.NMAX: NOISY_MAX,
}
_JOB_ANSWERS: dict[ChunkKind, Codec[Any, Any] | None] = {
    ChunkKind.ASK: ASK_ANSWER,
    ChunkKind.COMPARE: COMPARE_ANSWER,
    ChunkKind.ROBUST: None,
    ChunkKind.NMAX: NOISY_MAX_ANSWER,
}


def job_payload(inputs: JobInputs) -> tuple[ChunkKind, bytes]:
    """A leased job's kind and payload (an AskRequest, a CompareRequest, a
    NoisyMaxRequest, or the close-time chunk's ChunkHeader)."""
    kind = ChunkKind.of_inputs(inputs)
    return kind, _JOB_INPUTS[kind].encode(inputs)


def job_inputs(kind: ChunkKind, payload: bytes) -> JobInputs:
    out: JobInputs = _JOB_INPUTS[kind].decode(payload)
    return out


def job_result(kind: ChunkKind, answer: JobAnswer) -> bytes:
    codec = _JOB_ANSWERS[kind]
    if codec is None:
        assert isinstance(answer, bytes)
        return answer
    return codec.encode(answer)


def job_answer(kind: ChunkKind, result: bytes) -> JobAnswer:
    codec = _JOB_ANSWERS[kind]
    out: JobAnswer = result if codec is None else codec.decode(result)
    return out


# ---------------------------------------------------------------- the Peer service
@dataclass(frozen=True)
class PeerCall(Generic[Q, R]):
    """One of the helper's unary calls: the Peer RPC, its request and reply."""

    name: str
    request: Codec[Q, Any]
    reply: Codec[R, Any]


CREATE_TASK = PeerCall("CreateTask", TASK_SPEC, TASK_INFO)
DIGEST = PeerCall("Digest", TASK_REF, REPORT_SET)
CLOSE_COLLECTION = PeerCall("CloseCollection", TASK_REF, REPORT_SET)
LIST_REPORTS = PeerCall("ListReports", REPORT_PAGE, REPORT_IDS)
DROP_REPORTS = PeerCall("DropReports", REPORT_IDS, REPORT_SET)
MARK_AGREED = PeerCall("MarkAgreed", AGREEMENT, TASK_INFO)
BUDGET = PeerCall("Budget", TASK_REF, TASK_INFO)
PREPARE_STREAM = PeerCall("PrepareStream", PREPARE, STREAM_INFO)
FAIL_STREAM = PeerCall("FailStream", STREAM_REF, STREAM_INFO)
RESERVE_PLAN = PeerCall("ReservePlan", PLAN_REQUEST, PLAN_INFO)
END_PLAN = PeerCall("EndPlan", PLAN_REF, PLAN_INFO)
FAIL_PLAN = PeerCall("FailPlan", PLAN_REF, PLAN_INFO)
VERIFY = PeerCall("Verify", VERIFY_BATCH, VERIFY_RESULT)
CRAWL = PeerCall("CrawlStep", CRAWL_STEP, CRAWL_STEP_RESULT)
