"""The comparison data channel (servers/edge/datachannel.py): messages of every size
arrive intact, only a leader certificate is admitted, the leader admits only the
helper's name, a connection is bound to at most one session and closed when
none claims it, oversized messages end the connection — and a deployment runs
its chunks over the channel, or inside the gRPC stream when the helper offers
none, and recovers when the channel dies."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Deployment

from svtagg.dp.errors import PeerUnavailable
from svtagg.dp.queries import Query
from svtagg.mpc.channel import MemoryChannel
from svtagg.proto.tls import Identity, server_name, write_deployment
from svtagg.proto.vocab import Role
from svtagg.servers.edge import datachannel
from svtagg.servers.edge.datachannel import (
    ChannelClosed,
    DataConnection,
    DataListener,
    announce,
    connect,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("dc-certs")
    write_deployment(d)
    return d


def ident(certs: Path, role: str) -> Identity:
    return Identity.load(certs, role)


async def pair(
    certs: Path, sid: bytes = b"s" * 16
) -> tuple[DataListener, DataConnection, DataConnection]:
    lst = DataListener(ident(certs, "helper"), "127.0.0.1")
    await lst.start()
    conn = await connect("127.0.0.1", lst.port, ident(certs, "leader"))
    await announce(conn, sid)
    peer = await lst.claim(sid, 5)
    return lst, conn, peer


async def test_messages_of_every_size_both_ways(certs: Path) -> None:
    lst, a, b = await pair(certs)
    try:
        assert b.peer == Role.LEADER and a.peer == Role.HELPER
        sizes = [0, 1, 15, 65536, 65537, 3 << 20]
        for n in sizes:
            msg = os.urandom(n)
            await a.send(msg)
            got = await b.recv()
            assert bytes(got) == msg
            await b.send(memoryview(msg))
            assert bytes(await a.recv()) == msg
        # The session id is the listener's, not counted by the claimed end.
        assert a.bytes_sent == b.bytes_received + 16 == sum(sizes) + 16
        assert a.messages_sent == len(sizes) + 1
    finally:
        a.close()
        b.close()
        await lst.close()


@pytest.mark.parametrize("role", ["analyst", "client", "helper"])
async def test_listener_admits_only_the_leader(certs: Path, role: str) -> None:
    lst = DataListener(ident(certs, "helper"), "127.0.0.1")
    await lst.start()
    try:
        conn = await connect("127.0.0.1", lst.port, ident(certs, role))
        sid = b"r" * 16
        with pytest.raises(ChannelClosed):
            await announce(conn, sid)
            await asyncio.wait_for(conn.recv(), 5)  # closed by the listener
        with pytest.raises(PeerUnavailable):
            await lst.claim(sid, 0.3)
    finally:
        await lst.close()


async def test_leader_refuses_a_listener_without_the_helper_name(certs: Path) -> None:
    lst = DataListener(ident(certs, "leader"), "127.0.0.1", expect=Role.HELPER)
    await lst.start()
    try:
        with pytest.raises(ChannelClosed, match="certificate|hostname|match"):
            await connect("127.0.0.1", lst.port, ident(certs, "leader"), expect=Role.HELPER)
    finally:
        await lst.close()


async def test_certificate_of_another_ca_fails_the_handshake(certs: Path, tmp_path: Path) -> None:
    other = write_deployment(tmp_path / "other")
    lst = DataListener(ident(certs, "helper"), "127.0.0.1")
    await lst.start()
    try:
        with pytest.raises(ChannelClosed):
            await connect("127.0.0.1", lst.port, Identity.load(other, "leader"))
    finally:
        await lst.close()


async def test_a_session_id_is_bound_once_ever(certs: Path) -> None:
    """A second connection announcing an id already bound is closed at once —
    after the claim as before it (default expiry: this is not the unclaimed path)."""
    lst, a, b = await pair(certs, b"x" * 16)
    try:
        assert datachannel.UNCLAIMED_SECONDS >= 30
        again = await connect("127.0.0.1", lst.port, ident(certs, "leader"))
        await announce(again, b"x" * 16)
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(again.recv(), 5)  # well before any expiry
        with pytest.raises(PeerUnavailable):
            await lst.claim(b"x" * 16, 0.3)  # and no session can claim it again
        # The bound connection is unaffected.
        await a.send(b"still here")
        assert bytes(await b.recv()) == b"still here"
    finally:
        a.close()
        b.close()
        await lst.close()


async def test_an_unclaimed_connection_is_closed(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datachannel, "UNCLAIMED_SECONDS", 0.3)
    lst = DataListener(ident(certs, "helper"), "127.0.0.1")
    await lst.start()
    try:
        lone = await connect("127.0.0.1", lst.port, ident(certs, "leader"))
        await announce(lone, b"y" * 16)
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(lone.recv(), 5)
    finally:
        await lst.close()


async def test_a_helper_side_close_ends_the_leader_session(tmp_path: Path) -> None:
    """The helper drops a session's data connection: the leader's next chunk on
    that session fails, the session is discarded, and chunks go on."""
    dep = Deployment(write_deployment(tmp_path / "certs"), tmp_path)
    await dep.start()
    try:
        await _task(dep, "t")
        await _ask_far(dep, "t", k=5000)
        assert dep.helper is not None and dep.helper.data_listener is not None
        assert dep.helper.peer_service is not None
        # The result travels to the helper one way after the answer; `is_closed`
        # (which closes a connection with anything readable) is for idle ones.
        await dep.helper.peer_service.driver.settled()
        # Close every connection the helper holds (its side of each session).
        held = [c for c in dep.helper.data_listener.connections if not c.is_closed]
        assert held
        for conn in held:
            conn.close()
        await _ask_far(dep, "t", k=5000)  # a failed session is replaced, not reused
    finally:
        await dep.stop()


async def test_oversized_message_ends_the_connection(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lst, a, b = await pair(certs)
    monkeypatch.setattr(datachannel, "MAX_DATA_MESSAGE", 1000)
    try:
        await a.send(b"z" * 1001)
        with pytest.raises(ChannelClosed, match="exceeds the cap"):
            await b.recv()
        with pytest.raises(ChannelClosed):  # and the connection is gone for good
            await b.recv()
    finally:
        a.close()
        b.close()
        await lst.close()


async def test_close_wakes_a_blocked_receiver(certs: Path) -> None:
    lst, a, b = await pair(certs)
    try:
        waiting = asyncio.ensure_future(b.recv())
        await asyncio.sleep(0.1)
        b.close()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(a.recv(), 5)
    finally:
        a.close()
        await lst.close()


# ---------------------------------------------------------------- in a deployment
async def _ask_far(dep: Deployment, task: str, k: int = 300) -> None:
    from svtagg.analyst.remote_oracle import RemoteOracle

    def run() -> None:
        with RemoteOracle.from_certs(dep.leader_addr, task, dep.certs) as oracle:
            for _ in range(2):
                s = oracle.open_stream(1)
                assert s.ask([(Query(j % oracle.d), 10 * oracle.n) for j in range(k)]) is None

    await asyncio.to_thread(run)


async def _task(dep: Deployment, task: str) -> None:
    from svtagg.deploy.jobs import task_spec

    def run() -> None:
        from svtagg.proto import svtagg_pb2 as pb

        stub = dep.analyst_stub()
        stub.CreateTask(task_spec(task, 4, 100, "100"), timeout=30)
        with dep.uploader() as up:
            up.upload(task, np.random.default_rng(1).random((30, 4)))
        stub.CloseCollection(pb.TaskRef(task_id=task), timeout=60)

    await asyncio.to_thread(run)


@pytest.mark.parametrize("data_port", [0, None])
async def test_chunks_run_over_the_offered_transport(tmp_path: Path, data_port: int | None) -> None:
    dep = Deployment(write_deployment(tmp_path / "certs"), tmp_path)
    await dep.start(helper_data_port=data_port)
    try:
        await _task(dep, "t")
        await _ask_far(dep, "t")
        assert dep.leader is not None and dep.leader.analyst is not None
        pool = dep.leader.analyst.driver.pool
        session = await pool.acquire()
        try:
            assert (session.data is not None) == (data_port is not None)
            if session.data is not None:
                # Chunks of at most 4,096 lanes stay on the frames (latency); larger
                # ones go over the data connection (the pool has two sessions: ask
                # enough chunks that this one ran some of each).
                def counts() -> tuple[int, int]:
                    assert session.data is not None
                    data = session.data.bytes_sent + session.data.bytes_received
                    return session.channel.traffic, data

                frames0, data0 = counts()
                await pool.release(session, True)
                await _ask_far(dep, "t", k=5000)  # large chunks: the data connection only
                session = await pool.acquire()
                frames1, data1 = counts()
                assert data1 > data0 and frames1 == frames0
                # Both ends bound the messages by the chunk's size, not the cap.
                assert dep.helper is not None and dep.helper.data_listener is not None
                cap = datachannel.MAX_DATA_MESSAGE
                assert 0 < session.data.limit < cap  # type: ignore[attr-defined]
                assert any(0 < c.limit < cap for c in dep.helper.data_listener.connections)
                await pool.release(session, True)
                await _ask_far(dep, "t", k=300)  # small chunks: the frames only
                session = await pool.acquire()
                frames2, data2 = counts()
                assert frames2 > frames1 and data2 == data1
            # The data channel dies under an idle session (its leader end closed):
            # the pool hands that session out no more, and chunks go on.
            dead = session if session.data is not None else None
            if dead is not None and dead.data is not None:
                dead.data.close()
        finally:
            await pool.release(session, True)
        await _ask_far(dep, "t", k=5000)
        if dead is not None:
            fresh = await pool.acquire()
            try:
                assert fresh is not dead and fresh.data is not None and not fresh.data.is_closed
            finally:
                await pool.release(fresh, True)
    finally:
        await dep.stop()


async def test_a_stalled_handshake_holds_up_nobody(certs: Path) -> None:
    """A peer that connects and sends nothing (no TLS handshake) does not delay
    the leader's connection behind it."""
    import socket
    import time

    lst = DataListener(ident(certs, "helper"), "127.0.0.1")
    await lst.start()
    stalls = [socket.create_connection(("127.0.0.1", lst.port)) for _ in range(3)]
    try:
        t = time.perf_counter()
        conn = await connect("127.0.0.1", lst.port, ident(certs, "leader"))
        await announce(conn, b"q" * 16)
        peer = await lst.claim(b"q" * 16, 5)
        assert time.perf_counter() - t < 5  # not after the stalled ones' 10 s timeouts
        await conn.send(b"ping")
        assert bytes(await peer.recv()) == b"ping"
        conn.close()
        peer.close()
    finally:
        for s in stalls:
            s.close()
        await lst.close()


async def test_sessions_fall_back_to_grpc_when_the_data_port_is_unusable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper offers a data port the leader cannot use (filtered, flooded):
    the session is opened again inside the gRPC stream and queries go on."""
    dep = Deployment(write_deployment(tmp_path / "certs"), tmp_path)

    async def unreachable(*args: object, **kwargs: object) -> DataConnection:
        raise ChannelClosed("data channel to the helper: connection timed out")

    monkeypatch.setattr(datachannel, "connect", unreachable)
    await dep.start()
    try:
        await _task(dep, "t")
        await _ask_far(dep, "t", k=5000)
        assert dep.leader is not None and dep.leader.analyst is not None
        session = await dep.leader.analyst.driver.pool.acquire()
        assert session.data is None
        await dep.leader.analyst.driver.pool.release(session, True)
    finally:
        await dep.stop()


# ---------------------------------------------------------------- admission deadline
def _trickle_session_id(certs: Path, port: int, sid: bytes, interval: float) -> float:
    """A leader that completes TLS, then sends its framed session id one byte per
    TLS record every `interval` s; returns the seconds until the helper dropped
    it (or until it gave up waiting for a verdict: 5 s after its last byte)."""
    ctx = datachannel._context(ident(certs, "leader"), server=False)
    sock = datachannel._connect_blocking("127.0.0.1", port, ctx, server_name(Role.HELPER), 10)
    t = time.perf_counter()
    try:
        for byte in struct.pack("<Q", len(sid)) + sid:
            sock.sendall(bytes([byte]))
            time.sleep(interval)
        sock.settimeout(5)
        sock.recv(1)  # EOF (or a reset) once the helper has dropped the connection
    except OSError:
        pass
    finally:
        sock.close()
    return time.perf_counter() - t


async def test_a_trickled_session_id_is_dropped_at_the_admission_deadline(certs: Path) -> None:
    """Leaders that trickle their session ids (24 bytes, one every 0.25 s: 6 s)
    are dropped at the 1 s admission deadline; the handshake slots they held are
    free again, so a prompt leader is admitted while they are still trickling."""
    lst = DataListener(ident(certs, "helper"), "127.0.0.1", admit_seconds=1.0)
    await lst.start()
    sids = [os.urandom(16) for _ in range(datachannel.MAX_HANDSHAKES)]
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(len(sids))  # all of them at once, not the default pool's few
    try:
        slow = [
            loop.run_in_executor(pool, _trickle_session_id, certs, lst.port, sid, 0.25)
            for sid in sids
        ]
        await asyncio.sleep(2.0)  # every slot taken, and (if the deadline holds) freed
        conn = await connect("127.0.0.1", lst.port, ident(certs, "leader"))
        await announce(conn, b"p" * 16)
        peer = await lst.claim(b"p" * 16, 5)
        conn.close()
        peer.close()
        dropped_after = await asyncio.gather(*slow)
        assert max(dropped_after) < 3.0, dropped_after  # not after their 6 s of trickle
        for sid in sids:
            with pytest.raises(PeerUnavailable):
                await lst.claim(sid, 0.05)
    finally:
        pool.shutdown(wait=False)
        await lst.close()


# ---------------------------------------------------------------- message bounds
class _Recorder(MemoryChannel):
    """A MemoryChannel that takes the protocol's per-chunk bound and checks every
    message it sends against the bound its peer will apply."""

    def __init__(self, inbox: asyncio.Queue[bytes], outbox: asyncio.Queue[bytes]) -> None:
        super().__init__(inbox, outbox)
        self.limit = 0
        self.largest = 0

    def limit_messages(self, limit: int) -> None:
        self.limit = limit

    async def send(self, data: bytes) -> None:
        n = len(memoryview(data).cast("B"))
        self.largest = max(self.largest, n)
        assert n <= self.limit, f"an honest message of {n} bytes over the bound {self.limit}"
        await super().send(data)


@pytest.mark.parametrize("ot", ["iknp", "softspoken:4"])
@pytest.mark.parametrize("width", [8, 40, 64])
async def test_every_honest_message_fits_its_chunk_bound(width: int, ot: str) -> None:
    """The bound a receiver applies (`ChunkCircuit.max_message`) admits every
    message of every kind of chunk, on either OT extension, and is tight."""
    from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler

    q1: asyncio.Queue[bytes] = asyncio.Queue()
    q2: asyncio.Queue[bytes] = asyncio.Queue()
    cg, ce = _Recorder(q1, q2), _Recorder(q2, q1)
    cg.limit = ce.limit = 1 << 20  # the base OTs
    g, e = ComparisonGarbler(cg, b"b" * 16, ot=ot), ComparisonEvaluator(ce, b"b" * 16, ot=ot)
    await asyncio.gather(g.setup(), e.setup())
    rng = np.random.default_rng(5)
    for k in (1, 3, 700, 4097):
        z = rng.integers(0, 2**64, k, dtype=np.uint64)
        runs: list[tuple[str, tuple[Any, ...]]] = [
            ("first_yes", (z, width)),
            ("compare_to_thresholds", (z, z, width)),
        ]
        if width == 64:
            runs += [("any_per_group", (z, 1)), ("clamp_reshare", (z, 1000))]
        for name, args in runs:
            cg.largest = ce.largest = 0
            await asyncio.gather(getattr(g, name)(*args), getattr(e, name)(*args))
            assert cg.limit == ce.limit  # both sides bound the chunk alike
            # Tight: within 2.5x, plus the fixed 64 blocks of slack.  Within 3x for
            # a streamed chunk at w = 8 with SoftSpoken: the tables' bound covers
            # all its lane batches at once, and the OT message (IKNP's was the
            # largest there) is 4x shorter.
            largest = max(cg.largest, ce.largest)
            slack = 3.0 if width == 8 and ot != "iknp" else 2.5
            assert cg.limit <= slack * largest + 16 * 64, (k, largest, cg.limit)


async def test_an_oversized_length_header_is_refused_before_allocating(certs: Path) -> None:
    """A header announcing 512 MiB on a chunk whose bound is 1 MB ends the
    connection at once, with nothing like 512 MiB allocated."""
    import tracemalloc

    lst, a, b = await pair(certs)
    try:
        b.limit_messages(1 << 20)
        a._sock.sendall(struct.pack("<Q", 512 << 20))  # a header, and no body
        tracemalloc.start()
        try:
            with pytest.raises(ChannelClosed, match="exceeds this chunk"):
                await asyncio.wait_for(b.recv(), 5)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, f"{peak} bytes allocated for a refused header"
        with pytest.raises(ChannelClosed):  # and the connection is gone for good
            await b.recv()
    finally:
        a.close()
        b.close()
        await lst.close()


async def test_frame_channel_bounds_a_message_and_its_fragments() -> None:
    """Inside the gRPC stream: a message over the chunk's bound, or an endless
    run of empty fragments, is refused once the bound is passed, not joined."""
    from svtagg.proto import svtagg_pb2 as pb
    from svtagg.proto.vocab import FRAGMENT
    from svtagg.servers.exchange.session import FrameChannel

    read_count = 0

    def reader(frame: pb.PeerFrame) -> Any:
        async def read() -> pb.PeerFrame:
            nonlocal read_count
            read_count += 1
            assert read_count < 10_000, "read on and on: no bound"
            return frame

        return read

    async def nowhere(frame: pb.PeerFrame) -> None:
        raise AssertionError("nothing is sent")

    big = FrameChannel(nowhere, reader(pb.PeerFrame(fragment=b"x" * FRAGMENT, more=True)))
    big.limit_messages(3 * FRAGMENT)
    with pytest.raises(PeerUnavailable, match="bound"):
        await big.recv()
    assert read_count <= 4
    read_count = 0
    empty = FrameChannel(nowhere, reader(pb.PeerFrame(fragment=b"", more=True)))
    empty.limit_messages(3 * FRAGMENT)
    with pytest.raises(PeerUnavailable, match="bound"):
        await empty.recv()
    assert read_count <= 5
    # Before any chunk the bound is the base OTs' longest message.
    setup = FrameChannel(nowhere, reader(pb.PeerFrame(fragment=b"x" * FRAGMENT, more=True)))
    read_count = 0
    with pytest.raises(PeerUnavailable, match="bound"):
        await setup.recv()
    assert read_count == 1


async def test_two_sessions_with_one_id_never_share_a_connection(certs: Path) -> None:
    """Two helper sessions announcing the same id: the first claim gets the
    data connection, the second is refused at once (before and after delivery)."""
    lst = DataListener(ident(certs, "helper"), "127.0.0.1")
    await lst.start()
    sid = b"d" * 16
    try:
        first = asyncio.ensure_future(lst.claim(sid, 5))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(lst.claim(sid, 5))
        conn = await connect("127.0.0.1", lst.port, ident(certs, "leader"))
        await announce(conn, sid)
        peer = await first
        with pytest.raises(PeerUnavailable, match="already"):
            await asyncio.wait_for(second, 1)
        with pytest.raises(PeerUnavailable, match="already"):
            await asyncio.wait_for(lst.claim(sid, 5), 1)
        await conn.send(b"one owner")
        assert bytes(await peer.recv()) == b"one owner"
        conn.close()
        peer.close()
    finally:
        await lst.close()


async def test_a_refused_chunk_on_the_data_channel_reports_the_refusal(tmp_path: Path) -> None:
    """The leader's OT message of a large chunk goes out on the data connection
    behind the header, before the helper's verdict: a refused chunk must still
    come back as the helper's refusal (the helper drops what the leader sends
    until the leader ends the session), soon, and the next chunk runs on a
    fresh session."""
    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.dp.errors import Refusal

    dep = Deployment(write_deployment(tmp_path / "certs"), tmp_path)
    await dep.start(helper_data_port=0)
    try:
        await _task(dep, "t")
        assert dep.helper is not None
        # The analyst's calls block: they run in a thread, the servers in this loop.
        oracle = await asyncio.to_thread(RemoteOracle.from_certs, dep.leader_addr, "t", dep.certs)
        try:
            far = [(Query(j % oracle.d), 10 * oracle.n) for j in range(5000)]
            s = await asyncio.to_thread(oracle.open_stream, 1)
            assert await asyncio.to_thread(s.ask, far) is None
            dep.helper.core.fail_stream(s.stream_id)  # the helper's copy only
            t = time.monotonic()
            # An OT message of ≈ 30 MB: more than the sockets buffer, so the leader's
            # send completes only because the helper drains it.
            with pytest.raises(Refusal, match="helper: .*failed"):
                await asyncio.to_thread(s.ask, far * 10)
            assert time.monotonic() - t < 20  # not the chunk deadline
            fresh = await asyncio.to_thread(oracle.open_stream, 1)
            assert await asyncio.to_thread(fresh.ask, far) is None
        finally:
            oracle.close()
    finally:
        await dep.stop()


async def test_a_message_sent_in_pieces_is_read_as_it_arrives(certs: Path) -> None:
    """`send_pieces` puts the same bytes on the wire as one `send`; the peer's
    `recv_progressive` hands each prefix over as it comes, and the operations
    after it wait for the whole message."""
    lst, a, b = await pair(certs, b"p" * 16)
    try:
        sizes = [1, 300_000, 5, 700_000]
        parts = [os.urandom(n) for n in sizes]
        whole = b"".join(parts)
        made: list[int] = []

        def pieces() -> Iterator[memoryview]:
            for p in parts:
                made.append(len(p))
                yield memoryview(p)

        send = asyncio.ensure_future(a.send_pieces(len(whole), pieces()))
        msg = await b.recv_progressive()
        assert msg.size == len(whole)
        first = await asyncio.to_thread(msg.wait, 1)
        assert bytes(first) == whole[:1]
        await b.send(b"after")  # queued behind the rest of the message
        assert bytes(await asyncio.to_thread(msg.wait, len(whole))) == whole
        await send
        assert bytes(await a.recv()) == b"after"
        assert made == sizes
        assert a.bytes_sent == b.bytes_received + 16 == len(whole) + 16
        # The same bytes as one send: a plain recv reads a message sent in pieces.
        await a.send_pieces(len(whole), iter([memoryview(whole)]))
        assert bytes(await b.recv()) == whole
        # Pieces that do not add up to the announced length end the connection.
        with pytest.raises(ChannelClosed):
            await a.send_pieces(10, iter([memoryview(b"x" * 11)]))
    finally:
        a.close()
        b.close()
        await lst.close()


async def test_a_closed_connection_wakes_a_reader_of_a_partial_message(certs: Path) -> None:
    lst, a, b = await pair(certs, b"q" * 16)
    try:
        await a._io(a._sock.sendall, datachannel._HEADER.pack(1000) + b"y" * 10)
        msg = await b.recv_progressive()
        waiter = asyncio.ensure_future(asyncio.to_thread(msg.wait, 1000))
        await asyncio.sleep(0.05)
        a.close()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(waiter, 10)
    finally:
        a.close()
        b.close()
        await lst.close()


@pytest.mark.parametrize("ot", ["softspoken:4", "iknp", "ferret"])
async def test_streamed_chunks_over_a_data_connection(certs: Path, ot: str) -> None:
    """Chunks of several lane batches on a real data connection (the OT message
    in pieces, read as it arrives; the tables in parts): the same results as
    the one-process reference, chunk after chunk."""
    from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler

    lst, a, b = await pair(certs, b"r" * 16)
    try:
        g = ComparisonGarbler(b, b"r" * 16, ot=ot)
        e = ComparisonEvaluator(a, b"r" * 16, ot=ot)
        await asyncio.gather(g.setup(), e.setup())
        rng = np.random.default_rng(9)
        for k, at in ((10_000, 9_000), (4_097, None), (9_000, 5)):
            z_h = rng.integers(-(2**30), 0, k, dtype=np.int64)
            z_l = rng.integers(-(2**30), 0, k, dtype=np.int64)
            if at is not None:
                z_l[at] = -z_h[at] + 7
            got = await asyncio.gather(g.first_yes(z_h, 40), e.first_yes(z_l, 40))
            assert got == [at, at]
    finally:
        a.close()
        b.close()
        await lst.close()


async def test_pieces_fall_back_to_whole_messages_on_other_channels() -> None:
    """On a channel without the piecewise path (the session's frames, memory),
    a message made in pieces is one send of their concatenation, and a
    progressive read is the whole message."""
    from svtagg.mpc import streaming

    a, b = MemoryChannel.pair()
    parts = [b"ab", b"", b"cde"]
    await streaming.send_pieces(a, 5, iter([memoryview(p) for p in parts]))
    msg = await streaming.recv_progressive(b)
    assert msg.size == 5 and bytes(msg.wait(5)) == b"abcde" and bytes(msg.wait(2)) == b"ab"
