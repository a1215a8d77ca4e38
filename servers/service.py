"""The gRPC edge of a server: wire types in, domain calls, status codes out.

One process serves one role.  Both roles serve Ingest and Health; the leader
serves the Analyst API and drives the helper through the helper's Peer
service.  Every RPC first checks the role in the caller's (CA-verified)
certificate, then maps domain refusals to one status code each.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import grpc
from svtagg.analyst.kinds import StreamKind
from svtagg.analyst.oracle import BudgetExhausted, OracleError, StreamClosed
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.servers.core import (
    Chunk,
    PartyFactory,
    ServerCore,
    garbled_circuit_party,
    parse_chunk,
    parse_task_params,
    parse_taus,
)
from svtagg.servers.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PeerUnavailable,
    ResourceExhausted,
    ServerError,
)
from svtagg.servers.faults import crash_point
from svtagg.servers.limits import RateLimiter
from svtagg.servers.peer import (
    CHUNK_DEADLINE,
    OPTIONS,
    PEER_DEADLINE,
    FrameChannel,
    PeerClient,
    SessionPool,
)
from svtagg.servers.store import (
    FAILED,
    OPEN,
    REPORT_ID_BYTES,
    Store,
    StreamState,
    TaskState,
)
from svtagg.servers.tls import Identity, role_of_pem
from svtagg.servers.wire import UNDECODABLE, add_service

log = logging.getLogger("svtagg.server")

#: Lanes per range-validation chunk (2d per report): about 150 MB of protocol
#: traffic, well inside the chunk deadline.
VALIDATION_LANES = 50_000


STATUS_OF: dict[type[Exception], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    PeerUnavailable: grpc.StatusCode.UNAVAILABLE,
    BudgetExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StreamClosed: grpc.StatusCode.FAILED_PRECONDITION,
}

KIND_TO_PB = {
    StreamKind.LAP24: pb.LAP24,
    StreamKind.LAP3: pb.LAP3,
    StreamKind.EXP3: pb.EXP3,
    StreamKind.CTT: pb.CTT,
}
KIND_FROM_PB = {v: k for k, v in KIND_TO_PB.items()}

#: Message-size limits (an upload batch is at most 32 MiB; protocol messages
#: between the servers are fragmented) on the server; clients set the same.
SERVER_OPTIONS = [*OPTIONS, ("grpc.so_reuseport", 0)]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _status_for(exc: BaseException) -> grpc.StatusCode | None:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    if isinstance(exc, (ValueError, OracleError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    return None


#: Stands for "no client certificate", possible only on the optional
#: server-only-TLS ingest port (the main port's handshake demands a certificate).
ANONYMOUS = ""


def rpc(*roles: str) -> Callable[[F], F]:
    """Allow only callers whose certificate has one of `roles` (ANONYMOUS: none at
    all); map refusals to statuses."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            caller = peer_role(context) or ANONYMOUS
            if caller not in roles:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"{method.__name__} needs a certificate of role "
                    f"{' or '.join(r or 'none' for r in roles)}; "
                    f"caller presented {caller or 'none'}",
                )
            if request is UNDECODABLE:
                log.info("%s refused: INVALID_ARGUMENT (undecodable)", method.__name__)
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{method.__name__}: the request does not parse as its protobuf message",
                )
            limiter: RateLimiter | None = getattr(self, "limiter", None)
            # The leader (the only holder of the leader certificate) drives the
            # helper at protocol speed; every other caller is rate limited.
            if limiter is not None and caller != "leader" and not limiter.allow(
                caller_identity(context)
            ):
                log.info("%s refused: RESOURCE_EXHAUSTED (rate limit)", method.__name__)
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"rate limit: at most {limiter.rate:g} requests/s "
                    f"(bursts of {limiter.burst:g}) per caller; retry later",
                )
            try:
                return await method(self, request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - every refusal becomes a status
                code = _status_for(exc)
                if code is None:
                    log.exception("internal error in %s", method.__name__)
                    await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
                    raise
                # Only the method and code: messages may name parameters, never data.
                log.info("%s refused: %s", method.__name__, code.name)
                await context.abort(code, str(exc))

        return handler  # type: ignore[return-value]

    return wrap


def caller_identity(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for rate limits: the certificate's hash, else the address."""
    certs = context.auth_context().get("x509_pem_cert")
    if certs:
        return "cert:" + hashlib.sha256(certs[0]).hexdigest()
    peer = context.peer() or ""
    return "addr:" + peer.rsplit(":", 1)[0]


def peer_role(context: grpc.aio.ServicerContext) -> str | None:
    certs = context.auth_context().get("x509_pem_cert")
    return role_of_pem(certs[0]) if certs else None


# ---------------------------------------------------------------- conversions
def task_info(t: TaskState) -> pb.TaskInfo:
    p = t.params
    return pb.TaskInfo(
        spec=pb.TaskSpec(
            task_id=p.task_id, d=p.d, frac_bits=p.frac_bits, n_max=p.n_max,
            min_batch=p.min_batch, epsilon_total=str(p.epsilon_total),
            delta_total=str(p.delta_total), epsilon_min=str(p.epsilon_min),
            validate_reports=p.validate_reports,
        ),
        n=t.n,
        collection_open=t.collection_open,
        budget=pb.BudgetStatus(
            epsilon_total=str(t.budget.epsilon_total), delta_total=str(t.budget.delta_total),
            epsilon_spent=str(t.budget.epsilon_spent), delta_spent=str(t.budget.delta_spent),
        ),
        streams=t.streams,
        agreed=t.agreed,
    )


def stream_info(s: StreamState) -> pb.StreamInfo:
    return pb.StreamInfo(
        stream_id=s.stream_id, task_id=s.task_id, kind=KIND_TO_PB[s.kind],
        epsilon=str(s.epsilon), delta=str(s.delta), closed=s.state != OPEN,
        queries_answered=s.queries,
    )


def spec_params(spec: pb.TaskSpec) -> Any:
    return parse_task_params(
        spec.task_id, spec.d, spec.frac_bits, spec.n_max, spec.min_batch,
        spec.epsilon_total, spec.delta_total, spec.epsilon_min, spec.validate_reports,
    )


def split_ids(blob: bytes) -> list[bytes]:
    """Concatenated 16-byte report ids back to a list."""
    if len(blob) % REPORT_ID_BYTES:
        raise InvalidArgument(f"report ids must be {REPORT_ID_BYTES} bytes each")
    return [blob[i : i + REPORT_ID_BYTES] for i in range(0, len(blob), REPORT_ID_BYTES)]


def kind_of(value: int) -> StreamKind:
    if value not in KIND_FROM_PB:
        raise InvalidArgument(f"unknown stream kind {value}")
    return KIND_FROM_PB[value]  # type: ignore[index]


# ---------------------------------------------------------------- services
class IngestService(pb_grpc.IngestServicer):
    limiter: RateLimiter | None = None

    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc("client", ANONYMOUS)
    async def Upload(self, request: pb.UploadBatch, context: Any) -> pb.UploadResult:
        field = "explicit_share" if self.core.role == "leader" else "seed"
        reports = []
        for r in request.reports:
            if r.WhichOneof("share") != field:
                raise InvalidArgument(f"the {self.core.role} takes reports with a {field}")
            reports.append((r.report_id, getattr(r, field)))
        n = self.core.upload(request.task_id, reports)
        return pb.UploadResult(accepted=len(reports), n=n)

    @rpc("client", "analyst", "leader", ANONYMOUS)
    async def GetTask(self, request: pb.TaskRef, context: Any) -> pb.TaskInfo:
        return task_info(self.core.store.task(request.task_id))


def _peer_error(exc: grpc.aio.AioRpcError) -> ServerError:
    """The helper's refusal, kept with its meaning (e.g. its own budget check)."""
    msg = f"helper: {exc.details()}"
    for cls, code in STATUS_OF.items():
        if code == exc.code() and issubclass(cls, ServerError):
            return cls(msg)
    return PeerUnavailable(msg)


class AnalystService(pb_grpc.AnalystServicer):
    """The leader's analyst API; every state change is mirrored on the helper."""

    limiter: RateLimiter | None = None

    def __init__(self, core: ServerCore, peer: PeerClient, party: PartyFactory) -> None:
        self.core = core
        self.peer = peer
        self.pool = SessionPool(peer, party)
        self._busy: set[str] = set()
        self._close_lock = asyncio.Lock()
        # Tasks whose helper ledger may lag the leader's (after a restart, or after
        # a PrepareStream that failed): reconciled before the next stream opens.
        self._unsynced: set[str] = set(core.store.task_ids())
        # Streams this leader failed on recovery: failed on the helper as well at
        # the next reconciliation, so that both stores show them failed.
        self._recovered: dict[str, list[str]] = {}
        for sid, tid in core.store.recovered_failed:
            self._recovered.setdefault(tid, []).append(sid)
        self._sync_lock = asyncio.Lock()

    async def sync_ledgers(self, task_id: str) -> int:
        """Bring the helper's ledger up to the leader's; returns the charges replayed.

        Who wins: the leader charges first (committed) and the helper second, so
        after a crash between the two charges the leader has spent more.  The
        leader's ledger wins: every stream the leader failed is failed on the
        helper too, and one the helper never saw is replayed there (PrepareStream,
        which charges and draws a γ_H that is never used, then FailStream).  Both
        ledgers then show the larger spend; nothing is ever refunded."""
        async with self._sync_lock:
            if task_id not in self._unsynced:
                return 0
            task = self.core.store.task(task_id)
            ref = pb.TaskRef(task_id=task_id)
            helper = (await self._call(self.peer.stub.Budget, ref)).budget
            mine = task.budget
            replayed = 0
            if (helper.epsilon_spent, helper.delta_spent) != (
                str(mine.epsilon_spent), str(mine.delta_spent)
            ):
                failed = self.core.store.stream_ids(task_id, FAILED)
            else:
                failed = self._recovered.get(task_id, [])
            for sid in failed:
                replayed += await self._fail_or_replay(self.core.store.stream(sid))
            self._recovered.pop(task_id, None)
            if replayed:
                log.info("task %s: ledgers reconciled, %d charge(s) replayed on the helper",
                         task_id, replayed)
            self._unsynced.discard(task_id)
            return replayed

    async def _fail_or_replay(self, s: StreamState) -> int:
        ref = pb.StreamRef(stream_id=s.stream_id)
        try:
            await self.peer.stub.FailStream(ref, timeout=PEER_DEADLINE, wait_for_ready=True)
            return 0
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise _peer_error(exc) from None
        await self._call(self.peer.stub.PrepareStream, pb.PrepareStreamRequest(
            stream_id=s.stream_id, task_id=s.task_id, kind=KIND_TO_PB[s.kind],
            epsilon=str(s.epsilon), delta=str(s.delta) if s.delta else "",
        ))
        await self._call(self.peer.stub.FailStream, ref)
        return 1

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any) -> Any:
        try:
            return await method(request, timeout=PEER_DEADLINE, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise _peer_error(exc) from None

    @rpc("analyst")
    async def CreateTask(self, request: pb.TaskSpec, context: Any) -> pb.TaskInfo:
        params = spec_params(request)
        self.core.check_budget_policy(params)
        if params.task_id in self.core.store.task_ids():
            raise AlreadyExists(f"task {params.task_id!r} already exists")
        await self._call(self.peer.stub.CreateTask, request)
        return task_info(self.core.store.create_task(params))

    @rpc("analyst")
    async def DescribeTask(self, request: pb.TaskRef, context: Any) -> pb.TaskInfo:
        return await self._with_helper_budget(self.core.store.task(request.task_id))

    @rpc("analyst")
    async def Budget(self, request: pb.TaskRef, context: Any) -> pb.TaskInfo:
        return await self._with_helper_budget(self.core.store.task(request.task_id))

    async def _with_helper_budget(self, task: TaskState) -> pb.TaskInfo:
        try:
            await self.sync_ledgers(task.params.task_id)
            task = self.core.store.task(task.params.task_id)
        except PeerUnavailable:
            pass
        info = task_info(task)
        try:
            helper = await self._call(
                self.peer.stub.Budget, pb.TaskRef(task_id=task.params.task_id)
            )
        except PeerUnavailable:
            return info  # the leader's view still answers while the helper is down
        info.helper_budget.CopyFrom(helper.budget)
        return info

    @rpc("analyst")
    async def ListTasks(self, request: pb.Empty, context: Any) -> pb.TaskList:
        store = self.core.store
        return pb.TaskList(tasks=[task_info(store.task(t)) for t in store.task_ids()])

    @rpc("analyst")
    async def CloseCollection(self, request: pb.TaskRef, context: Any) -> pb.TaskInfo:
        """Close on both servers, then reconcile: a report only one server stored
        (a client that gave up between the two uploads) is taken out on that server,
        so n and the sums cover exactly the reports both hold.  Idempotent; queries
        are refused until both servers have recorded the agreement."""
        async with self._close_lock:  # one reconciliation at a time
            return await self._close(request.task_id)

    async def _close(self, task_id: str) -> pb.TaskInfo:
        task = self.core.store.task(task_id)
        if task.agreed:
            return task_info(task)
        if task.collection_open:
            task = self.core.store.close_collection(task_id)
        ref = pb.TaskRef(task_id=task_id)
        helper = await self._call(self.peer.stub.CloseCollection, ref)
        dropped = 0
        if (helper.n, helper.report_digest) != (task.n, task.digest):
            listed = await self._call(self.peer.stub.ListReports, ref)
            theirs = set(split_ids(listed.report_ids))
            mine = set(self.core.store.report_ids(task_id))
            only_mine, only_theirs = sorted(mine - theirs), sorted(theirs - mine)
            task = self.core.remove_reports(task_id, only_mine)
            helper = await self._call(
                self.peer.stub.DropReports,
                pb.ReportIds(task_id=task_id, report_ids=b"".join(only_theirs)),
            )
            dropped = len(only_mine) + len(only_theirs)
            log.info("task %s: dropped %d reports only one server had", task_id, dropped)
            if (helper.n, helper.report_digest) != (task.n, task.digest):
                raise FailedPrecondition(
                    f"servers still disagree on the reports (leader n={task.n}, "
                    f"helper n={helper.n}); try closing again"
                )
        invalid: list[bytes] = []
        if task.params.validate_reports:
            invalid = await self._validate_reports(task)
            if invalid:
                task = self.core.remove_reports(task_id, invalid)
                helper = await self._call(
                    self.peer.stub.DropReports,
                    pb.ReportIds(task_id=task_id, report_ids=b"".join(invalid)),
                )
                log.info("task %s: dropped %d reports with values out of range",
                         task_id, len(invalid))
                if (helper.n, helper.report_digest) != (task.n, task.digest):
                    raise FailedPrecondition("servers disagree after validation; close again")
        await self._call(
            self.peer.stub.MarkAgreed,
            pb.CollectionDigest(n=task.n, report_digest=task.digest, task_id=task_id),
        )
        info = task_info(self.core.store.mark_agreed(task_id))
        info.dropped_reports = dropped + len(invalid)
        return info

    async def _validate_reports(self, task: TaskState) -> list[bytes]:
        """Range-check every report with the first-YES circuit; the invalid ones.

        Reports go in sorted id order, VALIDATION_LANES lanes (2d per report) at a
        time; a hit names one invalid report, and the scan resumes after it."""
        task_id = task.params.task_id
        ids = sorted(self.core.store.report_ids(task_id))
        per = 2 * task.params.d
        batch = max(1, VALIDATION_LANES // per)
        invalid: list[bytes] = []
        i = 0
        while i < len(ids):
            part = ids[i : i + batch]
            j = await self._validation_chunk(task, part)
            if j is None:
                i += len(part)
            else:
                invalid.append(part[j // per])
                i += j // per + 1
        return invalid

    async def _validation_chunk(self, task: TaskState, report_ids: list[bytes]) -> int | None:
        header = pb.ChunkHeader(
            validate_task_id=task.params.task_id, report_ids=b"".join(report_ids)
        )
        z = self.core.validation_inputs(task, report_ids)
        j, _ = await self._exchange(header, lambda party: party.first_yes(z))
        return None if j is None else int(j)

    async def _exchange(
        self,
        header: pb.ChunkHeader,
        run: Callable[[Any], Awaitable[Any]],
        on_written: Callable[[], None] | None = None,
        on_failure: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Any, int]:
        """One chunk on a pooled session: send the header, (on_written: the durable
        mark), wait for the helper's go, run the garbled protocol, wait for its
        done.  A failure after on_written calls on_failure.  Returns the result and
        the bytes exchanged."""
        session = await self.pool.acquire()
        healthy = False
        written = False
        try:
            before = session.channel.traffic
            await session.channel.write_frame(pb.PeerFrame(header=header))
            if on_written is not None:
                on_written()
            written = True
            verdict = await session.status()
            if not verdict.ok:
                healthy = True  # the protocol never started; the session is intact
                raise _refusal(verdict)
            result = await asyncio.wait_for(run(session.party), CHUNK_DEADLINE)
            crash_point("chunk.after_result")
            done = await session.status()
            if not done.ok:
                raise _refusal(done)
            healthy = True
        except BaseException as exc:
            if written and on_failure is not None:
                await on_failure()
            if isinstance(exc, grpc.aio.AioRpcError):
                raise PeerUnavailable(f"helper: {exc.code().name} {exc.details()}") from None
            if isinstance(exc, asyncio.TimeoutError):
                raise PeerUnavailable("the protocol with the helper timed out") from None
            raise
        finally:
            await self.pool.release(session, healthy)
        return result, session.channel.traffic - before

    @rpc("analyst")
    async def OpenStream(self, request: pb.OpenStreamRequest, context: Any) -> pb.StreamInfo:
        """Charge the leader's ledger, then the helper's; each draws its own γ."""
        stream_id = secrets.token_hex(16)
        kind = kind_of(request.kind)
        if request.task_id in self._unsynced:
            self.core.store.task(request.task_id)  # NOT_FOUND before any peer call
            await self.sync_ledgers(request.task_id)
        # The leader's stream stays `opening` (failed closed on a restart) until the
        # helper has charged too, so a crash between the two charges is reconciled.
        self.core.open_stream(
            stream_id, request.task_id, kind, request.epsilon, request.delta, open_now=False
        )
        crash_point("open.before_helper")
        try:
            await self._call(
                self.peer.stub.PrepareStream,
                pb.PrepareStreamRequest(
                    stream_id=stream_id, task_id=request.task_id, kind=request.kind,
                    epsilon=request.epsilon, delta=request.delta,
                ),
            )
        except BaseException:
            # The leader's charge stays spent (never refund); the stream never answers.
            # The helper may or may not have charged: reconcile before the next open.
            self.core.store.fail_stream(stream_id)
            self._unsynced.add(request.task_id)
            raise
        self.core.store.confirm_stream(stream_id)
        return stream_info(self.core.store.stream(stream_id))

    def _open_stream(self, stream_id: str, compare: bool) -> tuple[StreamState, TaskState]:
        stream, task = self.core.stream_and_task(stream_id)
        if compare != (stream.kind == StreamKind.CTT):
            raise InvalidArgument(
                "a CompareToThresholds stream answers Compare, not Ask"
                if stream.kind == StreamKind.CTT
                else "only a CompareToThresholds stream answers Compare"
            )
        if stream.state != OPEN:
            raise FailedPrecondition(f"stream {stream_id} is {stream.state}; it answers no more")
        return stream, task

    @rpc("analyst")
    async def Ask(self, request: pb.AskRequest, context: Any) -> pb.AskResponse:
        stream, task = self._open_stream(request.stream_id, compare=False)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        taus = parse_taus(task, request.tau, len(chunk))

        async def run(party: Any, s: StreamState) -> tuple[Any, int, bool]:
            z = self.core.ask_inputs(s, task, chunk, taus)
            j = await party.first_yes(z)
            return j, len(chunk) if j is None else j + 1, j is not None

        j, closed, nbytes = await self._run_chunk(stream, chunk, False, run)
        return pb.AskResponse(yes=j is not None, index=j or 0, closed=closed, peer_bytes=nbytes)

    @rpc("analyst")
    async def Compare(self, request: pb.CompareRequest, context: Any) -> pb.CompareResponse:
        stream, task = self._open_stream(request.stream_id, compare=True)
        chunk = parse_chunk(task, request.queries.index, request.queries.complement)
        lows = parse_taus(task, request.tau_low, len(chunk), "tau_low")
        highs = parse_taus(task, request.tau_high, len(chunk), "tau_high")
        self.core.check_gap(stream, task, lows, highs)

        async def run(party: Any, s: StreamState) -> tuple[Any, int, bool]:
            z_high, z_low = self.core.compare_inputs(s, task, chunk, (lows, highs))
            out = list(await party.compare_to_thresholds(z_high, z_low))
            return out, len(out), 2 in out

        out, closed, nbytes = await self._run_chunk(stream, chunk, True, run)
        return pb.CompareResponse(
            outcomes=[int(o) + 1 for o in out], closed=closed, peer_bytes=nbytes
        )

    async def _run_chunk(
        self,
        stream: StreamState,
        chunk: Chunk,
        compare: bool,
        run: Callable[[Any, StreamState], Awaitable[tuple[Any, int, bool]]],
    ) -> tuple[Any, bool, int]:
        """One chunk at a time per stream (concurrent chunks are refused)."""
        sid = stream.stream_id
        if sid in self._busy:
            raise FailedPrecondition(f"stream {sid} is answering another chunk; send one at a time")
        self._busy.add(sid)
        try:
            return await self._chunk(stream, chunk, compare, run)
        finally:
            self._busy.discard(sid)

    async def _chunk(
        self,
        stream: StreamState,
        chunk: Chunk,
        compare: bool,
        run: Callable[[Any, StreamState], Awaitable[tuple[Any, int, bool]]],
    ) -> tuple[Any, bool, int]:
        """Send the header, mark the chunk in progress durably (while the helper
        does the same), run the garbled comparison on a pooled session, record
        the result.  Once marked, any failure or refusal fails the stream closed
        on both servers; nothing is refunded."""
        sid, next_chunk = stream.stream_id, stream.chunks + 1
        header = pb.ChunkHeader(
            stream_id=sid, chunk_no=next_chunk, compare=compare,
            queries=pb.Queries(
                index=chunk.index.tolist(),
                complement=chunk.complement.tolist() if chunk.complement.any() else [],
            ),
        )

        def mark() -> None:
            # Both servers fsync their "chunk in progress" mark in parallel; neither
            # runs the circuit before its own mark is durable.
            self.core.store.begin_chunk(sid, next_chunk)
            crash_point("chunk.after_mark")

        async def fail() -> None:
            self.core.store.fail_stream(sid)
            await self._fail_helper(sid)

        (result, answered, close), traffic = await self._exchange(
            header, lambda party: run(party, stream), mark, fail
        )
        self.core.store.end_chunk(sid, answered, close)
        return result, close, traffic

    async def _fail_helper(self, stream_id: str) -> None:
        try:
            await self.peer.stub.FailStream(pb.StreamRef(stream_id=stream_id), timeout=5.0)
        except grpc.aio.AioRpcError:
            log.warning("could not fail stream %s on the helper", stream_id)


def _refusal_frame(exc: BaseException) -> pb.PeerFrame:
    """The helper's answer to a chunk header it refuses (the session lives on)."""
    code = _status_for(exc) or grpc.StatusCode.INTERNAL
    return pb.PeerFrame(status=pb.PeerStatus(ok=False, code=code.value[0], message=str(exc)))


def _refusal(status: pb.PeerStatus) -> ServerError:
    code = grpc.StatusCode.UNKNOWN
    for c in grpc.StatusCode:
        if c.value[0] == status.code:
            code = c
    for cls, mapped in STATUS_OF.items():
        if mapped == code and issubclass(cls, ServerError):
            return cls(f"helper: {status.message}")
    return PeerUnavailable(f"helper: {status.message}")


class PeerService(pb_grpc.PeerServicer):
    """The helper's side: only the leader (role `leader`) may call it."""

    def __init__(self, core: ServerCore, party: PartyFactory) -> None:
        self.core = core
        self.party = party
        self.stopping = asyncio.Event()

    @rpc("leader")
    async def CreateTask(self, request: pb.TaskSpec, context: Any) -> pb.TaskInfo:
        params = spec_params(request)
        self.core.check_budget_policy(params)  # the helper enforces its own cap too
        if params.task_id in self.core.store.task_ids():
            existing = self.core.store.task(params.task_id)
            if existing.params == params:
                # The leader retries after failing between the two creations.
                return task_info(existing)
        return task_info(self.core.store.create_task(params))

    @rpc("leader")
    async def Digest(self, request: pb.TaskRef, context: Any) -> pb.CollectionDigest:
        t = self.core.store.task(request.task_id)
        return pb.CollectionDigest(n=t.n, report_digest=t.digest)

    @rpc("leader")
    async def CloseCollection(self, request: pb.TaskRef, context: Any) -> pb.CollectionDigest:
        t = self.core.store.task(request.task_id)
        if t.collection_open:
            t = self.core.store.close_collection(request.task_id)
        return pb.CollectionDigest(n=t.n, report_digest=t.digest)

    @rpc("leader")
    async def ListReports(self, request: pb.TaskRef, context: Any) -> pb.ReportIds:
        t = self.core.store.task(request.task_id)
        if t.collection_open:
            raise FailedPrecondition("report ids are listed only after the close")
        ids = self.core.store.report_ids(request.task_id)
        return pb.ReportIds(task_id=request.task_id, report_ids=b"".join(ids))

    @rpc("leader")
    async def DropReports(self, request: pb.ReportIds, context: Any) -> pb.CollectionDigest:
        t = self.core.remove_reports(request.task_id, split_ids(request.report_ids))
        return pb.CollectionDigest(n=t.n, report_digest=t.digest)

    @rpc("leader")
    async def MarkAgreed(self, request: pb.CollectionDigest, context: Any) -> pb.TaskInfo:
        """Record agreement only if this server's report set is the leader's."""
        t = self.core.store.task(request.task_id)
        if t.collection_open or (t.n, t.digest) != (request.n, request.report_digest):
            raise FailedPrecondition(
                f"helper holds n={t.n} reports with another digest; not agreed"
            )
        return task_info(self.core.store.mark_agreed(request.task_id))

    @rpc("leader")
    async def Budget(self, request: pb.TaskRef, context: Any) -> pb.TaskInfo:
        return task_info(self.core.store.task(request.task_id))

    @rpc("leader")
    async def PrepareStream(self, request: pb.PrepareStreamRequest, context: Any) -> pb.StreamInfo:
        state = self.core.open_stream(
            request.stream_id, request.task_id, kind_of(request.kind), request.epsilon,
            request.delta,
        )
        return stream_info(state)

    @rpc("leader")
    async def FailStream(self, request: pb.StreamRef, context: Any) -> pb.StreamInfo:
        self.core.store.fail_stream(request.stream_id)
        return stream_info(self.core.store.stream(request.stream_id))

    @rpc("leader")
    async def Session(self, request_iterator: Any, context: Any) -> None:
        """A comparison session: set up once, then chunks one at a time until EOF."""
        channel = FrameChannel(context.write, context.read)
        first = await channel.read_frame()
        if first.WhichOneof("body") != "open" or len(first.open.session_id) != 16:
            raise InvalidArgument("a session starts with SessionOpen (16-byte id)")
        party = self.party("helper", channel, first.open.session_id)
        await party.setup()
        while True:
            frame = await self._next_frame(context)
            if frame is grpc.aio.EOF or frame is None:
                return
            if frame.WhichOneof("body") != "header":
                raise InvalidArgument("expected a chunk header")
            if frame.header.validate_task_id:
                await self._validate(context, party, frame.header)
                continue
            try:
                stream, task, chunk = self._accept(frame.header)
            except Exception as exc:  # noqa: BLE001 - refusal goes back, session lives
                await context.write(_refusal_frame(exc))
                continue
            crash_point("chunk.after_mark")
            await context.write(pb.PeerFrame(status=pb.PeerStatus(ok=True)))
            await self._run(party, stream, task, chunk, frame.header.compare)
            await context.write(pb.PeerFrame(status=pb.PeerStatus(ok=True)))

    async def _validate(self, context: Any, party: Any, h: pb.ChunkHeader) -> None:
        """The evaluator's side of one range-validation chunk (see the leader's
        `_validate_reports`); a refusal goes back and the session lives on."""
        try:
            task = self.core.store.task(h.validate_task_id)
            if not task.params.validate_reports:
                raise FailedPrecondition("this task does not validate its reports")
            if task.agreed:
                raise FailedPrecondition("the report set is already agreed")
            z = self.core.validation_inputs(task, split_ids(h.report_ids))
        except Exception as exc:  # noqa: BLE001 - refusal goes back, session lives
            await context.write(_refusal_frame(exc))
            return
        await context.write(pb.PeerFrame(status=pb.PeerStatus(ok=True)))
        await party.first_yes(z)
        await context.write(pb.PeerFrame(status=pb.PeerStatus(ok=True)))

    async def _next_frame(self, context: Any) -> Any:
        """The next frame, or None once shutdown begins while the session is idle
        (so a stopping helper ends its sessions at once instead of after the grace)."""
        read = asyncio.ensure_future(context.read())
        stop = asyncio.ensure_future(self.stopping.wait())
        done, _ = await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if read in done:
            return read.result()
        read.cancel()
        return None

    def _accept(self, h: pb.ChunkHeader) -> tuple[StreamState, TaskState, Chunk]:
        stream, task = self.core.stream_and_task(h.stream_id)
        if h.compare != (stream.kind == StreamKind.CTT):
            raise InvalidArgument("chunk mode does not match the stream kind")
        chunk = parse_chunk(task, h.queries.index, h.queries.complement)
        self.core.store.begin_chunk(h.stream_id, h.chunk_no)
        return stream, task, chunk

    async def _run(
        self, party: Any, stream: StreamState, task: TaskState, chunk: Chunk, compare: bool
    ) -> None:
        try:
            if compare:
                z_high, z_low = self.core.compare_inputs(stream, task, chunk, None)
                out = list(await party.compare_to_thresholds(z_high, z_low))
                answered, close = len(out), 2 in out
            else:
                j = await party.first_yes(self.core.ask_inputs(stream, task, chunk, None))
                answered, close = (len(chunk), False) if j is None else (j + 1, True)
        except BaseException:
            self.core.store.fail_stream(stream.stream_id)
            raise
        crash_point("chunk.after_result")
        self.core.store.end_chunk(stream.stream_id, answered, close)


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: SERVING while up, NOT_SERVING once shutdown begins."""

    def __init__(self) -> None:
        self.serving = True
        self._changed = asyncio.Event()

    def set_serving(self, serving: bool) -> None:
        self.serving = serving
        self._changed.set()

    def _status(self) -> health_pb2.HealthCheckResponse:
        s = health_pb2.HealthCheckResponse
        return s(status=s.SERVING if self.serving else s.NOT_SERVING)

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        if request is UNDECODABLE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "undecodable request")
        if request.service not in ("", "svtagg.v1.Ingest", "svtagg.v1.Analyst", "svtagg.v1.Peer"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return self._status()

    async def Watch(self, request: Any, context: Any) -> Any:
        while True:
            yield self._status()
            if not self.serving:
                return
            self._changed.clear()
            await self._changed.wait()


# ---------------------------------------------------------------- server
@dataclass
class ServerConfig:
    role: str
    store_path: str
    identity: Identity
    listen: str = "127.0.0.1:0"
    helper_address: str | None = None
    #: Optional second port for clients holding no certificate (server-only TLS);
    #: only Ingest answers there, every other service sees no role and refuses.
    ingest_listen: str | None = None
    #: Per-caller token bucket (requests/s, burst); the leader's calls to the
    #: helper are exempt.  rate <= 0 disables the limit.
    rate_limit: float = 1000.0
    rate_burst: float = 2000.0
    #: Budget policy: largest total (ε, δ) a task may have on this server (None: no cap).
    max_epsilon_total: Fraction | None = None
    max_delta_total: Fraction | None = None
    #: Refuse tasks that do not range-check their reports.
    require_validation: bool = False


class SvtaggServer:
    """A running leader or helper: `await start()`, `port`, `await stop()`."""

    def __init__(self, config: ServerConfig, party: PartyFactory = garbled_circuit_party) -> None:
        if config.role not in ("leader", "helper"):
            raise ValueError(f"role must be leader or helper, got {config.role!r}")
        if config.role == "leader" and not config.helper_address:
            raise ValueError("the leader needs the helper's address")
        self.config = config
        self.store = Store(config.store_path)
        self.core = ServerCore(
            config.role,  # type: ignore[arg-type]
            self.store,
            max_epsilon_total=config.max_epsilon_total,
            max_delta_total=config.max_delta_total,
            require_validation=config.require_validation,
        )
        self.health = HealthService()
        self.peer: PeerClient | None = None
        self.analyst: AnalystService | None = None
        self.peer_service: PeerService | None = None
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.limiter = RateLimiter(config.rate_limit, config.rate_burst)
        ingest = IngestService(self.core)
        ingest.limiter = self.limiter
        add_service(pb_grpc.add_IngestServicer_to_server, ingest, self.server)
        add_service(health_pb2_grpc.add_HealthServicer_to_server, self.health, self.server)
        if config.role == "leader":
            assert config.helper_address is not None
            self.peer = PeerClient(config.helper_address, config.identity)
            self.analyst = AnalystService(self.core, self.peer, party)
            self.analyst.limiter = self.limiter
            add_service(pb_grpc.add_AnalystServicer_to_server, self.analyst, self.server)
        else:
            self.peer_service = PeerService(self.core, party)
            add_service(pb_grpc.add_PeerServicer_to_server, self.peer_service, self.server)
        ident = config.identity
        creds = grpc.ssl_server_credentials(
            [(ident.key, ident.cert)], root_certificates=ident.ca, require_client_auth=True
        )
        self.port = self.server.add_secure_port(config.listen, creds)
        if self.port == 0:
            raise OSError(f"cannot listen on {config.listen}")
        self.ingest_port: int | None = None
        if config.ingest_listen:
            self.ingest_port = self.server.add_secure_port(
                config.ingest_listen, grpc.ssl_server_credentials([(ident.key, ident.cert)])
            )

    async def start(self, warm: bool = True) -> None:
        await self.server.start()
        if self.analyst is not None and warm:
            # Base OTs with the helper before the first chunk needs them.
            self._warm = asyncio.ensure_future(self.analyst.pool.warm())
        log.info(
            "%s listening on port %d (failed closed on recovery: %d streams)",
            self.config.role, self.port, self.store.failed_on_recovery,
        )

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful shutdown: report NOT_SERVING, let calls finish, close the store."""
        self.health.set_serving(False)
        if self.peer_service is not None:
            self.peer_service.stopping.set()
        warm = getattr(self, "_warm", None)
        if warm is not None and not warm.done():
            warm.cancel()
        await self.server.stop(grace)
        if self.analyst is not None:
            await self.analyst.pool.close()
        if self.peer is not None:
            await self.peer.close()
        self.store.close()

    async def wait(self) -> None:
        await self.server.wait_for_termination()
