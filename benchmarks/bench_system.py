"""End-to-end system benchmark through two real server processes (mutual TLS,
SQLite, garbled circuits), configurations side by side in one run:

    numpy+grpc    numpy engine, protocol inside the gRPC session stream (before)
    native+grpc   native core, protocol inside the gRPC session stream
    native+data   native core, protocol on the comparison data channel (default)

and, with --configs, each garbling scheme on the last: native+data+halfgates,
native+data+threehalves (`--garbling`, both servers).

For each: single-query round trip and comparisons/s per chunk size; for the
last one also chunks of 10^5, batched upload and Algorithm 8 at scale (report
validation is measured by `bench_ingest`: proofs at ingest, next to the
retired garbled range check).

    python -m svtagg.benchmarks.bench_system            # full run, prints a table
    python -m svtagg.benchmarks.bench_system --quick    # smaller sizes, for a smoke test

Targets: ≥ 150,000 comparisons/s at chunks of 10^4; single-query p50 ≤ 3 ms.
JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.client.upload import Uploader
from svtagg.deploy.jobs import analyst_channel, analyst_stub, task_spec
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.tls import Identity


def _task(dep: LocalDeployment, task_id: str, d: int, n_max: int) -> None:
    analyst_stub(dep.address("leader"), dep.certs).CreateTask(
        task_spec(task_id, d, n_max, "1000000"), timeout=30
    )


def _upload(dep: LocalDeployment, task_id: str, values: np.ndarray, batch: int) -> float:
    c = Identity.load(dep.certs, "client")
    with Uploader(
        dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key, timeout=300
    ) as up:
        start = time.perf_counter()
        up.upload(task_id, values, batch_size=batch)
        return time.perf_counter() - start


def _close(dep: LocalDeployment, task_id: str) -> None:
    analyst_stub(dep.address("leader"), dep.certs).CloseCollection(
        pb.TaskRef(task_id=task_id), timeout=60
    )


def bench_proof_close(dep: LocalDeployment, n: int, d: int) -> dict[str, Any]:
    """CloseCollection of a task whose reports proved themselves one-hot at
    ingest: the close's field-to-ring pass, one garbled conversion per
    coordinate (its chunks become parallel jobs when the work is leased)."""
    spec = task_spec("proved", d, n, "1000000", validity="onehot")
    analyst_stub(dep.address("leader"), dep.certs).CreateTask(spec, timeout=30)
    rows = np.eye(d)[np.random.default_rng(5).integers(0, d, n)]
    _upload(dep, "proved", rows, 500)
    t = time.perf_counter()
    _close(dep, "proved")
    return {"reports": n, "d": d, "close_seconds": round(time.perf_counter() - t, 2)}


#: n_max of the task "cmp": its ε = 1 streams compare at `stream_width(CMP_N_MAX, 16,
#: "lap24", 1)` bits (34).
CMP_N_MAX = 10_000


def comparison_task(dep: LocalDeployment) -> None:
    """The closed task "cmp" the comparison figures ask: 1,000 reports, d = 1,000."""
    _task(dep, "cmp", 1000, CMP_N_MAX)
    _upload(dep, "cmp", np.random.default_rng(4).random((1000, 1000)), 500)
    _close(dep, "cmp")


def bench_upload(dep: LocalDeployment, n: int, d: int, batch: int) -> dict[str, Any]:
    _task(dep, "upload", d, n)
    values = np.random.default_rng(1).random((n, d))
    seconds = _upload(dep, "upload", values, batch)
    return {
        "n": n,
        "d": d,
        "batch": batch,
        "seconds": round(seconds, 3),
        "reports_per_s": round(n / seconds, 1),
    }


def bench_chunks(
    oracle: RemoteOracle, sizes: list[int], reps: int, one_stream: bool = False
) -> list[dict[str, Any]]:
    """NO-answering chunks (threshold far above every score): each on a stream
    of its own (the stream's opening, two durable charges, is timed too), or
    with `one_stream` all on one open stream (a NO keeps it open)."""
    rows = []
    rng = np.random.default_rng(2)
    far = 2 * oracle.n
    for k in sizes:
        chunk = [(Query(int(j)), far) for j in rng.integers(0, oracle.d, size=k)]
        times, peers = [], []
        shared = oracle.open_stream(1) if one_stream else None
        for _ in range(reps if k < 100_000 else max(1, reps // 3)):
            t = time.perf_counter()
            s = shared if shared is not None else oracle.open_stream(1)
            before = oracle.stats().peer_bytes
            assert s.ask(chunk) is None
            times.append(time.perf_counter() - t)
            peers.append(oracle.stats().peer_bytes - before)
        peer = sum(peers) / len(peers)  # amortized: a Ferret refill lands in some chunks
        best, med = min(times), float(np.median(times))
        rows.append(
            {
                "chunk": k,
                "one_stream": one_stream,
                "reps": len(times),
                "median_s": round(med, 4),
                "comparisons_per_s_median": round(k / med),
                "comparisons_per_s_best": round(k / best),
                "comparisons_per_s_worst": round(k / max(times)),
                "peer_MB_per_chunk": round(peer / 1e6, 2),
                "peer_bytes_per_comparison": round(peer / k, 1),
            }
        )
    return rows


def bench_single(oracle: RemoteOracle, count: int) -> dict[str, Any]:
    s = oracle.open_stream(1)
    far = 2 * oracle.n
    lat = []
    for i in range(count):
        t = time.perf_counter()
        assert s.ask([(Query(i % oracle.d), far)]) is None
        lat.append(time.perf_counter() - t)
    ms = np.array(lat) * 1e3
    return {
        "queries": count,
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def bench_floor(dep: LocalDeployment, count: int) -> dict[str, Any]:
    """What a single query cannot go below on this machine, measured beside it:
    a bare unary gRPC call to the leader (its health check: TLS, HTTP/2, both
    gRPC runtimes and the event loop, no handler work), as the analyst's Ask
    makes one; and one SQLite commit with an fsync (WAL, synchronous=FULL) in
    the deployment's folder, as each server's chunk mark makes one."""
    import sqlite3

    from svtagg.proto import health_pb2, health_pb2_grpc

    rtt = []
    with analyst_channel(dep.address("leader"), dep.certs) as ch:
        check = health_pb2_grpc.HealthStub(ch).Check
        for i in range(count + 20):
            t = time.perf_counter()
            check(health_pb2.HealthCheckRequest(), timeout=10)
            if i >= 20:  # the first calls warm the channel
                rtt.append(time.perf_counter() - t)
    path = dep.root / "floor.sqlite"
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)  # a fresh file every round
    db = sqlite3.connect(path, isolation_level=None)
    commits = []
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER)")
        for i in range(count):
            t = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (i % 4, i))
            db.execute("COMMIT")
            commits.append(time.perf_counter() - t)
    finally:
        db.close()
    return {
        "grpc_unary_p50_ms": round(1e3 * float(np.median(rtt)), 3),
        "fsync_commit_p50_ms": round(1e3 * float(np.median(commits)), 3),
    }


def bench_alg8(dep: LocalDeployment, n: int, d: int, batch: int) -> dict[str, Any]:
    from svtagg.analyst.selection import geometric_binary_search

    _task(dep, "alg8", d, n)
    gen = np.random.default_rng(3)
    # Per-user values in [0,1]: a few strong coordinates over uniform background.
    weights = gen.random(d) * 0.3
    weights[gen.choice(d, 5, replace=False)] = [0.9, 0.85, 0.8, 0.7, 0.6]
    upload_s = 0.0
    for start in range(0, n, 1000):  # 1000 users × d floats at a time bounds memory
        m = min(1000, n - start)
        block = (gen.random((m, d)) < weights).astype(np.float64)
        upload_s += _upload(dep, "alg8", block, batch)
    _close(dep, "alg8")
    with RemoteOracle.from_certs(dep.address("leader"), "alg8", dep.certs) as oracle:
        t = time.perf_counter()
        sel = geometric_binary_search(oracle, 1, 0.05)
        seconds = time.perf_counter() - t
        st = oracle.stats()
    return {
        "n": n,
        "d": d,
        "upload_seconds": round(upload_s, 1),
        "selection_seconds": round(seconds, 2),
        "selected": sel.query.index,
        "best": int(np.argmax(weights)),
        "streams": st.streams,
        "queries": st.queries,
        "peer_MB": round(st.peer_bytes / 1e6, 1),
    }


CONFIGS: dict[str, tuple[str, list[str]]] = {
    "numpy+grpc": ("numpy", ["--data-port", "off"]),
    "native+grpc": ("native", ["--data-port", "off"]),
    "native+data": ("native", []),
    "native+data+halfgates": ("native", ["--garbling", "halfgates"]),
    "native+data+threehalves": ("native", ["--garbling", "threehalves"]),
    "iknp": ("native", []),
    "softspoken:4": ("native", []),
    "ferret": ("native", []),
}
#: Run by default (the garbling schemes and the OT extensions on request, --configs).
DEFAULT_CONFIGS = ("numpy+grpc", "native+grpc", "native+data")
#: Configurations that set the servers' OT extension (`SVTAGG_OT`, inherited):
#: `--configs iknp,softspoken:4,ferret` compares them on the default transport.
CONFIG_OT = {"iknp": "iknp", "softspoken:4": "softspoken:4", "ferret": "ferret"}


def run_config(name: str, quick: bool, full: bool, skip_alg8: bool) -> dict[str, Any]:
    engine, args = CONFIGS[name]
    saved = os.environ.get("SVTAGG_BACKEND")
    saved_ot = os.environ.pop("SVTAGG_OT", None)
    os.environ["SVTAGG_BACKEND"] = engine  # the server processes inherit it
    if name in CONFIG_OT:
        os.environ["SVTAGG_OT"] = CONFIG_OT[name]
    out: dict[str, Any] = {"engine": engine, "server_args": args, "ot": CONFIG_OT.get(name)}
    try:
        with LocalDeployment(server_args=UNCAPPED_SERVER_ARGS + args) as dep:
            print(f"[{name}] leader {dep.address('leader')}, helper {dep.address('helper')}")
            comparison_task(dep)
            with RemoteOracle.from_certs(dep.address("leader"), "cmp", dep.certs) as oracle:
                oracle.open_stream(1).ask([(Query(0), 2 * oracle.n)])  # warm the session
                out["single_query"] = bench_single(oracle, 50 if quick else 300)
                print(f"[{name}] single query:", out["single_query"])
                out["floor"] = bench_floor(dep, 50 if quick else 300)
                print(f"[{name}] floor under a single query:", out["floor"])
                sizes = [1000, 10_000] + ([100_000] if full and not quick else [])
                out["chunks"] = bench_chunks(oracle, sizes, 2 if quick else 5)
                out["chunks_one_stream"] = bench_chunks(
                    oracle, [1000, 10_000], 2 if quick else 5, one_stream=True
                )
                for row in out["chunks"] + out["chunks_one_stream"]:
                    print(f"[{name}] chunk:", row)
            if full:
                out["upload"] = bench_upload(dep, 2_000 if quick else 50_000, 100, 1000)
                print(f"[{name}] upload:", out["upload"])
                if not skip_alg8:
                    out["alg8"] = bench_alg8(
                        dep, 10_000 if quick else 100_000, 1000 if quick else 10_000, 100
                    )
                    print(f"[{name}] alg8:", out["alg8"])
    finally:
        if saved is None:
            os.environ.pop("SVTAGG_BACKEND", None)
        else:
            os.environ["SVTAGG_BACKEND"] = saved
        os.environ.pop("SVTAGG_OT", None)
        if saved_ot is not None:
            os.environ["SVTAGG_OT"] = saved_ot
    return out


def _summary(results: dict[str, Any]) -> None:
    names = [n for n in CONFIGS if n in results["configs"]]
    base = results["configs"][names[0]]
    print("\nsummary (median, and min–max over the repetitions)")
    print(f"{'figure':<50}" + "".join(f"{n:>34}" for n in names) + "   target")

    def line(label: str, get: Any, target: str, ratio_of: str = "rate") -> None:
        cells = []
        for n in names:
            v = get(results["configs"][n])
            if v is None:
                cells.append(f"{'—':>34}")
                continue
            text, value = v
            ref = get(base)
            if ref is None:
                cells.append(f"{text:>34}")
                continue
            r = value / ref[1] if ratio_of == "rate" else ref[1] / value
            cells.append(f"{text + f' ({r:.2f}x)':>34}")
        print(f"{label:<50}" + "".join(cells) + f"   {target}")

    for key, label in (("chunks", "stream per chunk"), ("chunks_one_stream", "one open stream")):
        for k in (1000, 10_000, 100_000):

            def chunk(c: dict[str, Any], k: int = k, key: str = key) -> Any:
                row = next((r for r in c.get(key, []) if r["chunk"] == k), None)
                if row is None:
                    return None
                med = row["comparisons_per_s_median"]
                worst, best = row["comparisons_per_s_worst"], row["comparisons_per_s_best"]
                return f"{med:,} ({worst:,}–{best:,})", med

            if all(chunk(results["configs"][n]) is None for n in names):
                continue
            target = ">= 150,000" if k == 10_000 else ""
            line(f"comparisons/s, chunk {k:,}, {label}", chunk, target)

    for k in (1000, 10_000):

        def peer(c: dict[str, Any], k: int = k) -> Any:
            row = next((r for r in c.get("chunks", []) if r["chunk"] == k), None)
            if row is None:
                return None
            return f"{row['peer_bytes_per_comparison']:,}", row["peer_bytes_per_comparison"]

        line(f"peer bytes per comparison, chunk {k:,}", peer, "", ratio_of="time")

    def single(c: dict[str, Any]) -> Any:
        q = c["single_query"]
        return f"{q['p50_ms']} ms (p99 {q['p99_ms']})", q["p50_ms"]

    line("single-query round trip p50", single, "<= 3 ms", ratio_of="time")
    print("(x): against the first configuration, measured in this run")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    p.add_argument("--out", default="results/bench_system.json")
    p.add_argument("--skip-alg8", action="store_true")
    p.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"comma-separated, from {', '.join(CONFIGS)}; the last one gets the full run",
    )
    args = p.parse_args(argv)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown or not names:
        p.error(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    results: dict[str, Any] = {"machine": platform.platform(), "quick": args.quick, "configs": {}}
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for i, name in enumerate(names):
        results["configs"][name] = run_config(
            name, args.quick, full=i == len(names) - 1, skip_alg8=args.skip_alg8
        )
    _summary(results)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
