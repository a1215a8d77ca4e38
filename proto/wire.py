"""Registering the generated services with requests that fail to parse turned
into a clear INVALID_ARGUMENT (gRPC itself would answer UNKNOWN with the parser's
exception): unary requests are decoded by a tolerant deserializer that yields
`UNDECODABLE`, which the service edge refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


class _Undecodable:
    def __repr__(self) -> str:
        return "UNDECODABLE"


#: Stands for a unary request whose bytes do not parse as the method's message.
UNDECODABLE: Any = _Undecodable()


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # noqa: BLE001 - any parse failure is the caller's fault
            return UNDECODABLE

    return deserialize


class _Registrar:
    """Stands in for the server in a generated `add_…Servicer_to_server` call."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # registered below, from the rewritten method handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        rewritten = {
            name: h._replace(request_deserializer=_tolerant(h.request_deserializer))
            if not h.request_streaming and h.request_deserializer is not None
            else h
            for name, h in handlers.items()
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, rewritten),)
        )
        self.server.add_registered_method_handlers(service, rewritten)


def add_service(add: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server) -> None:
    """`add(servicer, server)` (a generated registration function), tolerantly."""
    add(servicer, _Registrar(server))
