"""End-to-end system benchmark through two real server processes (mutual TLS,
SQLite, garbled circuits): comparisons/s per chunk size, single-query round
trip, batched upload throughput, and Algorithm 8 selection at scale.

    python -m svtagg.benchmarks.bench_system            # full run, prints a table
    python -m svtagg.benchmarks.bench_system --quick    # smaller sizes, for a smoke test

Targets (issue 5): ≥ 25,000 comparisons/s at chunks of 10^4; single-query p50
≤ 10 ms; ≥ 10,000 reports/s at d = 100 with batches; Algorithm 8 at d = 10^4,
n = 10^5 in ≤ 30 s.  Results are also written as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.client.upload import Uploader
from svtagg.deploy.jobs import analyst_stub, task_spec
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


def bench_chunks(oracle: RemoteOracle, sizes: list[int], reps: int) -> list[dict[str, Any]]:
    """One NO-answering chunk per stream (threshold far above every score)."""
    rows = []
    rng = np.random.default_rng(2)
    far = 2 * oracle.n
    for k in sizes:
        chunk = [(Query(int(j)), far) for j in rng.integers(0, oracle.d, size=k)]
        times, peer = [], 0
        for _ in range(reps if k < 100_000 else max(1, reps // 3)):
            s = oracle.open_stream(1)
            before = oracle.stats().peer_bytes
            t = time.perf_counter()
            assert s.ask(chunk) is None
            times.append(time.perf_counter() - t)
            peer = oracle.stats().peer_bytes - before
        best, med = min(times), float(np.median(times))
        rows.append(
            {
                "chunk": k,
                "reps": len(times),
                "median_s": round(med, 4),
                "comparisons_per_s_median": round(k / med),
                "comparisons_per_s_best": round(k / best),
                "comparisons_per_s_worst": round(k / max(times)),
                "peer_MB_per_chunk": round(peer / 1e6, 2),
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    p.add_argument("--out", default="results/bench_system.json")
    p.add_argument("--skip-alg8", action="store_true")
    args = p.parse_args(argv)
    quick = args.quick
    results: dict[str, Any] = {"machine": platform.platform(), "quick": quick}
    with LocalDeployment(server_args=UNCAPPED_SERVER_ARGS) as dep:
        print(f"servers: leader {dep.address('leader')}, helper {dep.address('helper')}")
        results["upload"] = bench_upload(dep, 2_000 if quick else 50_000, 100, 1000)
        print("upload:", results["upload"])
        _task(dep, "cmp", 1000, 10_000)
        _upload(dep, "cmp", np.random.default_rng(4).random((1000, 1000)), 500)
        _close(dep, "cmp")
        with RemoteOracle.from_certs(dep.address("leader"), "cmp", dep.certs) as oracle:
            oracle.open_stream(1).ask([(Query(0), 2 * oracle.n)])  # warm the session
            results["single_query"] = bench_single(oracle, 50 if quick else 500)
            print("single query:", results["single_query"])
            sizes = [1000, 10_000] if quick else [1000, 10_000, 100_000]
            results["chunks"] = bench_chunks(oracle, sizes, 2 if quick else 5)
            for row in results["chunks"]:
                print("chunk:", row)
        if not args.skip_alg8:
            results["alg8"] = bench_alg8(
                dep, 10_000 if quick else 100_000, 1000 if quick else 10_000, 100
            )
            print("alg8:", results["alg8"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
