"""The comparison data channel: a mutual-TLS connection from the leader to the
helper that carries only the garbled-circuit protocol's byte messages.

Why not the gRPC session stream: a garbled chunk is tens of MB from the leader
to the helper, and every fragment of the gRPC stream is copied into a protobuf
message, serialized, copied into gRPC's buffers and joined again on the other
side, all under the interpreter lock.  Here a blocking TLS socket moves each
message in one `sendall` from the sender's buffer and one `recv_into` loop into
the receiver's, in a worker thread with the interpreter lock released (the
measured candidates, asyncio TLS streams among them, are in docs/mpc.md and
benchmarks/bench_transport.py).  Use is strictly alternating — one party sends,
the other receives — so the TLS object is never used by two threads at once.  Control
stays on gRPC: the session is opened there, chunk headers and the helper's
verdicts travel there, and a data connection is bound to one gRPC session by
its fresh 16-byte session id, which the leader sends as the first message.

Security is the gRPC peer channel's: TLS 1.3, both sides present deployment
certificates from the same CA, the leader verifies the helper's name
(`svtagg-helper`), the helper accepts only a certificate whose role is
`leader`.  Messages are length-prefixed (8 bytes, little-endian); a length over
the running chunk's bound (`limit_messages`, from the protocol) or over
`MAX_DATA_MESSAGE` ends the connection before anything is allocated for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import ssl
import struct
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from svtagg.dp.errors import PeerUnavailable
from svtagg.mpc.channel import Message
from svtagg.proto.tls import Identity, role_of_pem, server_name
from svtagg.proto.vocab import Role

log = logging.getLogger(__name__)

#: Largest protocol message accepted (a chunk of 10^5 comparisons at w = 64 is ≈ 310 MB).
MAX_DATA_MESSAGE = 1 << 30
_HEADER = struct.Struct("<Q")
#: A data connection whose session never claims it is closed after this long.
UNCLAIMED_SECONDS = 30.0
#: TLS handshakes (and session-id reads) in progress at once, and the deadline
#: of each whole admission.
MAX_HANDSHAKES = 16
ADMIT_SECONDS = 10.0
#: Session ids remembered as bound (ids are 16 random bytes; a replay of an
#: older one than this could only be bound if its session were still waiting).
USED_IDS = 65536
#: Messages up to this size are returned as `bytes` (one small copy); larger ones
#: as a memoryview of the buffer they were received into.
_SMALL = 1 << 16


def _uninitialized(size: int) -> memoryview:
    """A writable byte buffer of `size` bytes, not zeroed first (every byte is
    received into it before it is read; `bytearray(size)` would clear tens of
    MB per chunk for nothing)."""
    return np.empty(size, dtype=np.uint8).data.cast("B")


class ChannelClosed(PeerUnavailable):
    """The data connection ended (or failed) before a whole message arrived."""


def _context(identity: Identity, server: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    if server:
        ctx.num_tickets = 0  # no resumption; an idle connection has nothing to read
    ctx.load_verify_locations(cadata=identity.ca.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED
    # ssl loads a certificate chain only from files: a private temporary
    # directory holds them for the duration of the call.
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert.write_bytes(identity.cert)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(identity.key)
        ctx.load_cert_chain(cert, key)
    return ctx


def _peer_role(sock: ssl.SSLSocket) -> Role | None:
    der = sock.getpeercert(binary_form=True)
    return role_of_pem(ssl.DER_cert_to_PEM_cert(der).encode()) if der else None


def split_host(address: str) -> str:
    """The host of a `host:port` address (`[v6]:port` too)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _until(sock: ssl.SSLSocket, deadline: float) -> None:
    """The socket's timeout: the time left until `deadline` (timed out if none)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("data connection admission deadline passed")
    sock.settimeout(left)


def _recv_exact(sock: ssl.SSLSocket, view: memoryview, deadline: float | None = None) -> None:
    got = 0
    while got < len(view):
        if deadline is not None:
            _until(sock, deadline)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ChannelClosed("data connection closed by the peer")
        got += n


class Arriving:
    """A message being received: its length is known, its bytes come in
    behind `wait` (`DataConnection.recv_progressive`), so a reader in another
    thread can use each prefix as soon as it is there."""

    def __init__(self, size: int, closed: Callable[[], bool] = lambda: False) -> None:
        self.size = size
        self.buffer = _uninitialized(size)
        self._closed = closed
        self._got = 0
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    def _advance(self, got: int) -> None:
        with self._cond:
            self._got = got
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def wait(self, end: int) -> memoryview:
        """Blocks until the first `end` bytes are in; a view of them.  Wakes now
        and then: a closed connection must not strand the reader's thread."""
        with self._cond:
            while self._got < end:
                if self._error is not None:
                    raise ChannelClosed(f"data connection lost: {self._error}")
                if self._closed():
                    raise ChannelClosed("data connection is closed")
                self._cond.wait(timeout=1.0)
        return self.buffer[:end]


#: Bytes a progressive receive reads before it tells a waiting reader.
_PROGRESS = 1 << 18


class DataConnection:
    """One end of a data connection: `mpc.channel.Channel` (send/recv with
    counters).  Each operation runs in this connection's one worker thread, so
    operations are ordered and the socket is never used concurrently."""

    def __init__(self, sock: ssl.SSLSocket, peer: Role | None) -> None:
        self._sock = sock
        self.peer = peer
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="svtagg-data")
        self._closed = False
        #: Longest message accepted; the protocol lowers it to each chunk's bound.
        self.limit = MAX_DATA_MESSAGE
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0

    def _send_blocking(self, data: memoryview) -> None:
        if len(data) <= _SMALL:  # one TLS record, one segment: the same bytes
            self._sock.sendall(_HEADER.pack(len(data)) + data)
            return
        self._sock.sendall(_HEADER.pack(len(data)))
        self._sock.sendall(data)

    def _recv_blocking(self) -> bytes:
        size = self._recv_header_blocking()
        body = _uninitialized(size)
        _recv_exact(self._sock, body)
        # Large messages stay in the buffer they arrived in (no copy); readers
        # only take lengths, slices and memoryviews of them.
        return bytes(body) if size <= _SMALL else body  # type: ignore[return-value]

    def _send_pieces_blocking(self, total: int, pieces: Iterator[memoryview]) -> int:
        self._sock.sendall(_HEADER.pack(total))
        sent = 0
        for piece in pieces:  # each made here, in this thread, as the last one travels
            view = memoryview(piece).cast("B")
            if sent + len(view) > total:
                raise ValueError("pieces longer than their announced total")
            self._sock.sendall(view)
            sent += len(view)
        if sent != total:
            raise ValueError("pieces shorter than their announced total")
        return sent

    def _recv_header_blocking(self) -> int:
        """A message's length, checked before anything is allocated: a header
        alone must not make this side reserve memory no honest message of the
        chunk needs."""
        head = bytearray(_HEADER.size)
        _recv_exact(self._sock, memoryview(head))
        (size,) = _HEADER.unpack(head)
        if size > MAX_DATA_MESSAGE:
            raise ChannelClosed(f"data message of {size} bytes exceeds the cap")
        if size > self.limit:
            raise ChannelClosed(f"data message of {size} bytes exceeds this chunk's {self.limit}")
        return int(size)

    def _fill_blocking(self, msg: Arriving) -> None:
        view, got = msg.buffer, 0
        try:
            while got < msg.size:
                end = min(got + _PROGRESS, msg.size)
                _recv_exact(self._sock, view[got:end])
                got = end
                msg._advance(got)
        except BaseException as exc:
            msg._fail(exc)
            raise

    async def _io(self, fn: object, *args: object) -> object:
        if self._closed:
            raise ChannelClosed("data connection is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._worker, fn, *args)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:  # reset, shut down, or closed under us
            self.close()
            raise ChannelClosed(f"data connection lost: {exc}") from None
        except ChannelClosed:
            self.close()
            raise

    def limit_messages(self, limit: int) -> None:
        """Refuse messages longer than `limit` bytes (see `FrameChannel`)."""
        self.limit = limit

    async def send(self, data: Message) -> None:
        view = memoryview(data).cast("B")
        await self._io(self._send_blocking, view)
        self.bytes_sent += len(view)
        self.messages_sent += 1

    async def send_pieces(self, total: int, pieces: Iterator[memoryview]) -> None:
        """One message of `total` bytes whose pieces are made one after another
        in this connection's worker thread (the same bytes on the wire as one
        `send` of their concatenation): the peer has the first piece while the
        next one is being made."""
        await self._io(self._send_pieces_blocking, total, pieces)
        self.bytes_sent += total
        self.messages_sent += 1

    async def recv_progressive(self) -> Arriving:
        """The next message as it arrives: returned once its length header is
        read (and checked as `recv` checks it); its bytes are read on in the
        worker thread, and a reader waits for each prefix (`Arriving.wait`).
        Later operations on this connection run after the message is in."""
        size = await self._io(self._recv_header_blocking)
        assert isinstance(size, int)
        msg = Arriving(size, lambda: self._closed)
        if self._closed:
            raise ChannelClosed("data connection is closed")
        # Submitted now, so that it runs before any later operation on the connection.
        fill = asyncio.get_running_loop().run_in_executor(self._worker, self._fill_blocking, msg)
        fill.add_done_callback(self._after_fill)
        self.bytes_received += size
        self.messages_received += 1
        return msg

    def _after_fill(self, fill: asyncio.Future[None]) -> None:
        if not fill.cancelled() and fill.exception() is not None:
            self.close()  # the reader was told (`Arriving.wait` raises)

    async def recv(self) -> bytes:
        data = await self._io(self._recv_blocking)
        assert isinstance(data, (bytes, memoryview))
        self.bytes_received += len(data)
        self.messages_received += 1
        return data  # type: ignore[return-value]

    def close(self) -> None:
        """Ends the connection; a blocked send or recv fails at once."""
        if self._closed:
            return
        self._closed = True
        try:
            # The plain socket's shutdown (not SSL's): wakes a blocked worker.
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        except OSError:
            pass
        self._worker.submit(self._sock.close)
        self._worker.shutdown(wait=False)

    @property
    def is_closed(self) -> bool:
        """Closed here, or — asked between chunks, when the peer has nothing to
        send — anything readable: the peer's close_notify, EOF or a reset.  (The
        helper sends no TLS session tickets, so an idle healthy connection has
        nothing to read.)"""
        if self._closed:
            return True
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            readable = [self._sock]
        if readable or self._sock.pending():
            self.close()
        return self._closed


def _connect_blocking(
    host: str, port: int, ctx: ssl.SSLContext, name: str, timeout: float
) -> ssl.SSLSocket:
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = ctx.wrap_socket(raw, server_hostname=name)
    except BaseException:
        raw.close()
        raise
    sock.settimeout(None)
    return sock


async def connect(
    host: str, port: int, identity: Identity, expect: Role = Role.HELPER, timeout: float = 10.0
) -> DataConnection:
    """The leader's end: TLS to `host:port`, the server verified as `expect`."""
    ctx = _context(identity, server=False)
    try:
        sock = await asyncio.to_thread(
            _connect_blocking, host, port, ctx, server_name(expect), timeout
        )
    except (OSError, ssl.SSLError) as exc:
        raise ChannelClosed(f"data channel to {host}:{port}: {exc}") from None
    return DataConnection(sock, _peer_role(sock))


class DataListener:
    """The helper's data port.  An acceptor thread takes connections, completes
    the TLS handshake, keeps only certificates of role `expect` (the leader),
    reads the session id each announces first, and hands the connection to the
    gRPC session of that id (`claim`)."""

    def __init__(
        self,
        identity: Identity,
        host: str,
        port: int = 0,
        expect: Role = Role.LEADER,
        admit_seconds: float = ADMIT_SECONDS,
    ) -> None:
        self._ctx = _context(identity, server=True)
        self.host = host
        self.port = port
        self.expect = expect
        self.admit_seconds = admit_seconds
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[bytes, asyncio.Future[DataConnection]] = {}
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        #: Session ids already bound (most recent USED_IDS): never bound again.
        self._used: OrderedDict[bytes, None] = OrderedDict()
        #: Session ids some session has claimed (most recent USED_IDS): a second
        #: session announcing one gets no connection, never a shared one.
        self._claimed: OrderedDict[bytes, None] = OrderedDict()
        #: The connections handed to sessions and still referenced (tests, logs).
        self.connections: weakref.WeakSet[DataConnection] = weakref.WeakSet()

    def bind(self) -> int:
        """Bind and listen (before anything else of the server is created);
        returns the port, an ephemeral one if 0 was asked.  OSError if taken."""
        if self._sock is not None:
            return self.port
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(16)
        except OSError as exc:
            sock.close()
            raise OSError(
                f"cannot listen on {self.host}:{self.port} (--data-port): {exc.strerror or exc}"
            ) from None
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        return self.port

    async def start(self) -> int:
        """Bind if not yet bound, then accept in a background thread."""
        self._loop = asyncio.get_running_loop()
        self.bind()
        self._thread = threading.Thread(target=self._accept_loop, name="svtagg-data-accept")
        self._thread.daemon = True
        self._thread.start()
        return self.port

    def _accept_loop(self) -> None:
        """Accept, and hand each connection's handshake to a thread of its own (at
        most MAX_HANDSHAKES at once), so a peer that stalls its handshake holds up
        nobody else; over the limit, new connections are closed at once."""
        assert self._sock is not None
        while not self._stopped.is_set():
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return  # the listener was closed
            if not self._handshakes.acquire(blocking=False):
                log.warning("data channel: too many handshakes in progress; refused one")
                raw.close()
                continue
            threading.Thread(target=self._admit_guarded, args=(raw,), daemon=True).start()

    def _admit_guarded(self, raw: socket.socket) -> None:
        try:
            self._admit(raw)
        except (OSError, ssl.SSLError, ChannelClosed) as exc:
            log.warning("data channel: refused a connection (%s)", type(exc).__name__)
            raw.close()
        finally:
            self._handshakes.release()

    def _admit(self, raw: socket.socket) -> None:
        # One deadline for the whole admission (handshake and session id), not
        # per read: each blocking step gets only the time left, so a peer
        # trickling bytes is cut off at the deadline and frees its slot.
        deadline = time.monotonic() + self.admit_seconds
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self._ctx.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        try:
            _until(sock, deadline)
            sock.do_handshake()  # one deadline for all of it (ssl's own timeout rule)
            role = _peer_role(sock)
            if role != self.expect:
                log.warning("data channel: refused a %s certificate", role or "roleless")
                sock.close()
                return
            head = bytearray(_HEADER.size + 16)
            _recv_exact(sock, memoryview(head)[: _HEADER.size], deadline)
            if _HEADER.unpack_from(head)[0] != 16:  # refused before waiting for more
                raise ChannelClosed("a data connection starts with its 16-byte session id")
            _recv_exact(sock, memoryview(head)[_HEADER.size :], deadline)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        conn = DataConnection(sock, role)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver, bytes(head[_HEADER.size :]), conn)

    def _deliver(self, sid: bytes, conn: DataConnection) -> None:
        if sid in self._used:
            conn.close()  # a session id is bound to one connection, ever
            return
        fut = self._slot(sid)
        if fut.done():
            conn.close()
            return
        self._used[sid] = None
        self.connections.add(conn)
        while len(self._used) > USED_IDS:
            self._used.popitem(last=False)
        fut.set_result(conn)
        assert self._loop is not None
        self._loop.call_later(UNCLAIMED_SECONDS, self._expire, sid, fut)

    def _expire(self, sid: bytes, fut: asyncio.Future[DataConnection]) -> None:
        """A connection no session claimed in time is closed."""
        if self._waiting.get(sid) is fut:
            del self._waiting[sid]
            if not fut.cancelled():
                fut.result().close()

    def _slot(self, sid: bytes) -> asyncio.Future[DataConnection]:
        fut = self._waiting.get(sid)
        if fut is None:
            assert self._loop is not None
            fut = self._loop.create_future()
            self._waiting[sid] = fut
        return fut

    async def claim(self, sid: bytes, timeout: float) -> DataConnection:
        """The data connection of session `sid` (the leader connects right after
        SessionOpen); PeerUnavailable if it does not arrive in time, or if
        another session has claimed `sid` already."""
        if sid in self._claimed:
            raise PeerUnavailable("another session already claimed this session id")
        self._claimed[sid] = None
        while len(self._claimed) > USED_IDS:
            self._claimed.popitem(last=False)
        fut = self._slot(sid)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise PeerUnavailable("the leader's data connection did not arrive") from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                fut.result().close()  # delivered as the claim was cancelled: not leaked
            raise
        finally:
            self._waiting.pop(sid, None)
            if not fut.done():
                fut.cancel()

    async def close(self) -> None:
        self._stopped.set()
        if self._sock is not None:
            try:
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.result().close()  # delivered, never claimed
        self._waiting.clear()


async def announce(conn: DataConnection, sid: bytes) -> None:
    """The leader's first message on a new data connection: its session id."""
    if len(sid) != 16:
        raise ValueError("session ids are 16 bytes")
    await conn.send(sid)
