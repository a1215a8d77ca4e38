"""A userspace TCP relay that behaves like a network link: each direction delays
every byte by a one-way delay and serialises it at a configured rate, and it
counts the bytes and the "flights" (turns of the conversation) that cross it.

The benchmarks put it between the analyst and the leader and between the leader
and the helper (their gRPC connection and the comparison data channel), so a
run on one machine shows what a round trip on a real network costs.  It only
moves bytes, so TLS, HTTP/2 and the data channel pass through untouched.

The link model, per direction: a segment of b bytes that arrives at time t
starts on the wire at max(t, the end of the previous segment), takes 8b/rate
seconds to serialise, and is delivered one-way-delay later.  Segments are
scheduled by absolute release time, so many are in flight at once (the delay is
pipelined, as on a real link, not paid once per segment), and they leave in
the order they came.

A flight is a burst of bytes in one direction after the other direction was the
last to send, on one connection; a request and its answer are two flights, so
round trips ≈ flights / 2.  Counted from outside, it also sees a transport's
own turns (an HTTP/2 window update or ping acknowledgement is a flight too).

The relays run in an asyncio loop on a `select` selector: epoll's timeouts are
whole milliseconds, too coarse for a 0.5 ms one-way delay.  `RelayProcess`
runs them in a child process of their own, so the delays are not held up by
the benchmark's own Python work.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import selectors
import socket
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

#: Largest segment scheduled at once: at 1 Gbit/s it is ≈ 131 µs on the wire, so
#: a large write is delivered as a stream, not held back until its end.
SEGMENT = 16 * 1024
#: Bytes a direction holds before it stops reading (TCP's flow control then
#: holds the sender back, as a full router queue would); above any
#: bandwidth-delay product used here (10 Gbit/s × 50 ms is 62.5 MB: the relay
#: cannot move that much in Python anyway).
QUEUE_LIMIT = 64 * 1024 * 1024


def parse_rate(text: str) -> float | None:
    """Bits per second from "1g", "10g", "100m", "2.5k" or a plain number;
    "none"/"inf" for no limit."""
    t = text.strip().lower()
    if t in ("none", "inf", "0", ""):
        return None
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1])
    value = float(t[:-1]) * scale if scale else float(t)
    if value <= 0:
        raise ValueError(f"a rate must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class LinkSpec:
    """One relay: listen on `listen`, forward each connection to `target`."""

    name: str
    listen: tuple[str, int]
    target: tuple[str, int]
    #: Delay added to each direction, seconds (RTT / 2).
    one_way_delay: float = 0.0
    #: Bits per second in each direction; None: no serialisation delay.
    rate: float | None = None
    #: Relays of one group count flights together, as one conversation: a
    #: leader's gRPC connection and data channel to the helper, where an answer
    #: on one may be what the other was waiting for.  "": each connection alone.
    group: str = ""


@dataclass
class Counters:
    """What crossed one relay; "up" is from the connecting side to the target."""

    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    flights_up: int = 0
    flights_down: int = 0

    @property
    def flights(self) -> int:
        return self.flights_up + self.flights_down

    @property
    def bytes(self) -> int:
        return self.bytes_up + self.bytes_down

    def minus(self, before: Counters) -> Counters:
        a, b = asdict(self), asdict(before)
        return Counters(**{k: a[k] - b[k] for k in a})

    def plus(self, other: Counters) -> Counters:
        a, b = asdict(self), asdict(other)
        return Counters(**{k: a[k] + b[k] for k in a})


@dataclass
class _Turns:
    """Which direction of a conversation (a connection, or a group of relays)
    sent last, and a log of its flights: [arrival time, "up"/"down", bytes,
    the relay that began it]."""

    last: int = -1
    log: deque[list[Any]] = field(default_factory=lambda: deque(maxlen=100_000))


class _Direction:
    """One direction of one relayed connection: a delay line into `writer`."""

    def __init__(self, relay: Relay, up: bool, turns: _Turns, writer: Any) -> None:
        self.relay = relay
        self.counters = relay.counters
        self.up = up
        self.turns = turns
        self.writer = writer
        self.loop = asyncio.get_running_loop()
        self.queue: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.link_free = 0.0
        self.arrived = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()

    def _count(self, n: int) -> None:
        me = 0 if self.up else 1
        name = self.relay.spec.name
        if self.turns.last != me:
            self.turns.last = me
            self.turns.log.append([self.loop.time(), "up" if self.up else "down", 0, name])
            if self.up:
                self.counters.flights_up += 1
            else:
                self.counters.flights_down += 1
        elif not self.turns.log:  # the log was read mid-flight: its rest is logged anew
            self.turns.log.append([self.loop.time(), "up" if self.up else "down", 0, name])
        self.turns.log[-1][2] += n
        if self.up:
            self.counters.bytes_up += n
        else:
            self.counters.bytes_down += n

    def _schedule(self, data: bytes) -> None:
        now = self.loop.time()
        spec = self.relay.spec  # read per arrival: `Relay.spec` may be changed while running
        for i in range(0, max(len(data), 1), SEGMENT):
            part = data[i : i + SEGMENT]
            start = max(now, self.link_free)
            wire = 8 * len(part) / spec.rate if spec.rate else 0.0
            self.link_free = start + wire
            self.queue.append((self.link_free + spec.one_way_delay, part))
            self.queued += len(part)
        if self.queued > QUEUE_LIMIT:
            self.drained.clear()
        self.arrived.set()

    async def pump(self, reader: asyncio.StreamReader) -> None:
        """Read from the sending side until it closes; an empty segment marks the end."""
        while True:
            data = await reader.read(4 * SEGMENT)
            if data:
                self._count(len(data))
            self._schedule(data)
            if not data:
                return
            await self.drained.wait()

    async def deliver(self) -> None:
        """Release each segment at its time, in order; half-close at the end."""
        while True:
            while not self.queue:
                self.arrived.clear()
                await self.arrived.wait()
            release, part = self.queue[0]
            wait = release - self.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self.queue.popleft()
            self.queued -= len(part)
            if self.queued <= QUEUE_LIMIT:
                self.drained.set()
            if not part:
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                return
            self.writer.write(part)
            await self.writer.drain()


class Relay:
    """One listening relay; every accepted connection gets its own two directions."""

    def __init__(self, spec: LinkSpec, turns: _Turns | None = None) -> None:
        """`turns`: shared by the relays of one group (None: one per connection)."""
        self.spec = spec
        self.turns = turns
        self.counters = Counters()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Bind and listen; the bound port."""
        self.server = await asyncio.start_server(self._accept, *self.spec.listen)
        return int(self.server.sockets[0].getsockname()[1])

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)  # type: ignore[arg-type]
        try:
            t_reader, t_writer = await asyncio.open_connection(*self.spec.target)
        except OSError:
            c_writer.close()
            self.tasks.discard(task)  # type: ignore[arg-type]
            return
        self.counters.connections += 1
        turns = self.turns if self.turns is not None else _Turns()
        up = _Direction(self, True, turns, t_writer)
        down = _Direction(self, False, turns, c_writer)
        jobs = [
            asyncio.ensure_future(j)
            for j in (up.pump(c_reader), up.deliver(), down.pump(t_reader), down.deliver())
        ]
        try:
            # Both sides finished, or one side failed: then the whole connection goes.
            await asyncio.wait(jobs, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            for w in (c_writer, t_writer):
                w.close()
            self.tasks.discard(task)  # type: ignore[arg-type]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _new_loop() -> asyncio.AbstractEventLoop:
    # select() takes microseconds; epoll rounds every timeout up to a millisecond.
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


@dataclass
class _Host:
    """The child's side of `RelayProcess`: relays by name, commands over a pipe."""

    conn: Connection
    relays: dict[str, Relay] = field(default_factory=dict)
    groups: dict[str, _Turns] = field(default_factory=dict)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def command(self, msg: tuple[Any, ...]) -> Any:
        op = msg[0]
        if op == "add":
            spec: LinkSpec = msg[1]
            turns = self.groups.setdefault(spec.group, _Turns()) if spec.group else None
            relay = self.relays[spec.name] = Relay(spec, turns)
            return await relay.start()
        if op == "set":
            name, delay, rate = msg[1:]
            relay = self.relays[name]
            relay.spec = replace(relay.spec, one_way_delay=delay, rate=rate)
            return None
        if op == "stats":
            return {name: asdict(r.counters) for name, r in self.relays.items()}
        if op == "flights":
            # A group's flight log since the last call, times relative to now.
            turns = self.groups[msg[1]]
            now = asyncio.get_running_loop().time()
            log = [(round(now - t, 6), d, n, name) for t, d, n, name in turns.log]
            turns.log.clear()
            return log
        if op == "stop":
            for r in self.relays.values():
                await r.close()
            self.stopped.set()
            return None
        raise ValueError(f"unknown relay command {op!r}")

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        loop.add_reader(self.conn.fileno(), lambda: inbox.put_nowait(self.conn.recv()))
        while not self.stopped.is_set():
            msg = await inbox.get()
            try:
                self.conn.send(("ok", await self.command(msg)))
            except Exception as exc:  # reported to the parent, which raises it
                self.conn.send(("error", f"{type(exc).__name__}: {exc}"))
        loop.remove_reader(self.conn.fileno())


def _child(conn: Connection) -> None:
    loop = _new_loop()
    try:
        loop.run_until_complete(_Host(conn).serve())
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        loop.close()


class RelayProcess:
    """Relays in a child process of their own; use as a context manager.

    `add(spec)` starts one and returns its address; `counters()` reads every
    relay's counts (take two readings and subtract them to count one step)."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child,), daemon=True)
        self._proc.start()
        child.close()
        self.specs: dict[str, LinkSpec] = {}
        self.ports: dict[str, int] = {}

    def _ask(self, *msg: Any, timeout: float = 30.0) -> Any:
        self._conn.send(msg)
        if not self._conn.poll(timeout):
            raise TimeoutError(f"relay process did not answer {msg[0]!r} in {timeout} s")
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"relay process: {value}")
        return value

    def add(self, spec: LinkSpec) -> str:
        """Start a relay; its `host:port`."""
        port = int(self._ask("add", spec))
        self.specs[spec.name] = spec
        self.ports[spec.name] = port
        return f"{spec.listen[0]}:{port}"

    def set_link(self, name: str, one_way_delay: float, rate: float | None) -> None:
        """Change a running relay's delay and rate (for bytes that arrive from now on)."""
        self._ask("set", name, one_way_delay, rate)
        self.specs[name] = replace(self.specs[name], one_way_delay=one_way_delay, rate=rate)

    def counters(self) -> dict[str, Counters]:
        return {name: Counters(**c) for name, c in self._ask("stats").items()}

    def flights(self, group: str) -> list[tuple[float, str, int, str]]:
        """The flights of `group` since the last call (or since it started): how
        long ago each began (seconds), its direction, its bytes, and the relay
        whose bytes began it."""
        return [tuple(f) for f in self._ask("flights", group)]  # type: ignore[misc]

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError, EOFError, TimeoutError, RuntimeError):
                self._ask("stop", timeout=5.0)
            self._proc.join(5.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        self._conn.close()

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on `host` now (another process may take it later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
