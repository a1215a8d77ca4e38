"""Heavy hitters over strings by the prefix crawl: accuracy over ε and the
verifiable-DPF path's cost, in one run.

    python -m svtagg.benchmarks.bench_crawl                 # n = 10^5, ε ∈ {1/4, 1/2, 1, 2}
    python -m svtagg.benchmarks.bench_crawl --quick         # n = 2·10^4, fewer runs

*Accuracy.*  Each of n users holds one English word of at most 8 bytes
(wordfreq's list, the `test` extra), drawn with Zipf(1.1) popularity over the
first `--vocab` such words' ranks; strings of 64 bits, a stride of 8 (one byte
per level, 8 levels, ε/8 each).  τ = max(⌈φ·n⌉, the plan's false-positive
floor), public.  Per ε: how many of the true top-10 the walk returned
(median, min–max over runs), how many strings it returned, the levels it ran.
The walk runs on `LocalCrawlOracle` (plaintext counts, both servers' noise):
the answers' law is the servers' (`dp.crawl`), the counts the DPF path's
(tests/test_crawl.py checks them equal level by level).

*The DPF path.*  The same walk at `--dpf-epsilon` on the first `--dpf-users`
users' reports, through two in-process servers (`DpfCrawlOracle`: keys,
every level's check, count shares): bytes per report to each server, client
time per report, server time per report over the walk and per node (the
native core where it is built, else the numpy reference), the check's bytes
between the servers (32 per report and binary level), and how many of the
true top-10 it returned.  By default (`--dpf-path servers`) the walk runs
through a leader and a helper process instead (`servers_cost`): upload rate,
walk time per level, the bytes between the servers (the levels' checks and
their garbled comparisons), the ε on the leader's ledger.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.analyst.crawl import (
    DpfCrawlOracle,
    LocalCrawlOracle,
    crawl,
    encode_string,
    false_positive_floor,
    make_reports,
)
from svtagg.dp.crawl import CrawlPlan
from svtagg.dp.noise import RandomSource
from svtagg.vdaf.crawl import PrefixDpf
from svtagg.vdaf.crawl import _native as crawl_native
from svtagg.vdaf.sparse import KEY_SIZE, NONCE_SIZE

BITS, STRIDE, TOP = 64, 8, 10


def vocabulary(size: int) -> list[str]:
    """The first `size` words of wordfreq's English list that fit 8 bytes."""
    try:
        import wordfreq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("bench_crawl needs wordfreq: pip install 'svtagg[test]'") from exc
    words = [w for w in wordfreq.top_n_list("en", 4 * size) if len(w.encode()) <= BITS // 8]
    if len(words) < size:
        raise SystemExit(f"wordfreq lists only {len(words)} words of at most 8 bytes")
    return words[:size]


def corpus(n: int, vocab: list[str], zipf: float, seed: int) -> list[str]:
    """n users' words, Zipf(`zipf`) over the vocabulary's ranks."""
    ranks = np.arange(1, len(vocab) + 1, dtype=np.float64)
    p = ranks**-zipf
    p /= p.sum()
    picks = np.random.default_rng(seed).choice(len(vocab), size=n, p=p)
    return [vocab[i] for i in picks]


def threshold(n: int, plan_eps: Fraction, phi: float, max_kept: int) -> int:
    levels = -(-BITS // STRIDE)
    floor = false_positive_floor(plan_eps / levels, max_kept << STRIDE)
    return max(math.ceil(phi * n), floor)


def accuracy(
    words: list[str], epsilons: list[Fraction], runs: int, phi: float, max_kept: int
) -> list[dict[str, Any]]:
    values = [encode_string(w, BITS) for w in words]
    truth = [w for w, _ in Counter(words).most_common(TOP)]
    tenth = Counter(words).most_common(TOP)[-1][1]
    rows = []
    for eps in epsilons:
        tau = threshold(len(words), eps, phi, max_kept)
        plan = CrawlPlan(BITS, STRIDE, eps, tau, max_kept)
        recall, sizes, levels, secs = [], [], [], []
        for _ in range(runs):
            oracle = LocalCrawlOracle(values, BITS, eps, rng=RandomSource())
            t = time.perf_counter()
            res = crawl(oracle, plan)
            secs.append(time.perf_counter() - t)
            found = set(res.strings())
            recall.append(sum(w in found for w in truth))
            sizes.append(len(found))
            levels.append(len(res.levels))
        rows.append(
            {
                "epsilon": str(eps),
                "tau": tau,
                "tenth_count": tenth,
                "top10_found": _spread(recall),
                "strings_returned": _spread(sizes),
                "levels_run": _spread(levels),
                "walk_seconds": round(statistics.median(secs), 2),
            }
        )
    return rows


def dpf_cost(words: list[str], epsilon: Fraction, phi: float, max_kept: int) -> dict[str, Any]:
    """The walk of the accuracy table's plan at `epsilon`, on two in-process
    servers holding the reports' keys (every level's check, count shares)."""
    values = [encode_string(w, BITS) for w in words]
    t = time.perf_counter()
    reports = make_reports(values, BITS)
    client = (time.perf_counter() - t) / len(values)
    oracle = DpfCrawlOracle(reports, BITS, epsilon)
    plan = CrawlPlan(BITS, STRIDE, epsilon, threshold(len(words), epsilon, phi, max_kept), max_kept)
    t = time.perf_counter()
    res = crawl(oracle, plan)
    walk = time.perf_counter() - t
    # nodes each server evaluates per report: a level of K kept prefixes
    # expands 2K, 4K, …, 2^s·K nodes (2^(s+1) − 2 per kept prefix)
    kept, nodes, depth = 1, 0, 0
    for r in res.levels:
        nodes += kept * ((2 << (r.prefix_bits - depth)) - 2)
        kept, depth = r.kept, r.prefix_bits
    public = PrefixDpf(BITS).public_share_bytes()
    truth = [w for w, _ in Counter(words).most_common(TOP)]
    found = set(res.strings())
    return {
        "users": len(words),
        "epsilon": str(epsilon),
        "tau": plan.threshold,
        "bytes_per_report_to_each_server": NONCE_SIZE + public + KEY_SIZE,
        "client_ms_per_report": round(1e3 * client, 3),
        "walk_seconds_both_servers": round(walk, 2),
        "server_us_per_report_per_walk": round(1e6 * walk / 2 / len(words), 1),
        "server_ns_per_node": round(1e9 * walk / 2 / len(words) / max(nodes, 1), 1),
        "check_bytes_between_servers": 32 * depth * len(words),
        "candidates_per_level": [r.candidates for r in res.levels],
        "top10_found": sum(w in found for w in truth),
        "strings_found": len(found),
        "refused": sum(oracle.refused_at.values()),
    }


def servers_cost(words: list[str], epsilon: Fraction, phi: float, max_kept: int) -> dict[str, Any]:
    """The same walk through a leader and a helper process (`svtagg server`
    as a user starts them, SQLite stores): the strings uploaded through the
    SDK (each report's first level checked at ingest), the collection closed,
    and the walk run by `TaskHandle.heavy_strings` — every level a crawl
    stream charged on both ledgers, checked on both servers and compared in
    the garbled circuit.  Upload rate, walk time and the bytes between the
    servers (the levels' checks and their comparisons)."""
    import svtagg
    from svtagg.deploy.launch import LocalDeployment

    plan_tau = threshold(len(words), epsilon, phi, max_kept)
    truth = [w for w, _ in Counter(words).most_common(TOP)]
    with LocalDeployment() as dep:
        with svtagg.connect(
            dep.address("leader"), certs=dep.certs, helper=dep.address("helper")
        ) as conn:
            task = conn.create_string_task(
                "bench", epsilon, bits=BITS, n_max=2 * len(words), min_batch=1
            )
            t = time.perf_counter()
            task.upload_strings(words, journal=False)
            upload = time.perf_counter() - t
            t = time.perf_counter()
            task.close_collection()
            close = time.perf_counter() - t
            levels: list[tuple[float, int, int]] = []
            t = time.perf_counter()

            def level_done(r: Any) -> None:
                levels.append((time.perf_counter() - t, r.candidates, r.kept))

            res = task.heavy_strings(
                epsilon, stride=STRIDE, threshold=plan_tau, max_kept=max_kept, progress=level_done
            )
            walk = time.perf_counter() - t
            stats = task.crawl_stats
            spent = task.budget().exact["epsilon_spent"]
    found = set(res.strings())
    assert stats is not None
    return {
        "users": len(words),
        "epsilon": str(epsilon),
        "tau": plan_tau,
        "upload_reports_per_second": round(len(words) / upload, 1),
        "close_seconds": round(close, 2),
        "walk_seconds": round(walk, 2),
        "level_seconds": [
            round(b - a, 2)
            for a, b in zip([0.0] + [x[0] for x in levels], [x[0] for x in levels], strict=False)
        ],
        "candidates_per_level": [x[1] for x in levels],
        "peer_bytes": stats.peer_bytes,
        # the levels' check values, both ways: 16 bytes per report and level
        "check_bytes": 2 * 16 * len(res.levels) * len(words),
        "refused": stats.refused,
        "epsilon_spent_leader_ledger": str(spent),
        "top10_found": sum(w in found for w in truth),
        "strings_found": len(found),
    }


def _spread(xs: list[int]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def table(rows: list[dict[str, Any]], n: int) -> str:
    out = [
        f"| ε (64-bit strings, n = {n:,}, 8 levels) | τ | true top-10 returned, median (min–max) "
        "| strings returned | levels run |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        f, s, lv = r["top10_found"], r["strings_returned"], r["levels_run"]
        out.append(
            f"| {r['epsilon']} | {r['tau']:,} | {f['median']:g} ({f['min']:g}–{f['max']:g}) "
            f"| {s['median']:g} ({s['min']:g}–{s['max']:g}) | {lv['median']:g} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="n = 2·10^4, 3 runs, 100 DPF users")
    p.add_argument("--n", type=int, default=100_000, help="users")
    p.add_argument("--epsilon", default="1/4,1/2,1,2", help="walk ε values (comma-separated)")
    p.add_argument("--runs", type=int, default=10, help="walks per ε")
    p.add_argument("--vocab", type=int, default=5000, help="distinct words")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent over word ranks")
    p.add_argument("--phi", type=float, default=0.005, help="τ is at least ⌈φ·n⌉")
    p.add_argument("--max-kept", type=int, default=64, help="prefixes a level may keep")
    p.add_argument(
        "--dpf-users", type=int, default=100_000, help="users through the DPF path (the first)"
    )
    p.add_argument("--dpf-epsilon", default="1", help="the DPF path's walk ε")
    p.add_argument(
        "--dpf-path",
        choices=["servers", "in-process", "both"],
        default="servers",
        help="the DPF path through a leader and a helper process (default), two "
        "in-process servers (no comparison, one process), or both",
    )
    p.add_argument("--seed", type=int, default=0, help="the corpus's seed (noise: CSPRNG)")
    p.add_argument("--out", default="results/bench_crawl.json")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.runs, args.dpf_users = 20_000, 3, 2000
    epsilons = [Fraction(x) for x in args.epsilon.split(",")]
    vocab = vocabulary(args.vocab)
    words = corpus(args.n, vocab, args.zipf, args.seed)
    t0 = time.perf_counter()
    rows = accuracy(words, epsilons, args.runs, args.phi, args.max_kept)
    dpf_words = words if args.dpf_users >= args.n else words[: args.dpf_users]
    eps = Fraction(args.dpf_epsilon)
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "accuracy": rows,
    }
    print(table(rows, args.n))
    engine = "native core" if crawl_native() else "numpy reference"
    paths = {
        "in-process": ("dpf_path", dpf_cost, f"(two in-process servers, {engine}, no comparison)"),
        "servers": (
            "servers_path",
            servers_cost,
            f"through a leader and a helper process ({engine})",
        ),
    }
    for name, (key, run, title) in paths.items():
        if args.dpf_path in (name, "both"):
            cost = run(dpf_words, eps, args.phi, args.max_kept)
            result[key] = cost
            print(f"\nDPF path {title}:")
            for k, v in cost.items():
                print(f"  {k}: {v}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["cpus"] = os.cpu_count()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
