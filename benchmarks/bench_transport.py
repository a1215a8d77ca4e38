"""Candidate peer transports between the leader and the helper, measured on
loopback with the deployment's mutual-TLS certificates: MB/s of large messages
(a garbled chunk of 10^4 comparisons is ≈ 19 MB leader → helper) answered by a
small one, the pattern of a comparison chunk.

    python -m svtagg.benchmarks.bench_transport [--mb 20] [--rounds 10]
    python -m svtagg.benchmarks.bench_transport --bytes 1500 --rounds 2000  # small messages

Candidates:
  grpc-1MiB / grpc-4MiB  the Peer.Session bidirectional gRPC stream (grpc.aio),
                         the message cut into PeerFrame fragments of that size;
  asyncio-tls            an asyncio TLS connection, length-prefixed messages read
                         with StreamReader.readexactly;
  thread-tls             a blocking TLS socket driven from a worker thread,
                         `sendall` and `recv_into` one buffer per message (what
                         `servers/edge/datachannel.py` uses).
The receiver runs in a second process, as the helper does.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.tls import Identity, write_deployment
from svtagg.proto.vocab import CHANNEL_OPTIONS, SERVER_OPTIONS
from svtagg.servers.edge import datachannel


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- gRPC
_METHOD = "/bench.Pipe/Stream"


def _grpc_receiver(certs: str, port: int, ready: mp.synchronize.Event) -> None:
    async def main() -> None:
        ident = Identity.load(certs, "helper")
        creds = grpc.ssl_server_credentials(
            [(ident.key, ident.cert)], root_certificates=ident.ca, require_client_auth=True
        )
        server = grpc.aio.server(options=SERVER_OPTIONS)

        async def stream(request_iter, context):  # type: ignore[no-untyped-def]
            size = 0
            async for frame in request_iter:
                size += len(frame.fragment)
                if not frame.more:
                    yield pb.PeerFrame(fragment=b"ok")
                    size = 0

        handler = grpc.stream_stream_rpc_method_handler(
            stream,
            request_deserializer=pb.PeerFrame.FromString,
            response_serializer=pb.PeerFrame.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("bench.Pipe", {"Stream": handler})]
        )
        server.add_secure_port(f"127.0.0.1:{port}", creds)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def _grpc_sender(certs: str, port: int, size: int, rounds: int, fragment: int) -> list[float]:
    ident = Identity.load(certs, "leader")
    creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
    opts = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", "svtagg-helper")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=opts) as ch:
        call = ch.stream_stream(
            _METHOD,
            request_serializer=pb.PeerFrame.SerializeToString,
            response_deserializer=pb.PeerFrame.FromString,
        )()
        payload = os.urandom(size)
        view = memoryview(payload)
        rates = []
        for _ in range(rounds + 1):
            t = time.perf_counter()
            for start in range(0, len(view), fragment):
                end = start + fragment
                await call.write(
                    pb.PeerFrame(fragment=bytes(view[start:end]), more=end < len(view))
                )
            await call.read()
            rates.append(len(payload) / 1e6 / (time.perf_counter() - t))
        await call.done_writing()
        return rates[1:]


# ---------------------------------------------------------------- TLS sockets
class _AsyncioStream:
    """Length-prefixed messages over an asyncio TLS stream (readexactly)."""

    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w = r, w

    async def send(self, data: bytes) -> None:
        self.w.writelines([len(data).to_bytes(8, "little"), memoryview(data)])
        await self.w.drain()

    async def recv(self) -> bytes:
        size = int.from_bytes(await self.r.readexactly(8), "little")
        return await self.r.readexactly(size)


def _asyncio_receiver(certs: str, port: int, ready: mp.synchronize.Event) -> None:
    async def main() -> None:
        ident = Identity.load(certs, "helper")
        done = asyncio.Event()

        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            conn = _AsyncioStream(r, w)
            try:
                while True:
                    await conn.recv()
                    await conn.send(b"ok")
            except (asyncio.IncompleteReadError, ConnectionError):
                done.set()

        ctx = datachannel._context(ident, server=True)
        server = await asyncio.start_server(on_conn, "127.0.0.1", port, ssl=ctx)
        ready.set()
        await done.wait()
        server.close()

    asyncio.run(main())


async def _asyncio_sender(certs: str, port: int, size: int, rounds: int) -> list[float]:
    ctx = datachannel._context(Identity.load(certs, "leader"), server=False)
    r, w = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="svtagg-helper"
    )
    conn = _AsyncioStream(r, w)
    return await _pingpong(conn, size, rounds, lambda: w.close())


def _thread_receiver(certs: str, port: int, ready: mp.synchronize.Event) -> None:
    async def main() -> None:
        listener = datachannel.DataListener(Identity.load(certs, "helper"), "127.0.0.1", port)
        await listener.start()
        ready.set()
        conn = await listener.claim(b"0123456789abcdef", 60)
        try:
            while True:
                await conn.recv()
                await conn.send(b"ok")
        except datachannel.ChannelClosed:
            pass
        await listener.close()

    asyncio.run(main())


async def _thread_sender(certs: str, port: int, size: int, rounds: int) -> list[float]:
    conn = await datachannel.connect("127.0.0.1", port, Identity.load(certs, "leader"))
    await datachannel.announce(conn, b"0123456789abcdef")
    return await _pingpong(conn, size, rounds, conn.close)


async def _pingpong(conn, size: int, rounds: int, close) -> list[float]:  # type: ignore[no-untyped-def]
    payload = os.urandom(size)
    rates = []
    for _ in range(rounds + 1):
        t = time.perf_counter()
        await conn.send(payload)
        await conn.recv()
        rates.append(len(payload) / 1e6 / (time.perf_counter() - t))
    close()
    return rates[1:]


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(name: str, target, args, sender) -> tuple[list[float], float]:  # type: ignore[no-untyped-def]
    """(MB/s per round, CPU seconds of both processes)."""
    ready = mp.Event()
    proc = mp.Process(target=target, args=(*args, ready), daemon=True)
    proc.start()
    if not ready.wait(30):
        raise RuntimeError(f"{name}: receiver did not start")
    try:
        before = _proc_cpu(proc.pid)  # type: ignore[arg-type]
        cpu = time.process_time()
        rates = asyncio.run(sender)
        cpu = time.process_time() - cpu + _proc_cpu(proc.pid) - before  # type: ignore[arg-type]
        return rates, cpu
    finally:
        proc.terminate()
        proc.join(5)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=20, help="MiB per large message")
    ap.add_argument(
        "--bytes", type=int, default=0, help="bytes per message instead of --mb (small messages)"
    )
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    size = args.bytes or args.mb << 20
    with tempfile.TemporaryDirectory() as tmp:
        certs = str(Path(tmp) / "certs")
        write_deployment(certs)
        results: dict[str, tuple[list[float], float]] = {}
        for frag in (1 << 20, 4 << 20):
            port = _free_port()
            results[f"grpc-{frag >> 20}MiB"] = _run(
                "grpc",
                _grpc_receiver,
                (certs, port),
                _grpc_sender(certs, port, size, args.rounds, frag),
            )
        port = _free_port()
        results["asyncio-tls"] = _run(
            "asyncio",
            _asyncio_receiver,
            (certs, port),
            _asyncio_sender(certs, port, size, args.rounds),
        )
        port = _free_port()
        results["thread-tls"] = _run(
            "thread",
            _thread_receiver,
            (certs, port),
            _thread_sender(certs, port, size, args.rounds),
        )
    print(f"{size:,}-byte messages, {args.rounds} rounds, receiver in another process")
    base = statistics.median(results["grpc-1MiB"][0])
    moved = (args.rounds + 1) * size / 1e6  # MB, warm-up round included
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for name, (rates, cpu) in results.items():
        med = statistics.median(rates)
        print(
            f"{name:>13}: {med:7.0f} MB/s median (min {min(rates):.0f}, max {max(rates):.0f})"
            f"  {med / base:4.2f}x grpc-1MiB;  {1e3 * cpu / moved:5.2f} ms CPU per MB"
            f" (both processes); a round trip {1e6 * size / 1e6 / med:,.0f} µs median,"
            f" {1e6 * cpu / (args.rounds + 1):,.0f} µs CPU"
        )


if __name__ == "__main__":
    main()
