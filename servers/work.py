"""Leased comparison work: the leader's chunks and close-time passes run by
worker processes that take them from the server's PostgreSQL store.

Who does what (docs/scaling.md, "Leased comparison work"):
- the leader's front end (`svtagg-server --role leader --lease-work`) checks
  each Ask / Compare and each close-time pass, writes it to the `work` table
  as a job (`pending`) and waits for its result;
- a leader worker (`svtagg-server --role leader --worker`) takes the oldest
  pending job with `FOR UPDATE SKIP LOCKED` (two workers never take the same
  job), marks it `leased` by itself until `lease_until`, renews the lease while
  it runs, and runs the job exactly as the in-process leader would (its own
  `LeaderDriver` over the same store): durable chunk mark, garbled comparison
  with the helper process it is paired with, result.  A helper worker
  (`--role helper --worker`) is a helper process over the helper's store that
  serves sessions; the chunk's helper half takes its own durable mark there;
- the result (or the refusal, as a PeerStatus) is written only while the
  lease is still the worker's (`finish`), and a finished job's state is final
  (trigger), so a job is answered at most once;
- a worker that dies stops renewing: the waiting front end sees the lease
  expire, takes the job out of the table (so that a late answer has nowhere to
  go), and fails the stream closed on both servers (nothing refunded) —
  exactly what a leader crash mid-chunk does.  A job no
  worker took within `PICKUP_DEADLINE` is withdrawn: it never ran, its
  stream stays open and nothing was spent.

Nothing here ever re-runs a job: a chunk whose noise may have been drawn is
failed, never retried.  At most one job per stream is queued or running (a
unique index), so two front ends cannot run two chunks of one stream at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, overload

from svtagg.dp.errors import FailedPrecondition, InvalidArgument, PeerUnavailable, Refusal
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import refusal_from_status, refusal_status, status_of
from svtagg.servers.edge import wire
from svtagg.servers.exchange.values import (
    Ask,
    AskAnswer,
    ChunkKind,
    Compare,
    CompareAnswer,
    JobAnswer,
    JobInputs,
    NoisyMax,
    NoisyMaxAnswer,
    RobustChunk,
)

if TYPE_CHECKING:  # psycopg is the optional `postgres` extra: imported where used
    import psycopg

    from svtagg.servers.store.rules import Store

log = logging.getLogger("svtagg.work")

#: A worker's lease on a job, renewed every third of it while the job runs.
LEASE_SECONDS = 10.0
#: How long a queued job waits for a worker before it is withdrawn (never run).
PICKUP_DEADLINE = 30.0
#: A worker is counted alive if it was seen within this many leases.
ALIVE_LEASES = 3
#: The front end re-reads a waited-for job at least this often (lease expiry).
POLL_SECONDS = 0.5
#: Finished jobs whose waiter gave up are deleted after this many seconds.
SWEEP_AFTER = 600.0


class WorkerLost(PeerUnavailable):
    """The worker running a job stopped renewing its lease (the job is gone)."""


class Unclaimed(PeerUnavailable):
    """No worker took the job in time, or none is running (nothing ran)."""


@dataclass(frozen=True)
class Job:
    """A job as the `work` table holds it: its kind (a `ChunkKind`'s value) and
    its payload, the protobuf bytes `servers.edge.wire` makes of its inputs."""

    job_id: int
    kind: str
    stream_id: str | None
    payload: bytes


class JobQueue(Protocol):
    """Where the leader queues a job and waits for its result (`WorkQueue`)."""

    async def run(
        self,
        kind: str,
        payload: bytes,
        stream_id: str | None = None,
        on_lost: Callable[[str], Awaitable[None]] | None = None,
    ) -> bytes: ...


@overload
async def run_leased(
    queue: JobQueue,
    inputs: Ask,
    stream_id: str | None = None,
    on_lost: Callable[[str], Awaitable[None]] | None = None,
) -> AskAnswer: ...


@overload
async def run_leased(
    queue: JobQueue,
    inputs: Compare,
    stream_id: str | None = None,
    on_lost: Callable[[str], Awaitable[None]] | None = None,
) -> CompareAnswer: ...


@overload
async def run_leased(
    queue: JobQueue,
    inputs: NoisyMax,
    stream_id: str | None = None,
    on_lost: Callable[[str], Awaitable[None]] | None = None,
) -> NoisyMaxAnswer: ...


@overload
async def run_leased(
    queue: JobQueue,
    inputs: RobustChunk,
    stream_id: str | None = None,
    on_lost: Callable[[str], Awaitable[None]] | None = None,
) -> bytes: ...


async def run_leased(
    queue: JobQueue,
    inputs: JobInputs,
    stream_id: str | None = None,
    on_lost: Callable[[str], Awaitable[None]] | None = None,
) -> JobAnswer:
    """Run `inputs` as a leased job on `queue` (`WorkQueue.run`); its answer."""
    kind, payload = wire.job_payload(inputs)
    return wire.job_answer(kind, await queue.run(kind, payload, stream_id, on_lost))


async def serve_job(job: Job, run: Callable[[JobInputs], Awaitable[JobAnswer]]) -> bytes:
    """A worker's side of `run_leased`: `job`'s inputs to `run`, its answer as
    the bytes the front end reads back."""
    try:
        kind = ChunkKind(job.kind)
    except ValueError:
        raise InvalidArgument(f"unknown job kind {job.kind!r}") from None
    return wire.job_result(kind, await run(wire.job_inputs(kind, job.payload)))


def _channel(schema: str, what: str) -> str:
    # NOTIFY channels are identifiers (≤ 63 bytes); one pair per store schema.
    return f"svtagg_{what}_{schema}"[:63]


class WorkQueue:
    """The `work` table of one server's PostgreSQL store, over two connections
    of its own (commands, and LISTEN for wake-ups)."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        listen: psycopg.AsyncConnection[Any],
        schema: str,
        metrics: Any = None,
    ) -> None:
        self._conn = conn
        self._listen = listen
        self.schema = schema
        self._lock = asyncio.Lock()
        self._events: dict[int, asyncio.Event] = {}
        self._new = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._abandoned: set[asyncio.Future[None]] = set()
        self._early: set[int] = set()  # finished jobs whose waiter was not yet registered
        self._alive = (0, 0.0)  # (leader workers seen, when: time.monotonic())
        #: The front end's Prometheus metrics (servers.edge.metrics.Metrics), if any.
        self.metrics = metrics

    @classmethod
    async def connect(
        cls, store: Store, channels: tuple[str, ...] = ("new", "done"), metrics: Any = None
    ) -> WorkQueue:
        """The queue of `store` (a `PgStore`; SQLite has no work queue), over two
        sessions of its own on the store's database (`PgStore.open_session`),
        woken by the notifications it needs: "done" (a front end), "new" (a worker)."""
        from psycopg import sql

        from svtagg.servers.store.postgres import PgStore

        if not isinstance(store, PgStore):
            raise ValueError("leased work needs a PostgreSQL store (--db postgresql://...)")
        schema = store.schema
        conns = []
        try:
            for _ in range(2):
                conns.append(await store.open_session(f"svtagg-work-{os.getpid()}"))
        except BaseException:
            for c in conns:
                await c.close()
            raise
        q = cls(conns[0], conns[1], schema, metrics)
        for what in channels:
            await q._listen.execute(
                sql.SQL("LISTEN {}").format(sql.Identifier(_channel(schema, what)))
            )
        q._reader = asyncio.ensure_future(q._read_notifies())
        return q

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        await self._conn.close()
        await self._listen.close()

    async def _read_notifies(self) -> None:
        done = _channel(self.schema, "done")
        async for n in self._listen.notifies():
            if n.channel == done:
                with contextlib.suppress(ValueError):
                    job_id = int(n.payload)
                    ev = self._events.get(job_id)
                    if ev is not None:
                        ev.set()
                    else:  # its waiter may not be registered yet (see `run`)
                        if len(self._early) > 4096:
                            self._early.clear()
                        self._early.add(job_id)
            else:
                self._new.set()

    async def _exec(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async with self._lock:
            cur = await self._conn.execute(query.encode(), params)
            return await cur.fetchall() if cur.description else []

    # ------------------------------------------------------------ front end
    async def reset(self) -> int:
        """At the front end's start: withdraw jobs whose waiter is gone (pending)
        and drop finished ones.  Leased jobs are left to their workers (their
        streams were failed closed by the store's recovery)."""
        rows = await self._exec("DELETE FROM work WHERE state <> 'leased' RETURNING state")
        return sum(r[0] == "pending" for r in rows)

    async def workers_alive(self) -> int:
        """Leader workers seen within ALIVE_LEASES leases (a count of at least one
        is trusted for a second, so a busy front end asks once a second)."""
        now = time.monotonic()
        if self._alive[0] and now - self._alive[1] < 1.0:
            return self._alive[0]
        rows = await self._exec(
            "SELECT count(*) FROM workers WHERE role='leader'"
            " AND seen > now() - make_interval(secs => %s)",
            (ALIVE_LEASES * LEASE_SECONDS,),
        )
        self._alive = (int(rows[0][0]), now)
        if self.metrics is not None:
            self.metrics.workers_alive.set(self._alive[0])
        return self._alive[0]

    async def run(
        self,
        kind: str,
        payload: bytes,
        stream_id: str | None = None,
        on_lost: Callable[[str], Awaitable[None]] | None = None,
        pickup: float = PICKUP_DEADLINE,
    ) -> bytes:
        """Queue a job and wait for its result; a refusal is raised as such.
        `on_lost(stream_id)` runs when the job's worker was lost mid-job (the
        stream must then be failed closed on both servers)."""
        import psycopg

        if not await self.workers_alive():
            self._count(kind, "unclaimed")
            raise Unclaimed("no comparison worker is running (svtagg-server --worker)")
        try:
            # One round trip: the row, and the workers' wake-up (sent at commit).
            rows = await self._exec(
                "WITH j AS (INSERT INTO work (kind, stream_id, payload) VALUES (%s, %s, %s)"
                " RETURNING job_id) SELECT job_id, pg_notify(%s, job_id::text) FROM j",
                (kind, stream_id, payload, _channel(self.schema, "new")),
            )
        except psycopg.errors.UniqueViolation:
            raise FailedPrecondition(
                f"stream {stream_id} is answering another chunk; send one at a time"
            ) from None
        job_id = int(rows[0][0])
        ev = self._events[job_id] = asyncio.Event()
        if job_id in self._early:  # finished before its waiter was registered
            ev.set()
        try:
            out = await self._wait(job_id, ev, stream_id, on_lost, pickup)
            self._count(kind, "done")
            return out
        except WorkerLost:
            self._count(kind, "lost")
            raise
        except Unclaimed:
            self._count(kind, "unclaimed")
            raise
        except Refusal:
            self._count(kind, "refused")
            raise
        except asyncio.CancelledError:
            self._count(kind, "abandoned")
            # The caller gave up (e.g. the analyst's deadline): a job not yet taken
            # is withdrawn; one already running finishes and is swept later.
            cleanup = asyncio.ensure_future(self._abandon(job_id))
            self._abandoned.add(cleanup)
            cleanup.add_done_callback(self._abandoned.discard)
            raise
        finally:
            self._events.pop(job_id, None)

    def _count(self, kind: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.jobs.labels(kind=kind, outcome=outcome).inc()

    async def _abandon(self, job_id: int) -> None:
        with contextlib.suppress(Exception):
            await self._exec(
                "DELETE FROM work WHERE state <> 'leased'"
                " AND (job_id=%s OR (state <> 'pending'"
                " AND created < now() - make_interval(secs => %s)))",
                (job_id, SWEEP_AFTER),
            )

    async def _wait(
        self,
        job_id: int,
        ev: asyncio.Event,
        stream_id: str | None,
        on_lost: Callable[[str], Awaitable[None]] | None,
        pickup: float,
    ) -> bytes:
        while True:
            # Woken by the worker's notification, or every POLL_SECONDS to look
            # at the lease; a finished job is taken out of the table as it is read.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), POLL_SECONDS)
            ev.clear()
            self._early.discard(job_id)
            rows = await self._exec(
                "DELETE FROM work WHERE job_id=%s AND state IN ('done', 'failed')"
                " RETURNING state, result, error",
                (job_id,),
            )
            if rows:
                state, result, error = rows[0]
                if state == "done":
                    return bytes(result)
                raise refusal_from_status(pb.PeerStatus.FromString(bytes(error or b"")))
            rows = await self._exec(
                "SELECT state, lease_until < now(),"
                " created < now() - make_interval(secs => %s) FROM work WHERE job_id=%s",
                (pickup, job_id),
            )
            if not rows:
                raise PeerUnavailable(f"job {job_id} vanished from the work table")
            state, expired, stale = rows[0]
            # Taken out of the table only if still in that state (a worker may
            # have leased or finished it since): a lease it no longer holds
            # cannot be renewed or answered.
            if state == "leased" and expired and await self._take_out(job_id, "leased", True):
                log.warning("job %d: its worker was lost mid-job (lease expired)", job_id)
                if stream_id is not None and on_lost is not None:
                    await on_lost(stream_id)
                raise WorkerLost(
                    "the comparison worker running this chunk was lost; "
                    + ("the stream is failed closed" if stream_id else "try again")
                )
            if state == "pending" and stale and await self._take_out(job_id, "pending"):
                raise Unclaimed(
                    f"no comparison worker took the job within {pickup:g} s; nothing ran"
                )

    async def _take_out(self, job_id: int, state: str, expired: bool = False) -> bool:
        rows = await self._exec(
            "DELETE FROM work WHERE job_id=%s AND state=%s"
            + (" AND lease_until < now()" if expired else "")
            + " RETURNING job_id",
            (job_id, state),
        )
        return bool(rows)

    # ------------------------------------------------------------ workers
    async def heartbeat(self, owner: str, role: str) -> None:
        await self._exec(
            "INSERT INTO workers (owner, role, seen) VALUES (%s, %s, now())"
            " ON CONFLICT (owner) DO UPDATE SET seen=now()",
            (owner, role),
        )

    async def leave(self, owner: str) -> None:
        await self._exec("DELETE FROM workers WHERE owner=%s", (owner,))

    async def lease(self, owner: str, seconds: float = LEASE_SECONDS) -> Job | None:
        """The oldest pending job, now leased by `owner`; None if there is none."""
        rows = await self._exec(
            "UPDATE work SET state='leased', owner=%s,"
            " lease_until=now() + make_interval(secs => %s)"
            " WHERE job_id = (SELECT job_id FROM work WHERE state='pending'"
            " ORDER BY job_id FOR UPDATE SKIP LOCKED LIMIT 1)"
            " RETURNING job_id, kind, stream_id, payload",
            (owner, seconds),
        )
        if not rows:
            return None
        job_id, kind, stream_id, payload = rows[0]
        return Job(int(job_id), str(kind), stream_id, bytes(payload))

    async def renew(self, job: Job, owner: str, seconds: float = LEASE_SECONDS) -> bool:
        """Extend the lease; False if it is no longer this worker's."""
        rows = await self._exec(
            "UPDATE work SET lease_until=now() + make_interval(secs => %s)"
            " WHERE job_id=%s AND owner=%s AND state='leased' RETURNING job_id",
            (seconds, job.job_id, owner),
        )
        return bool(rows)

    async def finish(
        self, job: Job, owner: str, result: bytes | None, error: BaseException | None = None
    ) -> bool:
        """Write the result (or the refusal) while the lease is still this
        worker's; False (nothing written) if it is not."""
        state, err = ("done", None) if error is None else ("failed", _failure(error))
        rows = await self._exec(
            "WITH f AS (UPDATE work SET state=%s, result=%s, error=%s, lease_until=NULL"
            " WHERE job_id=%s AND owner=%s AND state='leased' RETURNING job_id)"
            " SELECT job_id, pg_notify(%s, job_id::text) FROM f",
            (state, result, err, job.job_id, owner, _channel(self.schema, "done")),
        )
        return bool(rows)

    async def wait_for_new(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._new.wait(), timeout)
        self._new.clear()


def _failure(exc: BaseException) -> bytes:
    """A failed job's status as stored: a refusal keeps its message; any other
    error says what the in-process path says (its text may hold data)."""
    status = refusal_status(exc)
    if status_of(exc) is None:
        status.message = "internal server error"
    return status.SerializeToString()


def worker_name(role: str) -> str:
    return f"{role}-{os.uname().nodename}-{os.getpid()}-{secrets.token_hex(4)}"


class Worker:
    """A leader worker's loop: lease, run with the lease renewed, finish."""

    def __init__(
        self,
        queue: WorkQueue,
        execute: Callable[[Job], Awaitable[bytes]],
        lease: float = LEASE_SECONDS,
        owner: str | None = None,
    ) -> None:
        self.queue = queue
        self.execute = execute
        self.lease_seconds = lease
        self.owner = owner or worker_name("leader")
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        log.info("worker %s: taking work (lease %.1f s)", self.owner, self.lease_seconds)
        beat = asyncio.ensure_future(self._beat())
        try:
            while not self.stopping.is_set():
                job = await self.queue.lease(self.owner, self.lease_seconds)
                if job is None:
                    await self.queue.wait_for_new(self.lease_seconds / 3)
                    continue
                await self._run(job)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await beat
            with contextlib.suppress(Exception):
                await self.queue.leave(self.owner)

    async def _beat(self) -> None:
        import psycopg

        while True:
            with contextlib.suppress(psycopg.Error):
                await self.queue.heartbeat(self.owner, "leader")
            await asyncio.sleep(self.lease_seconds / 3)

    async def _run(self, job: Job) -> None:
        running = asyncio.ensure_future(self.execute(job))
        lost = False
        while True:
            done, _ = await asyncio.wait({running}, timeout=self.lease_seconds / 3)
            if done:
                break
            if not await self.queue.renew(job, self.owner, self.lease_seconds):
                # Taken away (the front end saw the lease expire): the stream is
                # failed on both servers; this run's answer must never be used.
                lost = True
                running.cancel()
                with contextlib.suppress(BaseException):
                    await running
                break
        if lost:
            log.warning("worker %s: lost the lease on job %d", self.owner, job.job_id)
            return
        if running.cancelled():
            return  # the worker is stopping past its grace: the lease runs out
        exc = running.exception()
        if exc is not None and not isinstance(exc, Refusal):
            # The type and the place, not the text: it may hold data.
            where = traceback.extract_tb(exc.__traceback__)[-1:]
            at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
            log.error(
                "worker %s: job %d failed: %s%s", self.owner, job.job_id, type(exc).__name__, at
            )
        written = await self.queue.finish(
            job, self.owner, None if exc is not None else running.result(), exc
        )
        if not written:
            log.warning(
                "worker %s: job %d was no longer leased; result dropped", self.owner, job.job_id
            )
