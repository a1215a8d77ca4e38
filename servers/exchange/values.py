"""The servers' exchanges as domain values: what the analyst asks the leader and
gets back, what the leader asks the helper and gets back (each of the Peer
service's unary calls), and what a comparison chunk is.

These are the types the drivers, the core and the ports speak; protobuf is
converted to and from them at the edges only (`servers.edge.wire`).  Rationals the
analyst proposes (a stream's ε, a plan's groups, a task's budget: its proposal
is `dp.task.TaskSpec`) stay the text the analyst wrote until the core validates
them, so every refusal reads as it always did and the leader forwards them to
the helper as written; everything a server reports (ledgers, charges, refunds)
is an exact `Fraction`.

A chunk is one of six kinds (`ChunkKind`): an Ask, a Compare or a
report-noisy-max chunk of a stream, a robust-aggregate chunk of the close,
a batch of a joint-noise stream's noise generated ahead of its chunks, or the
comparison of one level of a prefix crawl.
Each kind's `ChunkSpec` names its header, the inputs a leased job of that
kind carries, the stream kinds it answers, and its progress rule — how many
queries a result answers and whether the stream closes — written once for both
servers (the Ask rule in `dp.queries.ask_progress`, which the analyst's remote
oracle reads its answers with too)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from svtagg.dp.kinds import ABOVE_THRESHOLD_KINDS, StreamKind
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import (
    Budget,
    Outcome,
    Progress,
    ask_progress,
    noisy_max_progress,
)
from svtagg.dp.task import TaskParams
from svtagg.mpc.circuits import CLOSE
from svtagg.servers.exchange.machine import Flow
from svtagg.servers.store.rules import OPEN, StreamState, TaskState

#: (plan id, group) of a stream charged to a plan's group.
PlanSlot = tuple[str, int]


# ---------------------------------------------------------------- tasks
@dataclass(frozen=True)
class TaskInfo:
    """A task as a server reports it: its parameters, its reports, its ledger."""

    params: TaskParams
    n: int
    collection_open: bool
    budget: Budget
    streams: int
    agreed: bool
    #: The helper's ledger, when the leader describes a task with it.
    helper_budget: Budget | None = None
    #: The close: reports taken out (held by one server only, or out of range).
    dropped_reports: int = 0
    #: Peer CreateTask's answer only: the Prio3 verify key the helper drew.
    verify_key: bytes = b""
    #: Reports refused at ingest for a failed validity proof: (reason, count).
    rejected: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, t: TaskState) -> TaskInfo:
        return cls(
            t.params, t.n, t.collection_open, t.budget, t.streams, t.agreed, rejected=t.rejected
        )


# ---------------------------------------------------------------- the close
@dataclass(frozen=True)
class ReportSet:
    """One server's report set of a task: its size and digest, and (the close's
    answer) whether that server has already agreed on it."""

    n: int
    digest: bytes
    agreed: bool = False

    def same_as(self, task: TaskState) -> bool:
        """Whether this is the report set `task` holds."""
        return (self.n, self.digest) == (task.n, task.digest)


@dataclass(frozen=True)
class ReportPage:
    """One page of a closed task's report ids, ascending, after `after` (b"":
    from the first), at most `limit` (0: the helper's page size)."""

    task_id: str
    after: bytes = b""
    limit: int = 0


@dataclass(frozen=True)
class ReportIds:
    """Report ids of a task: a page of them (`more`: further ids follow), or
    the ids the helper is to drop."""

    task_id: str
    ids: tuple[bytes, ...]
    more: bool = False


@dataclass(frozen=True)
class Agreement:
    """The leader's report set, for the helper to agree on, and the
    robust-aggregate pass whose staged shares the helper keeps."""

    task_id: str
    n: int
    digest: bytes
    pass_id: bytes


# ---------------------------------------------------------------- ingest verification
@dataclass(frozen=True)
class VerifyBatch:
    """One upload batch of a task with a validity circuit, for the helper to
    verify: the report ids in the batch's order and the leader's encoded Prio3
    prep share of each (b"": the leader could not decode its input share)."""

    task_id: str
    ids: tuple[bytes, ...]
    prep_shares: tuple[bytes, ...]


@dataclass(frozen=True)
class VerifyResult:
    """The helper's side of a batch: its prep shares (empty when `replayed`),
    one verdict byte per report, and its n after folding the valid ones."""

    prep_shares: tuple[bytes, ...]
    verdicts: bytes
    replayed: bool
    n: int


# ---------------------------------------------------------------- streams
@dataclass(frozen=True)
class OpenStream:
    """The analyst's request for a stream (ε and δ as written)."""

    task_id: str
    kind: StreamKind
    epsilon: str
    delta: str = ""
    plan: PlanSlot | None = None


@dataclass(frozen=True)
class PrepareStream:
    """The leader's stream, for the helper to charge and draw its own γ; or
    (`replay`) the charge of a stream the leader failed and the helper never
    saw, recorded there as failed."""

    stream_id: str
    task_id: str
    kind: StreamKind
    epsilon: str
    delta: str = ""
    plan: PlanSlot | None = None
    replay: bool = False

    @classmethod
    def opened(cls, stream_id: str, request: OpenStream) -> PrepareStream:
        """The helper's half of the analyst's `request`, as the analyst wrote it."""
        r = request
        return cls(stream_id, r.task_id, r.kind, r.epsilon, r.delta, r.plan)

    @classmethod
    def replay_of(cls, s: StreamState) -> PrepareStream:
        """The charge of the leader's failed stream `s`, replayed on the helper."""
        delta = str(s.delta) if s.delta else ""
        return cls(s.stream_id, s.task_id, s.kind, str(s.epsilon), delta, s.plan, replay=True)


@dataclass(frozen=True)
class StreamInfo:
    """A stream as a server reports it."""

    stream_id: str
    task_id: str
    kind: StreamKind
    epsilon: Fraction
    delta: Fraction
    closed: bool
    queries_answered: int

    @classmethod
    def of(cls, s: StreamState) -> StreamInfo:
        return cls(s.stream_id, s.task_id, s.kind, s.epsilon, s.delta, s.state != OPEN, s.queries)


# ---------------------------------------------------------------- plans
@dataclass(frozen=True)
class PlanGroup:
    """One group of a budget plan (ε and δ as written)."""

    epsilon: str
    delta: str = ""


@dataclass(frozen=True)
class PlanRequest:
    """A budget plan to reserve: its groups and slack δ' (as written); the
    leader names the plan when it reserves it on the helper."""

    task_id: str
    groups: tuple[PlanGroup, ...]
    delta_slack: str = ""
    plan_id: str = ""

    @classmethod
    def of_book(cls, task_id: str, book: PlanBook, plan_id: str) -> PlanRequest:
        """The request that reserves `book`'s groups and slack again."""
        groups = tuple(PlanGroup(str(g.epsilon), str(g.delta)) for g in book.groups)
        return cls(task_id, groups, str(book.slack), plan_id)

    def pairs(self) -> list[tuple[str, str]]:
        """The groups as (ε, δ) pairs, for `dp.plans.parse_groups`."""
        return [(g.epsilon, g.delta) for g in self.groups]


@dataclass(frozen=True)
class PlanInfo:
    """A plan as a server reports it: its charge, its state, and (when ended)
    what it refunded."""

    plan_id: str
    task_id: str
    epsilon: Fraction
    delta: Fraction
    rule: str
    state: str
    refunded_epsilon: Fraction = Fraction(0)
    refunded_delta: Fraction = Fraction(0)


# ---------------------------------------------------------------- chunks
_NO_FLAGS: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)
_NO_FLAGS.flags.writeable = False


def compare_progress(codes: Sequence[int], k: int) -> Progress:
    """A Compare chunk: every outcome returned (up to and including the first
    CLOSE) is answered; a CLOSE closes the stream."""
    return Progress(len(codes), CLOSE in codes)


def frozen_ints(values: Any) -> npt.NDArray[Any]:
    """A read-only int64 copy of `values` (a sequence, an array or a protobuf
    repeated field, read at C speed); values beyond int64 stay exact Python ints
    (dtype object) for the bound checks to refuse."""
    try:
        arr = np.array(values, dtype=np.int64)
    except OverflowError:
        arr = np.array(list(values), dtype=object)
    arr.flags.writeable = False
    return arr


def frozen_flags(values: Any) -> npt.NDArray[np.bool_]:
    arr = np.array(values, dtype=np.bool_)
    arr.flags.writeable = False
    return arr


class _Vectors:
    """A frozen record whose `_vectors` fields are read-only numpy arrays: each
    given value frozen into one by its function, equality and hashing by dtype
    kind and values (as tuples compared)."""

    _vectors: dict[str, Callable[[Any], npt.NDArray[Any]]] = {}

    def __post_init__(self) -> None:
        for name, freeze in self._vectors.items():
            object.__setattr__(self, name, freeze(getattr(self, name)))

    def _key(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out.append((v.dtype.kind, tuple(v.tolist())) if f.name in self._vectors else v)
        return tuple(out)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True, eq=False)
class Queries(_Vectors):
    """A chunk's queries: query j is (index[j], complement[j]); no flags, all plain.
    Both are read-only arrays (any sequence given is copied into one): a chunk
    of 10^4 queries crosses the servers as arrays, never as Python ints."""

    index: npt.NDArray[Any]
    complement: npt.NDArray[np.bool_] = field(default_factory=lambda: _NO_FLAGS)
    _vectors = {"index": frozen_ints, "complement": frozen_flags}


@dataclass(frozen=True, eq=False)
class Ask(_Vectors):
    """An Ask chunk as the analyst sends it (thresholds in grid units, read-only)."""

    stream_id: str
    queries: Queries
    tau: npt.NDArray[Any]
    _vectors = {"tau": frozen_ints}


@dataclass(frozen=True, eq=False)
class Compare(_Vectors):
    """A Compare chunk as the analyst sends it (thresholds in grid units, read-only)."""

    stream_id: str
    queries: Queries
    tau_low: npt.NDArray[Any]
    tau_high: npt.NDArray[Any]
    _vectors = {"tau_low": frozen_ints, "tau_high": frozen_ints}


@dataclass(frozen=True)
class NoisyMax:
    """A report-noisy-max chunk as the analyst sends it: the candidates, and
    whether more chunks of the stream's tournament follow (`more`: nothing is
    revealed, the winner so far is carried secret-shared; the chunk without it
    reveals the index over all the stream's candidates and closes the stream)."""

    stream_id: str
    queries: Queries
    more: bool = False


@dataclass(frozen=True)
class AskAnswer:
    """An Ask chunk's answer: the first YES in the chunk (None: none)."""

    index: int | None
    closed: bool
    peer_bytes: int
    #: A joint-noise stream: the queries whose ν was drawn in the chunk (none ready).
    noise_drawn: int = 0

    @property
    def yes(self) -> bool:
        return self.index is not None


@dataclass(frozen=True)
class CompareAnswer:
    """A Compare chunk's answer: outcomes up to and including the first CLOSE."""

    outcomes: tuple[Outcome, ...]
    closed: bool
    peer_bytes: int


@dataclass(frozen=True)
class NoisyMaxAnswer:
    """A report-noisy-max chunk's answer: the position of the largest noisy
    score among the stream's candidates, all chunks counted (the stream is
    closed by it); None for a chunk with more to follow (the stream stays open)."""

    index: int | None
    closed: bool
    peer_bytes: int


# ---------------------------------------------------------------- the prefix crawl
@dataclass(frozen=True)
class CrawlLevel:
    """One level of a prefix crawl as the analyst asks it (servers/crawl.py):
    the walk ("" starts one at the root), the last level's candidates to
    extend (`depth` bits each; none at the root), the bits to extend them by,
    the level's ε (as written) and the threshold on the counts."""

    task_id: str
    walk_id: str
    parents: tuple[int, ...]
    depth: int
    steps: int
    epsilon: str
    tau: int


@dataclass(frozen=True)
class CrawlAnswer:
    """A crawl level's answer: which candidates (parents × 2^steps,
    parent-major) hold a noisy count ≥ τ, the reports its check took out of
    the walk, and the bytes exchanged with the helper."""

    walk_id: str
    stream_id: str
    above: tuple[bool, ...]
    refused: int
    peer_bytes: int


@dataclass(frozen=True)
class CrawlStep:
    """The leader's side of a crawl level for the helper: the level's stream
    (charged on both), the walk, the parents, and the leader's prep shares of
    the level's check (`reports` rows of 32·steps bytes, ascending report id)."""

    stream_id: str
    task_id: str
    walk_id: str
    parents: tuple[int, ...]
    depth: int
    steps: int
    prep_shares: bytes
    reports: int


@dataclass(frozen=True)
class CrawlStepResult:
    """The helper's prep shares of a crawl level, laid out as the leader's."""

    prep_shares: bytes


def crawl_progress(result: Any, k: int) -> Progress:
    """A crawl level's chunk answers every candidate and closes its stream."""
    return Progress(k, True)


class ChunkKind(StrEnum):
    """The kinds of chunk (the strings are a leased job's `kind`)."""

    ASK = "ask"
    COMPARE = "compare"
    ROBUST = "robust"
    NMAX = "nmax"
    NOISE = "noise"
    CRAWL = "crawl"

    @property
    def spec(self) -> ChunkSpec:
        return _SPECS[self]

    @classmethod
    def of_stream(cls, kind: StreamKind) -> ChunkKind:
        """The kind of chunk a stream of `kind` answers."""
        return next(k for k in cls if kind in k.spec.streams)

    @classmethod
    def of_inputs(cls, inputs: JobInputs) -> ChunkKind:
        """The kind of chunk a leased job's inputs run."""
        return next(k for k in cls if isinstance(inputs, k.spec.inputs))


@dataclass(frozen=True)
class PoolDraw:
    """The ahead-of-time joint noise an Ask chunk of a joint-noise stream
    consumes (servers/exchange/joint.py): ν of its first `count` queries from the
    samples numbered [lo, lo + count) of the stream's pool (the rest drawn in
    the chunk), and (its first chunk) whether γ comes from the pool too
    instead of being drawn in the chunk.  The default: nothing from the pool."""

    lo: int = 0
    count: int = 0
    gamma: bool = False


@dataclass(frozen=True)
class StreamChunk:
    """The header of a stream's chunk (Ask, Compare or noisy-max): the stream, the chunk's
    number in it (1, 2, ...; the helper refuses any other), the queries, and
    (a joint-noise stream) the pooled noise it consumes."""

    FLOW: ClassVar[Flow] = Flow.STREAM

    kind: ChunkKind
    stream_id: str
    chunk_no: int
    queries: Queries
    #: A report-noisy-max chunk with more of its tournament to follow (`NoisyMax.more`).
    more: bool = False
    pool: PoolDraw = PoolDraw()

    def __post_init__(self) -> None:
        if self.kind.spec.header is not StreamChunk:
            raise ValueError(f"a {self.kind.value} chunk belongs to no stream")
        if self.more and self.kind != ChunkKind.NMAX:
            raise ValueError("only a report-noisy-max chunk has more to follow")


@dataclass(frozen=True)
class RobustChunk:
    """The header of a robust-aggregate chunk of the close: coordinates
    [coord_lo, coord_hi) of the task re-shared as g(S), staged on the helper
    under the pass `pass_id`."""

    FLOW: ClassVar[Flow] = Flow.ROBUST

    task_id: str
    coord_lo: int
    coord_hi: int
    pass_id: bytes

    @property
    def kind(self) -> ChunkKind:
        return ChunkKind.ROBUST


@dataclass(frozen=True)
class NoiseBatch:
    """The header of a joint-noise batch (ahead of the chunks that use it): `count`
    of a joint-noise stream's ν samples, numbered [lo, lo + count) in its pool,
    and (`gamma`) one γ sample, generated and kept by both servers."""

    FLOW: ClassVar[Flow] = Flow.BATCH

    stream_id: str
    lo: int
    count: int
    gamma: bool = False
    #: Prepared noise (servers/exchange/prepared.py): the pool of one task and
    #: sampler shape, at its generation `epoch`.  With `stream_id` empty the
    #: batch fills that pool ([lo, lo + count) of its numbering); with
    #: `stream_id` set and `move`, the pool's samples [source_lo, source_lo +
    #: count) become the stream's [lo, lo + count): nothing is generated.
    prepared: PreparedRef | None = None
    move: bool = False
    source_lo: int = 0

    @property
    def kind(self) -> ChunkKind:
        return ChunkKind.NOISE

    @property
    def fills_prepared(self) -> bool:
        return not self.stream_id and self.prepared is not None


@dataclass(frozen=True)
class PreparedRef:
    """A task's prepared pool of one sampler shape (`shape`: "kind:ε") at one
    generation (`epoch`: 16 random bytes the leader draws per pool)."""

    task_id: str
    shape: str
    epoch: bytes


ChunkHeader = StreamChunk | RobustChunk | NoiseBatch
#: What a leased job carries: the analyst's chunk, or a close-time chunk's header.
JobInputs = Ask | Compare | NoisyMax | RobustChunk
#: What a leased job answers: the analyst's answer, or a close-time chunk's bytes.
JobAnswer = AskAnswer | CompareAnswer | NoisyMaxAnswer | bytes


@dataclass(frozen=True)
class ChunkSpec:
    """What makes a chunk kind: its header's type, the inputs a leased job of
    the kind carries, the stream kinds it answers (none: a close-time chunk)
    and its progress rule (result, queries in the chunk) → `Progress`."""

    header: type
    inputs: type
    streams: frozenset[StreamKind]
    progress: Callable[[Any, int], Progress] | None


_SPECS = {
    ChunkKind.ASK: ChunkSpec(
        StreamChunk,
        Ask,
        ABOVE_THRESHOLD_KINDS,
        ask_progress,
    ),
    ChunkKind.COMPARE: ChunkSpec(
        StreamChunk, Compare, frozenset({StreamKind.CTT}), compare_progress
    ),
    ChunkKind.ROBUST: ChunkSpec(RobustChunk, RobustChunk, frozenset(), None),
    ChunkKind.NMAX: ChunkSpec(
        StreamChunk, NoisyMax, frozenset({StreamKind.NMAX}), noisy_max_progress
    ),
    # Run by the leader on its own sessions, never leased (no JobInputs).
    ChunkKind.NOISE: ChunkSpec(NoiseBatch, NoiseBatch, frozenset(), None),
    # A crawl level's comparison: run by the leader's main process, never leased.
    ChunkKind.CRAWL: ChunkSpec(
        StreamChunk, CrawlLevel, frozenset({StreamKind.CRAWL}), crawl_progress
    ),
}
