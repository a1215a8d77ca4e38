"""What one small message costs on a `grpc.aio` stream against a plain asyncio
stream: the transport question behind a one-query chunk's CPU
(docs/scaling.md, "One transaction per chunk, and what limits the rest").

Both ends in this one process, on loopback without TLS, so the figure is the
two ends' CPU together per round trip (two messages of `--size` bytes):

    python -m svtagg.benchmarks.bench_stream_write [--size 1500] [--rounds 3000]

Rows: a `grpc.aio` bidirectional stream answered by an async generator
(`yield`) and by `context.write`, then an `asyncio` stream with a 4-byte
length prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc


async def _timed(name: str, rounds: int, trip: Callable[[], Awaitable[None]]) -> None:
    for _ in range(min(200, rounds)):  # warm-up
        await trip()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        await trip()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{name:36s} {1e6 * wall / rounds:7.0f} µs wall  {1e6 * cpu / rounds:7.0f} µs CPU")


async def grpc_rows(size: int, rounds: int) -> None:
    async def by_yield(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for m in requests:
            yield m

    async def by_write(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        async for m in requests:
            await context.write(m)

    handler = grpc.method_handlers_generic_handler(
        "bench",
        {
            "Yield": grpc.stream_stream_rpc_method_handler(by_yield),
            "Write": grpc.stream_stream_rpc_method_handler(by_write),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    message = bytes(size)
    try:
        for method in ("Yield", "Write"):
            call = channel.stream_stream(f"/bench/{method}")()

            async def trip(call: grpc.aio.StreamStreamCall = call) -> None:  # type: ignore[type-arg]
                await call.write(message)
                await call.read()

            await _timed(f"grpc.aio stream ({method.lower()})", rounds, trip)
            await call.done_writing()
            await call.read()  # the end of the stream
    finally:
        await channel.close()
        await server.stop(None)


async def asyncio_row(size: int, rounds: int) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readexactly(4)
                writer.write(head + await reader.readexactly(int.from_bytes(head, "big")))
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    framed = size.to_bytes(4, "big") + bytes(size)

    async def trip() -> None:
        writer.write(framed)
        head = await reader.readexactly(4)
        await reader.readexactly(int.from_bytes(head, "big"))

    try:
        await _timed("asyncio stream (length-prefixed)", rounds, trip)
    finally:
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.05)  # the echo sees the end of the stream and returns
        server.close()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1500, help="bytes per message")
    ap.add_argument("--rounds", type=int, default=3000)
    args = ap.parse_args(argv)
    print(f"round trips of two {args.size}-byte messages, both ends in this process:")
    asyncio.run(grpc_rows(args.size, args.rounds))
    asyncio.run(asyncio_row(args.size, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
