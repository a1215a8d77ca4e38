"""Query counts: answered SVT queries against d for Algorithms 6, 8, 9 and the
variants, next to d·log n, d·log* n + log³ n and each plan's own bound."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import (
    binary_search,
    geometric_binary_search,
    plan_for,
    plan_practical,
    plan_scan,
    practical_selection,
    sampling_and_filtering,
    scan_selection,
)
from svtagg.experiments.common import (
    Progress,
    band,
    local_oracle,
    oracle_seed,
    planted_scores,
    pyplot,
    seeded_rng,
    summarize,
    write_result,
)
from svtagg.experiments.figure1 import FIG1_METHODS


def log_star(x: float) -> int:
    """Iterated logarithm (base 2)."""
    k = 0
    while x > 1:
        x = math.log2(x)
        k += 1
    return k


QUERY_LABELS = {
    "alg6": "SVT: Alg 6 (binary search)",
    "alg8": FIG1_METHODS["alg8"][0],
    "alg9": FIG1_METHODS["alg9"][0],
    "alg9_tuned": FIG1_METHODS["alg9_tuned"][0],
    "practical": FIG1_METHODS["practical"][0],
    "scan": FIG1_METHODS["scan"][0],
}


def queries(
    out: Path,
    reps: int = 5,
    seed: int = 0,
    ds: list[int] | None = None,
    n: int = 100_000,
    epsilon: float = 1.0,
) -> dict[str, Any]:
    """Answered SVT queries vs d for Algorithms 6, 8, 9 against d·log n and
    d·log* n + log³ n (logs base 2)."""
    ds = ds or [10, 100, 1000, 10000]
    algs: dict[str, Callable[[LocalOracle, int, np.random.Generator], Any]] = {
        "alg6": lambda o, d, g: binary_search(o, epsilon, 0.1),
        "alg8": lambda o, d, g: geometric_binary_search(o, epsilon, 0.1),
        "alg9": lambda o, d, g: sampling_and_filtering(o, epsilon, 1 / (2 * d), rng=g),
        "alg9_tuned": lambda o, d, g: sampling_and_filtering(
            o, epsilon, 1 / (2 * d), variant="tuned", rng=g
        ),
        # later, so that the others keep the generators they had before these were added
        "practical": lambda o, d, g: practical_selection(o, epsilon, 0.1),
        "scan": lambda o, d, g: scan_selection(o, epsilon, 0.1),
    }
    bar = Progress(reps * len(ds), "queries")
    rows: dict[str, list[dict[str, Any]]] = {a: [] for a in algs}
    bounds = []
    for i, d in enumerate(ds):
        counts: dict[str, list[float]] = {a: [] for a in algs}
        streams: dict[str, list[float]] = {a: [] for a in algs}
        sent: dict[str, list[float]] = {a: [] for a in algs}
        for r in range(reps):
            scores = planted_scores(n, d, seeded_rng(seed, 3, i, r))
            for k, (a, fn) in enumerate(algs.items()):
                g = seeded_rng(seed, 3, i, r, k + 1)
                res = fn(local_oracle(scores, n, oracle_seed(g)), d, g)
                counts[a].append(res.spend.queries)
                streams[a].append(res.spend.streams)
                sent[a].append(res.spend.queries_sent)
            bar.tick(f"d={d}")
        for a in algs:
            rows[a].append(
                {
                    "d": d,
                    "queries": counts[a],
                    "streams": summarize(streams[a]),
                    "sent": summarize(sent[a]),
                    **summarize(counts[a]),
                }
            )
        probe = local_oracle(np.zeros(d, dtype=np.int64), n, 0)
        plan = plan_for(probe, epsilon, 1 / (2 * d))
        bounds.append(
            {
                "d": d,
                "d_log_n": d * math.log2(n),
                "d_logstar_n_plus_log3_n": d * log_star(n) + math.log2(n) ** 3,
                "alg8_bound_d_T": d * max(1, math.ceil(math.log2(n))),
                "alg6_bound_d_R": d * (math.ceil(math.log2(2 * n)) + 1),
                "alg9_plan_max": plan.max_queries(),
                "practical_plan_max": plan_practical(probe, epsilon, 0.1, d, n).max_queries(),
                "scan_plan_max": plan_scan(probe, epsilon, 0.1, d, n).max_queries(),
            }
        )
    result = {
        "experiment": "queries",
        "config": {"n": n, "ds": ds, "epsilon": epsilon, "reps": reps, "seed": seed},
        "count": "answered queries (each chunk answers up to and including its first YES); "
        "'sent' counts every (query, τ) pair sent, what the servers' circuit evaluates",
        "rows": rows,
        "bounds": bounds,
    }
    write_result(out, "queries", result)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for a, rs in rows.items():
        band(ax, ds, rs, QUERY_LABELS.get(a, a))
    ax.plot(ds, [b["d_log_n"] for b in bounds], "k--", label="d·log n")
    ax.plot(ds, [b["d_logstar_n_plus_log3_n"] for b in bounds], "k:", label="d·log* n + log³ n")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("d")
    ax.set_ylabel("SVT queries answered")
    ax.set_title(f"queries vs d (n = {n}, ε = {epsilon}); medians, IQR bands")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "queries.png", dpi=110)
    plt.close(fig)
    return result
