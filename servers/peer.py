"""The gRPC implementation of `HelperPort`: unary calls to the helper's Peer
service with deadlines, and comparison sessions as Peer.Session bidirectional
streams.  Transport failures become refusals here (an unreachable or failing
helper is PeerUnavailable), so the leader driver never sees gRPC."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from svtagg.dp.errors import PeerUnavailable
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import Identity, tls_target
from svtagg.proto.vocab import CHANNEL_OPTIONS, PEER_DEADLINE, Role, refusal_from_rpc
from svtagg.servers import datachannel
from svtagg.servers.core import PartyFactory
from svtagg.servers.datachannel import DataConnection, split_host
from svtagg.servers.port import PeerMethod
from svtagg.servers.session import LeaderSession

log = logging.getLogger(__name__)


def _unavailable(exc: grpc.aio.AioRpcError) -> PeerUnavailable:
    return PeerUnavailable(f"helper: {exc.code().name} {exc.details()}")


class GrpcHelperPort:
    """The leader's connection to the helper's Peer service."""

    def __init__(self, address: str, identity: Identity, data_channel: bool = True) -> None:
        """`data_channel`: ask the helper for the comparison data channel
        (servers/datachannel.py) on each new session."""
        self.identity = identity
        self.host = split_host(address)
        self.data_channel = data_channel
        creds = grpc.ssl_channel_credentials(identity.ca, identity.key, identity.cert)
        # Reconnect quickly after a helper restart; calls wait for the connection
        # (wait_for_ready) up to their deadline instead of failing at once.
        self.channel = grpc.aio.secure_channel(
            address,
            creds,
            options=[
                *CHANNEL_OPTIONS,
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2000),
                *tls_target(Role.HELPER),
            ],
        )
        self.stub = pb_grpc.PeerStub(self.channel)

    async def call(self, method: PeerMethod, request: Any, timeout: float | None = None) -> Any:
        rpc = getattr(self.stub, method.value)
        try:
            return await rpc(request, timeout=timeout or PEER_DEADLINE, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise refusal_from_rpc(exc, "helper: ") from None

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
