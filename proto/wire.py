"""Registering the generated services:

- requests that fail to parse become a clear INVALID_ARGUMENT (gRPC itself
  would answer UNKNOWN with the parser's exception, or INTERNAL on a stream):
  every request, unary or streamed, is decoded by a tolerant deserializer that
  yields `UNDECODABLE`, which the service edge refuses;
- with an `admit` hook (servers/edge/admission.py), every call is admitted before
  its request is read: a unary request is registered as a one-message client
  stream on the server side (the wire is the same), so the method's message
  is read only once the call holds its place."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

#: `admit(full method name, context, roles)`: an async context manager held
#: while the call runs, or ending the call (context.abort) when it is not
#: admitted; `roles` are the roles the method serves (None: any).
Admit = Callable[[str, Any, "tuple[str, ...] | None"], AbstractAsyncContextManager[None]]
#: `reading(full method name, context)`: held while a unary request is read.
Reading = Callable[[str, Any], AbstractAsyncContextManager[None]]
#: How long a unary request may take to arrive once its call is admitted: 64 MiB
#: at ≈ 0.5 MiB/s.  A caller that sends nothing does not hold its place longer.
READ_SECONDS = 120.0


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


async def _one(context: Any) -> Any:
    """The single request of a unary call registered as a client stream, read
    within READ_SECONDS."""
    try:
        request = await asyncio.wait_for(context.read(), READ_SECONDS)
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the request did not arrive within {READ_SECONDS:g} s of the call's start",
        )
    if request is grpc.aio.EOF:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request")
    return request


def _forget(exc: BaseException) -> None:
    """Drop what the frames of a failed call's exceptions hold.

    A refused call ends by raising (context.abort), and the exception's
    traceback keeps every frame of the handler alive, with the request in
    them, until the cycle collector happens to run: measured, each refused
    40 MiB upload left ≈ 45 MB held.  Clearing the finished frames frees the
    request when the call ends."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__context__, e.__cause__]


def _admitted(full: str, h: Any, admit: Admit, reading: Reading) -> Any:
    """Method handler `h` of method `full`, admitted before anything is read."""
    ser, des = h.response_serializer, h.request_deserializer
    behaviour = h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream
    roles = getattr(behaviour, "roles", None)
    if not h.request_streaming and not h.response_streaming:
        unary = h.unary_unary

        async def stream_unary(_requests: AsyncIterator[Any], context: Any) -> Any:
            async with admit(full, context, roles):
                async with reading(full, context):
                    request = await _one(context)
                try:
                    return await unary(request, context)
                except BaseException as exc:
                    del request
                    _forget(exc)
                    raise

        return grpc.stream_unary_rpc_method_handler(stream_unary, des, ser)
    if not h.request_streaming:
        unary_stream = h.unary_stream

        async def stream_stream_one(_requests: AsyncIterator[Any], context: Any) -> Any:
            async with admit(full, context, roles):
                async with reading(full, context):
                    request = await _one(context)
                async for answer in unary_stream(request, context):
                    yield answer

        return grpc.stream_stream_rpc_method_handler(stream_stream_one, des, ser)
    if h.response_streaming and inspect.isasyncgenfunction(h.stream_stream):
        answers = h.stream_stream

        async def stream_stream_gen(requests: AsyncIterator[Any], context: Any) -> Any:
            async with admit(full, context, roles):
                async for answer in answers(requests, context):
                    yield answer

        return grpc.stream_stream_rpc_method_handler(stream_stream_gen, des, ser)
    if h.response_streaming:  # answers by context.write
        streams = h.stream_stream

        async def stream_stream(requests: AsyncIterator[Any], context: Any) -> Any:
            async with admit(full, context, roles):
                await streams(requests, context)

        return grpc.stream_stream_rpc_method_handler(stream_stream, des, ser)
    stream_unary_ = h.stream_unary

    async def stream_unary_held(requests: AsyncIterator[Any], context: Any) -> Any:
        async with admit(full, context, roles):
            return await stream_unary_(requests, context)

    return grpc.stream_unary_rpc_method_handler(stream_unary_held, des, ser)


@contextlib.asynccontextmanager
async def _no_gate(_full: str, _context: Any) -> AsyncIterator[None]:
    yield


class _Registrar:
    """Stands in for the server in a generated `add_…Servicer_to_server` call."""

    def __init__(
        self, server: grpc.aio.Server, admit: Admit | None, reading: Reading | None
    ) -> None:
        self.server = server
        self.admit = admit
        self.reading = reading or _no_gate

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # registered below, from the rewritten method handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        rewritten = {
            name: h._replace(request_deserializer=_tolerant(h.request_deserializer))
            if h.request_deserializer is not None
            else h
            for name, h in handlers.items()
        }
        if self.admit is not None:
            admit = self.admit
            rewritten = {
                name: _admitted(f"/{service}/{name}", h, admit, self.reading)
                for name, h in rewritten.items()
            }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, rewritten),)
        )
        self.server.add_registered_method_handlers(service, rewritten)


def add_service(
    add: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    admit: Admit | None = None,
    reading: Reading | None = None,
) -> None:
    """`add(servicer, server)` (a generated registration function), tolerantly,
    each call admitted by `admit` first and its unary request read inside
    `reading` (if given)."""
    add(servicer, _Registrar(server, admit, reading))
