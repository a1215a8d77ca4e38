"""The servers' protobuf edge (servers/edge/wire.py) and the domain exchanges it
converts (servers/exchange/values.py): every Peer call's request and reply comes back
from its bytes as it went in, the flat ChunkHeader decodes by the rule the
helper has always applied, leased jobs keep their kinds and payloads, and the
chunk kinds' progress rules and names are the ones the servers and the work
table use."""

from __future__ import annotations

import inspect
import re
from fractions import Fraction
from typing import Any

import pytest

from svtagg.dp.errors import InvalidArgument
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Budget, Outcome
from svtagg.dp.task import TaskParams, TaskSpec
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.edge import wire
from svtagg.servers.exchange.values import (
    Agreement,
    Ask,
    AskAnswer,
    ChunkKind,
    Compare,
    CompareAnswer,
    CrawlAnswer,
    CrawlLevel,
    CrawlStep,
    CrawlStepResult,
    NoiseBatch,
    NoisyMax,
    NoisyMaxAnswer,
    PlanGroup,
    PlanInfo,
    PlanRequest,
    PoolDraw,
    PreparedRef,
    PrepareStream,
    Progress,
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
    ask_progress,
    compare_progress,
    noisy_max_progress,
)
from svtagg.servers.store import postgres_schema as store_pg_schema

PARAMS = TaskParams("t", 4, 16, 1000, 1, Fraction(20), Fraction(1, 1000), Fraction(1, 10), True)
PROOF_PARAMS = TaskParams(
    "t", 4, 16, 1000, 1, Fraction(20), Fraction(0), Fraction(1, 10), False, "", "multihot:2"
)
INFO = TaskInfo(PARAMS, 12, False, Budget(Fraction(20), Fraction(1, 1000), Fraction(3, 2)), 3, True)
PLAN = PlanInfo("p" * 32, "t", Fraction(3, 4), Fraction(0), "basic", "ended", Fraction(1, 4))
STREAM = StreamInfo("s" * 32, "t", StreamKind.CTT, Fraction(1, 2), Fraction(1, 10**4), True, 7)

#: A request and a reply of each of the helper's unary calls.
EXCHANGES: list[tuple[wire.PeerCall[Any, Any], Any, Any]] = [
    (wire.CREATE_TASK, TaskSpec("t", 4, 16, 1000, 1, "20", "0.001", "1/10", True, "vectors"), INFO),
    (wire.DIGEST, "t", ReportSet(12, b"d" * 16)),
    (wire.CLOSE_COLLECTION, "t", ReportSet(12, b"d" * 16, agreed=True)),
    (wire.LIST_REPORTS, ReportPage("t", b"a" * 16, 7), ReportIds("t", (b"b" * 16,), more=True)),
    (wire.DROP_REPORTS, ReportIds("t", (b"b" * 16, b"c" * 16)), ReportSet(10, b"e" * 16)),
    (wire.MARK_AGREED, Agreement("t", 10, b"e" * 16, b"p" * 16), INFO),
    (wire.BUDGET, "t", INFO),
    (
        wire.PREPARE_STREAM,
        PrepareStream("s" * 32, "t", StreamKind.CTT, "0.5", "1/10000", ("p" * 32, 1), True),
        STREAM,
    ),
    (wire.FAIL_STREAM, "s" * 32, STREAM),
    (
        wire.RESERVE_PLAN,
        PlanRequest("t", (PlanGroup("1/2"), PlanGroup("1/4", "1/10^6")), "1e-6", "p" * 32),
        PLAN,
    ),
    (wire.END_PLAN, "p" * 32, PLAN),
    (wire.FAIL_PLAN, "p" * 32, PLAN),
    (
        wire.VERIFY,
        VerifyBatch("t", (b"a" * 16, b"b" * 16), (b"leader prep share", b"")),
        VerifyResult((b"helper prep share", b""), b"\x00\x03", False, 11),
    ),
    (
        wire.CRAWL,
        CrawlStep("s" * 32, "t", "w" * 32, (3, (1 << 255) + 7), 8, 4, b"x" * 256, 2),
        CrawlStepResult(b"y" * 256),
    ),
]


@pytest.mark.parametrize("call, request_, reply", EXCHANGES, ids=[c.name for c, _, _ in EXCHANGES])
def test_every_peer_call_comes_back_from_its_bytes(
    call: wire.PeerCall[Any, Any], request_: Any, reply: Any
) -> None:
    assert call.request.decode(call.request.encode(request_)) == request_
    assert call.reply.decode(call.reply.encode(reply)) == reply
    assert call.name in pb.DESCRIPTOR.services_by_name["Peer"].methods_by_name


def test_the_rpcs_are_all_there() -> None:
    """One PeerCall per unary RPC of the Peer service (Session is the stream)."""
    unary = set(pb.DESCRIPTOR.services_by_name["Peer"].methods_by_name) - {"Session"}
    assert {c.name for c, _, _ in EXCHANGES} == unary


def test_analyst_values_come_back_from_their_bytes() -> None:
    q = Queries((3, 2, 1), (False, False, True))
    for codec, value in [
        (wire.ASK, Ask("s", q, (1 << 20, -(1 << 20), 0))),
        (wire.COMPARE, Compare("s", q, (-5,) * 3, (5,) * 3)),
        (wire.ASK_ANSWER, AskAnswer(None, False, 10)),
        (wire.ASK_ANSWER, AskAnswer(0, True, 10)),
        (wire.COMPARE_ANSWER, CompareAnswer((Outcome.HIGH, Outcome.LOW, Outcome.CLOSE), True, 9)),
        (wire.CRAWL_LEVEL, CrawlLevel("t", "", (), 0, 8, "1/8", 40)),
        (wire.CRAWL_LEVEL, CrawlLevel("t", "w" * 32, (5, 1 << 200), 201, 3, "1", 1)),
        (wire.CRAWL_ANSWER, CrawlAnswer("w" * 32, "s" * 32, (True,) + (False,) * 8, 2, 99)),
        (wire.TASK_INFO, TaskInfo(PARAMS, 1, True, INFO.budget, 0, False, INFO.budget, 2)),
        (
            wire.TASK_INFO,
            TaskInfo(
                PROOF_PARAMS, 1, True, INFO.budget, 0, False, rejected=(("invalid_proof", 2),)
            ),
        ),
        (
            wire.TASK_INFO,
            TaskInfo(PROOF_PARAMS, 0, True, INFO.budget, 0, False, verify_key=b"k" * 16),
        ),
    ]:
        assert codec.decode(codec.encode(value)) == value  # type: ignore[attr-defined]


def test_a_first_yes_at_zero_is_a_yes() -> None:
    """The wire's (yes, index) pair: index 0 with yes is a YES at 0, not none."""
    sent = wire.ASK_ANSWER.to_pb(AskAnswer(0, True, 1))
    assert sent.yes and sent.index == 0
    assert wire.ASK_ANSWER.from_pb(pb.AskResponse(index=0)).index is None


def test_the_flat_chunk_header_decodes_as_the_helper_always_read_it() -> None:
    """A robust task id wins over a stream; `compare` makes a stream's chunk a
    Compare chunk; a range-validation header (the retired garbled range check of
    an older leader) is refused.  Each domain header goes out with only its own
    fields set."""
    with pytest.raises(InvalidArgument, match="retired"):
        wire.CHUNK_HEADER.from_pb(pb.ChunkHeader(validate_task_id="v", report_ids=b"r" * 16))
    robust = pb.ChunkHeader(stream_id="s", robust_task_id="r", coord_lo=1, coord_hi=2)
    assert wire.CHUNK_HEADER.from_pb(robust) == RobustChunk("r", 1, 2, b"")
    compare = pb.ChunkHeader(stream_id="s", chunk_no=2, compare=True)
    assert wire.CHUNK_HEADER.from_pb(compare) == StreamChunk(ChunkKind.COMPARE, "s", 2, Queries(()))
    for header in (
        RobustChunk("r", 0, 4096, b"p" * 16),
        StreamChunk(ChunkKind.ASK, "s", 1, Queries((0, 1), (False, True))),
        StreamChunk(ChunkKind.COMPARE, "s", 3, Queries((2,))),
        StreamChunk(ChunkKind.NMAX, "s", 1, Queries((4, 0, 9), (False, True, False))),
        StreamChunk(ChunkKind.ASK, "s", 1, Queries((0, 1)), pool=PoolDraw(2**40, 2, True)),
        NoiseBatch("s", 2**40 + 2, 10_000, True),
        NoiseBatch("s", 0, 1),
        NoiseBatch("", 7, 5000, False, PreparedRef("t", "lap24:1/40", b"e" * 16)),
        NoiseBatch("s", 3, 10, False, PreparedRef("t", "exp3:1", b"e" * 16), True, 2**40),
    ):
        assert wire.CHUNK_HEADER.decode(wire.CHUNK_HEADER.encode(header)) == header
    # An older leader's Ask header takes nothing from a pool.
    old = wire.CHUNK_HEADER.from_pb(pb.ChunkHeader(stream_id="s", chunk_no=1))
    assert isinstance(old, StreamChunk) and old.pool == PoolDraw()
    with pytest.raises(InvalidArgument, match="no chunk"):
        wire.CHUNK_HEADER.from_pb(pb.ChunkHeader(stream_id="s", chunk_no=1, joint_batch=True))
    # A prepared-noise move names its pool and its stream; a batch names one or the other.
    with pytest.raises(InvalidArgument, match="names its pool and its stream"):
        wire.CHUNK_HEADER.from_pb(
            pb.ChunkHeader(stream_id="s", joint_batch=True, prepared_move=True)
        )
    with pytest.raises(InvalidArgument, match="names a stream or a prepared pool"):
        wire.CHUNK_HEADER.from_pb(pb.ChunkHeader(joint_batch=True, joint_count=3))
    nmax = pb.ChunkHeader(stream_id="s", chunk_no=1, noisy_max=True)
    assert wire.CHUNK_HEADER.from_pb(nmax) == StreamChunk(ChunkKind.NMAX, "s", 1, Queries(()))
    with pytest.raises(InvalidArgument, match="two kinds"):
        wire.CHUNK_HEADER.from_pb(pb.ChunkHeader(stream_id="s", compare=True, noisy_max=True))
    with pytest.raises(ValueError, match="no stream"):
        StreamChunk(ChunkKind.ROBUST, "s", 1, Queries((0,)))


def test_leased_jobs_keep_their_kind_and_payload() -> None:
    q = Queries((0,))
    jobs = [
        (Ask("s", q, (1,)), ChunkKind.ASK, AskAnswer(None, False, 3)),
        (Compare("s", q, (-1,), (1,)), ChunkKind.COMPARE, CompareAnswer((), False, 3)),
        (RobustChunk("t", 0, 2, b"p" * 16), ChunkKind.ROBUST, bytes(16)),
        (NoisyMax("s", Queries((3, 1), (True, False))), ChunkKind.NMAX, NoisyMaxAnswer(1, True, 3)),
    ]
    for inputs, kind, answer in jobs:
        got_kind, payload = wire.job_payload(inputs)
        assert got_kind == kind and wire.job_inputs(kind, payload) == inputs
        assert wire.job_answer(kind, wire.job_result(kind, answer)) == answer
    # A close-time chunk's payload is its ChunkHeader, as workers have always read it.
    _, payload = wire.job_payload(RobustChunk("t", 0, 2, b"p" * 16))
    assert pb.ChunkHeader.FromString(payload).robust_task_id == "t"


def test_progress_rules() -> None:
    assert ask_progress(None, 5) == Progress(5, False)
    assert ask_progress(0, 5) == Progress(1, True)
    assert ask_progress(4, 5) == Progress(5, True)
    assert compare_progress([0, 1], 4) == Progress(2, False)
    assert compare_progress([1, 0, 2], 4) == Progress(3, True)
    assert ChunkKind.ASK.spec.progress is ask_progress
    assert ChunkKind.COMPARE.spec.progress is compare_progress
    assert ChunkKind.ROBUST.spec.progress is None
    assert ChunkKind.NMAX.spec.progress is noisy_max_progress
    assert noisy_max_progress(0, 5) == noisy_max_progress(4, 5) == Progress(5, True)


def test_each_stream_kind_answers_one_chunk_kind() -> None:
    assert {k: ChunkKind.of_stream(k) for k in StreamKind} == {
        StreamKind.LAP24: ChunkKind.ASK,
        StreamKind.LAP3: ChunkKind.ASK,
        StreamKind.EXP3: ChunkKind.ASK,
        StreamKind.CTT: ChunkKind.COMPARE,
        StreamKind.NMAX: ChunkKind.NMAX,
        StreamKind.CRAWL: ChunkKind.CRAWL,
    }


def test_chunk_kinds_are_the_work_tables_kinds() -> None:
    """The kinds a leased job may have on disk (the PostgreSQL CHECK, as the
    last migration that sets it leaves it) are the ChunkKind values."""
    found = re.findall(r"CHECK \(kind IN \(([^)]*)\)\)", inspect.getsource(store_pg_schema))
    assert found
    # A crawl level's chunk runs in the leader's main process, never leased.
    leased = {k.value for k in ChunkKind} - {ChunkKind.CRAWL.value}
    assert {k.strip().strip("'") for k in found[-1].split(",")} == leased
