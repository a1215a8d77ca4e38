"""The servers' part of the mechanism, free of any transport: task validation,
upload accounting, stream opening (charge and γ in one transaction) and each chunk's
masked comparison inputs z_L / z_H.

Trust assumptions relied on here (see docs/services.md): two non-colluding,
semi-honest servers; each draws its own full-scale noise from its own CSPRNG
(or, for a task with noise = joint, holds its additive share of one joint
draw made in the garbled circuit: servers/exchange/joint.py) and never reveals γ, ν or
its share sums; only the comparison protocol's
output (first YES index / outcomes) leaves a server.  Clients are not trusted:
queries read the robust aggregates g(S) (`query_sums`), whose sensitivity is
2^F whatever the other reports are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from svtagg.dp.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from svtagg.dp.jointsvt import JOINT, JOINT_MAX_TOURNAMENT, check_joint_queries, joint_charge
from svtagg.dp.kinds import (
    StreamKind,
    as_fraction,
    default_tau_bound,
    stream_width,
    validate_stream,
)
from svtagg.dp.noise import RandomSource, draw_query_noise, draw_threshold_noise
from svtagg.dp.plans import PlanBook, parse_groups
from svtagg.dp.queries import (
    MAX_TOURNAMENT,
    check_chunk_size,
    check_ctt_width,
    check_stream_chunks,
)
from svtagg.dp.task import TASK_ID_RE, TaskParams
from svtagg.mpc.ring import RING_BITS, U64, sensitivity
from svtagg.mpc.sharing import expand_seed
from svtagg.proto.terms import (
    MAX_BATCH_REPORTS,
    MAX_BATCH_VALUES,
    MAX_TASKS,
    REPORT_ID_BYTES,
    SEED_BYTES,
    VERIFY_SLOTS,
    Role,
)
from svtagg.servers.crawl import Walks, crawl_width
from svtagg.servers.exchange.joint import (
    JointDraw,
    Pooled,
    joint_shares,
    pools_noise,
    shapes,
    stream_noise,
)
from svtagg.servers.exchange.party import ComparisonParty
from svtagg.servers.exchange.prepared import PreparedNoise, parse_shape, shape_key
from svtagg.servers.exchange.values import (
    ChunkKind,
    NoiseBatch,
    PlanInfo,
    PlanRequest,
    PoolDraw,
    PrepareStream,
    Progress,
)
from svtagg.servers.faults import crash_point
from svtagg.servers.ingest.validity import check_validity, helper_undo_sum
from svtagg.servers.store.rules import FAILED, Store, StreamState, TaskState, unknown_task
from svtagg.vdaf.prio3 import VERIFY_KEY_SIZE

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """A validated chunk: query indices, complement flags and (leader only) thresholds."""

    index: npt.NDArray[np.int64]
    complement: npt.NDArray[np.bool_]
    #: A report-noisy-max chunk with more of its stream's tournament to follow.
    more: bool = False

    def __len__(self) -> int:
        return int(self.index.size)


def parse_chunk(
    task: TaskState,
    index: Sequence[int] | npt.NDArray[Any],
    complement: Sequence[bool] | npt.NDArray[np.bool_],
) -> Chunk:
    k = len(index)
    check_chunk_size(k)
    idx = np.asarray(index, dtype=np.int64)
    if int(idx.max()) >= task.params.d:
        raise InvalidArgument(f"query index {int(idx.max())} out of range [0, {task.params.d})")
    if len(complement) not in (0, k):
        raise InvalidArgument(f"{len(complement)} complement flags for {k} queries")
    comp = np.asarray(complement, dtype=bool) if len(complement) else np.zeros(k, dtype=bool)
    return Chunk(idx, comp)


def parse_taus(
    task: TaskState, taus: Sequence[int] | npt.NDArray[Any], k: int, name: str = "tau"
) -> U64:
    """Thresholds in grid units, bounded by default_tau_bound, as ring elements:
    one per query, or one for every query of the chunk."""
    if len(taus) not in (1, k):
        raise InvalidArgument(f"{len(taus)} {name} values for {k} queries (one per query, or one)")
    bound = default_tau_bound(task.params.n_max, task.params.frac_bits)
    too_big = InvalidArgument(f"|{name}| exceeds the bound of {bound} grid units (4·n_max·2^F)")
    try:
        grid = np.asarray(taus, dtype=np.int64)
    except OverflowError:
        raise too_big from None
    # Both ends compared, no abs: np.abs(int64(-2^63)) is still negative, and a
    # threshold of -2^63 would flip the comparison (z wraps past the sign bit).
    if grid.size and (int(grid.max()) > bound or int(grid.min()) < -bound):
        raise too_big
    return np.broadcast_to(grid, (k,)).astype(np.uint64)


#: Tasks whose g(S) a server keeps in memory (`ServerCore.query_sums`).
SUMS_CACHED = 16
#: Noise drawn ahead (`ServerCore._draw_ahead`): at most this many draws per
#: stream (1 MB), for at most this many streams (the most recent).
AHEAD_DRAWS = 1 << 17
AHEAD_STREAMS = 16

#: The analyst's thresholds of a chunk, as ring elements: τ (Ask) or (τL, τH) (Compare).
Thresholds = U64 | tuple[U64, U64]


class ServerCore:
    """One server's state machine over its store; the service layer wraps it."""

    def __init__(
        self,
        role: Role,
        store: Store,
        *,
        rng: RandomSource | None = None,
        max_epsilon_total: Fraction | None = None,
        max_delta_total: Fraction | None = None,
        require_validation: bool = False,
        robust_aggregates: bool = True,
        verify_proofs: bool = True,
    ) -> None:
        self.role: Role = role
        self.store = store
        self.rng = rng or RandomSource()
        #: The operator's budget policy: the analyst proposes a task's total
        #: budget, and each server refuses one above its own cap (None: no cap).
        self.max_epsilon_total = max_epsilon_total
        self.max_delta_total = max_delta_total
        #: The analyst also chooses whether reports are range-checked; a server
        #: that must not trust clients refuses tasks that skip the check.
        self.require_validation = require_validation
        #: Queries read g(S) = min(tri(S), n·2^F), computed at the close, never S
        #: itself (docs/privacy.md, "Robust aggregates"): whatever a malicious
        #: client uploads, an honest user moves every compared value by ≤ 2^F.
        #: Switched off only by tests, as the negative control of the wrap attack.
        self.robust_aggregates = robust_aggregates
        #: Check every report's validity proof at ingest (servers/ingest/batches.py).
        #: Switched off only by tests, as the negative control of poisoning:
        #: then every report that decodes is folded unchecked.
        self.verify_proofs = verify_proofs
        #: Test-only hook: when a list, each chunk of a joint-noise stream appends
        #: this server's shares of the noise it used (servers never set it; a
        #: test adds both servers' shares to see the noise the pair produced).
        self.joint_noise_log: list[JointDraw] | None = None
        #: Joint noise prepared ahead of the streams, in memory
        #: (servers/exchange/prepared.py).
        self.prepared = PreparedNoise()
        #: Called with the path ("garbled" or "ot") each first-YES / CTT chunk
        #: took on this server (the `svtagg_comparison_chunks` metric).
        self.on_path: Callable[[str], None] | None = None
        #: g(S) of the tasks that have streams here, which never changes again
        #: (`query_sums`), by task id; the most recent few.
        self._query_sums: dict[str, U64] = {}
        #: Tasks as the chunk path reads them (`_chunk_task`).
        self._chunk_tasks: dict[str, TaskState] = {}
        #: Ingest verifications running at once (servers/ingest/batches.py: VERIFY_SLOTS).
        self.verify_slots = asyncio.Semaphore(VERIFY_SLOTS)
        #: Tasks this server holds at most (`--max-tasks`).
        self.max_tasks = MAX_TASKS
        #: Prefix-crawl walks and the levels awaiting their comparison (servers/crawl.py).
        self.walks = Walks()
        #: Per-query noise drawn ahead for a stream's next chunk, by stream id
        #: (`_draw_ahead`), the most recent AHEAD_STREAMS streams.
        self._ahead: dict[str, U64] = {}

    def check_budget_policy(self, params: TaskParams) -> None:
        """Refuse a task whose total (ε, δ) exceeds this server's configured cap, or
        that skips report validation where this server requires it."""
        if self.require_validation and not params.validity:
            raise InvalidArgument(
                "this server requires every report to be validated: give the task a "
                "validity circuit (--validity)"
            )
        if params.validity:
            check_validity(params.validity, params.d, params.frac_bits, params.embedding)
            if params.crawl and params.noise == JOINT:
                raise InvalidArgument(
                    "a crawl task draws each server's own noise: give it noise=independent"
                )
        if self.max_epsilon_total is not None and params.epsilon_total > self.max_epsilon_total:
            raise InvalidArgument(
                f"epsilon_total={params.epsilon_total} exceeds this server's cap of "
                f"{self.max_epsilon_total}"
            )
        if self.max_delta_total is not None and params.delta_total > self.max_delta_total:
            raise InvalidArgument(
                f"delta_total={params.delta_total} exceeds this server's cap of "
                f"{self.max_delta_total}"
            )

    # ------------------------------------------------------------ tasks
    def task(self, task_id: str) -> TaskState:
        if not TASK_ID_RE.fullmatch(task_id):  # no such task can exist: the store is not asked
            raise unknown_task(task_id)
        return self.store.task(task_id)

    def task_ids(self) -> list[str]:
        return self.store.task_ids()

    def create_task(self, params: TaskParams, verify_key: bytes = b"") -> TaskState:
        """Record a task; one with a validity circuit holds the Prio3 verify key
        both servers share (drawn by the helper, `verify_key` on the leader)."""
        if params.validity and not verify_key:
            verify_key = self.rng.random_bytes(VERIFY_KEY_SIZE)
        if len(self.store.task_ids()) >= self.max_tasks:
            raise ResourceExhausted(f"this server holds its limit of {self.max_tasks} tasks")
        return self.store.create_task(params, verify_key)

    def close_collection(self, task_id: str) -> TaskState:
        return self.store.close_collection(task_id)

    def report_ids(self, task_id: str, after: bytes = b"", limit: int | None = None) -> list[bytes]:
        """The task's report ids in ascending order, after `after` (at most `limit`)."""
        return self.store.report_ids(task_id, after, limit)

    def sums(self, task_id: str) -> U64:
        """This server's share of the task's raw aggregates S (not what queries read)."""
        return self.store.sums(task_id)

    # ------------------------------------------------------------ uploads
    def check_batch(self, task: TaskState, ids: Sequence[bytes]) -> list[bytes]:
        """An upload batch's ids, refused unless the batch's size and ids are well formed."""
        if not task.collection_open:
            raise FailedPrecondition(f"collection of task {task.params.task_id!r} is closed")
        if not ids:
            raise InvalidArgument("empty upload batch")
        if len(ids) > MAX_BATCH_REPORTS:
            raise ResourceExhausted(
                f"a batch holds at most {MAX_BATCH_REPORTS} reports, got {len(ids)}"
            )
        d = task.params.d
        if len(ids) * d > MAX_BATCH_VALUES:
            raise ResourceExhausted(
                f"a batch holds at most {MAX_BATCH_VALUES} values (reports × d); "
                f"at d={d} send at most {max(1, MAX_BATCH_VALUES // d)} reports per batch"
            )
        if any(len(rid) != REPORT_ID_BYTES for rid in ids):
            raise InvalidArgument(f"report ids must be {REPORT_ID_BYTES} bytes")
        if len(set(ids)) != len(ids):
            raise InvalidArgument("duplicate report id within one batch")
        return list(ids)

    def upload(self, task_id: str, reports: Sequence[tuple[bytes, bytes]]) -> int:
        """Store one batch of (report id, share) atomically; returns n afterwards.

        The leader's share is d little-endian uint64; the helper's a 16-byte seed.
        (A task with a validity circuit takes Prio3 reports: servers/ingest/batches.py.)"""
        task = self.store.task(task_id)
        if task.params.validity:
            raise InvalidArgument(
                f"task {task_id!r} takes reports with a validity proof "
                f"({task.params.validity}); this client sent plain shares (upgrade it)"
            )
        ids = self.check_batch(task, [rid for rid, _ in reports])
        d = task.params.d
        shares = [share for _, share in reports]
        if self.role == Role.LEADER:
            width = 8 * d
            if any(len(share) != width for share in shares):
                raise InvalidArgument(
                    f"explicit shares must be {width} bytes (d={d} little-endian uint64)"
                )
        elif any(len(seed) != SEED_BYTES for seed in shares):
            raise InvalidArgument(f"helper shares are {SEED_BYTES}-byte seeds")
        n = self.store.add_reports(task_id, ids, shares, self.share_sum(d, shares))
        crash_point("upload.after_store")
        return n

    def share_sum(self, d: int, shares: Sequence[bytes]) -> U64:
        """Sum of this server's shares: explicit vectors (leader) or expanded seeds (helper)."""
        if self.role == Role.LEADER:
            blob = b"".join(shares)
            return (
                np.frombuffer(blob, dtype="<u8")
                .reshape(len(shares), d)
                .sum(axis=0, dtype=np.uint64)
            )
        total = np.zeros(d, dtype=np.uint64)
        for seed in shares:
            total += expand_seed(seed, d)
        return total

    def remove_reports(self, task_id: str, report_ids: list[bytes]) -> TaskState:
        """Reconciliation: drop reports the other server never stored."""
        task = self.store.task(task_id)
        if task.params.validity:
            if self.role == Role.LEADER and report_ids:
                # The helper records a verified batch first, so this never
                # happens between two intact stores.
                raise FailedPrecondition(
                    f"the leader holds {len(report_ids)} verified reports the helper lacks "
                    "(a helper store restored from an older copy?); they cannot be taken out"
                )
            return self.store.remove_reports(
                task_id, report_ids, lambda seeds: helper_undo_sum(task, seeds)
            )
        d = task.params.d
        return self.store.remove_reports(task_id, report_ids, lambda sh: self.share_sum(d, sh))

    # ------------------------------------------------------------ the agreement
    def mark_agreed(self, task_id: str, robust: U64 | None) -> TaskState:
        """Record that both servers hold this report set; `robust`: this
        server's shares of g(S), which queries read from then on."""
        return self.store.mark_agreed(task_id, robust)

    def stage_robust(self, task: TaskState, pass_id: bytes, lo: int, shares: U64) -> None:
        """Keep a robust-aggregate chunk's shares (coordinates from `lo`) under
        its pass until the agreement names the pass (the helper)."""
        self.store.stage_robust(task.params.task_id, pass_id, task.digest, lo, shares)

    def staged_robust(self, task: TaskState, pass_id: bytes) -> U64 | None:
        """The pass's staged shares of every coordinate of `task`'s report set
        (None unless the pass staged them all)."""
        return self.store.staged_robust(task.params.task_id, pass_id, task.digest, task.params.d)

    def clear_staged(self, task_id: str) -> None:
        self.store.clear_staged(task_id)

    # ------------------------------------------------------------ streams
    def stream(self, stream_id: str) -> StreamState:
        return self.store.stream(stream_id)

    def failed_streams(self, task_id: str) -> list[StreamState]:
        return [self.store.stream(sid) for sid in self.store.stream_ids(task_id, FAILED)]

    @property
    def recovered_streams(self) -> list[tuple[str, str]]:
        """(stream id, task id) of each stream the store's recovery failed closed."""
        return self.store.recovered_failed

    def confirm_stream(self, stream_id: str) -> None:
        """The other server has charged the stream too: it answers from now on."""
        self.store.confirm_stream(stream_id)

    def fail_stream(self, stream_id: str) -> None:
        """Fail the stream closed (idempotent): it never answers again, and its
        charge stays spent (and its pooled joint noise is discarded first, so
        that no failed stream keeps shares whatever stops in between)."""
        self._discard_pool(stream_id)
        self._ahead.pop(stream_id, None)  # noise drawn ahead: no chunk will use it
        self.store.fail_stream(stream_id)

    def begin_chunk(self, stream_id: str, chunk_no: int) -> None:
        """Mark chunk `chunk_no` in progress, durably, before its protocol runs."""
        self.store.begin_chunk(stream_id, chunk_no)

    def end_chunk(self, stream_id: str, progress: Progress) -> None:
        """Record what the chunk answered (and whether the stream closed)."""
        self.store.end_chunk(stream_id, progress.answered, progress.closes)
        if progress.closes:
            self._discard_pool(stream_id)
            self._ahead.pop(stream_id, None)

    def open_stream(self, request: PrepareStream, open_now: bool = True) -> StreamState:
        """Validate, draw this server's γ, then charge the ledger and store γ in
        one durable transaction.  With open_now=False (the leader) the stream
        stays `opening` until confirmed.  With `request.replay` (the helper, at
        reconciliation) only the charge of a stream the leader opened and failed
        is recorded, the stream failed, and no γ drawn (`Store.open_stream`)."""
        stream_id, task_id, plan = request.stream_id, request.task_id, request.plan
        epsilon, delta = request.epsilon, request.delta
        task = self.store.task(task_id)
        try:
            req = validate_stream(request.kind, epsilon or "", delta or "0", parties=2)
        except (ValueError, ArithmeticError) as exc:
            raise InvalidArgument(str(exc)) from None
        kind, eps, dl, charge_delta = req.kind, req.epsilon, req.delta, req.charge_delta
        joint = task.params.noise == JOINT
        if joint:  # the stream's δ and the sampler's finite-support δ; ε is unchanged
            stream_noise(kind, eps, task.params.frac_bits)  # refused here if it cannot fit
            charge_delta = joint_charge(req, task.params.frac_bits)
        if request.replay:
            # The leader opened it when the task allowed it; it never answers here.
            self.store.open_stream(
                stream_id, task_id, kind, eps, dl, charge_delta, plan=plan, replay=True
            )
            return self.store.stream(stream_id)
        self.require_queryable(task)
        if not task.agreed:
            raise FailedPrecondition(
                f"task {task_id!r}: the servers have not agreed on the reports; close again"
            )
        crawl_task = task.params.crawl
        if crawl_task != (kind == StreamKind.CRAWL):
            raise InvalidArgument(
                f"task {task_id!r} answers crawl levels only (CrawlLevel)"
                if crawl_task
                else f"a crawl level needs a crawl task; task {task_id!r} is not one"
            )
        if not crawl_task:
            self.query_sums(task)  # refused before any charge if g(S) is missing
        if eps < task.params.epsilon_min:
            raise InvalidArgument(
                f"epsilon={eps} is below the task's epsilon_min={task.params.epsilon_min}"
            )
        # Joint noise: γ's shares are drawn in the first chunk (servers/exchange/joint.py);
        # the 0 stored here is never compared (a failed first chunk fails the stream).
        gamma = 0 if joint else draw_threshold_noise(kind, eps, task.params.frac_bits, self.rng)
        # The charge and γ commit together (one fsync); a refused charge drops γ
        # unused, and no comparison reads it before both servers have charged.
        with self.store.atomic():
            self.store.open_stream(stream_id, task_id, kind, eps, dl, charge_delta, plan=plan)
            self.store.set_threshold_noise(stream_id, gamma, open_now)
        crash_point("open.after_charge")
        return self.store.stream(stream_id)

    # ------------------------------------------------------------ plans
    def reserve_plan(self, plan_id: str, request: PlanRequest) -> PlanInfo:
        """Validate the plan, compute its charge (the one rule both servers apply)
        and reserve it on the ledger durably; refused whole if it does not fit."""
        task = self.store.task(request.task_id)
        self.require_queryable(task)
        try:
            slack = as_fraction(request.delta_slack or "0", "delta_slack")
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        book = PlanBook.reserve(parse_groups(request.pairs()), slack)
        self.store.reserve_plan(plan_id, request.task_id, book)
        return self.plan_info(plan_id)

    def plan_info(
        self, plan_id: str, refunded: tuple[Fraction, Fraction] = (Fraction(0), Fraction(0))
    ) -> PlanInfo:
        book, state, task_id = self.store.plan(plan_id)
        c = book.charge
        return PlanInfo(plan_id, task_id, c.epsilon, c.delta, c.rule.value, state, *refunded)

    def plan(self, plan_id: str) -> tuple[PlanBook, str, str]:
        """(its book, its state, its task) of a reserved plan."""
        return self.store.plan(plan_id)

    def plan_ids(self, task_id: str, state: str) -> list[str]:
        return self.store.plan_ids(task_id, state)

    @property
    def recovered_plans(self) -> list[tuple[str, str]]:
        """(plan id, task id) of each plan active when the store was opened."""
        return self.store.recovered_plans

    def end_plan(self, plan_id: str) -> PlanInfo:
        """End the plan (idempotent), refunding what it did not use (basic plans)."""
        return self.plan_info(plan_id, self.store.end_plan(plan_id))

    def fail_plan(self, plan_id: str) -> PlanInfo:
        """Fail the plan: it admits no stream, and nothing is refunded."""
        self.store.fail_plan(plan_id)
        return self.plan_info(plan_id)

    @staticmethod
    def require_queryable(task: TaskState) -> None:
        if task.collection_open:
            raise FailedPrecondition(f"task {task.params.task_id!r}: collection is still open")
        if task.n < task.params.min_batch:
            raise FailedPrecondition(
                f"task {task.params.task_id!r} has n={task.n} < min_batch={task.params.min_batch}"
            )

    def shape_width(self, task: TaskState, kind: StreamKind, epsilon: Fraction) -> int:
        """`comparison_width` of a stream of this kind and ε on `task` (a crawl
        level's: its counts', `servers.crawl.crawl_width`)."""
        if kind == StreamKind.CRAWL:
            return crawl_width(task.params.n_max, epsilon)
        if not self.robust_aggregates and not task.params.validity:
            return RING_BITS
        p = task.params
        return stream_width(p.n_max, p.frac_bits, kind, epsilon)

    def prepared_batch(self, batch: NoiseBatch) -> tuple[TaskState, StreamKind, Fraction]:
        """(The helper) check a batch filling a prepared pool and reserve its
        numbers: a joint-noise task that exists, an Ask kind, a sampler that fits."""
        assert batch.prepared is not None
        if batch.gamma:
            raise InvalidArgument("prepared noise holds ν only")
        task = self.store.task(batch.prepared.task_id)
        if task.params.noise != JOINT:
            raise InvalidArgument(f"task {task.params.task_id!r} draws no joint noise")
        kind, eps = parse_shape(batch.prepared.shape)
        stream_noise(kind, eps, task.params.frac_bits)
        self.prepared.reserve(batch.prepared, batch.count, batch.lo)
        return task, kind, eps

    def take_prepared(self, stream: StreamState, task: TaskState, batch: NoiseBatch) -> U64:
        """Prepared samples a move hands to `stream` (servers/exchange/prepared.py),
        taken out of this server's pool: the pool must be the stream's task's,
        of the stream's shape, at the generation the batch names."""
        ref = batch.prepared
        if ref is None or ref.task_id != task.params.task_id:
            raise InvalidArgument("a prepared-noise move names its stream's task")
        if ref.shape != shape_key(stream.kind, stream.epsilon) or batch.gamma:
            raise InvalidArgument("prepared noise moves ν of the stream's own shape only")
        return self.prepared.take(ref, batch.source_lo, batch.count)

    def comparison_width(self, task: TaskState, stream: StreamState) -> int:
        """The comparison width w of this stream's chunks, from public parameters
        only, so both servers derive the same w (docs/mpc.md, "Width"): every
        |z_L + z_H| is at most wrap_bound(n_max, F, τ bound, both parties' noise
        clamps at this stream's ε) < 2^(w−1) — scores are robust aggregates in
        [0, n·2^F] whatever clients uploaded — and w is the least such width."""
        # (The test-only control without robust aggregates compares raw,
        # wrapping sums at the full ring width.)
        return self.shape_width(task, stream.kind, stream.epsilon)

    async def robust_shares(
        self, party: ComparisonParty, task: TaskState, sums: U64, lo: int, hi: int
    ) -> U64:
        """This server's new shares of g(S) for coordinates [lo, hi) of `sums`
        (its stored share sums): re-shared in Z_2^64 from ring shares, or — a
        task with a validity circuit — converted from Field128 shares (added
        mod p inside the circuit, clamped, re-shared in the ring)."""
        bound = self.clamp_bound(task)
        if task.params.validity:
            words = sums.reshape(-1, 2)[lo:hi]
            return await party.field_clamp_reshare(words, bound, "Field128")
        return await party.clamp_reshare(sums[lo:hi], bound)

    @staticmethod
    def clamp_bound(task: TaskState) -> int:
        """N = n·2^F: the largest honest aggregate, where robust aggregates clamp."""
        return task.n * sensitivity(task.params.frac_bits)

    def query_sums(self, task: TaskState) -> U64:
        """This server's share of what queries read: g(S) (robust aggregates)."""
        if not self.robust_aggregates and not task.params.validity:
            return self.store.sums(task.params.task_id)
        task_id = task.params.task_id
        cached = self._query_sums.get(task_id)
        if cached is not None:
            return cached
        robust = self.store.robust_sums(task_id)
        if robust is None:
            raise FailedPrecondition(
                f"task {task_id!r} was agreed without robust aggregates "
                "(by an older version); create a new task"
            )
        if task.agreed and task.streams:  # no close rewrites it any more (`mark_agreed`)
            robust.setflags(write=False)
            if len(self._query_sums) >= SUMS_CACHED:
                del self._query_sums[next(iter(self._query_sums))]
            self._query_sums[task_id] = robust
        return robust

    def stream_and_task(
        self, stream_id: str, read: StreamState | None = None
    ) -> tuple[StreamState, TaskState]:
        """The stream a chunk is for (`read`: as the caller has just read it),
        and its task; refused once the stream has answered its last chunk (each
        server counts its own)."""
        stream = read if read is not None else self.store.stream(stream_id)
        check_stream_chunks(stream.chunks)
        return stream, self._chunk_task(stream.task_id)

    def _chunk_task(self, task_id: str) -> TaskState:
        """The task a chunk is for.  Once the servers agreed on its reports and
        a stream was opened, nothing a chunk reads of it changes again (its
        parameters, n, digest, noise, validity and verify key; no close
        rewrites it): that copy is kept, one store read less per chunk.  Its
        ledger fields go stale, and the chunk path does not read them."""
        held = self._chunk_tasks.get(task_id)
        if held is not None:
            return held
        task = self.store.task(task_id)
        if task.agreed and task.streams and not task.collection_open:
            if len(self._chunk_tasks) >= SUMS_CACHED:
                self._chunk_tasks.clear()
            self._chunk_tasks[task_id] = task
        return task

    def _scores(self, task: TaskState, chunk: Chunk) -> U64:
        """q(S) on this server's share: S[j], or for a complement n·2^F − S[j] (leader)
        and −S[j] (helper), so that the two shares add up to n·2^F − S_j."""
        sums = self.query_sums(task)[chunk.index]
        full = (
            np.uint64(task.n * sensitivity(task.params.frac_bits))
            if self.role == Role.LEADER
            else np.uint64(0)
        )
        return np.where(chunk.complement, full - sums, sums).astype(np.uint64)

    def _draw(self, stream: StreamState, task: TaskState, k: int) -> U64:
        return draw_query_noise(
            stream.kind, stream.epsilon, task.params.frac_bits, k, self.rng
        ).astype(np.uint64)

    def _noise(self, stream: StreamState, task: TaskState, k: int) -> U64:
        """k of the stream's per-query noise draws: first those drawn ahead
        (`_draw_ahead`; i.i.d. like the rest, each used once), then fresh ones."""
        ahead = self._ahead.pop(stream.stream_id, None)
        if ahead is None:
            return self._draw(stream, task, k)
        if ahead.shape[0] > k:
            self._ahead[stream.stream_id] = ahead[k:]
        if ahead.shape[0] >= k:
            return ahead[:k]
        return np.concatenate([ahead, self._draw(stream, task, k - ahead.shape[0])])

    def _draw_ahead(self, stream: StreamState, task: TaskState, k: int) -> None:
        """A stream's next chunk's noise (as many draws as this chunk's, at most
        AHEAD_DRAWS) drawn while this server waits: the helper after a chunk
        that left its stream open, waiting for the next header; the leader
        during the chunk, waiting for the garbled tables (its evaluator's
        `while_waiting`; dropped if the chunk closes the stream).  Drawn when
        the header comes, the helper's draw would lie between the header and
        its first answer, the leader's between its header and its first
        flight (on the OT path the helper then waits for those d bits): both
        on the chunk's critical path, ≈ 0.7 ms each at 10^4.  Nothing about
        the draws changes: the same sampler and source, each draw used once,
        none kept on disk.  It runs where the chunk's messages have gone out
        (or its answer is made), so a failed draw is logged and dropped, never
        the chunk's failure: the next chunk then draws its noise itself."""
        have = self._ahead.pop(stream.stream_id, np.zeros(0, np.uint64))
        n = min(k, AHEAD_DRAWS) - have.shape[0]
        try:
            if n > 0:
                have = np.concatenate([have, self._draw(stream, task, n)])
        except Exception as exc:  # logged without values; nothing is lost
            log.warning("noise for stream %s not drawn ahead: %s", stream.stream_id, type(exc))
            return
        self._ahead[stream.stream_id] = have  # the most recent last
        while len(self._ahead) > AHEAD_STREAMS:
            del self._ahead[next(iter(self._ahead))]

    def ask_inputs(
        self,
        stream: StreamState,
        task: TaskState,
        chunk: Chunk,
        taus: U64 | None,
        noise: tuple[int, U64] | None = None,
    ) -> U64:
        """z = q(S) − τ + ν − γ (leader, τ in grid units) or q(S) + ν − γ (helper):
        this server's own draws, or its shares (γ, ν) of joint noise (`noise`)."""
        if noise is None:
            assert stream.gamma is not None
            noise = stream.gamma, self._noise(stream, task, len(chunk))
        z = self._scores(task, chunk) + noise[1]
        if taus is not None:
            z -= taus
        return z - np.uint64(noise[0] % (1 << 64))

    def noisy_max_inputs(self, stream: StreamState, task: TaskState, chunk: Chunk) -> U64:
        """z = q(S) + ν for every candidate: this server's share of the score
        plus its own one-sided noise (no threshold, no γ)."""
        return self._scores(task, chunk) + self._noise(stream, task, len(chunk))

    def check_queries(self, stream: StreamState, chunk: Chunk) -> None:
        """The one size rule of a stream's chunks, on both servers, before the
        chunk is marked: a report-noisy-max stream's candidates, over all its
        chunks, number at most MAX_TOURNAMENT (< 2^32, the carried and revealed
        index's width), JOINT_MAX_TOURNAMENT on a joint-noise task; any other
        stream of a joint-noise task is sent at most JOINT_MAX_QUERIES queries
        (either δ is paid per candidate or query: dp/jointsvt.py)."""
        joint = self._chunk_task(stream.task_id).params.noise == JOINT
        if stream.kind == StreamKind.NMAX:
            most = JOINT_MAX_TOURNAMENT if joint else MAX_TOURNAMENT
            if stream.queries + len(chunk) > most:
                raise InvalidArgument(
                    f"a report-noisy-max stream holds at most {most:,} candidates"
                    + (" on a task with joint noise" if joint else "")
                )
        elif joint:
            try:
                check_joint_queries(stream.queries, len(chunk))
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None

    async def noisy_max(
        self, party: ComparisonParty, stream: StreamState, task: TaskState, chunk: Chunk, width: int
    ) -> int | None:
        """One chunk of the stream's tournament (docs/mpc.md, "Chunked
        tournaments"): its candidates are numbered from the stream's answered
        queries; from the second chunk on, this server's share of the winner so
        far comes in, stored by the chunk before.  A chunk with `more` to follow
        stores this server's share of the new winner durably and reveals
        nothing (None); the last returns the index over the stream."""
        if task.params.noise == JOINT:
            z = self._scores(task, chunk) + await self._joint_candidates(
                party, stream, task, len(chunk), width
            )
        else:
            z = self.noisy_max_inputs(stream, task, chunk)
        carry = self._carried(stream)
        if chunk.more:
            share = await party.noisy_max_carry(z, carry, stream.queries, width)
            self.store.set_noisy_max_carry(stream.stream_id, share.astype("<u8").tobytes())
            return None
        j = await party.noisy_max(z, width, carry, stream.queries)
        if j is None:  # k ≥ 1 candidates always have a maximum
            raise FailedPrecondition("the tournament returned no candidate")
        return j

    def _carried(self, stream: StreamState) -> U64 | None:
        """This server's share of the winner the stream's last chunk carried
        (None before the first chunk); refused unless that chunk stored it."""
        if stream.chunks == 0:
            return None
        stored = self.store.noisy_max_carry(stream.stream_id)
        if stored is None or stored[0] != stream.chunks:
            raise FailedPrecondition(
                f"stream {stream.stream_id!r}: no carried winner of chunk {stream.chunks}"
            )
        return np.frombuffer(stored[1], dtype="<u8").astype(np.uint64)

    def compare_inputs(
        self,
        stream: StreamState,
        task: TaskState,
        chunk: Chunk,
        taus: tuple[U64, U64] | None,
        noise: tuple[int, U64] | None = None,
    ) -> tuple[U64, U64]:
        """(z_high, z_low) of CompareToThresholds; the leader folds in τH, τL and the −1s.
        This server's own draws, or its shares (γ, ν) of joint noise (`noise`)."""
        if noise is None:
            assert stream.gamma is not None
            noise = stream.gamma, self._noise(stream, task, len(chunk))
        q_u = self._scores(task, chunk) + noise[1]
        gamma = np.uint64(noise[0] % (1 << 64))
        z_high = q_u + gamma
        z_low = gamma - q_u
        if taus is not None:
            tau_low, tau_high = taus
            one = np.uint64(1)
            z_high = z_high - tau_high - one
            z_low = z_low + tau_low - one
        return z_high, z_low

    @staticmethod
    def check_gap(stream: StreamState, task: TaskState, tau_low: U64, tau_high: U64) -> None:
        """Refuse thresholds closer than the CompareToThresholds gap (dp.queries' rule;
        a joint-noise task's is `dp.jointsvt.joint_ctt_gap`)."""
        highs = tau_high.view(np.int64).tolist()
        lows = tau_low.view(np.int64).tolist()
        width = min(int(h) - int(lo) for h, lo in zip(highs, lows, strict=True))  # exact ints
        frac_bits = task.params.frac_bits
        try:
            check_ctt_width(
                Fraction(width, sensitivity(frac_bits)),
                stream.epsilon,
                stream.delta,
                2,
                frac_bits if task.params.noise == JOINT else None,
            )
        except ValueError as exc:  # the joint sampler cannot fit (refused at open first)
            raise InvalidArgument(str(exc)) from None

    async def run_chunk(
        self,
        party: ComparisonParty,
        stream: StreamState,
        task: TaskState,
        chunk: Chunk,
        thresholds: Thresholds | None = None,
        pooled: Pooled | None = None,
    ) -> tuple[Any, Progress]:
        """One chunk of a stream on this server's side of the garbled comparison:
        its masked inputs (the leader folds in the analyst's `thresholds`: τ for
        an Ask chunk, (τL, τH) for a Compare chunk, none for noisy-max), the
        protocol, and what the result did to the stream (the kind's progress
        rule).  `pooled`: the joint noise it took from its stream's pool
        (`begin_pooled`).  The result: the first YES index (None: none), the
        CompareToThresholds codes, or the noisy-max index."""
        kind = ChunkKind.of_stream(stream.kind)
        width = self.comparison_width(task, stream)
        drawn_here = task.params.noise != JOINT and kind in (ChunkKind.ASK, ChunkKind.COMPARE)
        if drawn_here and self.role == Role.LEADER and hasattr(party, "while_waiting"):
            party.while_waiting = lambda: self._draw_ahead(stream, task, len(chunk))
        try:
            result = await self._chunk_result(
                party, stream, task, chunk, kind, width, thresholds, pooled
            )
        finally:
            if hasattr(party, "while_waiting"):  # the evaluator's
                party.while_waiting = None
        if kind not in (ChunkKind.NMAX, ChunkKind.CRAWL) and self.on_path is not None:
            self.on_path(str(getattr(party, "last_path", "garbled")))
        progress = kind.spec.progress
        assert progress is not None
        done = progress(result, len(chunk))
        if self.role == Role.HELPER and drawn_here and not done.closes:
            self._draw_ahead(stream, task, len(chunk))
        return result, done

    async def _chunk_result(
        self,
        party: ComparisonParty,
        stream: StreamState,
        task: TaskState,
        chunk: Chunk,
        kind: ChunkKind,
        width: int,
        thresholds: Thresholds | None,
        pooled: Pooled | None,
    ) -> Any:
        """The protocol of one chunk of `kind`, on this server's inputs."""
        result: Any
        if kind == ChunkKind.CRAWL:
            # The level's inputs, made at its CrawlStep (servers/crawl.py): each
            # candidate's sign bit, revealed to both servers.
            z = self.walks.take_inputs(stream.stream_id, len(chunk))
            result = await party.any_per_group(z, 1, width)
            self.walks.compared(self.store, stream.stream_id)  # the level's record
        elif kind == ChunkKind.NMAX:
            assert thresholds is None
            result = await self.noisy_max(party, stream, task, chunk, width)
        elif kind == ChunkKind.COMPARE:
            assert thresholds is None or isinstance(thresholds, tuple)
            joint = None
            if task.params.noise == JOINT:  # drawn in the chunk: no pool for ctt
                joint = await self._joint_noise(party, stream, task, len(chunk))
            z_high, z_low = self.compare_inputs(stream, task, chunk, thresholds, joint)
            result = list(await party.compare_to_thresholds(z_high, z_low, width))
        else:
            assert not isinstance(thresholds, tuple)
            noise = None
            if task.params.noise == JOINT:
                noise = await self._joint_noise(party, stream, task, len(chunk), pooled)
            z = self.ask_inputs(stream, task, chunk, thresholds, noise)
            result = await party.first_yes(z, width)
        return result

    # ------------------------------------------------------------ joint noise
    # (servers/exchange/joint.py says how a stream's pool is filled and drawn)
    def _discard_pool(self, stream_id: str) -> None:
        if self.store.joint_pool(stream_id).runs:
            self.store.discard_joint_pool(stream_id)

    def pool_draw(self, stream: StreamState, task: TaskState, k: int) -> PoolDraw:
        """(The leader) what the next chunk of k queries of `stream` takes from
        its pool: the first held run's samples, up to k, and γ if it is pooled."""
        if not pools_noise(stream, task):
            return PoolDraw()
        pool = self.store.joint_pool(stream.stream_id)
        lo, held = pool.first_run()
        return PoolDraw(lo, min(k, held), stream.chunks == 0 and pool.gamma_ready)

    def begin_pooled(
        self, stream: StreamState, task: TaskState, chunk_no: int, draw: PoolDraw, k: int
    ) -> Pooled | None:
        """`begin_chunk`, consuming in the same durable transaction what the
        chunk draws from its stream's pool (both servers, before the comparison).
        The helper checks the leader's `draw` against its own store: a sample
        below its `used` counter, or not held, is refused — no share is used
        twice.  A refusal fails the stream here."""
        if draw == PoolDraw():
            self.begin_chunk(stream.stream_id, chunk_no)
            return None
        try:
            if not pools_noise(stream, task) or draw.count > k:
                raise InvalidArgument("pooled noise: only for an Ask chunk's joint ν, one each")
            if draw.gamma:
                if stream.chunks != 0:
                    raise InvalidArgument("only a stream's first chunk takes γ from the pool")
                if not self.store.joint_pool(stream.stream_id).gamma_ready:
                    raise FailedPrecondition("this server holds no pooled γ for the stream")
            _, nu = self.store.begin_pooled_chunk(stream.stream_id, chunk_no, draw.lo, draw.count)
            # Read after the mark: a pooled γ is frozen once a chunk has begun.
            gamma = self.store.stream(stream.stream_id).gamma if draw.gamma else None
        except BaseException:
            self.fail_stream(stream.stream_id)
            raise
        return Pooled(gamma, nu, draw.lo)

    def reserve_noise_batch(
        self, stream_id: str, count: int, gamma: bool, lo: int | None = None
    ) -> tuple[NoiseBatch, StreamState, TaskState]:
        """Check a batch for a joint-noise stream and reserve its sequence numbers
        durably (the leader: its next ones; the helper: the leader's `lo`,
        refused if any was reserved before)."""
        stream, task = self.stream_and_task(stream_id)
        if not pools_noise(stream, task):
            raise InvalidArgument(f"stream {stream_id} draws no joint noise ahead of time")
        stream_noise(stream.kind, stream.epsilon, task.params.frac_bits)
        if gamma and stream.chunks:
            raise FailedPrecondition("the stream's γ is drawn already")
        first = self.store.reserve_joint_batch(stream_id, count, lo)
        return NoiseBatch(stream_id, first, count, gamma), stream, task

    async def _joint_candidates(
        self, party: object, stream: StreamState, task: TaskState, k: int, width: int
    ) -> U64:
        """This server's shares of a joint-noise tournament chunk's k draws, one
        per candidate, made in the chunk (no γ, no pool: dp/jointsvt.py)."""
        _, nu_shape = shapes(
            stream_noise(stream.kind, stream.epsilon, task.params.frac_bits), width
        )
        nu = await joint_shares(party, k, nu_shape)
        if self.joint_noise_log is not None:
            self.joint_noise_log.append(JointDraw.of(stream, 0, nu, None))
        return nu

    async def _joint_noise(
        self,
        party: object,
        stream: StreamState,
        task: TaskState,
        k: int,
        pooled: Pooled | None = None,
    ) -> tuple[int, U64]:
        """This server's shares of a joint-noise stream's γ (pooled, or drawn and
        stored durably in its first chunk) and of the chunk's k ν: the pooled
        ones first, the rest drawn now."""
        gamma_shape, nu_shape = shapes(
            stream_noise(stream.kind, stream.epsilon, task.params.frac_bits),
            self.comparison_width(task, stream),
        )
        if pooled is not None and pooled.gamma is not None:
            gamma = pooled.gamma
        elif stream.chunks == 0:
            assert gamma_shape is not None  # an Ask stream's kind has a threshold
            gamma = int((await joint_shares(party, 1, gamma_shape))[0])
            self.store.set_joint_threshold_noise(stream.stream_id, gamma)
        else:
            assert stream.gamma is not None
            gamma = stream.gamma
        m = 0 if pooled is None else len(pooled.nu)
        nu = np.zeros(0, dtype=np.uint64) if pooled is None else pooled.nu
        if m < k:
            nu = np.concatenate([nu, await joint_shares(party, k - m, nu_shape)])
        if self.joint_noise_log is not None:
            self.joint_noise_log.append(JointDraw.of(stream, gamma, nu, pooled))
        return gamma, nu
