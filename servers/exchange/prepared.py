"""Prepared noise: joint-noise samples made before the streams that use them,
while the servers are idle (between runs), and moved into a stream's pool when
its chunks need them (docs/services.md, "Prepared noise").

A stream's own pool (servers/exchange/joint.py) is filled only once the stream
is open, so a selection that asks ~10^5 queries back to back runs at the
sampler's pace.  Samples do not depend on the stream, only on the sampler's
shape — the stream kind and ε (with the task's F and comparison width, fixed
per task) — so the leader keeps, per task and shape, a *prepared pool* filled
by ordinary noise batches (`NoiseBatch` with no stream, naming the pool) and
hands its samples to a stream in a *move*: a batch that generates nothing, in
which both servers take the same range of prepared samples out of the pool and
keep them as the stream's own samples under the stream's sequence numbers.
From there the stream's rules hold unchanged: each sample is used once, the
chunk consumes it durably before its comparison.

Why no prepared sample is used twice, by either server: the pool's numbering
follows `servers.store.jointpool` (a batch reserves its numbers before the
sampler runs; the helper refuses numbers it reserved before; a take moves the
pool's `used` counter past what it takes and deletes everything below), and a
move takes on both servers before either keeps the samples for the stream.
A move the helper refuses leaves the leader's taken samples unused (lost, never
reused) and the stream's reserved numbers empty (skipped).

In memory only, on both servers: a restart loses a server's prepared pools (a
cache of randomness, nothing else).  Each pool has a generation, `epoch`, 16
random bytes the leader draws when it starts the pool; every batch and move
names it, and the helper keeps one generation per pool (a new one replaces the
old, dropping its samples), so a leader that restarted never pairs its new
samples with the helper's old ones under the same numbers.

Storage bound: at most `MAX_PREPARED` samples held or reserved per task on each
server (8 bytes each: 3.2 MB), `MAX_TASKS` tasks (the oldest dropped first).
Only Ask streams' ν is prepared (γ, one per stream, comes with the stream's
first batch as before; report-noisy-max draws in its chunk)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from svtagg.dp.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from svtagg.dp.jointsvt import JOINT_SVT_KINDS
from svtagg.dp.kinds import StreamKind
from svtagg.mpc.ring import U64
from svtagg.servers.exchange.values import PreparedRef
from svtagg.servers.store import jointpool
from svtagg.servers.store.jointpool import Batch, JointPool

#: Samples one server holds or has reserved per task (8 bytes of share each).
MAX_PREPARED = 400_000
#: Tasks with prepared pools on one server; the one whose first pool started
#: earliest is dropped first.
MAX_TASKS = 8
EPOCH_BYTES = 16


@dataclass(frozen=True)
class PrepareStatus:
    """What the leader holds of one shape for a task, and what it still means
    to make (the answer to the analyst's PrepareNoise)."""

    held: int
    pending: int
    cap: int
    task_held: int


def shape_key(kind: StreamKind | str, epsilon: Fraction) -> str:
    """The sampler shape of a stream of this kind and ε on a task: "kind:ε"."""
    return f"{StreamKind.parse(kind).value}:{Fraction(epsilon)}"


def parse_shape(text: str) -> tuple[StreamKind, Fraction]:
    """(kind, ε) of a shape key; InvalidArgument for anything else."""
    kind_text, _, eps_text = text.partition(":")
    try:
        kind, eps = StreamKind.parse(kind_text), Fraction(eps_text)
    except (ValueError, ZeroDivisionError):
        raise InvalidArgument(f"not a prepared-noise shape: {text[:40]!r}") from None
    if kind not in JOINT_SVT_KINDS or eps <= 0:
        raise InvalidArgument(f"not a prepared-noise shape: {text[:40]!r}")
    return kind, eps


@dataclass
class _Pool:
    epoch: bytes
    counters: JointPool = field(default_factory=JointPool)
    batches: list[Batch] = field(default_factory=list)

    @property
    def held(self) -> int:
        return sum(len(s) for _, s in self.batches)

    @property
    def reserved(self) -> int:
        """Numbers reserved and not yet taken: what the bound counts."""
        return self.counters.next - self.counters.used


class PreparedNoise:
    """One server's prepared pools, by (task id, shape)."""

    def __init__(self, cap: int = MAX_PREPARED, tasks: int = MAX_TASKS) -> None:
        self.cap = cap
        self.tasks = tasks
        self._pools: dict[tuple[str, str], _Pool] = {}
        self._order: list[str] = []  # task ids, least recently started first

    # ------------------------------------------------------------ reading
    def ref(self, task_id: str, shape: str) -> PreparedRef | None:
        pool = self._pools.get((task_id, shape))
        return None if pool is None else PreparedRef(task_id, shape, pool.epoch)

    def first_run(self, task_id: str, shape: str) -> tuple[int, int]:
        """(first, count) of the contiguous held samples from the lowest one."""
        pool = self._pools.get((task_id, shape))
        if pool is None:
            return 0, 0
        runs = jointpool.runs_of([(lo, len(s)) for lo, s in pool.batches])
        return replace(pool.counters, runs=runs).first_run()

    def held(self, task_id: str, shape: str | None = None) -> int:
        return sum(
            p.held for (t, s), p in self._pools.items() if t == task_id and shape in (None, s)
        )

    def _committed(self, task_id: str) -> int:
        return sum(p.reserved for (t, _), p in self._pools.items() if t == task_id)

    # ------------------------------------------------------------ the pool's life
    def start(self, task_id: str, shape: str) -> PreparedRef:
        """(The leader) the pool of this task and shape, started with a fresh
        epoch if there is none."""
        parse_shape(shape)
        if (task_id, shape) not in self._pools:
            self._admit(task_id)
            self._pools[(task_id, shape)] = _Pool(os.urandom(EPOCH_BYTES))
        ref = self.ref(task_id, shape)
        assert ref is not None
        return ref

    def _admit(self, task_id: str) -> None:
        if task_id in self._order:
            return
        self._order.append(task_id)
        while len(self._order) > self.tasks:
            self.drop_task(self._order[0])

    def _pool(self, ref: PreparedRef, create: bool) -> _Pool:
        """The pool `ref` names: on the helper (`create`) a generation other
        than its own replaces it; otherwise refused."""
        key = (ref.task_id, ref.shape)
        pool = self._pools.get(key)
        if pool is not None and pool.epoch == ref.epoch:
            return pool
        if not create:
            raise FailedPrecondition(
                f"no prepared noise of {ref.shape} for task {ref.task_id!r} at that generation"
            )
        if len(ref.epoch) != EPOCH_BYTES:
            raise InvalidArgument(f"a prepared pool's epoch is {EPOCH_BYTES} bytes")
        parse_shape(ref.shape)
        self._admit(ref.task_id)
        pool = self._pools[key] = _Pool(ref.epoch)
        return pool

    def reserve(self, ref: PreparedRef, count: int, lo: int | None = None) -> int:
        """A new batch's first number: the leader's next (lo None), or the
        leader's `lo` on the helper (refused if any of its numbers was reserved
        before); refused past the task's bound."""
        pool = self._pool(ref, create=lo is not None)
        if lo is not None:  # the helper: pools the leader let go may still hold room
            for key in [k for k in self._pools if k[0] == ref.task_id and k[1] != ref.shape]:
                if self._committed(ref.task_id) + count <= self.cap:
                    break
                del self._pools[key]  # at worst a later move of those is refused
        if self._committed(ref.task_id) + count > self.cap:
            raise ResourceExhausted(
                f"task {ref.task_id!r} holds {self.cap:,} prepared noise samples at most"
            )
        first = jointpool.reserve(pool.counters, count, lo)
        pool.counters = replace(pool.counters, next=first + count)
        return first

    def add(self, ref: PreparedRef, lo: int, shares: U64) -> bool:
        """Keep a batch's shares (False: its pool or its numbers are gone)."""
        pool = self._pools.get((ref.task_id, ref.shape))
        if pool is None or pool.epoch != ref.epoch:
            return False
        c = pool.counters
        if lo < c.used or lo + len(shares) > c.next:
            return False
        pool.batches.append((lo, np.asarray(shares, dtype=np.uint64)))
        return True

    def take(self, ref: PreparedRef, lo: int, count: int) -> U64:
        """Samples [lo, lo + count) out of the pool, and everything held below
        them dropped (`jointpool.take`'s rule: refused if any was taken before
        or is not held here)."""
        pool = self._pool(ref, create=False)
        taken, keep = jointpool.take(pool.batches, pool.counters.used, lo, count)
        end = lo + count
        pool.batches = sorted(keep, key=lambda b: b[0])  # every sample from `end` on
        pool.counters = replace(pool.counters, used=end, next=max(pool.counters.next, end))
        return taken

    def drop(self, task_id: str, shape: str) -> None:
        self._pools.pop((task_id, shape), None)
        if task_id in self._order and not any(t == task_id for t, _ in self._pools):
            self._order.remove(task_id)

    def drop_task(self, task_id: str) -> None:
        for key in [k for k in self._pools if k[0] == task_id]:
            del self._pools[key]
        if task_id in self._order:
            self._order.remove(task_id)
