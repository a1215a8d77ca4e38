"""The per-chunk path, side by side: this checkout against another one (for
example main before a change), alternated in rounds, in one run.

For each checkout, a leader and a helper process of that checkout's code (the
same `svtagg server` flags a user runs, SQLite stores, mutual TLS), the task
"cmp" of `bench_system` (1,000 reports, d = 1,000, closed), and the analyst
of this checkout.  Per round and side:

- single queries: `--single` one-query Ask chunks on one open stream, each
  answered NO; p50 / p99 latency as the analyst sees it, and the CPU time each
  process spent per chunk (leader, helper: from /proc, all threads; analyst:
  this process);
- chunks of 10^3 / 10^4 / 10^5 queries on one open stream: comparisons/s.

Each figure is printed as the median of the rounds' own figures with their
min–max, and the ratio this/other per round (median, min–max).  Then the
store statements and transactions per one-query chunk per server, counted
in-process through the one-process reference (`servers.reference`) with the
SQLite connection's statements counted — the same drivers and stores as the
server processes run.

    git worktree add /tmp/base/svtagg <ref>          # the other checkout, in a folder `svtagg`
    cp mpc/*.so /tmp/base/svtagg/mpc/; cp vdaf/*.so /tmp/base/svtagg/vdaf/   # or build it
    python -m svtagg.benchmarks.bench_chunk --other /tmp/base [--rounds 3] [--quick]

`--other` is the folder that contains the other checkout's `svtagg` folder
(it goes first on the server processes' PYTHONPATH).  Without it, this
checkout runs alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.benchmarks.bench_system import comparison_task
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.dp.queries import Query

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def one_side(other: Path | None, single: int, sizes: list[int], reps: int) -> dict[str, Any]:
    """One deployment of one checkout's servers: its figures."""
    env = {"PYTHONPATH": f"{other}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"} if other else {}
    dep = LocalDeployment(server_args=list(UNCAPPED_SERVER_ARGS))
    try:
        dep.start_role("helper", env=env)
        dep.start_role("leader", env=env)
        comparison_task(dep)
        oracle = RemoteOracle.from_certs(dep.address("leader"), "cmp", dep.certs)
        far = 2 * oracle.n
        stream = oracle.open_stream(1)
        for i in range(50):  # warm-up: sessions, caches
            assert stream.ask([(Query(i % oracle.d), far)]) is None
        pids = {r: dep.procs[r].pid for r in ("leader", "helper")}
        before = {r: cpu_seconds(p) for r, p in pids.items()}
        mine = time.process_time()
        lat = []
        for i in range(single):
            t = time.perf_counter()
            assert stream.ask([(Query(i % oracle.d), far)]) is None
            lat.append(time.perf_counter() - t)
        out: dict[str, Any] = {
            "single_p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "single_p99_ms": 1e3 * float(np.percentile(lat, 99)),
            "analyst_cpu_ms": 1e3 * (time.process_time() - mine) / single,
        }
        for r, p in pids.items():
            out[f"{r}_cpu_ms"] = 1e3 * (cpu_seconds(p) - before[r]) / single
        rng = np.random.default_rng(2)
        for k in sizes:
            chunk = [(Query(int(j)), far) for j in rng.integers(0, oracle.d, size=k)]
            times = []
            for _ in range(reps if k < 100_000 else max(1, reps // 3)):
                t = time.perf_counter()
                assert stream.ask(chunk) is None
                times.append(time.perf_counter() - t)
            out[f"cmp_per_s_{k}"] = k / float(np.median(times))
        oracle.close()
        return out
    finally:
        dep.stop()


def statements_per_chunk(chunks: int = 300) -> dict[str, dict[str, float]]:
    """Store statements and transactions per one-query chunk, per server,
    through the one-process reference pair (this checkout)."""
    from svtagg.dp.task import TaskSpec
    from svtagg.servers.exchange.values import Ask, Queries
    from svtagg.servers.reference import reference_pair

    class Counted:
        """The SQLite connection, its statements counted."""

        def __init__(self, db: Any) -> None:
            self.db, self.statements, self.transactions = db, 0, 0

        def execute(self, statement: str, *args: Any) -> Any:
            self.statements += 1
            verb = statement.split(None, 1)[0].upper()
            # a BEGIN, or a write outside one (a transaction of its own)
            self.transactions += verb == "BEGIN" or (
                verb in ("INSERT", "UPDATE", "DELETE") and not self.db.in_transaction
            )
            return self.db.execute(statement, *args)

        def executemany(self, statement: str, *args: Any) -> Any:
            self.statements += 1
            return self.db.executemany(statement, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

    async def run(root: Path) -> dict[str, dict[str, float]]:
        async with reference_pair(root) as pair:
            spec = TaskSpec("t", 10, 16, 1000, 1, "1000", "0", "1/4")
            await pair.leader.create_task(spec)
            pair.upload("t", np.random.default_rng(1).random((100, 10)))
            await pair.leader.close_collection("t")
            sid = await pair.open("t")
            far = 200 << 16

            async def ask() -> None:
                await pair.leader.ask(Ask(sid, Queries(np.zeros(1, np.int64)), np.array([far])))
                await pair.helper.settled()

            for _ in range(20):
                await ask()
            stores = {"leader": pair.leader.core.store, "helper": pair.helper.core.store}
            counted = {}
            for role, store in stores.items():
                counted[role] = store._db = Counted(store._db)  # type: ignore[attr-defined]
            for _ in range(chunks):
                await ask()
            return {
                role: {
                    "statements": c.statements / chunks,
                    "transactions": c.transactions / chunks,
                }
                for role, c in counted.items()
            }

    with tempfile.TemporaryDirectory() as root:
        return asyncio.run(run(Path(root)))


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", type=Path, help="folder holding the other checkout's svtagg/")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--single", type=int, default=600, help="one-query chunks per round")
    p.add_argument("--quick", action="store_true", help="chunks of 10^3 and 10^4 only")
    p.add_argument("--out", default="results/bench_chunk.json")
    args = p.parse_args(argv)
    if args.other is not None and not (args.other / "svtagg" / "__init__.py").exists():
        p.error(f"--other {args.other}: no svtagg/ checkout there")
    sizes = [1000, 10_000] if args.quick else [1000, 10_000, 100_000]
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    sides = {"this": None, "other": args.other} if args.other else {"this": None}
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for name, where in sides.items():
            rows[name].append(one_side(where, args.single, sizes, 5))
            print(f"round {r + 1} {name}: {json.dumps(rows[name][-1], default=round)}")
    keys = list(rows["this"][0])
    f2: Callable[[float], str] = lambda v: f"{v:,.2f}"  # noqa: E731
    f0: Callable[[float], str] = lambda v: f"{v:,.0f}"  # noqa: E731
    fr: Callable[[float], str] = lambda v: f"{v:.2f}×"  # noqa: E731
    print()
    print(f"| figure | this | {'other | this/other |' if args.other else ''}")
    print(f"|---|---|{'---|---|' if args.other else ''}")
    for k in keys:
        fmt = f0 if k.startswith("cmp") else f2
        this = [row[k] for row in rows["this"]]
        line = f"| {k} | {spread(this, fmt)} |"
        if args.other:
            other = [row[k] for row in rows["other"]]
            ratios = [a / b for a, b in zip(this, other, strict=True)]
            line += f" {spread(other, fmt)} | {spread(ratios, fr)} |"
        print(line)
    counts = statements_per_chunk()
    print()
    for role, c in counts.items():
        print(
            f"{role}: {c['statements']:.1f} store statements, "
            f"{c['transactions']:.1f} transactions per one-query chunk (this checkout)"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rounds": rows, "statements": counts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
