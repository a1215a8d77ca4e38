"""Upload throughput: one SQLite process per server against PostgreSQL with an
ingest replica beside each server's main process (two ingest processes per
server), the same clients in one run: two client processes, d = 100, batches
of 1,000.  Both deployments stay up; each repetition uploads a fresh task into
each, SQLite and PostgreSQL alternately, and the table gives the medians.

    SVTAGG_TEST_POSTGRES=postgresql://... python -m svtagg.benchmarks.bench_replicas \
        [--n 40000] [--repeat 5]
    SVTAGG_TEST_POSTGRES=postgresql://... python -m svtagg.benchmarks.bench_replicas \
        --proofs onehot,sparse-onehot [--d 10000] [--n 1000] [--repeat 3]

`--proofs`: uploads with validity proofs on PostgreSQL, verified by one pair
of ingest processes (the two main processes) against two pairs (the main
processes, and a leader replica started with --helper paired with a helper
replica), side by side in one run: two client processes, one-hot rows (or
uniform rows for range), each (circuit, pairs) in turn per repetition.

`scripts/start_postgres.sh DIR` starts a throwaway server and prints its URL.
The CPU milliseconds per 1,000 reports are read from /proc for the server
processes and (PostgreSQL) the database's processes, when the database is on
this machine; they show where a run's cores went, and unlike the rates they
do not depend on how many processes share the cores with other load.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.benchmarks.pg import server_url
from svtagg.client.upload import Uploader
from svtagg.deploy.jobs import analyst_stub, task_spec
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.proto.tls import Identity

_TICK = os.sysconf("SC_CLK_TCK")


def _client(
    certs: str,
    leader: str,
    helper: str,
    task: str,
    n: int,
    seed: int,
    out: mp.Queue,
    d: int = 100,
    onehot: bool = False,
    batch: int = 1000,
) -> None:
    c = Identity.load(certs, "client")
    gen = np.random.default_rng(seed)
    if onehot:
        values = np.zeros((n, d))
        values[np.arange(n), gen.integers(0, d, n)] = 1.0
    else:
        values = gen.random((n, d))
    with Uploader(leader, helper, c.ca, c.cert, c.key, timeout=120) as up:
        t = time.perf_counter()
        cpu = time.process_time()
        up.upload(task, values, batch_size=batch)
        out.put((t, time.perf_counter(), time.process_time() - cpu))


def _run_clients(
    certs: Path,
    pairs: list[tuple[str, str]],
    task: str,
    n: int,
    d: int = 100,
    onehot: bool = False,
    batch: int = 1000,
) -> tuple[float, float]:
    """Reports/s of all clients together (first start to last end), and the
    clients' CPU seconds during their uploads."""
    # spawned, not forked: this process holds gRPC channels, which do not survive a fork
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(str(certs), ld, hp, task, n, i, out, d, onehot, batch))
        for i, (ld, hp) in enumerate(pairs)
    ]
    for p in procs:
        p.start()
    spans = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    rate = len(procs) * n / (max(e for _, e, _ in spans) - min(s for s, _, _ in spans))
    return rate, sum(c for _, _, c in spans)


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process on this machine (0 if it is gone or elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


class _CpuMeter:
    """CPU seconds per group of processes between `start` and `stop`: the
    deployment's server processes by role, and the database's processes."""

    def __init__(self, dep: LocalDeployment, conn: Any = None) -> None:
        self.dep = dep
        self.conn = conn
        self.before: dict[int, float] = {}
        self.groups: dict[int, str] = {}

    def _pids(self) -> dict[int, str]:
        pids = {p.pid: name.split("-")[0] for name, p in self.dep.procs.items()}
        if self.conn is not None:
            for (pid,) in self.conn.execute("SELECT pid FROM pg_stat_activity").fetchall():
                pids[int(pid)] = "postgres"
        return pids

    def start(self) -> None:
        self.groups = self._pids()
        self.before = {pid: _cpu_seconds(pid) for pid in self.groups}

    def stop(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, group in self.groups.items():
            used = _cpu_seconds(pid) - self.before[pid]
            out[group] = out.get(group, 0.0) + max(used, 0.0)
        return out


def _fmt(xs: list[float], unit: str = "") -> str:
    return f"{statistics.median(xs):9,.0f}{unit} ({min(xs):,.0f}-{max(xs):,.0f})"


def proofs(url: str, circuits: list[str], d: int, n: int, repeat: int) -> None:
    """Uploads with proofs through one pair of ingest processes against two
    (see the module's text), alternating, on one PostgreSQL deployment."""
    import psycopg

    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    tag = uuid.uuid4().hex[:10]
    schemas = {r: f"{r}_bench_{tag}" for r in ("leader", "helper")}
    env = {r: {"PGOPTIONS": f"-csearch_path={schemas[r]}"} for r in schemas}
    rates: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, psycopg.connect(url, autocommit=True) as conn:
        dep = LocalDeployment(Path(tmp) / "pg", server_args=[*UNCAPPED_SERVER_ARGS, "--db", url])
        try:
            for role in ("helper", "leader"):
                dep.start_role(role, env=env[role])
            helper_replica = dep.start_replica("helper", url, env=env["helper"])
            leader_replica = dep.start_replica(
                "leader", url, env=env["leader"], helper=helper_replica
            )
            main_pair = (dep.address("leader"), dep.address("helper"))
            layouts = {1: [main_pair, main_pair], 2: [main_pair, (leader_replica, helper_replica)]}
            for i in range(repeat):
                for circuit in circuits:
                    for pairs, addresses in layouts.items():
                        task = f"p{i}-{pairs}-{circuit}"
                        spec = task_spec(task, d, 4 * n, "1000000", validity=circuit)
                        analyst_stub(main_pair[0], dep.certs).CreateTask(spec, timeout=30)
                        batch = 400 if circuit == "onehot" and d >= 10_000 else 1000
                        onehot = circuit != "range"
                        rate, _ = _run_clients(dep.certs, addresses, task, n, d, onehot, batch)
                        rates.setdefault((circuit, pairs), []).append(rate)
                        print(f"  run {i + 1}: {circuit}, {pairs} pair(s): {rate:,.0f} reports/s")
        finally:
            dep.stop()
            for schema in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(f"2 clients x {n:,} reports, d = {d:,}; {repeat} runs each, alternated")
    print("median (min-max) reports/s:      one pair (main processes)   two pairs (+ replicas)")
    for circuit in circuits:
        one, two = rates[(circuit, 1)], rates[(circuit, 2)]
        ratio = statistics.median(two) / statistics.median(one)
        print(f"  {circuit:16s} {_fmt(one):>26s} {_fmt(two):>26s}   {ratio:.2f}x")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40_000, help="reports per client")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each store")
    ap.add_argument(
        "--proofs",
        default="",
        help="comma-separated validity circuits: one pair of ingest processes against "
        "two, with proofs verified by replicas (e.g. onehot,sparse-onehot)",
    )
    ap.add_argument("--d", type=int, default=10_000, help="--proofs: the tasks' d")
    args = ap.parse_args(argv)
    url = server_url()
    if args.proofs:
        proofs(url, args.proofs.split(","), args.d, args.n, args.repeat)
        return
    import psycopg

    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    tag = uuid.uuid4().hex[:10]
    schemas = {r: f"{r}_bench_{tag}" for r in ("leader", "helper")}
    sqlite_rates: list[float] = []
    pg_rates: list[float] = []
    cpu: dict[str, list[float]] = {}
    lite_cpu: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        psycopg.connect(url, autocommit=True) as conn,
        LocalDeployment(Path(tmp) / "sqlite", server_args=UNCAPPED_SERVER_ARGS) as lite,
    ):
        dep = LocalDeployment(Path(tmp) / "pg", server_args=[*UNCAPPED_SERVER_ARGS, "--db", url])
        try:
            for role in ("helper", "leader"):
                dep.start_role(role, env={"PGOPTIONS": f"-csearch_path={schemas[role]}"})
            replicas = [
                dep.start_replica(r, url, env={"PGOPTIONS": f"-csearch_path={schemas[r]}"})
                for r in ("leader", "helper")
            ]
            main_pg = (dep.address("leader"), dep.address("helper"))
            pg_pairs = [main_pg, (replicas[0], replicas[1])]
            main_lite = (lite.address("leader"), lite.address("helper"))
            meter = _CpuMeter(dep, conn)
            lite_meter = _CpuMeter(lite)
            for i in range(args.repeat):
                task = f"bench{i}"
                spec = task_spec(task, 100, 4 * args.n, "1000000")
                analyst_stub(main_lite[0], lite.certs).CreateTask(spec, timeout=30)
                analyst_stub(main_pg[0], dep.certs).CreateTask(spec, timeout=30)
                lite_meter.start()
                rate, client_cpu = _run_clients(lite.certs, [main_lite, main_lite], task, args.n)
                sqlite_rates.append(rate)
                used = {**lite_meter.stop(), "clients": client_cpu}
                for group, seconds in used.items():
                    lite_cpu.setdefault(group, []).append(1000 * seconds / (2 * args.n))
                meter.start()
                rate, client_cpu = _run_clients(dep.certs, pg_pairs, task, args.n)
                used = {**meter.stop(), "clients": client_cpu}
                pg_rates.append(rate)
                for group, seconds in used.items():
                    cpu.setdefault(group, []).append(1000 * seconds / (2 * args.n))
        finally:
            dep.stop()  # the replicas with it
            for schema in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    ratios = [p / s for p, s in zip(pg_rates, sqlite_rates, strict=True)]
    print(f"2 clients x {args.n:,} reports, d = 100, batches of 1,000; {args.repeat} runs each")
    print("median (min-max) reports/s:")
    print(f"SQLite, one process per server:              {_fmt(sqlite_rates)}")
    print(f"PostgreSQL, main + ingest replica / server:  {_fmt(pg_rates)}")
    print(
        f"ratio PostgreSQL / SQLite (per run pair):    {statistics.median(ratios):9.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f})   [target >= 1x]"
    )
    print("CPU ms per 1,000 reports, median:      SQLite  PostgreSQL")
    for group in sorted(cpu):
        lite_ms = f"{1000 * statistics.median(lite_cpu[group]):8.0f}" if group in lite_cpu else ""
        print(f"  {group:32s} {lite_ms:>8s} {1000 * statistics.median(cpu[group]):8.0f}")
    totals = [sum(1000 * statistics.median(c[g]) for g in c) for c in (lite_cpu, cpu)]
    print(f"  {'total':32s} {totals[0]:8.0f} {totals[1]:8.0f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
