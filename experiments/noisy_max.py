"""Report-noisy-max against the default scan selection on planted data: the
selection error of each (score units), its ratio to the exponential
mechanism's exact expected error and its ε-equivalence (`error_row`), the
comparisons each sends per candidate, and the budget noisy-max needs for the
scan's error.

Both run on `LocalOracle` with two servers' noise (each party's own full draw
per term: exactly the law the servers' answers follow, which
`tests/test_noisy_max_servers.py` checks for noisy-max), noisy-max also with
one party's noise (central).  Each run is a fresh planted dataset
(`planted_scores`: the best candidate at n/2, one candidate per score unit
below it) and a fresh oracle seed.

    python -m svtagg.experiments.noisy_max [--n 10000] [--d 1000] [--runs 300]
        [--epsilon 1] [--seed 0] [--out results]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.analyst.selection import noisy_max_selection, scan_selection
from svtagg.experiments.common import (
    Progress,
    em_expected_error,
    error_row,
    fmt,
    fmt_eq,
    local_oracle,
    oracle_seed,
    planted_scores,
    seeded_rng,
    write_result,
)

#: Multiples of ε at which noisy-max's mean error is measured, to find the
#: budget at which it matches the scan's (log-linear interpolation between them).
BUDGET_GRID = [1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1.0]


def _error(scores: np.ndarray, index: int) -> float:
    return float(scores.max() - scores[index])


def noisy_max_budget(curve: list[tuple[float, float]], target: float) -> float | None:
    """The ε at which the measured curve of (ε, mean error), error falling in ε,
    crosses `target` (None when it does not within the grid)."""
    for (e0, m0), (e1, m1) in zip(curve, curve[1:], strict=False):
        if m0 >= target >= m1 and m0 > m1:
            w = (math.log(m0) - math.log(target)) / (math.log(m0) - math.log(m1))
            return math.exp(math.log(e0) + w * (math.log(e1) - math.log(e0)))
    return None


def noisy_max_vs_scan(
    n: int = 10_000, d: int = 1000, runs: int = 300, epsilon: float = 1.0, seed: int = 0
) -> dict[str, Any]:
    """Every run's errors and comparisons, the rows of the table, and the budget
    at which noisy-max (two servers) reaches the scan's mean error."""
    datasets = [planted_scores(n, d, seeded_rng(seed, 23, r)) for r in range(runs)]
    em_mean = float(np.mean([em_expected_error(s, epsilon) for s in datasets]))
    errs: dict[str, list[float]] = {"scan": [], "nmax2": [], "nmax1": []}
    sent: list[float] = []
    curve_errs: dict[float, list[float]] = {c: [] for c in BUDGET_GRID}
    bar = Progress(runs, "noisy-max vs scan")
    for r, scores in enumerate(datasets):
        rng = seeded_rng(seed, 29, r)
        oracle = local_oracle(scores, n, oracle_seed(rng), parties=2)
        sel = scan_selection(oracle, epsilon, 0.05)
        errs["scan"].append(_error(scores, sel.index))
        sent.append(oracle.stats().queries / d)
        for key, parties in (("nmax2", 2), ("nmax1", 1)):
            o = local_oracle(scores, n, oracle_seed(rng), parties=parties)
            errs[key].append(_error(scores, noisy_max_selection(o, epsilon).index))
        o = local_oracle(scores, n, oracle_seed(rng), parties=2)
        for c in BUDGET_GRID:
            curve_errs[c].append(_error(scores, noisy_max_selection(o, epsilon * c).index))
        bar.tick()
    labels = {
        "scan": ("scan selection (default), two servers", float(np.mean(sent))),
        "nmax2": ("report-noisy-max, two servers", 1.0),
        "nmax1": ("report-noisy-max, one party (central)", 1.0),
    }
    rows = [
        error_row(
            {"method": key, "label": label, "comparisons_per_candidate": cmp},
            errs[key],
            em_mean,
            datasets,
            epsilon,
        )
        for key, (label, cmp) in labels.items()
    ]
    curve = [(epsilon * c, float(np.mean(curve_errs[c]))) for c in BUDGET_GRID]
    scan_mean = rows[0]["mean"]
    return {
        "config": {"n": n, "d": d, "runs": runs, "epsilon": epsilon, "seed": seed},
        "em_mean": em_mean,
        "rows": rows,
        "noisy_max_curve": curve,
        "noisy_max_budget_for_scan_error": noisy_max_budget(curve, scan_mean),
    }


def table(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"n = {cfg['n']:,}, d = {cfg['d']:,}, ε = {cfg['epsilon']:g}, {cfg['runs']} runs "
        f"(EM's exact mean error {result['em_mean']:.2f})",
        "",
        "| method | mean / median error | /EM | ε-eq. | comparisons per candidate |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        ratio = row["mean_ratio_to_em"]
        lines.append(
            f"| {row['label']} | {row['mean']:.2f} / {row['median']:.1f} | "
            f"{fmt(ratio) if ratio is not None else '—'} | {fmt_eq(row)} | "
            f"{row['comparisons_per_candidate']:.0f} |"
        )
    budget = result["noisy_max_budget_for_scan_error"]
    curve = ", ".join(f"{e:g}: {m:.2f}" for e, m in result["noisy_max_curve"])
    lines += [
        "",
        f"noisy-max (two servers) mean error by ε: {curve}",
        "noisy-max reaches the scan's mean error at ε ≈ "
        + (f"{budget:.3g}" if budget is not None else "— (outside the grid)"),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--d", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results")
    args = ap.parse_args()
    result = noisy_max_vs_scan(args.n, args.d, args.runs, args.epsilon, args.seed)
    result["table"] = table(result)
    path = write_result(Path(args.out), "noisy_max", result)
    print(result["table"])
    print(f"written: {path}")


if __name__ == "__main__":
    main()
