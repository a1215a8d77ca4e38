"""Upload throughput: one SQLite process per server against PostgreSQL with an
ingest replica beside each server's main process (two ingest processes per
server), the same clients in one run: two client processes, d = 100, batches
of 1,000.

    SVTAGG_TEST_POSTGRES=postgresql://... python -m svtagg.benchmarks.bench_replicas [--n 40000]

`scripts/start_postgres.sh DIR` starts a throwaway server and prints its URL.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from svtagg.client.upload import Uploader
from svtagg.deploy.jobs import analyst_stub, task_spec
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.proto.tls import Identity


def _client(certs: str, leader: str, helper: str, n: int, seed: int, out: mp.Queue) -> None:
    c = Identity.load(certs, "client")
    values = np.random.default_rng(seed).random((n, 100))
    with Uploader(leader, helper, c.ca, c.cert, c.key, timeout=120) as up:
        t = time.perf_counter()
        up.upload("bench", values, batch_size=1000)
        out.put((t, time.perf_counter()))


def _run_clients(certs: Path, pairs: list[tuple[str, str]], n: int) -> float:
    """Reports/s of all clients together (first start to last end)."""
    out: mp.Queue = mp.Queue()
    procs = [
        mp.Process(target=_client, args=(str(certs), ld, hp, n, i, out))
        for i, (ld, hp) in enumerate(pairs)
    ]
    for p in procs:
        p.start()
    spans = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    return len(procs) * n / (max(e for _, e in spans) - min(s for s, _ in spans))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40_000, help="reports per client")
    args = ap.parse_args(argv)
    url = os.environ.get("SVTAGG_TEST_POSTGRES")
    if not url:
        raise SystemExit("set SVTAGG_TEST_POSTGRES (scripts/start_postgres.sh DIR prints one)")
    spec = task_spec("bench", 100, 4 * args.n, "1000000")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        with LocalDeployment(Path(tmp) / "sqlite", server_args=UNCAPPED_SERVER_ARGS) as dep:
            analyst_stub(dep.address("leader"), dep.certs).CreateTask(spec, timeout=30)
            main_pair = (dep.address("leader"), dep.address("helper"))
            sqlite_rate = _run_clients(dep.certs, [main_pair, main_pair], args.n)
        tag = uuid.uuid4().hex[:10]
        schemas = {r: f"{r}_bench_{tag}" for r in ("leader", "helper")}
        dep = LocalDeployment(Path(tmp) / "pg", server_args=[*UNCAPPED_SERVER_ARGS, "--db", url])
        try:
            for role in ("helper", "leader"):
                dep.start_role(role, env={"PGOPTIONS": f"-csearch_path={schemas[role]}"})
            analyst_stub(dep.address("leader"), dep.certs).CreateTask(spec, timeout=30)
            replicas = [
                dep.start_replica(r, url, env={"PGOPTIONS": f"-csearch_path={schemas[r]}"})
                for r in ("leader", "helper")
            ]
            pairs = [(dep.address("leader"), dep.address("helper")), (replicas[0], replicas[1])]
            pg_rate = _run_clients(dep.certs, pairs, args.n)
        finally:
            dep.stop()  # the replicas with it
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                for schema in schemas.values():
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(f"2 clients x {args.n:,} reports, d = 100, batches of 1,000")
    print(f"SQLite, one process per server:           {sqlite_rate:9,.0f} reports/s")
    print(
        f"PostgreSQL, main + ingest replica / server: {pg_rate:9,.0f} reports/s "
        f"({pg_rate / sqlite_rate:.2f}x)   [target >= the SQLite figure]"
    )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
