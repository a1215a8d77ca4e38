"""Leased comparison work: the leader running its chunks in process against a
leader front end (`--lease-work`) with one or two leader workers (`--worker`),
all on PostgreSQL stores, side by side in one run:

    in-process   leader main process runs every chunk (no workers)
    1 worker     front end + one leader worker (paired with the helper's main process)
    2 workers    front end + two leader workers (the second paired with a helper worker)

For each: single-query round trip (k = 1), comparisons/s for chunks of 10^4 on
one stream and on two streams asked at once, and the close of a task of
proved one-hot reports at d = 10^4 (its field-to-ring chunks become parallel
jobs).

    SVTAGG_TEST_POSTGRES=postgresql://... python -m svtagg.benchmarks.bench_workers [--quick]

`scripts/start_postgres.sh DIR` starts a throwaway server and prints its URL.
On a 2-core machine every process shares the same two cores: the figures show
what the queue costs, not what more machines would add.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from typing import Any

import numpy as np

from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.benchmarks.bench_system import (
    bench_chunks,
    bench_proof_close,
    bench_single,
    comparison_task,
)
from svtagg.benchmarks.pg import server_url
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.dp.queries import Query

CONFIGS = {"in-process": 0, "1 worker": 1, "2 workers": 2}


def _two_streams(dep: LocalDeployment, k: int, reps: int) -> dict[str, Any]:
    """Two analysts at once, each asking `reps` NO-answering chunks of k on its
    own stream: comparisons/s of both together."""
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def analyst(seed: int) -> None:
        try:
            with RemoteOracle.from_certs(dep.address("leader"), "cmp", dep.certs) as o:
                rng = np.random.default_rng(seed)
                chunk = [(Query(int(j)), 2 * o.n) for j in rng.integers(0, o.d, size=k)]
                s = o.open_stream(1)
                t = time.perf_counter()
                for _ in range(reps):
                    assert s.ask(chunk) is None
                spans.append((t, time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=analyst, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    seconds = max(e for _, e in spans) - min(s for s, _ in spans)
    return {"chunk": k, "reps_each": reps, "comparisons_per_s": round(2 * k * reps / seconds)}


def run_config(name: str, workers: int, url: str, quick: bool) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:10]
    schemas = {r: f"{r}_bw_{tag}" for r in ("leader", "helper")}
    env = {r: {"PGOPTIONS": f"-csearch_path={schemas[r]}"} for r in schemas}
    dep = LocalDeployment(server_args=[*UNCAPPED_SERVER_ARGS, "--db", url])
    if workers:
        dep.role_args = {"leader": ["--lease-work"]}
    out: dict[str, Any] = {"workers": workers}
    try:
        dep.start_role("helper", env=env["helper"])
        dep.start_role("leader", env=env["leader"])
        helper_worker = dep.start_worker("helper", url, env=env["helper"]) if workers > 1 else None
        for i in range(workers):
            dep.start_worker("leader", url, helper=helper_worker if i else None, env=env["leader"])
        comparison_task(dep)
        with RemoteOracle.from_certs(dep.address("leader"), "cmp", dep.certs) as oracle:
            oracle.open_stream(1).ask([(Query(0), 2 * oracle.n)])  # warm the sessions
            out["single_query"] = bench_single(oracle, 30 if quick else 200)
            print(f"[{name}] single query:", out["single_query"], flush=True)
            out["chunks"] = bench_chunks(oracle, [10_000], 2 if quick else 7, one_stream=True)
            print(f"[{name}] chunk:", out["chunks"][0], flush=True)
        out["two_streams"] = _two_streams(dep, 10_000, 2 if quick else 6)
        print(f"[{name}] two streams:", out["two_streams"], flush=True)
        out["close"] = bench_proof_close(dep, 200 if quick else 1000, 10_000)
        print(f"[{name}] close:", out["close"], flush=True)
    finally:
        dep.stop()
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
    args = ap.parse_args(argv)
    url = server_url()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    results = {name: run_config(name, w, url, args.quick) for name, w in CONFIGS.items()}
    base = results["in-process"]
    print("\nconfiguration   k=1 p50 ms   10^4 chunk, 1 stream   10^4, 2 streams   close")
    for name, r in results.items():
        c, two, v = r["chunks"][0], r["two_streams"], r["close"]
        ratio = c["comparisons_per_s_median"] / base["chunks"][0]["comparisons_per_s_median"]
        print(
            f"{name:<14} {r['single_query']['p50_ms']:>10.2f}   "
            f"{c['comparisons_per_s_median']:>10,}/s ({ratio:.2f}x)   "
            f"{two['comparisons_per_s']:>10,}/s   {v['close_seconds']:>6.2f} s "
            f"({v['reports']:,} x d={v['d']})"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
