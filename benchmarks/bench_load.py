"""Bounded load test through two real server processes (issue 6): many concurrent
uploader *processes* against the leader and the helper, then many concurrent
analyst streams on different tasks.  Reports reports/s and streams/s held, p50
and p99 latency (per upload batch, per stream), the servers' peak RSS, and that
nothing was lost or wrong:

* every uploader regenerates its rows from its seed, so the plaintext is known;
  after the close both servers' n equals the acknowledged uploads and
  S_L + S_H (read from the stores: `benchmarks/storeview.py`, test-only, since no RPC
  reveals sums) equals the sum of the encoded rows, coordinate by coordinate;
* the stream phase uses a deterministic query design: coordinate 0 holds 1 for
  every user and coordinate 1 holds 0, and each stream asks
  [(q1, n/2), (q0, n/2)] at ε = 1 — the noise would have to exceed n/2 = 100s
  of units for any other answer than a YES at index 1, so every stream's
  answer is checked (wrong bits are counted, and must be 0).

    python -m svtagg.benchmarks.bench_load                    # 32 uploaders, 64 streams
    python -m svtagg.benchmarks.bench_load --uploaders 4 --streams 8   # smoke
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.benchmarks.storeview import encoded_sum, store_view
from svtagg.client.upload import Uploader, make_batch
from svtagg.deploy.jobs import analyst_stub
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.tls import Identity

F = 16


@dataclass
class LoadResult:
    uploaders: int
    reports_per_uploader: int
    batch: int
    d: int
    acked_reports: int = 0
    n_leader: int = 0
    n_helper: int = 0
    sums_match: bool = False
    upload_seconds: float = 0.0
    reports_per_s: float = 0.0
    batch_p50_ms: float = 0.0
    batch_p99_ms: float = 0.0
    upload_errors: int = 0
    streams: int = 0
    stream_workers: int = 0
    tasks: int = 0
    stream_seconds: float = 0.0
    streams_per_s: float = 0.0
    stream_p50_ms: float = 0.0
    stream_p99_ms: float = 0.0
    wrong_answers: int = 0
    stream_errors: int = 0
    peak_rss_mb: dict[str, float] = field(default_factory=dict)

    def lost(self) -> bool:
        return not (
            self.n_leader == self.n_helper == self.acked_reports
            and self.sums_match
            and self.upload_errors == 0
        )


def rows(seed: int, m: int, d: int) -> np.ndarray:
    return np.random.default_rng(1000 + seed).random((m, d))


def _uploader(args: tuple[str, str, str, str, int, int, int, int]) -> tuple[int, list[float], int]:
    """One uploader process: its rows in batches; returns (acked, batch latencies, errors)."""
    leader, helper, certs, task, seed, m, d, batch = args
    c = Identity.load(certs, "client")
    values = rows(seed, m, d)
    acked, lat, errors = 0, [], 0
    with Uploader(leader, helper, c.ca, c.cert, c.key, timeout=120, retries=8) as up:
        for start in range(0, m, batch):
            b = make_batch(task, values[start : start + batch], F)
            t0 = time.perf_counter()
            try:
                up.send(b)
                acked += len(b)
            except Exception:  # noqa: BLE001 - counted, and the run reports it
                errors += 1
            lat.append(time.perf_counter() - t0)
    return acked, lat, errors


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q)) if xs else float("nan")


def run_load(
    dep: LocalDeployment,
    uploaders: int = 32,
    reports: int = 500,
    batch: int = 50,
    d: int = 32,
    streams: int = 64,
    stream_workers: int = 16,
    tasks: int = 8,
) -> LoadResult:
    res = LoadResult(uploaders, reports, batch, d)
    stub = analyst_stub(dep.address("leader"), dep.certs)

    def create(task: str, dd: int, n_max: int) -> None:
        stub.CreateTask(
            pb.TaskSpec(
                task_id=task,
                d=dd,
                frac_bits=F,
                n_max=n_max,
                min_batch=1,
                epsilon_total="100000",
                delta_total="1/1000",
                epsilon_min="1/100",
            ),
            timeout=60,
        )

    # ---- phase 1: concurrent uploader processes on one task
    create("load", d, uploaders * reports)
    jobs = [
        (dep.address("leader"), dep.address("helper"), str(dep.certs), "load", i, reports, d, batch)
        for i in range(uploaders)
    ]
    with ProcessPoolExecutor(uploaders, mp_context=get_context("spawn")) as pool:
        # Warm the workers (interpreter start, imports) before the clock starts.
        list(pool.map(time.sleep, [0.0] * uploaders))
        t0 = time.perf_counter()
        out = list(pool.map(_uploader, jobs))
        res.upload_seconds = time.perf_counter() - t0
    lat = [x for _, ls, _ in out for x in ls]
    res.acked_reports = sum(a for a, _, _ in out)
    res.upload_errors = sum(e for _, _, e in out)
    res.reports_per_s = res.acked_reports / res.upload_seconds
    res.batch_p50_ms, res.batch_p99_ms = _pct(lat, 50), _pct(lat, 99)
    stub.CloseCollection(pb.TaskRef(task_id="load"), timeout=120)
    lead = store_view(dep.root / "leader.sqlite", "load")
    help_ = store_view(dep.root / "helper.sqlite", "load")
    res.n_leader, res.n_helper = lead.n, help_.n
    truth = encoded_sum(np.vstack([rows(i, reports, d) for i in range(uploaders)]), F)
    res.sums_match = bool(np.array_equal(lead.sums + help_.sums, truth))

    # ---- phase 2: concurrent analyst streams on different tasks
    n_users = 200
    res.streams, res.stream_workers, res.tasks = streams, stream_workers, tasks
    data = np.zeros((n_users, 2))
    data[:, 0] = 1.0
    c = Identity.load(dep.certs, "client")
    with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
        for t in range(tasks):
            create(f"s{t}", 2, n_users)
            up.upload(f"s{t}", data)
            stub.CloseCollection(pb.TaskRef(task_id=f"s{t}"), timeout=60)
    oracles = [
        RemoteOracle.from_certs(dep.address("leader"), f"s{t}", dep.certs) for t in range(tasks)
    ]

    def one(i: int) -> tuple[float, bool, bool]:
        o = oracles[i % tasks]
        t0 = time.perf_counter()
        try:
            j = o.open_stream(1).ask([(Query(1), n_users / 2), (Query(0), n_users / 2)])
        except Exception:  # noqa: BLE001 - counted
            return time.perf_counter() - t0, False, True
        return time.perf_counter() - t0, j != 1, False

    with ThreadPoolExecutor(stream_workers) as threads:
        t0 = time.perf_counter()
        answers = list(threads.map(one, range(streams)))
        res.stream_seconds = time.perf_counter() - t0
    for o in oracles:
        o.close()
    res.streams_per_s = streams / res.stream_seconds
    res.stream_p50_ms = _pct([a for a, _, _ in answers], 50)
    res.stream_p99_ms = _pct([a for a, _, _ in answers], 99)
    res.wrong_answers = sum(w for _, w, _ in answers)
    res.stream_errors = sum(e for _, _, e in answers)
    res.peak_rss_mb = {r: peak_rss_mb(dep.procs[r].pid) for r in ("leader", "helper")}
    return res


def summary(r: LoadResult) -> str:
    return (
        f"upload: {r.uploaders} processes x {r.reports_per_uploader} reports (d={r.d}, batches "
        f"of {r.batch}): {r.acked_reports} acked in {r.upload_seconds:.1f} s = "
        f"{r.reports_per_s:,.0f} reports/s, batch p50 {r.batch_p50_ms:.0f} ms, p99 "
        f"{r.batch_p99_ms:.0f} ms, errors {r.upload_errors}; n leader/helper "
        f"{r.n_leader}/{r.n_helper}, S_L+S_H == plaintext sum: {r.sums_match}\n"
        f"streams: {r.streams} on {r.tasks} tasks by {r.stream_workers} threads in "
        f"{r.stream_seconds:.1f} s = {r.streams_per_s:.1f} streams/s, p50 "
        f"{r.stream_p50_ms:.0f} ms, p99 {r.stream_p99_ms:.0f} ms, wrong answers "
        f"{r.wrong_answers}, errors {r.stream_errors}\n"
        f"peak RSS: leader {r.peak_rss_mb.get('leader', 0):.0f} MB, helper "
        f"{r.peak_rss_mb.get('helper', 0):.0f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uploaders", type=int, default=32)
    p.add_argument("--reports", type=int, default=500, help="reports per uploader")
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--stream-workers", type=int, default=16)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--out", help="write the figures as JSON")
    a = p.parse_args(argv)
    with LocalDeployment(server_args=UNCAPPED_SERVER_ARGS) as dep:
        r = run_load(
            dep, a.uploaders, a.reports, a.batch, a.d, a.streams, a.stream_workers, a.tasks
        )
    print(summary(r))
    if a.out:
        Path(a.out).write_text(json.dumps(asdict(r), indent=2))
    return 1 if r.lost() or r.wrong_answers or r.stream_errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
