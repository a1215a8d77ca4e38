"""What the servers need from a store, and what the two stores share.

A store is one server's durable state: tasks, seen report ids, running share
sums, the privacy ledger, budget plans and each stream's secret threshold
noise.  `Store` names the operations the servers call and the promises every
store keeps; SQLite (`store_sqlite.SqliteStore`) and PostgreSQL
(`store_pg.PgStore`) implement it side by side, and `store_open.open_store`
picks one from a `--db` value.  This module holds only what both share: the
records a store returns, the rules applied to rows (pure functions) and the
columns both schemas hold.

Durability rules (one committed transaction per step, in both stores):
- an upload batch is stored atomically: its report ids, the sum and n move
  together, so a kill -9 never half-counts a batch and a replay is refused;
- opening a stream charges the ledger and records the stream as `opening` in
  one committed transaction *before* any noise is drawn; a crash never refunds;
- a chunk is marked `in_chunk` (committed) before the comparison runs, and on
  restart every `opening` / `in_chunk` stream is failed closed, so a stream
  interrupted mid-protocol never answers again;
- a joint-noise stream's ahead-of-time shares are consumed (deleted, the
  stream's `used` counter moved past them) in a committed transaction before
  the chunk that uses them compares, and a stream that answers no more keeps
  none (servers/store/jointpool.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from svtagg.dp.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.ledger import Ledger
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import Budget
from svtagg.dp.task import TaskParams
from svtagg.mpc.ring import U64
from svtagg.servers.store.jointpool import JointPool
from svtagg.vdaf.field import FIELD128

DIGEST_BYTES = 16


#: Stream states.  Only `open` answers; `closed` and `failed` are final.
class StreamStatus(StrEnum):
    """Life of a stream in a store (the strings are what the database holds)."""

    OPENING = "opening"  # charged, waiting for the other server (failed on a restart)
    OPEN = "open"
    IN_CHUNK = "in_chunk"  # a chunk is running (failed on a restart: never answers twice)
    CLOSED = "closed"  # answered YES / Close
    FAILED = "failed"  # failed closed; its charge stays spent


OPENING, OPEN, IN_CHUNK, CLOSED, FAILED = StreamStatus

#: Plan states: `active` admits its streams; `ended` (refunded what was unused)
#: and `failed` (never refunded) admit none.
PLAN_ACTIVE, PLAN_ENDED, PLAN_FAILED = "active", "ended", "failed"


@dataclass(frozen=True)
class TaskState:
    params: TaskParams
    n: int
    collection_open: bool
    budget: Budget
    digest: bytes
    streams: int
    #: Both servers hold the same report set (checked when the collection closed).
    agreed: bool = False
    #: The Prio3 verify key of a task with a validity circuit (a server secret).
    verify_key: bytes = field(default=b"", repr=False)
    #: Reports refused at ingest for a failed proof: (reason, count), by reason.
    rejected: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class StreamState:
    stream_id: str
    task_id: str
    kind: StreamKind
    epsilon: Fraction
    delta: Fraction
    gamma: int | None
    state: StreamStatus
    chunks: int
    queries: int
    #: (plan id, group) of a stream charged to a plan's group, None for the task's ledger.
    plan: tuple[str, int] | None = None

    @property
    def closed(self) -> bool:
        return self.state != OPEN


class Store(Protocol):
    """One server's store, as the servers use it.  Not thread-safe: one server,
    one event loop.  Every method that changes state commits before it returns
    (or changes nothing and raises)."""

    #: (stream, task) of the streams this start failed closed (`opening` or
    #: `in_chunk` at the last stop).
    recovered_failed: list[tuple[str, str]]
    #: (plan, task) of the plans active at the last stop, left active: a leader
    #: killed inside ReservePlan may hold one the helper never reserved.
    recovered_plans: list[tuple[str, str]]
    #: How many streams this start failed closed.
    failed_on_recovery: int

    def close(self) -> None: ...

    # ------------------------------------------------------------ tasks
    def create_task(self, p: TaskParams, verify_key: bytes = b"") -> TaskState:
        """Record a new task (AlreadyExists if its id is taken); `verify_key`:
        the Prio3 verify key of a task with a validity circuit."""
        ...

    def task(self, task_id: str) -> TaskState: ...

    def task_ids(self) -> list[str]: ...

    def sums(self, task_id: str) -> U64:
        """This server's share of S = Σ reports (what uploads add to)."""
        ...

    def robust_sums(self, task_id: str) -> U64 | None:
        """This server's share of g(S) (robust aggregates), None before agreement."""
        ...

    # ------------------------------------------------------------ uploads
    def add_reports(
        self,
        task_id: str,
        report_ids: list[bytes],
        shares: list[bytes],
        share_sum: U64,
        verified: Verified | None = None,
    ) -> int:
        """Store one batch atomically; returns the task's n afterwards.  Each report's
        own share (explicit share or seed; b"" for none) is kept until the servers
        agree on the report set, so that a report only one server received can be
        taken out.  A batch holding an id already stored is refused whole
        (AlreadyExists), before the capacity check, so that a batch resent after
        a lost answer is refused as a replay, not as a full task.

        A task with a validity circuit stores only the batch's valid reports,
        `share_sum` is their output shares' sum in the field (its encoding as
        uint64 words, `fold`), and `verified` says what the verification did:
        its verdicts are recorded under the batch id, the refusals counted and
        the batch's pending shares (`add_pending`) dropped, in the same
        transaction."""
        ...

    def add_pending(
        self, task_id: str, report_ids: list[bytes], blobs: list[bytes], cap: int | None = None
    ) -> int:
        """The helper of a task with a validity circuit: keep each report's Prio3
        shares until the leader's verification of its batch (atomically; an id
        already pending keeps its first shares; AlreadyExists if an id is already
        verified; ResourceExhausted, nothing kept, if the task would then hold
        more than `cap` pending reports).  Returns how many reports of the task
        are pending."""
        ...

    def pending(self, task_id: str, report_ids: list[bytes]) -> list[bytes | None]:
        """The pending shares of each report (None: not received)."""
        ...

    def verdicts(self, task_id: str, batch_id: bytes) -> bytes | None:
        """The verdicts recorded for a verified batch (None: not verified here)."""
        ...

    def counted(self, task_id: str, report_ids: list[bytes]) -> int:
        """How many of `report_ids` the task holds as reports (verified or stored)."""
        ...

    def verdict_binding(self, task_id: str, batch_id: bytes) -> bytes | None:
        """What a verified batch's verdicts are bound to (`Verified.binding`;
        None: not verified here, or recorded before bindings were kept)."""
        ...

    def close_collection(self, task_id: str) -> TaskState:
        """No more uploads; pending shares and batch verdicts are dropped."""
        ...

    def shares(self, task_id: str, report_ids: list[bytes]) -> list[bytes]:
        """This server's stored share of each report (until the agreement)."""
        ...

    def report_ids(self, task_id: str, after: bytes = b"", limit: int | None = None) -> list[bytes]:
        """The task's report ids in ascending order: all, or the page of at most
        `limit` after `after` (reconciliation in bounded messages)."""
        ...

    def remove_reports(
        self, task_id: str, report_ids: list[bytes], share_sum: Callable[[list[bytes]], U64]
    ) -> TaskState:
        """Take reports out of a closed collection (atomically): their ids, their
        shares' sum (`share_sum` of their stored shares), n and the digest."""
        ...

    def mark_agreed(self, task_id: str, robust_sums: U64 | None) -> TaskState:
        """Record that both servers hold the same reports, with this server's share
        of the robust aggregates (atomically); per-report shares are no longer
        needed and are dropped (a crawl task's are kept: its walks read them)."""
        ...

    # ------------------------------------------------------------ streams
    def open_stream(
        self,
        stream_id: str,
        task_id: str,
        kind: StreamKind,
        epsilon: Fraction,
        delta: Fraction,
        delta_charge: Fraction,
        plan: tuple[str, int] | None = None,
        *,
        replay: bool = False,
    ) -> None:
        """Charge (ε, delta_charge) — to the task's ledger, or to a group of a
        reserved plan — and record the stream as `opening`, in one committed
        transaction (which `atomic` may extend to the stream's γ).

        `replay` (reconciliation): the other server opened and failed this
        stream while this one never saw it.  It is recorded `failed` (it never
        answers here) with its charge where the stream's own went: the task's
        ledger, or its plan's group whatever the plan's state now — a plan
        ended since refunded that group's unused part without this stream, so
        the task is charged what the refund would have kept back.  Idempotent:
        a stream already recorded is left as it is."""
        ...

    def atomic(self) -> AbstractContextManager[None]:
        """Several of these steps as one transaction: their commits join it (one
        commit, one fsync at its end); an exception rolls all of them back."""
        ...

    def set_threshold_noise(self, stream_id: str, gamma: int, open_now: bool = True) -> None:
        """Store γ; the stream opens now, or (leader) stays `opening` until
        `confirm_stream` once the helper has charged too."""
        ...

    def set_joint_threshold_noise(self, stream_id: str, gamma: int) -> None:
        """Store this server's share of a joint-noise stream's γ, drawn in the
        stream's first chunk (there is no garbled session at the open), durably,
        before that chunk's comparison: refused unless the stream is in its first
        chunk (`in_chunk`, one chunk begun)."""
        ...

    def set_noisy_max_carry(self, stream_id: str, carry: bytes) -> None:
        """Store this server's share of the winner a chunk of a chunked
        report-noisy-max carries to the next (servers/core.py), durably, under
        the chunk's number, before the chunk's end is recorded: refused unless
        the stream is mid-chunk.  The next chunk reads it (`noisy_max_carry`)."""
        ...

    def noisy_max_carry(self, stream_id: str) -> tuple[int, bytes] | None:
        """(chunk number, share) of the last carried winner stored for the
        stream, None if none was."""
        ...

    def add_crawl_level(self, record: CrawlRecord) -> None:
        """Record a level of a prefix-crawl walk this server completed
        (durably; a level recorded again replaces the record)."""
        ...

    def crawl_levels(self, walk_id: str) -> list[CrawlRecord]:
        """The levels recorded for a walk, in level order."""
        ...

    def confirm_stream(self, stream_id: str) -> None:
        """The leader's stream opens once the helper has charged and drawn its γ.
        May commit without waiting for durability: losing it leaves the stream
        `opening`, failed on restart (safe; the ledger reconciliation then makes
        sure the helper's charge stands)."""
        ...

    def stream_ids(self, task_id: str, state: str) -> list[str]:
        """The ids of a task's streams in `state`, in the order they were opened
        (ledger reconciliation)."""
        ...

    def stream(self, stream_id: str) -> StreamState: ...

    def begin_chunk(self, stream_id: str, chunk_no: int | None = None) -> int:
        """Mark the stream mid-chunk (durably) and return the chunk's number.

        The helper passes the leader's chunk number and refuses anything but the
        next one, so a session id is never reused."""
        ...

    def end_chunk(self, stream_id: str, answered: int, close: bool) -> None:
        """Record a chunk's result.  May commit without waiting for durability:
        if a power loss drops this record, the stream is back to `in_chunk` and
        is failed closed on restart, which is safe; the durable commit the chunk
        needs is the one of its `in_chunk` mark."""
        ...

    def fail_stream(self, stream_id: str) -> None:
        """Fail a stream closed (a closed one stays closed); its charge stays spent."""
        ...

    # ------------------------------------------------------------ joint noise pool
    def joint_pool(self, stream_id: str) -> JointPool:
        """The stream's pool of ahead-of-time joint noise shares (servers/store/jointpool.py)."""
        ...

    def reserve_joint_batch(self, stream_id: str, count: int, lo: int | None = None) -> int:
        """Reserve sequence numbers [lo, lo + count) for a batch about to be
        generated, durably, and return lo: the leader's next (lo None), or the
        leader's lo on the helper, refused if any of them was reserved before.
        Refused unless the stream is open (or in a chunk)."""
        ...

    def add_joint_batch(self, stream_id: str, lo: int, nu: U64, gamma: int | None) -> bool:
        """Keep a generated batch of this server's ν shares at [lo, lo + len(nu)),
        durably, and its γ share if it drew one while the stream has begun no
        chunk (else that γ is discarded).  Nothing is kept (False) once the stream
        no longer answers or its samples from lo on are consumed."""
        ...

    def take_joint_noise(self, stream_id: str, lo: int, count: int) -> U64:
        """Consume samples [lo, lo + count) for the chunk the stream is in,
        durably, before its comparison: they and every held sample below them
        are deleted and `used` moves past them, in one transaction.  Refused
        (nothing changes) unless the stream is in a chunk, lo ≥ used and all of
        them are held."""
        ...

    def begin_pooled_chunk(
        self, stream_id: str, chunk_no: int | None, lo: int, count: int
    ) -> tuple[int, U64]:
        """`begin_chunk` and `take_joint_noise` in one committed transaction
        (one fsync on the query path, as for a chunk without pooled noise);
        refused whole, nothing marked or taken."""
        ...

    def discard_joint_pool(self, stream_id: str) -> None:
        """Delete every held sample of the stream (it answers no more); the
        counters stay, so no sequence number is ever handed out again."""
        ...

    # ------------------------------------------------------------ plans
    def plan(self, plan_id: str) -> tuple[PlanBook, str, str]:
        """(book, state, task id) of a plan."""
        ...

    def reserve_plan(self, plan_id: str, task_id: str, book: PlanBook) -> None:
        """Charge the plan's composed (ε, δ) to the ledger and record it, atomically
        (BudgetExhausted: nothing is spent)."""
        ...

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        """End an active plan and return what it did not use (basic plans; see
        `PlanBook.refund`) to the ledger.  Idempotent: an ended plan refunds 0."""
        ...

    def fail_plan(self, plan_id: str) -> None:
        """No more streams of this plan, and never a refund."""
        ...

    def plan_ids(self, task_id: str, state: str) -> list[str]: ...

    # ------------------------------------------------------------ robust staging
    def stage_robust(
        self, task_id: str, pass_id: bytes, digest: bytes, lo: int, shares: U64
    ) -> None:
        """Keep the helper's new shares of coordinates [lo, lo + len(shares)) of the
        report set `digest`, computed by the pass `pass_id`.  Each pass stages
        apart: a late chunk of an abandoned pass never replaces a newer pass's."""
        ...

    def staged_robust(self, task_id: str, pass_id: bytes, digest: bytes, d: int) -> U64 | None:
        """The shares pass `pass_id` staged for report set `digest`, if they
        cover all d coordinates."""
        ...

    def clear_staged(self, task_id: str) -> None:
        """Drop every pass staged for the task (at the agreement)."""
        ...


# ------------------------------------------------------------ the shared schema
#: The columns of `tasks` (aliased `t`) that `task_state` reads, in its order.
TASK_COLUMNS = (
    "task_id, d, frac_bits, n_max, min_batch, epsilon_total, delta_total,"
    " epsilon_min, n, collection_open, epsilon_spent, delta_spent, digest,"
    " (SELECT COUNT(*) FROM streams s WHERE s.task_id = t.task_id), agreed,"
    " validate_reports, embedding, validity, verify_key, rejected, noise"
)
#: The columns of `tasks` a new task sets, in the order of `new_task_row`.
NEW_TASK_COLUMNS = (
    "task_id, d, frac_bits, n_max, min_batch, epsilon_total,"
    " delta_total, epsilon_min, digest, sums, validate_reports, embedding, validity, verify_key,"
    " noise"
)
#: The columns of `tasks` an upload batch is checked against (`admit_batch`).
BATCH_COLUMNS = "n, n_max, collection_open, sums, digest, d, validity, rejected"
#: The columns of `streams` that `stream_state` reads, in its order.
STREAM_COLUMNS = (
    "stream_id, task_id, kind, epsilon, delta, gamma, state, chunks, queries, plan_id, plan_group"
)
#: The columns of `streams` a new stream sets, in the order of `new_stream_row`.
NEW_STREAM_COLUMNS = "stream_id, task_id, kind, epsilon, delta, state, plan_id, plan_group"
#: The columns of `plans` that `plan_state` reads, in its order.
PLAN_COLUMNS = "book, state, task_id"


def new_task_row(p: TaskParams, verify_key: bytes = b"") -> tuple[object, ...]:
    """The values of NEW_TASK_COLUMNS for a task with nothing uploaded."""
    return (
        p.task_id,
        p.d,
        p.frac_bits,
        p.n_max,
        p.min_batch,
        str(p.epsilon_total),
        str(p.delta_total),
        str(p.epsilon_min),
        bytes(DIGEST_BYTES),
        bytes(sum_bytes(p.d, bool(p.validity))),
        int(p.validate_reports),
        p.embedding,
        p.validity,
        verify_key,
        p.noise,
    )


@functools.lru_cache(maxsize=4096)
def _fraction(text: Any) -> Fraction:
    """A stored rational (ε, δ, a budget's spend) as a Fraction.  Every chunk
    reads its stream and task afresh, and parsing their few decimal strings was
    a visible share of a one-query chunk; a Fraction is immutable, so the same
    stored text can share one."""
    return Fraction(text)


def unknown_task(task_id: str) -> NotFound:
    """NotFound for a task id no store holds, quoting at most 64 characters of
    it: a request may carry an id of megabytes, and a task id has at most 64."""
    shown = repr(task_id[:64]) + ("…" if len(task_id) > 64 else "")
    return NotFound(f"unknown task {shown}")


def task_state(task_id: str, row: Sequence[Any] | None) -> TaskState:
    """The task a row of TASK_COLUMNS holds (NotFound for no row)."""
    if row is None:
        raise unknown_task(task_id)
    params = TaskParams(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        _fraction(row[5]),
        _fraction(row[6]),
        _fraction(row[7]),
        bool(row[15]),
        row[16],
        row[17],
        row[20],
    )
    budget = Budget(
        params.epsilon_total, params.delta_total, _fraction(row[10]), _fraction(row[11])
    )
    return TaskState(
        params,
        row[8],
        bool(row[9]),
        budget,
        bytes(row[12]),
        row[13],
        bool(row[14]),
        bytes(row[18] or b""),
        tuple(sorted(json.loads(row[19] or "{}").items())),
    )


def new_stream_row(
    stream_id: str,
    task_id: str,
    kind: StreamKind,
    epsilon: Fraction,
    delta: Fraction,
    plan: tuple[str, int] | None,
    replay: bool,
) -> tuple[object, ...]:
    """The values of NEW_STREAM_COLUMNS for a stream being opened (`failed`
    when replayed: it never answers here)."""
    plan_id, group = plan if plan is not None else (None, None)
    state = FAILED if replay else OPENING
    return (stream_id, task_id, kind.value, str(epsilon), str(delta), state, plan_id, group)


def stream_state(stream_id: str, row: Sequence[Any] | None) -> StreamState:
    """The stream a row of STREAM_COLUMNS holds (NotFound for no row)."""
    if row is None:
        raise NotFound(f"unknown stream {stream_id!r}")
    return StreamState(
        row[0],
        row[1],
        StreamKind(row[2]),
        _fraction(row[3]),
        _fraction(row[4]),
        None if row[5] is None else int(row[5]),
        row[6],
        row[7],
        row[8],
        None if row[9] is None else (row[9], int(row[10])),
    )


def plan_state(plan_id: str, row: Sequence[Any] | None) -> tuple[PlanBook, str, str]:
    """(book, state, task id) of the plan a row of PLAN_COLUMNS holds."""
    if row is None:
        raise NotFound(f"unknown plan {plan_id!r}")
    return PlanBook.from_json(json.loads(row[0])), row[1], row[2]


def book_text(book: PlanBook) -> str:
    """A plan's book as the `plans.book` column holds it."""
    return json.dumps(book.to_json())


# ------------------------------------------------------------ uploads
def report_digest(report_ids: list[bytes]) -> bytes:
    """Order-independent digest of a set of report ids (XOR of truncated hashes)."""
    acc = 0
    for rid in report_ids:
        acc ^= int.from_bytes(hashlib.sha256(rid).digest()[:DIGEST_BYTES], "little")
    return acc.to_bytes(DIGEST_BYTES, "little")


def xor_reports(digest: bytes, report_ids: list[bytes]) -> bytes:
    """The digest of a report set with `report_ids` added, or taken out (XOR is
    its own inverse)."""
    return bytes(x ^ y for x, y in zip(digest, report_digest(report_ids), strict=True))


@dataclass(frozen=True)
class CrawlRecord:
    """One level of a prefix-crawl walk as a server records it once the
    level's comparison is done (servers/crawl.py): its number in the walk,
    the parents' bits and the bits it added, the parents (32 bytes each,
    big-endian; none at the root), and the reports its check refused (their
    positions in the task's ascending ids, uint32 little-endian)."""

    walk_id: str
    level: int
    task_id: str
    depth: int
    steps: int
    parents: bytes
    refused: bytes


@dataclass(frozen=True)
class Verified:
    """What ingest verification did with one batch (`Store.add_reports`): the
    batch's id and its verdicts (one byte per report; recorded unless the id is
    b"", as on the leader), the refusals by reason, and every id of the batch
    (whose pending shares are dropped)."""

    batch_id: bytes
    verdicts: bytes
    rejected: dict[str, int]
    batch_ids: list[bytes]
    #: The helper's record: a digest of the leader's prep shares the verdicts
    #: were decided on (servers/ingest/batches.py: `binding`), kept with them so a
    #: retried batch is answered from the record only if it is the same batch.
    binding: bytes = b""


def check_pending_cap(held: int, adding: int, cap: int) -> None:
    """Refuse (ResourceExhausted) a batch that would take a task's pending
    reports past `cap` (the rule both stores apply inside `add_pending`)."""
    if held + adding > cap:
        raise ResourceExhausted(
            f"the helper holds {held} unverified reports of this task; {adding} more "
            f"would pass its bound of {cap} (the task's room plus one batch): send "
            "each batch's leader half before the next batch's helper half"
        )


def sum_bytes(d: int, in_field: bool) -> int:
    """Bytes of a task's share sums: d uint64 ring elements, or d Field128 ones."""
    return (FIELD128.encoded_size if in_field else 8) * d


def fold(blob: bytes, delta: U64, in_field: bool, subtract: bool = False) -> bytes:
    """Stored share sums with `delta` added (or taken out): in Z_2^64, or in
    Field128 for a task with a validity circuit (both as their uint64 words)."""
    if not in_field:
        old = np.frombuffer(blob, dtype=np.uint64)
        return (old - delta if subtract else old + delta).tobytes()
    f = FIELD128
    old = f.decode_vec(blob)
    new = f.decode_vec(np.ascontiguousarray(delta, dtype="<u8").tobytes())
    return f.encode_vec(f.sub(old, new) if subtract else f.add(old, new))


def counted(text: str | None, more: dict[str, int]) -> str:
    """A task's stored refusal counts (JSON) with `more` added."""
    counts: dict[str, int] = json.loads(text or "{}")
    for reason, k in more.items():
        if k:
            counts[reason] = counts.get(reason, 0) + int(k)
    return json.dumps(counts, sort_keys=True)


def batch_id(task_id: str, report_ids: Sequence[bytes]) -> bytes:
    """A batch's id: a hash of its task and its ids in order, so the leader's
    retry of a batch names the batch the helper already verified."""
    h = hashlib.sha256(b"svtagg-batch\0" + task_id.encode() + b"\0")
    for rid in report_ids:
        h.update(rid)
    return h.digest()[:16]


def admit_batch(
    task_id: str, row: Sequence[Any] | None, share_sum: U64
) -> tuple[int, int, bytes, bytes]:
    """The checks every store makes on an upload batch before looking for
    replayed ids, from the task's row of BATCH_COLUMNS: (n, n_max, sums,
    digest).  Capacity is checked after the replay check (`within_capacity`),
    so that a batch resent after a lost answer is refused as a replay, not as a
    full task, and a resuming client counts it as held."""
    if row is None:
        raise unknown_task(task_id)
    n, n_max, is_open, sums_blob, digest, d, validity = row[:7]
    if not is_open:
        raise FailedPrecondition(f"collection of task {task_id!r} is closed")
    words = sum_bytes(d, bool(validity)) // 8
    if share_sum.shape != (words,):
        raise InvalidArgument(f"share sum has {share_sum.size} words, task (d={d}) has {words}")
    return n, n_max, sums_blob, digest


def within_capacity(task_id: str, n: int, n_max: int, count: int) -> None:
    """Refuse a batch (of `count` ids not held yet) that would take n above n_max."""
    if n + count > n_max:
        raise ResourceExhausted(f"task {task_id!r} accepts at most n_max={n_max} reports (has {n})")


def check_removable(task: TaskState) -> None:
    """Reports are taken out only between the close and the agreement."""
    if task.collection_open:
        raise FailedPrecondition("reports are reconciled only after the close")
    if task.agreed:
        raise FailedPrecondition("the report set is already agreed; nothing to remove")


# ------------------------------------------------------------ ledger and plans
def charged(budget: Budget, epsilon: Fraction, delta: Fraction) -> Budget:
    """The budget after spending (ε, δ) of it (BudgetExhausted: it cannot)."""
    ledger = Ledger(
        budget.epsilon_total, budget.delta_total, budget.epsilon_spent, budget.delta_spent
    )
    ledger.charge(epsilon, delta)
    return ledger.budget()


def refunded(budget: Budget, epsilon: Fraction, delta: Fraction) -> Budget:
    """The budget after (ε, δ) of what was spent is given back."""
    ledger = Ledger(
        budget.epsilon_total, budget.delta_total, budget.epsilon_spent, budget.delta_spent
    )
    ledger.refund(epsilon, delta)
    return ledger.budget()


def admit_to_plan(
    plan: tuple[str, int],
    held: tuple[PlanBook, str, str],
    task_id: str,
    charge: tuple[Fraction, Fraction],
    replay: bool,
) -> tuple[Fraction, Fraction] | None:
    """Admit a stream's (ε, δ) `charge` to group `plan[1]` of the plan `held`
    ((book, state, task id); the book is updated in place): an active plan of
    the stream's task, or any plan of it when replayed.  Returns what the
    task's ledger is to be charged besides (None: nothing) — a plan ended
    since refunded the group's unused part without this stream, so the task
    pays what the refund would have kept back (only basic plans refund)."""
    plan_id, group = plan
    book, state, plan_task = held
    if plan_task != task_id or (state != PLAN_ACTIVE and not replay):
        raise FailedPrecondition(f"plan {plan_id} is {state} or of another task")
    kept = book.refund()
    book.admit(group, *charge)
    after = book.refund()
    if state == PLAN_ENDED and after != kept:
        return kept[0] - after[0], kept[1] - after[1]
    return None


# ------------------------------------------------------------ streams
def next_chunk(s: StreamState, chunk_no: int | None) -> int:
    """The number of the stream's next chunk; refused unless the stream is
    open, and unless `chunk_no` (the helper's copy of the leader's number) is
    that next one."""
    if s.state != OPEN:
        raise FailedPrecondition(f"stream {s.stream_id!r} is {s.state}; it answers no more")
    if chunk_no is not None and chunk_no != s.chunks + 1:
        raise FailedPrecondition(
            f"stream {s.stream_id!r}: chunk {chunk_no} out of order (expected {s.chunks + 1})"
        )
    return s.chunks + 1


def assemble(d: int, parts: list[tuple[int, U64]]) -> U64 | None:
    """d shares from (lo, shares) pieces, or None unless every coordinate is covered."""
    out = np.zeros(d, dtype=np.uint64)
    filled = np.zeros(d, dtype=bool)
    for lo, shares in parts:
        if lo < 0 or lo + len(shares) > d:
            return None
        out[lo : lo + len(shares)] = shares
        filled[lo : lo + len(shares)] = True
    return out if filled.all() else None
