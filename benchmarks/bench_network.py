"""What a selection costs on a network: the two servers and the analyst talk
through relays (benchmarks/relay.py) that add a round-trip time and limit the
rate, and count bytes and round trips from outside the processes.

    analyst ──relay "analyst"──▶ leader ──relay "peer" (gRPC)──▶ helper
                                        ──relay "data" (comparison data channel)──▶

The leader is started with `--helper` at the peer relay's address on
127.0.0.2, and the helper with a fixed `--data-port` P; the helper announces P
per session and the leader dials P on the host of its `--helper` address, so
it reaches the data relay listening on 127.0.0.2:P, which forwards to the
helper's 127.0.0.1:P.  No server option is needed for that.

One deployment and one upload serve every configuration; the relays' delay
and rate change between configurations.  Per configuration: the link's RTT as
a ping through an identical relay measures it, single-query latency, the
stream opening, comparisons/s at chunks of 10^3 and 10^4 on one open stream,
the demo's selection (`svtagg demo`, model selection by scan), and, counted by
the relays, round trips (flights / 2) and bytes per comparison.

    python -m svtagg.benchmarks.bench_network          # 1, 10, 50 ms at 1g; 1 ms at 10g
    python -m svtagg.benchmarks.bench_network --quick  # smaller demo, fewer repetitions
    python -m svtagg.benchmarks.bench_network --rtt 0,1 --rate 1g --grid
    python -m svtagg.benchmarks.bench_network --quick --rtt 1 --rate 1g \
        --garbling halfgates,threehalves   # each scheme, a deployment each
    python -m svtagg.benchmarks.bench_network --quick --rtt 10 --rate 1g \
        --comparison garbled,ot,auto:10:1000 --chunks 1000,10000,100000
                                           # each comparison path (the leader's
                                           # --comparison), a deployment each
    python -m svtagg.benchmarks.bench_network --quick --rtt 10 --rate 1g \
        --comparison garbled,ot --chunks 10000,100000 --rounds 5
                                           # both deployments up at once, their
                                           # chunk timings alternated per round,
                                           # with the per-round ratio

Configurations: every --rtt at the first --rate, and the first --rtt at each
further rate (--grid: every pair).  JSON goes to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.benchmarks.bench_system import comparison_task
from svtagg.benchmarks.relay import Counters, LinkSpec, RelayProcess, free_port, parse_rate
from svtagg.deploy.algorithms import RunFlags, run_algorithm
from svtagg.deploy.jobs import analyst_stub, upload_parallel
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.deploy.tasks import task_spec
from svtagg.deploy.workloads import model_selection
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb

#: The leader reaches the helper here: another loopback address, so that the data
#: relay can listen on the helper's own data port number.
RELAY_HOST = "127.0.0.2"
#: The relays between leader and helper (gRPC Peer calls, comparison data channel).
PEER_LINKS = ("peer", "data")

T = TypeVar("T")


@dataclass(frozen=True)
class Config:
    rtt_ms: float
    rate: str
    analyst_rtt_ms: float

    @property
    def name(self) -> str:
        return f"{self.rtt_ms:g} ms @ {self.rate}"


@dataclass
class Counted:
    """One step's traffic: the analyst's link, the leader↔helper links (counted
    as one conversation), and the latter's flights in order."""

    analyst: Counters
    peer: Counters
    trace: list[str]


def _trace(log: list[tuple[float, str, int, str]]) -> list[str]:
    """Flights as "+12.3 ms leader→helper 1,234 B (data)", from the first one."""
    if not log:
        return []
    first = log[0][0]
    arrows = {"up": "leader→helper", "down": "helper→leader"}
    return [
        f"+{(first - ago) * 1e3:.1f} ms {arrows[d]} {n:,} B ({name})" for ago, d, n, name in log
    ]


@dataclass
class Network:
    """A running deployment behind relays, and the address the analyst uses."""

    dep: LocalDeployment
    relays: RelayProcess
    analyst: str
    probe: str

    def configure(self, cfg: Config) -> None:
        rate = parse_rate(cfg.rate)
        for name in (*PEER_LINKS, "probe"):
            self.relays.set_link(name, cfg.rtt_ms / 2e3, rate)
        self.relays.set_link("analyst", cfg.analyst_rtt_ms / 2e3, rate)

    def counted(self, step: Callable[[], T], settle: float) -> tuple[T, Counted]:
        """Run `step` once between two readings of the relays' counters, with
        `settle` seconds before and after so that no other step's bytes fall
        in; what crossed the analyst's link and the leader↔helper links."""
        time.sleep(settle)
        before = self.relays.counters()
        self.relays.flights("peer")
        result = step()
        time.sleep(settle)
        after = self.relays.counters()
        log = self.relays.flights("peer")
        diff = {k: after[k].minus(before[k]) for k in after}
        peer = diff[PEER_LINKS[0]].plus(diff[PEER_LINKS[1]])
        return result, Counted(diff["analyst"], peer, _trace(log))


def _echo(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(65536):
                conn.sendall(data)


def ping(address: str, count: int) -> list[float]:
    """Round trips of 100 bytes to an echo server at `address`, seconds."""
    host, port = address.rsplit(":", 1)
    out = []
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            t = time.perf_counter()
            s.sendall(b"x" * 100)
            got = 0
            while got < 100:
                got += len(s.recv(100 - got))
            out.append(time.perf_counter() - t)
    return out


def _data_port() -> int:
    """A port free on both loopback addresses (the helper's and the relay's)."""
    for _ in range(20):
        port = free_port("127.0.0.1")
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((RELAY_HOST, port))
            return port
    raise RuntimeError(f"no port free on both 127.0.0.1 and {RELAY_HOST}")


@contextlib.contextmanager
def network_deployment(
    garbling: str | None = None, comparison: str | None = None
) -> Iterator[Network]:
    """Helper, relays, leader (pointed at the relays), the analyst's relay, and
    a probe relay to a local echo server; all links start with no delay.
    `garbling`: both servers' --garbling (None: their default); `comparison`:
    the leader's --comparison (the helper follows it)."""
    data_port = _data_port()
    echo = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_echo, args=(echo,), daemon=True).start()
    scheme = ["--garbling", garbling] if garbling else []
    path = ["--comparison", comparison] if comparison else []
    dep = LocalDeployment(
        server_args=UNCAPPED_SERVER_ARGS + scheme,
        role_args={"helper": ["--data-port", str(data_port)]},
    )
    with RelayProcess() as relays:
        try:
            dep.start_role("helper")
            helper = ("127.0.0.1", dep.ports["helper"])
            peer = relays.add(LinkSpec("peer", (RELAY_HOST, 0), helper, group="peer"))
            data = (RELAY_HOST, data_port)
            relays.add(LinkSpec("data", data, ("127.0.0.1", data_port), group="peer"))
            dep.role_args["leader"] = ["--helper", peer, *path]
            dep.start_role("leader")
            leader = ("127.0.0.1", dep.ports["leader"])
            analyst = relays.add(LinkSpec("analyst", ("127.0.0.1", 0), leader))
            probe = relays.add(
                LinkSpec("probe", ("127.0.0.1", 0), ("127.0.0.1", echo.getsockname()[1]))
            )
            yield Network(dep, relays, analyst, probe)
        finally:
            dep.stop()
            echo.close()


def demo_task(dep: LocalDeployment, users: int, d: int) -> None:
    """The demo's model-selection task (`svtagg demo`'s data), uploaded straight
    to both servers (not through the relays: the upload is not measured), with
    a budget large enough for one selection per configuration."""
    values = model_selection(users, d, 1)
    stub = analyst_stub(dep.address("leader"), dep.certs)
    stub.CreateTask(task_spec("demo", d, 10 * users, "10000", min_batch=100), timeout=60)
    upload_parallel(dep.address("leader"), dep.address("helper"), dep.certs, "demo", values, 1, 500)
    stub.CloseCollection(pb.TaskRef(task_id="demo"), timeout=600)


def _spread(values: list[float], scale: float = 1.0, digits: int = 1) -> dict[str, float]:
    return {
        "median": round(statistics.median(values) * scale, digits),
        "min": round(min(values) * scale, digits),
        "max": round(max(values) * scale, digits),
    }


def _trips(c: Counters) -> float:
    return c.flights / 2


def _counts(c: Counted) -> dict[str, Any]:
    return {
        "peer_round_trips": _trips(c.peer),
        "analyst_round_trips": _trips(c.analyst),
        "peer_flights": [c.peer.flights_up, c.peer.flights_down],
        "peer_bytes": c.peer.bytes,
    }


def measure_open(net: Network, oracle: RemoteOracle, reps: int, settle: float) -> dict[str, Any]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        oracle.open_stream(1)
        times.append(time.perf_counter() - t)
    _, c = net.counted(lambda: oracle.open_stream(1), settle)
    return {"ms": _spread(times, 1e3), **_counts(c), "trace": c.trace}


def measure_chunk(
    net: Network, oracle: RemoteOracle, k: int, reps: int, settle: float
) -> dict[str, Any]:
    """Chunks of `k` NO-answering queries on one open stream (the stream's
    opening is not timed): seconds per chunk, and one chunk's counts."""
    rng = np.random.default_rng(k)
    far = 2 * oracle.n
    stream = oracle.open_stream(1)
    chunk = [(Query(int(j)), far) for j in rng.integers(0, oracle.d, size=k)]
    assert stream.ask(chunk) is None  # warm the pooled session
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        assert stream.ask(chunk) is None
        times.append(time.perf_counter() - t)
    before = oracle.stats().peer_bytes
    _, c = net.counted(lambda: stream.ask(chunk), settle)
    return {
        **chunk_times(k, times),
        **_counts(c),
        "wire_bytes_per_comparison": round(c.peer.bytes / k, 1),
        "server_bytes_per_comparison": round((oracle.stats().peer_bytes - before) / k, 1),
        "trace": c.trace if k <= 1000 else c.trace[:40],
    }


def measure_demo(net: Network, epsilon: str, settle: float) -> dict[str, Any]:
    with RemoteOracle.from_certs(net.analyst, "demo", net.dep.certs) as oracle:
        t = time.perf_counter()
        res, c = net.counted(
            lambda: run_algorithm(oracle, RunFlags("scan", epsilon, seed=1)), settle
        )
        seconds = time.perf_counter() - t - 2 * settle
        st = oracle.stats()
    return {
        "seconds": round(seconds, 2),
        "selected": int(res["selected"]),
        "streams": st.streams,
        "chunks": st.chunks,
        "queries": st.queries,
        "peer_round_trips": _trips(c.peer),
        "analyst_round_trips": _trips(c.analyst),
        "peer_MB": round(c.peer.bytes / 1e6, 1),
    }


def chunk_times(k: int, times: list[float]) -> dict[str, Any]:
    """A chunk size's timings (seconds per chunk) and their spreads."""
    return {
        "chunk": k,
        "reps": len(times),
        "seconds": times,
        "ms": _spread(times, 1e3, 2),
        "comparisons_per_s": _spread([k / t for t in times], digits=0),
    }


def more_rounds(
    nets: list[Network], results: list[dict[str, Any]], rounds: int, quick: bool
) -> None:
    """Rounds 2…`rounds` of the chunk timings, the deployments alternated within
    each round (A B, A B, …: the machine's drift falls on both alike); every
    round's timings join the first round's, and each result gets, per chunk
    size, the ratio of its round median comparisons/s to the first
    deployment's in the same round (`ratio_to_first`: median, min–max)."""
    per_round: list[list[dict[int, float]]] = [
        [{c["chunk"]: statistics.median(c["seconds"]) for c in r["chunks"]}] for r in results
    ]
    for _ in range(1, rounds):
        for i, (net, r) in enumerate(zip(nets, results, strict=True)):
            settle = _settle(Config(**r["config"]))
            with RemoteOracle.from_certs(net.analyst, "cmp", net.dep.certs) as oracle:
                oracle.open_stream(1).ask([(Query(0), 2 * oracle.n)])
                medians = {}
                for c in r["chunks"]:
                    k = c["chunk"]
                    m = measure_chunk(net, oracle, k, _chunk_reps(k, quick), settle)
                    c.update(chunk_times(k, c["seconds"] + m["seconds"]))
                    medians[k] = statistics.median(m["seconds"])
            per_round[i].append(medians)
    for i, r in enumerate(results):
        r["rounds"] = rounds
        for c in r["chunks"]:
            k = c["chunk"]
            ratios = [
                first[k] / mine[k] for first, mine in zip(per_round[0], per_round[i], strict=True)
            ]
            c["ratio_to_first"] = _spread(ratios, digits=2)


def _settle(cfg: Config) -> float:
    """Seconds of quiet around a counted step: no other step's bytes fall in."""
    return 0.05 + 2 * max(cfg.rtt_ms, cfg.analyst_rtt_ms) / 1e3


def _chunk_reps(k: int, quick: bool) -> int:
    return (3 if quick else 5) if k <= 1000 else (2 if quick else 3)


def run_config(
    net: Network, cfg: Config, quick: bool, chunks: tuple[int, ...] = (1000, 10_000)
) -> dict[str, Any]:
    net.configure(cfg)
    settle = _settle(cfg)
    out: dict[str, Any] = {"config": asdict(cfg)}
    out["link_rtt_ms"] = _spread(ping(net.probe, 20), 1e3, 2)
    with RemoteOracle.from_certs(net.analyst, "cmp", net.dep.certs) as oracle:
        oracle.open_stream(1).ask([(Query(0), 2 * oracle.n)])  # connections and session up
        out["open_stream"] = measure_open(net, oracle, 3 if quick else 5, settle)
        out["single"] = measure_chunk(net, oracle, 1, 10 if quick else 30, settle)
        out["chunks"] = [
            measure_chunk(net, oracle, k, _chunk_reps(k, quick), settle) for k in chunks
        ]
    out["demo"] = measure_demo(net, "4", settle)
    return out


def _cell(s: dict[str, float], unit: str = "") -> str:
    return f"{s['median']:,g}{unit} ({s['min']:,g}–{s['max']:,g})"


def _name(r: dict[str, Any]) -> str:
    extra = [r[key] for key in ("garbling", "comparison") if r.get(key)]
    return ", ".join([Config(**r["config"]).name, *extra])


def table(results: list[dict[str, Any]]) -> str:
    """The per-configuration figures as a Markdown table, one column each."""
    names = [_name(r) for r in results]
    sizes = [c["chunk"] for c in results[0]["chunks"]]

    def chunk(r: dict[str, Any], k: int) -> dict[str, Any]:
        return next(c for c in r["chunks"] if c["chunk"] == k)

    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("link RTT, measured by ping (ms)", lambda r: _cell(r["link_rtt_ms"])),
        ("single query, ms", lambda r: _cell(r["single"]["ms"])),
        ("stream opening, ms", lambda r: _cell(r["open_stream"]["ms"])),
        *[
            (f"comparisons/s, chunk {k:,}", lambda r, k=k: _cell(chunk(r, k)["comparisons_per_s"]))
            for k in sizes
        ],
        *[
            (
                f"comparisons/s ÷ {names[0]}'s, per round, chunk {k:,}",
                lambda r, k=k: _cell(chunk(r, k)["ratio_to_first"]),
            )
            for k in sizes
            if "rounds" in results[0]
        ],
        ("demo selection, s", lambda r: f"{r['demo']['seconds']:g}"),
        (
            "demo: streams / chunks / leader↔helper round trips",
            lambda r: (
                f"{r['demo']['streams']} / {r['demo']['chunks']} / "
                f"{r['demo']['peer_round_trips']:g}"
            ),
        ),
        ("leader↔helper round trips, stream opening", lambda r: _g(r["open_stream"])),
        ("leader↔helper round trips, chunk of 1", lambda r: _g(r["single"])),
        *[
            (f"leader↔helper round trips, chunk {k:,}", lambda r, k=k: _g(chunk(r, k)))
            for k in sizes
        ],
        *[
            (
                f"bytes per comparison on the wire, chunk {k:,}",
                lambda r, k=k: f"{chunk(r, k)['wire_bytes_per_comparison']:,g}",
            )
            for k in sizes
            if k >= 10_000
        ],
    ]
    lines = ["| figure | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(get(r) for r in results) + " |" for label, get in rows]
    return "\n".join(lines)


def _g(step: dict[str, Any]) -> str:
    return f"{step['peer_round_trips']:g}"


def configs(rtts: list[float], rates: list[str], analyst_rtt: float, grid: bool) -> list[Config]:
    pairs = [(r, rates[0]) for r in rtts] + [(rtts[0], rate) for rate in rates[1:]]
    if grid:
        pairs = [(r, rate) for rate in rates for r in rtts]
    return [Config(r, rate, analyst_rtt) for r, rate in pairs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small demo, fewer repetitions")
    p.add_argument("--rtt", default="1,10,50", help="leader↔helper RTTs, ms (comma-separated)")
    p.add_argument("--rate", default="1g,10g", help="link rates, bits/s (1g, 10g, 100m, none)")
    p.add_argument("--analyst-rtt", type=float, default=1.0, help="analyst↔leader RTT, ms")
    p.add_argument("--grid", action="store_true", help="every RTT at every rate")
    p.add_argument(
        "--garbling",
        default="",
        help="comma-separated garbling schemes, each on a deployment of its own, "
        "every configuration under each (default: the servers' default only)",
    )
    p.add_argument(
        "--comparison",
        default="",
        help="comma-separated comparison paths (the leader's --comparison: garbled, ot, "
        "auto:RTT_MS:MBPS), each on a deployment of its own (default: the servers' default)",
    )
    p.add_argument("--chunks", default="1000,10000", help="chunk sizes measured (comma-separated)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of chunk timings: above 1, every deployment (--garbling × --comparison) "
        "is up at once and their timings alternate round by round, with each one's "
        "comparisons/s ratio to the first deployment's per round",
    )
    p.add_argument("--out", default="results/bench_network.json")
    args = p.parse_args(argv)
    rtts = [float(x) for x in args.rtt.split(",") if x.strip()]
    rates = [x.strip() for x in args.rate.split(",") if x.strip()]
    for rate in rates:
        parse_rate(rate)
    plan = configs(rtts, rates, args.analyst_rtt, args.grid)
    users, d = (2000, 200) if args.quick else (10_000, 1000)
    started = time.perf_counter()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    results = []
    sizes = tuple(int(x) for x in args.chunks.split(",") if x.strip())
    schemes = [x.strip() for x in args.garbling.split(",") if x.strip()] or [None]
    paths = [x.strip() for x in args.comparison.split(",") if x.strip()] or [None]
    variants = [(scheme, path) for scheme in schemes for path in paths]

    def up(stack: contextlib.ExitStack, scheme: str | None, path: str | None) -> Network:
        net = stack.enter_context(network_deployment(scheme, path))
        comparison_task(net.dep)
        demo_task(net.dep, users, d)
        print(f"deployment up, tasks uploaded in {time.perf_counter() - started:.0f} s")
        return net

    def run(net: Network, cfg: Config, scheme: str | None, path: str | None) -> dict[str, Any]:
        r = run_config(net, cfg, args.quick, sizes)
        return {**r, "garbling": scheme, "comparison": path}

    if args.rounds > 1:  # every deployment up at once, their chunk timings alternated
        with contextlib.ExitStack() as stack:
            nets = [up(stack, scheme, path) for scheme, path in variants]
            for cfg in plan:
                batch = [run(net, cfg, *v) for net, v in zip(nets, variants, strict=True)]
                more_rounds(nets, batch, args.rounds, args.quick)
                for r in batch:
                    print(f"[{_name(r)}]", json.dumps(r), flush=True)
                results += batch
    else:
        for scheme, path in variants:
            with contextlib.ExitStack() as stack:
                net = up(stack, scheme, path)
                for cfg in plan:
                    results.append(run(net, cfg, scheme, path))
                    print(f"[{_name(results[-1])}]", json.dumps(results[-1]), flush=True)
    print(
        f"\ndemo: {users:,} users, d = {d:,}, scan selection at ε = 4; "
        f"analyst↔leader RTT {args.analyst_rtt:g} ms; medians (min–max)\n"
    )
    print(table(results))
    for r in results:
        name = _name(r)
        for label, step in (("stream opening", r["open_stream"]), ("chunk of 1", r["single"])):
            print(f"\nleader↔helper flights, {label}, {name}:")
            print("\n".join(f"  {line}" for line in step["trace"]))
    print(
        f"\nload average at end: {os.getloadavg()[0]:.2f}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": platform.platform(), "quick": args.quick, "demo": [users, d]}
    out.write_text(json.dumps({**report, "results": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
