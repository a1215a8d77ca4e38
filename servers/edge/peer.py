"""The gRPC implementation of `HelperPort`: unary calls to the helper's Peer
service with deadlines (domain values converted by `servers.edge.wire`), and
comparison sessions as Peer.Session bidirectional streams.  Transport failures
become refusals here (an unreachable or failing helper is PeerUnavailable, its
message starting "helper unreachable"), so the leader driver never sees gRPC.
Also the leader's checks of the helper: its health (`probe`) and, before the
leader starts, its certificate (`check_certificates`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any, TypeVar

import grpc

from svtagg.dp.errors import PeerUnavailable, Refusal
from svtagg.dp.task import TaskSpec
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import CertificateError, Identity, server_name, tls_target
from svtagg.proto.vocab import (
    CHANNEL_OPTIONS,
    PEER_DEADLINE,
    REFUSAL_KEY,
    Role,
    refusal_from_rpc,
)
from svtagg.servers.edge import datachannel, wire
from svtagg.servers.edge.datachannel import DataConnection, split_host
from svtagg.servers.exchange.party import PartyFactory
from svtagg.servers.exchange.session import LeaderSession
from svtagg.servers.exchange.values import (
    Agreement,
    CrawlStep,
    CrawlStepResult,
    PlanInfo,
    PlanRequest,
    PrepareStream,
    ReportIds,
    ReportPage,
    ReportSet,
    StreamInfo,
    TaskInfo,
    VerifyBatch,
    VerifyResult,
)

log = logging.getLogger(__name__)
Q = TypeVar("Q")
R = TypeVar("R")

#: Longest wait between two attempts to reconnect to the helper (ms).
MAX_RECONNECT_BACKOFF_MS = 1000
#: How long a call waits for a connection to the helper before it fails with
#: "helper unreachable" (s): above the longest reconnect backoff, so that a
#: helper that has just restarted is still reached, and far below PEER_DEADLINE,
#: so that a helper that is down is reported in seconds, not after a whole
#: call deadline.
CONNECT_DEADLINE = 3.0


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _unavailable(exc: grpc.aio.AioRpcError) -> PeerUnavailable:
    return PeerUnavailable(
        "helper unreachable: the connection was lost during a comparison "
        f"({exc.code().name}: {_one_line(exc.details())})"
    )


def _refusal(exc: grpc.aio.AioRpcError) -> Refusal:
    """An UNAVAILABLE that the helper did not send as a refusal of its own is
    the connection failing under the call."""
    refused = any(key == REFUSAL_KEY for key, _ in exc.trailing_metadata() or ())
    if exc.code() == grpc.StatusCode.UNAVAILABLE and not refused:
        return PeerUnavailable(
            f"helper unreachable: the connection was lost ({_one_line(exc.details())})"
        )
    return refusal_from_rpc(exc, "helper: ")


class GrpcHelperPort:
    """The leader's connection to the helper's Peer service."""

    def __init__(
        self,
        address: str,
        identity: Identity,
        data_channel: bool = True,
        connect_deadline: float = CONNECT_DEADLINE,
    ) -> None:
        """`data_channel`: ask the helper for the comparison data channel
        (servers/edge/datachannel.py) on each new session."""
        self.address = address
        self.identity = identity
        self.host = split_host(address)
        self.data_channel = data_channel
        self.connect_deadline = connect_deadline
        #: Why the last probe could not reach the helper ('' when it could).
        self.unreachable = ""
        creds = grpc.ssl_channel_credentials(identity.ca, identity.key, identity.cert)
        # Reconnect quickly after a helper restart.
        self.channel = grpc.aio.secure_channel(
            address,
            creds,
            options=[
                *CHANNEL_OPTIONS,
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
                *tls_target(Role.HELPER),
            ],
        )
        self.stub = pb_grpc.PeerStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    async def connected(self) -> None:
        """Return once there is a connection to the helper; PeerUnavailable
        ("helper unreachable: ...") if none is made within the connect deadline."""
        if self.channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return
        try:
            await asyncio.wait_for(self.channel.channel_ready(), self.connect_deadline)
        except TimeoutError:
            why = self.unreachable or "no connection"
            raise PeerUnavailable(
                f"helper unreachable at {self.address}: {why} "
                f"(waited {self.connect_deadline:g} s for a connection)"
            ) from None

    async def _call(
        self,
        call: wire.PeerCall[Q, R],
        rpc: grpc.aio.UnaryUnaryMultiCallable,
        request: Q,
        timeout: float | None,
    ) -> R:
        await self.connected()
        try:
            reply = await rpc(
                call.request.to_pb(request), timeout=timeout or PEER_DEADLINE, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            raise _refusal(exc) from None
        return call.reply.from_pb(reply)

    async def create_task(self, spec: TaskSpec, timeout: float | None = None) -> TaskInfo:
        return await self._call(wire.CREATE_TASK, self.stub.CreateTask, spec, timeout)

    async def digest(self, task_id: str, timeout: float | None = None) -> ReportSet:
        return await self._call(wire.DIGEST, self.stub.Digest, task_id, timeout)

    async def close_collection(self, task_id: str, timeout: float | None = None) -> ReportSet:
        stub = self.stub.CloseCollection
        return await self._call(wire.CLOSE_COLLECTION, stub, task_id, timeout)

    async def list_reports(self, page: ReportPage, timeout: float | None = None) -> ReportIds:
        return await self._call(wire.LIST_REPORTS, self.stub.ListReports, page, timeout)

    async def drop_reports(self, ids: ReportIds, timeout: float | None = None) -> ReportSet:
        return await self._call(wire.DROP_REPORTS, self.stub.DropReports, ids, timeout)

    async def mark_agreed(self, agreement: Agreement, timeout: float | None = None) -> TaskInfo:
        return await self._call(wire.MARK_AGREED, self.stub.MarkAgreed, agreement, timeout)

    async def verify(self, batch: VerifyBatch, timeout: float | None = None) -> VerifyResult:
        return await self._call(wire.VERIFY, self.stub.Verify, batch, timeout)

    async def crawl_step(self, step: CrawlStep, timeout: float | None = None) -> CrawlStepResult:
        return await self._call(wire.CRAWL, self.stub.CrawlStep, step, timeout)

    async def budget(self, task_id: str, timeout: float | None = None) -> TaskInfo:
        return await self._call(wire.BUDGET, self.stub.Budget, task_id, timeout)

    async def prepare_stream(
        self, request: PrepareStream, timeout: float | None = None
    ) -> StreamInfo:
        stub = self.stub.PrepareStream
        return await self._call(wire.PREPARE_STREAM, stub, request, timeout)

    async def fail_stream(self, stream_id: str, timeout: float | None = None) -> StreamInfo:
        return await self._call(wire.FAIL_STREAM, self.stub.FailStream, stream_id, timeout)

    async def reserve_plan(self, request: PlanRequest, timeout: float | None = None) -> PlanInfo:
        return await self._call(wire.RESERVE_PLAN, self.stub.ReservePlan, request, timeout)

    async def end_plan(self, plan_id: str, timeout: float | None = None) -> PlanInfo:
        return await self._call(wire.END_PLAN, self.stub.EndPlan, plan_id, timeout)

    async def fail_plan(self, plan_id: str, timeout: float | None = None) -> PlanInfo:
        return await self._call(wire.FAIL_PLAN, self.stub.FailPlan, plan_id, timeout)

    async def probe(self, timeout: float) -> str:
        """'' if the helper answers its health check SERVING within `timeout`, else
        a one-line reason (kept in `unreachable` for the calls' refusals)."""
        try:
            r = await self._health.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            ok = r.status == health_pb2.HealthCheckResponse.SERVING
            why = "" if ok else "it answers NOT_SERVING (shutting down)"
        except grpc.aio.AioRpcError as exc:
            why = f"{exc.code().name}: {_one_line(exc.details())}"
            try:
                found = await asyncio.to_thread(tls_problem, self.address, self.identity, timeout)
            except Exception:  # noqa: BLE001 - gRPC's reason is then the best there is
                found = None
            why = found[1] if found else why
        self.unreachable = why
        return why

    async def check_certificates(self) -> None:
        """`check_helper_certificate` on this port's helper."""
        await asyncio.to_thread(check_helper_certificate, self.address, self.identity)

    async def open_session(self, factory: PartyFactory) -> LeaderSession:
        """A new comparison session; on the data channel when the helper offers
        one, and when that connection cannot be made (the port filtered, or
        flooded), once more without it: slower, but the queries go on."""
        if not self.data_channel:
            return await self._open(factory, data=False)
        try:
            return await self._open(factory, data=True)
        except datachannel.ChannelClosed as exc:
            log.warning("data channel unusable (%s); this session runs inside gRPC", exc)
            return await self._open(factory, data=False)

    async def _open(self, factory: PartyFactory, data: bool) -> LeaderSession:
        await self.connected()
        call = self.stub.Session(wait_for_ready=True)

        async def write(frame: pb.PeerFrame) -> None:
            try:
                await call.write(frame)
            except grpc.aio.AioRpcError as exc:
                raise _unavailable(exc) from None

        async def read() -> Any:
            try:
                frame = await call.read()
            except grpc.aio.AioRpcError as exc:
                raise _unavailable(exc) from None
            return None if frame is grpc.aio.EOF else frame

        async def connect_data(port: int, sid: bytes) -> DataConnection:
            conn = await datachannel.connect(self.host, port, self.identity, Role.HELPER)
            try:
                await datachannel.announce(conn, sid)
            except BaseException:
                conn.close()
                raise
            return conn

        return await LeaderSession.open(
            write,
            read,
            call.cancel,
            call.done,
            factory,
            connect_data if data else None,
        )

    async def close(self) -> None:
        await self.channel.close()


def check_helper_certificate(address: str, identity: Identity, timeout: float = 3.0) -> None:
    """CertificateError (one line) when the helper's certificate does not verify
    against this leader's CA or the helper refuses the leader's; a helper that
    cannot be reached at all is no such error (it may start later).  Blocking."""
    found = tls_problem(address, identity, timeout)
    if found is not None and found[0]:
        raise CertificateError(
            f"the helper at {address}: {found[1]}; the leader and the helper "
            "need certificates of one CA (svtagg certs)"
        )


def tls_problem(address: str, identity: Identity, timeout: float) -> tuple[bool, str] | None:
    """Why a TLS connection from this leader to the helper at `address` fails, as
    (a certificate is at fault, one-line reason); None when it succeeds.  Blocking.

    The reasons gRPC gives for a failed handshake are OpenSSL's; this makes the
    same connection with Python's ssl (the leader's certificate, its CA, the
    helper's server name, HTTP/2 as gRPC negotiates it) to tell a helper that is
    down from one whose certificate another CA issued."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None  # not host:port: gRPC's own message will have to do
    ca = "this leader's CA (ca.pem)"
    try:
        raw = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except TimeoutError:
        return False, f"no answer within {timeout:g} s"
    except OSError as exc:
        return False, (exc.strerror or _one_line(str(exc))).lower()
    ctx = datachannel._context(identity, server=False)
    ctx.set_alpn_protocols(["h2"])
    try:
        sock = ctx.wrap_socket(raw, server_hostname=server_name(Role.HELPER))
    except ssl.SSLCertVerificationError as exc:
        raw.close()
        if exc.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            return True, f"its certificate is not a helper certificate: {exc.verify_message}"
        return True, f"its certificate is not from {ca}: {exc.verify_message}"
    except OSError as exc:  # ssl.SSLError included
        raw.close()
        return False, f"no TLS handshake ({_one_line(str(exc))})"
    with sock:
        # A helper that refuses the leader's certificate closes the connection
        # once the handshake is done; one that accepts it sends its HTTP/2 settings.
        try:
            refused = not sock.recv(1)
        except ssl.SSLError:  # its alert
            refused = True
        except OSError:
            return None  # silent or reset: nothing here says a certificate is wrong
    if refused:
        return True, (
            "it closed the connection after the TLS handshake: it does not accept "
            "this leader's certificate (issued by another CA?)"
        )
    return None
