"""The prefix crawl on the servers: a task whose reports are strings
(validity ``crawl:B``, vdaf/crawl.py) walked level by level, each level
answering only which candidates hold a noisy count ≥ τ (docs/privacy.md,
"The prefix crawl").

A task's reports are verified at ingest (the first level's check,
servers/ingest/batches.py) and, unlike every other task's, kept by both
servers after the agreement: a walk reads them from the store, in ascending
report id, into one `vdaf.crawl.CrawlReports` per server (`Walk`).

One level (`CrawlLevel`, the leader's `crawl_level`):

1. the leader checks the request against its walk (the parents are distinct
   candidates of the walk's last level, or the root; the bits fit), then
   opens a CRAWL stream at the level's ε: charged on both ledgers, as every
   stream is (crash-safe, never refunded);
2. the leader keeps the parents' nodes, extends them by `steps` bits and
   sends its check value of every report (`CrawlStep`: a 16-byte hash of
   its prep shares of the step's binary levels, `vdaf.crawl.check_values`);
   the helper runs the same checks against *its own* walk, extends, decides
   every report's check from both values (equal exactly when the check
   holds), drops the refused reports, and answers with its values; the
   leader decides alike;
3. each server turns its Field128 count shares into ring shares locally
   (`vdaf.crawl.ring_shares`) and adds its own discrete Laplace noise of
   scale 2/ε (`dp.crawl.draw_level_noise`); the leader subtracts τ;
4. one comparison chunk of the stream (`ChunkKind.CRAWL`) reveals each
   candidate's sign bit [z_L + z_H ≥ 0] to both servers (the garbled
   `any_per_group` circuit with groups of one); the stream closes.

What the helper enforces on its own: the stream was charged on its ledger
and answers once; the parents are candidates it evaluated and checked at the
walk's last level; every report's check.  So a leader that lies cannot have
an unchecked node counted, nor a level answered twice for one charge.

Walks live in memory (at most `MAX_WALKS` per server; the oldest idle one
is forgotten past it), and each server records every level it completed
(`Store.add_crawl_level`: the parents, the bits, the reports its check
refused), so a restart, a forgotten walk or a level that failed costs a
rebuild from the record, not the walk (`Walks.at`); a level that failed is
asked again under a new charge, and the charges made stay spent.  A crawl
runs in the leader's and the helper's main processes (chunk workers and
replicas do not serve it).
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.dp.crawl import MAX_LEVEL_CANDIDATES, MAX_STRIDE, draw_level_noise, level_scale
from svtagg.dp.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from svtagg.dp.kinds import clamp_bound
from svtagg.dp.noise import RandomSource
from svtagg.mpc.ring import U64
from svtagg.proto.terms import MAX_MESSAGE_BYTES, PEER_DEADLINE, REPORT_PAGE
from svtagg.servers.ingest.validity import report_of, task_validity
from svtagg.servers.store.rules import CrawlRecord, Store, TaskState
from svtagg.vdaf.crawl import (
    CHECK_VALUE_SIZE,
    CrawlReports,
    check_hashed,
    check_values,
    prefixes_from_bytes,
    prefixes_to_bytes,
    ring_shares,
)
from svtagg.vdaf.sparse import SparseError

#: Walks one server holds at once (each holds every report's key: ≈ 3 KB a
#: report at 64 bits).
MAX_WALKS = 2
#: The most bytes of one server's check values for one level (a CrawlStep
#: message, with room for its other fields).
MAX_STEP_BYTES = MAX_MESSAGE_BYTES - (1 << 20)
#: A walk's id: 32 hex digits, drawn by the leader.
WALK_ID_RE = re.compile(r"[0-9a-f]{32}")


def check_crawl_task(task: TaskState) -> int:
    """A crawl task, closed and agreed: its strings' length in bits."""
    v = task_validity(task) if task.params.validity else None
    if v is None or not v.crawl:
        raise FailedPrecondition(
            f"task {task.params.task_id!r} is not a crawl task (validity crawl:B)"
        )
    if task.collection_open:
        raise FailedPrecondition(f"task {task.params.task_id!r}: close the collection first")
    if not task.agreed:
        raise FailedPrecondition(
            f"task {task.params.task_id!r}: the servers have not agreed on the reports; close again"
        )
    return v.bits


def load_reports(store: Store, task: TaskState) -> list[tuple[bytes, bytes, bytes]]:
    """Every report the server kept for the task, ascending by id: (nonce,
    public share, this server's key)."""
    v = task_validity(task)
    out: list[tuple[bytes, bytes, bytes]] = []
    after = b""
    while True:
        ids = store.report_ids(task.params.task_id, after, REPORT_PAGE)
        if not ids:
            return out
        out.extend(report_of(v, blob) for blob in store.shares(task.params.task_id, ids))
        after = ids[-1]


@dataclass
class Walk:
    """One server's side of one walk: its reports' state (`CrawlReports`)
    and the number of levels it has completed."""

    walk_id: str
    task_id: str
    reports: CrawlReports
    levels: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def size(self) -> int:
        return len(self.reports.reports)

    def check_level(self, parents: Sequence[int], depth: int, steps: int) -> int:
        """Refuse a level this walk cannot answer soundly; its candidates' count."""
        r = self.reports
        if depth != r.depth:
            raise InvalidArgument(
                f"walk {self.walk_id} is at {r.depth} bits; the level names depth {depth}"
            )
        if not 1 <= steps <= MAX_STRIDE:
            raise InvalidArgument(f"a level extends by 1 to {MAX_STRIDE} bits, got {steps}")
        if depth + steps > r.dpf.bits:
            raise InvalidArgument(
                f"{depth} + {steps} bits is past the task's strings of {r.dpf.bits} bits"
            )
        if depth == 0:
            if list(parents) not in ([], [0]):
                raise InvalidArgument("a walk's first level extends the root: no parents")
            width = 1
        else:
            if not parents:
                raise InvalidArgument("a level past the root names the prefixes it extends")
            if any(b <= a for a, b in zip(parents, parents[1:], strict=False)):
                raise InvalidArgument("the parents must be distinct and ascending")
            if not set(r.candidates).issuperset(parents):
                raise InvalidArgument(
                    "a parent is not a candidate of the walk's last level: only checked "
                    "prefixes are extended"
                )
            width = len(parents)
        k = width << steps
        if k > MAX_LEVEL_CANDIDATES:
            raise InvalidArgument(
                f"a level of {k:,} candidates (at most {MAX_LEVEL_CANDIDATES:,}): keep fewer "
                "prefixes or extend by fewer bits"
            )
        if self.size * CHECK_VALUE_SIZE > MAX_STEP_BYTES:
            raise ResourceExhausted(
                f"a level over {self.size:,} reports moves {self.size * CHECK_VALUE_SIZE:,} "
                "bytes of checks in one message"
            )
        return k

    def extend(self, parents: Sequence[int], steps: int, agg_id: int) -> npt.NDArray[np.uint8]:
        """Keep the parents (past the root) and evaluate their extensions:
        this server's check value of every report (`vdaf.crawl.check_values`:
        16 bytes each, a hash of its prep shares of the step's binary levels)."""
        if self.reports.depth:
            self.reports.keep(list(parents))
        prep = self.reports.extend(steps)
        return check_values(prep, agg_id, self.reports.live)

    def decide(
        self, leader: npt.NDArray[np.uint8], helper: npt.NDArray[np.uint8]
    ) -> npt.NDArray[np.bool_]:
        """Every report's check from both servers' check values; the refused
        ones are dropped (for the rest of the walk).  Returns them."""
        live = self.reports.live
        try:
            ok = check_hashed(leader, helper, live)
        except SparseError as exc:
            raise InvalidArgument(f"the level's check values: {exc}") from None
        invalid = live & ~ok
        self.reports.drop(invalid)
        self.levels += 1
        return invalid

    def inputs(self, epsilon: Fraction, rng: RandomSource, agg_id: int, tau: int = 0) -> U64:
        """This server's comparison inputs: its ring share of each candidate's
        count plus its own noise (the leader: minus τ)."""
        z = ring_shares(self.reports.count_shares(), agg_id)
        z = z + draw_level_noise(epsilon, z.size, rng).astype(np.uint64)
        if agg_id == 0:
            z = z - np.uint64(tau)
        return z


def candidates_of(record: CrawlRecord) -> list[int]:
    """The candidates of a recorded level: its parents (the root: 0)
    extended by its bits, parent-major."""
    parents = list(prefixes_from_bytes(record.parents)) or [0]
    return [(p << record.steps) | x for p in parents for x in range(1 << record.steps)]


def crawl_width(n_max: int, epsilon: Fraction) -> int:
    """The comparison width of a level, from public values alone (both
    servers derive it): |count + ν_L + ν_H − τ| is at most n_max + 4·n_max
    (τ's bound) + both draws' clamps (`dp.kinds.clamp_bound` of scale 2/ε),
    which stays below 2^(w−1)."""
    bound = 5 * n_max + 2 * clamp_bound(level_scale(epsilon)) + 1
    return max(2, min(64, bound.bit_length() + 1))


def step_deadline(reports: int, parents: int, steps: int) -> float:
    """Seconds the leader gives the helper's side of a level (`CrawlStep`):
    the peer deadline plus a generous 200 ns per node evaluated (a kept
    prefix expands 2^(steps+1) − 2 nodes per report) and 50 µs per report
    (a new walk reads and decodes every report first)."""
    nodes = max(parents, 1) * ((2 << steps) - 2)
    return PEER_DEADLINE + reports * (nodes * 2e-7 + 5e-5)


def shares_of(data: bytes, reports: int) -> npt.NDArray[np.uint8]:
    """The other server's check values, as `Walk.decide` takes them."""
    if len(data) != reports * CHECK_VALUE_SIZE:
        raise InvalidArgument(
            f"the check values of {reports} reports are {reports * CHECK_VALUE_SIZE} bytes, "
            f"got {len(data)}"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(reports, CHECK_VALUE_SIZE)


class Walks:
    """One server's walks, the levels awaiting their comparison chunk, and
    each level's record once its comparison is done.

    A walk is answered from memory when it stands where the level asks (its
    last level's candidates at the level's depth); otherwise — after a
    restart, a walk forgotten past `MAX_WALKS`, a level that failed, or a
    level asked again — it is rebuilt from this server's record of the
    walk's completed levels (`Store.crawl_levels`): the reports read again,
    the ones its checks refused left out, and the walk positioned at the
    recorded level whose candidates the request extends
    (`CrawlReports.resume`).  So what a level may extend is always what this
    server itself checked and recorded."""

    def __init__(self) -> None:
        self._walks: OrderedDict[str, Walk] = OrderedDict()
        #: Per CRAWL stream: this server's inputs to its one comparison chunk.
        self._inputs: dict[str, U64] = {}
        #: Per CRAWL stream: the record of its level, written once compared.
        self._pending: dict[str, CrawlRecord] = {}

    async def at(
        self,
        store: Store,
        task: TaskState,
        walk_id: str,
        depth: int,
        parents: Sequence[int],
        agg_id: int,
    ) -> Walk:
        """The walk, standing where a level at `depth` extending `parents`
        asks (module and class text); FailedPrecondition when this server
        recorded no level the request extends."""
        if not WALK_ID_RE.fullmatch(walk_id):
            raise InvalidArgument(f"a walk id is 32 hex digits, got {walk_id!r}")
        task_id = task.params.task_id
        walk = self._walks.get(walk_id)
        if walk is not None and walk.task_id != task_id:
            raise FailedPrecondition(f"walk {walk_id} is not a walk of task {task_id!r}")
        if walk is not None and walk.lock.locked():
            raise FailedPrecondition(f"walk {walk_id} is answering another level; one at a time")
        if walk is not None:
            r = walk.reports
            if depth == 0 and r.depth == 0 or (depth and r.depth == depth and not r.kept):
                self._walks.move_to_end(walk_id)
                return walk
        records = store.crawl_levels(walk_id)
        if any(rec.task_id != task_id for rec in records):
            raise FailedPrecondition(f"walk {walk_id} is not a walk of task {task_id!r}")
        base: CrawlRecord | None = None
        if depth:
            fits = [
                rec
                for rec in records
                if rec.depth + rec.steps == depth and set(candidates_of(rec)).issuperset(parents)
            ]
            if not fits:
                raise FailedPrecondition(
                    f"this server recorded no level of walk {walk_id} whose candidates the "
                    f"level extends (depth {depth}): start a new walk"
                )
            base = fits[-1]
        bits = check_crawl_task(task)
        # The store is read on the event loop (its connection is the loop's);
        # the keys are decoded off it.
        kept = load_reports(store, task)
        reports = await asyncio.to_thread(CrawlReports, bits, agg_id, task.verify_key, kept)
        if base is not None:
            dropped = np.zeros(len(kept), dtype=bool)
            for rec in records:
                dropped[np.frombuffer(rec.refused, dtype="<u4")] = True
            reports.resume(candidates_of(base), depth, dropped)
        while len(self._walks) >= MAX_WALKS and walk_id not in self._walks:
            oldest = next((w for w in self._walks.values() if not w.lock.locked()), None)
            if oldest is None:
                raise ResourceExhausted(f"this server runs {MAX_WALKS} walks already")
            del self._walks[oldest.walk_id]
        walk = Walk(walk_id, task_id, reports, base.level if base is not None else 0)
        self._walks[walk_id] = walk
        self._walks.move_to_end(walk_id)
        return walk

    def forget(self, walk: Walk) -> None:
        """A level failed inside: the next one rebuilds from the record."""
        if self._walks.get(walk.walk_id) is walk:
            del self._walks[walk.walk_id]

    def stepped(
        self,
        stream_id: str,
        walk: Walk,
        parents: Sequence[int],
        depth: int,
        steps: int,
        refused: npt.NDArray[np.bool_],
        z: U64,
    ) -> None:
        """A level's step done on this server: its comparison inputs, and its
        record, written once the comparison is done (`compared`)."""
        if stream_id in self._inputs:
            raise FailedPrecondition(f"stream {stream_id} has its level's inputs already")
        self._inputs[stream_id] = z
        self._pending[stream_id] = CrawlRecord(
            walk.walk_id,
            walk.levels,
            walk.task_id,
            depth,
            steps,
            prefixes_to_bytes(parents if depth else ()),
            np.flatnonzero(refused).astype("<u4").tobytes(),
        )

    def compared(self, store: Store, stream_id: str) -> None:
        """The level's comparison is done on this server: record the level."""
        record = self._pending.pop(stream_id, None)
        if record is not None:
            store.add_crawl_level(record)

    def has_inputs(self, stream_id: str, k: int) -> bool:
        z = self._inputs.get(stream_id)
        return z is not None and z.size == k

    def take_inputs(self, stream_id: str, k: int) -> U64:
        """The level's inputs, once: a chunk of another size is refused."""
        z = self._inputs.pop(stream_id, None)
        if z is None or z.size != k:
            raise FailedPrecondition(
                f"this server holds no crawl level of {k} candidates for stream {stream_id}"
            )
        return z

    def drop_inputs(self, stream_id: str) -> None:
        self._inputs.pop(stream_id, None)
        self._pending.pop(stream_id, None)
