"""The benchmark's network relay (benchmarks/relay.py): the delay it adds, the
rate it lets through, and its byte and flight counts, against a plain TCP
echo/sink server on this machine."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from svtagg.benchmarks.relay import Counters, LinkSpec, RelayProcess, parse_rate


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = s.recv(min(n - len(buf), 1 << 20))
        if not part:
            raise ConnectionError("closed early")
        buf += part
    return bytes(buf)


def _serve(listener: socket.socket, mode: str) -> None:
    """`echo`: send back whatever arrives; `sink`: read to the end, then answer
    with the byte count as 8 bytes; each connection in a thread of its own."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_handle, args=(conn, mode), daemon=True).start()


def _handle(conn: socket.socket, mode: str) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        total = 0
        while data := conn.recv(1 << 20):
            total += len(data)
            if mode == "echo":
                conn.sendall(data)
        if mode == "sink":
            conn.sendall(total.to_bytes(8, "big"))


@pytest.fixture
def server() -> Iterator[dict[str, int]]:
    ports = {}
    listeners = []
    for mode in ("echo", "sink"):
        lst = socket.create_server(("127.0.0.1", 0))
        listeners.append(lst)
        ports[mode] = lst.getsockname()[1]
        threading.Thread(target=_serve, args=(lst, mode), daemon=True).start()
    yield ports
    for lst in listeners:
        lst.close()


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _ping_pong(address: str, rounds: int, size: int) -> tuple[list[float], bytes, bytes]:
    """`rounds` request/answer exchanges of `size` random bytes; the round trip
    times, and everything sent and received."""
    times, sent, got = [], bytearray(), bytearray()
    with _connect(address) as s:
        for _ in range(rounds):
            msg = os.urandom(size)
            t = time.perf_counter()
            s.sendall(msg)
            back = _recv_exact(s, size)
            times.append(time.perf_counter() - t)
            sent += msg
            got += back
    return times, bytes(sent), bytes(got)


def test_parse_rate() -> None:
    assert parse_rate("1g") == 1e9
    assert parse_rate("10G") == 1e10
    assert parse_rate("250m") == 2.5e8
    assert parse_rate("1000") == 1000.0
    assert parse_rate("none") is None
    with pytest.raises(ValueError):
        parse_rate("-1g")


def test_ping_pong_adds_the_round_trip_and_counts_every_flight(server: dict[str, int]) -> None:
    """A 10 ms RTT relay adds 10 ms to each exchange (against the same relay
    with no delay, fastest exchange against fastest: the machine's other load
    only ever adds), passes the bytes unchanged and in order, counts them
    exactly, and sees one flight each way per exchange."""
    rounds, size = 30, 200
    echo = ("127.0.0.1", server["echo"])
    with RelayProcess() as relays:
        base, _, _ = _ping_pong(relays.add(LinkSpec("zero", ("127.0.0.1", 0), echo)), rounds, size)
        via = relays.add(LinkSpec("echo", ("127.0.0.1", 0), echo, 0.005))
        times, sent, got = _ping_pong(via, rounds, size)
        time.sleep(0.05)  # the relay counts the closing connection's end too
        c = relays.counters()["echo"]
    added = min(times) - min(base)
    assert abs(added - 0.010) < 0.001, f"added round trip {added * 1e3:.2f} ms, configured 10 ms"
    assert min(times) >= 0.010, "no exchange may beat the configured delay"
    assert got == sent
    assert c == Counters(
        connections=1,
        bytes_up=rounds * size,
        bytes_down=rounds * size,
        flights_up=rounds,
        flights_down=rounds,
    )


def test_sub_millisecond_delay_is_kept(server: dict[str, int]) -> None:
    """RTT 1 ms (0.5 ms each way): the event loop's timers must resolve below a
    millisecond (epoll would round each wait up to 1 ms)."""
    echo = ("127.0.0.1", server["echo"])
    with RelayProcess() as relays:
        base, _, _ = _ping_pong(relays.add(LinkSpec("zero", ("127.0.0.1", 0), echo)), 40, 100)
        times, _, _ = _ping_pong(
            relays.add(LinkSpec("echo", ("127.0.0.1", 0), echo, 0.0005)), 40, 100
        )
    added = min(times) - min(base)
    # Rounded up to whole milliseconds, each direction's 0.5 ms would add ≥ 2 ms;
    # the margin above 1 ms is the relay's own scheduling on a loaded box.
    assert 0.0009 < added < 0.0019, f"added round trip {added * 1e3:.3f} ms, configured 1 ms"


def test_bulk_transfer_runs_at_the_configured_rate(server: dict[str, int]) -> None:
    """4 MB at 100 Mbit/s with 2 ms one way: ≈ 0.34 s; the measured rate is
    within 15 % of the configured one, and the relay counts every byte."""
    n, rate, delay = 4_000_000, 100e6, 0.002
    payload = os.urandom(n)
    with RelayProcess() as relays:
        via = relays.add(
            LinkSpec("sink", ("127.0.0.1", 0), ("127.0.0.1", server["sink"]), delay, rate)
        )
        with _connect(via) as s:
            t = time.perf_counter()
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            total = int.from_bytes(_recv_exact(s, 8), "big")
            seconds = time.perf_counter() - t
        time.sleep(0.05)
        c = relays.counters()["sink"]
    assert total == n
    measured = 8 * n / (seconds - 2 * delay)
    assert abs(measured / rate - 1) < 0.15, f"{measured / 1e6:.1f} Mbit/s through a 100 Mbit/s link"
    assert (c.bytes_up, c.bytes_down) == (n, 8)
    assert (c.flights_up, c.flights_down) == (1, 1)


def test_delay_is_pipelined_not_paid_per_segment(server: dict[str, int]) -> None:
    """Many segments in flight at once: a 2 MB echo through 20 ms each way with
    no rate limit takes about one RTT plus the local copying, not one delay per
    16 KiB segment (which would be over 2.5 s)."""
    n = 2_000_000
    payload = os.urandom(n)
    with RelayProcess() as relays:
        via = relays.add(LinkSpec("echo", ("127.0.0.1", 0), ("127.0.0.1", server["echo"]), 0.02))
        with _connect(via) as s:
            t = time.perf_counter()
            reader = threading.Thread(target=lambda: got.append(_recv_exact(s, n)))
            got: list[bytes] = []
            reader.start()
            s.sendall(payload)
            reader.join(30)
            seconds = time.perf_counter() - t
    assert got and got[0] == payload
    assert 0.04 <= seconds < 0.6, f"2 MB echo took {seconds:.3f} s through a 40 ms RTT"


def test_a_group_counts_flights_across_its_connections(server: dict[str, int]) -> None:
    """Two relays of one group are one conversation: a request on one connection
    and its answer on the other are two flights, and the flight log lists them
    in order with their bytes and the relay that began each.  Ungrouped, the
    same traffic would be four flights (each connection turns once)."""
    sink = ("127.0.0.1", server["sink"])
    with RelayProcess() as relays:
        a = relays.add(LinkSpec("a", ("127.0.0.1", 0), sink, group="g"))
        b = relays.add(LinkSpec("b", ("127.0.0.1", 0), sink, group="g"))
        with _connect(a) as sa, _connect(b) as sb:
            sa.sendall(b"x" * 10)
            time.sleep(0.05)
            sb.sendall(b"y" * 20)
            sb.shutdown(socket.SHUT_WR)
            assert int.from_bytes(_recv_exact(sb, 8), "big") == 20
            time.sleep(0.05)
            sa.shutdown(socket.SHUT_WR)
            assert int.from_bytes(_recv_exact(sa, 8), "big") == 10
        time.sleep(0.05)
        c = relays.counters()
        log = relays.flights("g")
        assert relays.flights("g") == [], "the log is read once"
    assert [(d, n, name) for _, d, n, name in log] == [("up", 30, "a"), ("down", 16, "b")]
    assert log[0][0] > log[1][0] > 0, "each flight's age, the earlier one older"
    assert c["a"].flights + c["b"].flights == 2
    assert (c["a"].bytes_up, c["b"].bytes_up, c["a"].bytes_down, c["b"].bytes_down) == (
        10,
        20,
        8,
        8,
    )
