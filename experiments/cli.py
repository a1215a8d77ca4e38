"""`svtagg experiment figure1|words|queries|applications|frontier|all`: the command line
of the paper's experiments.

Each experiment writes `<name>.json` (configuration, every run, medians with
quartiles) and `<name>.png` into the output folder.  SVT algorithms run against
`LocalOracle` (exact samplers, central or two-server noise); baselines are
simulation baselines (`svtagg.analyst.baselines`).  The figures need matplotlib
and `words` needs `wordfreq`: `pip install 'svtagg[experiments]'`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from svtagg.experiments.applications import ApplicationsConfig
    from svtagg.experiments.figure1 import Figure1Config
    from svtagg.experiments.frontier import FrontierConfig
    from svtagg.experiments.words import WordsConfig

#: The command line's exit code for a missing local prerequisite (as `svtagg.deploy.cli`).
EXIT_ENVIRONMENT = 3

#: `svtagg experiment --help`'s description.
DESCRIPTION = """Experiments reproducing the paper's comparisons: Figure 1 (selection error vs d
and n, planted data), selection on real word frequencies (`words`, needs the
`wordfreq` package), query counts, the §7 applications, and the selection frontier (`frontier`:
error against bytes between the servers for the scan selection, noisy-max and
the baselines at the same data and ε).

Each writes `<name>.json` (configuration, every run, medians with quartiles) and
`<name>.png` into the output folder.  SVT algorithms run against `LocalOracle`
(exact samplers, central noise); baselines are simulation baselines (see
`baselines`).  Run with
`svtagg experiment figure1|words|queries|applications|frontier|all`.
"""


def quick_configs() -> tuple[Figure1Config, list[int], int, ApplicationsConfig]:
    """Tiny sizes for smoke tests (`--quick`); points repeat so α caches are shared."""
    from svtagg.experiments.applications import ApplicationsConfig
    from svtagg.experiments.figure1 import Figure1Config

    f1 = Figure1Config(ds=[10, 40], n_for_d=5000, ns=[2000, 5000, 20_000], d_for_n=10)
    ap = ApplicationsConfig(
        hh_ns=[5000],
        hh_d=40,
        hh_k=2,
        sm_ns=[5000],
        sm_d=10,
        sm_k=1,
        mwem_n=5000,
        mwem_attributes=3,
        mwem_ts=[2],
    )
    return f1, [10], 5000, ap


def words_config(args: argparse.Namespace) -> WordsConfig:
    """The words experiment's settings from the CLI flags (--n, --epsilon, --window,
    --parties; --quick: one small setting)."""
    from svtagg.experiments.words import WordsConfig

    cfg = WordsConfig()
    ns = [int(x) for x in args.n.split(",")] if getattr(args, "n", None) else None
    es = [float(x) for x in args.epsilon.split(",")] if getattr(args, "epsilon", None) else None
    if ns or es:
        ns = ns or [100_000]
        es = es or [1.0]
        if len(ns) != len(es) and 1 not in (len(ns), len(es)):
            raise ValueError("--n and --epsilon need the same number of values (or one)")
        k = max(len(ns), len(es))
        cfg.settings = list(zip(ns * (k // len(ns)), es * (k // len(es)), strict=True))
    elif getattr(args, "quick", False):
        cfg.settings = [(20_000, 1.0)]
    if getattr(args, "window", None):
        lo, _, hi = args.window.partition(":")
        cfg.window = (int(lo), int(hi))
    elif getattr(args, "quick", False):
        cfg.window = (101, 300)
    if getattr(args, "parties", None):
        names = [x.strip() for x in args.parties.split(",")]
        if not set(names) <= {"1", "2", "joint"}:
            raise ValueError("--parties takes 1, 2 and joint, comma-separated (e.g. 1,2,joint)")
        cfg.parties = tuple(x if x == "joint" else int(x) for x in names)
    for n, e in cfg.settings:
        if n < 1 or e <= 0:
            raise ValueError(f"need n >= 1 and ε > 0, got n={n}, ε={e}")
    return cfg


def frontier_config(args: argparse.Namespace) -> FrontierConfig:
    """The frontier's settings from the CLI flags (--n, --d, --epsilon: one value
    each; --reps: runs, default 100; --quick: n = 2000, d = 100, 4 runs)."""
    from svtagg.experiments.frontier import FrontierConfig

    cfg = FrontierConfig(seed=args.seed)
    if getattr(args, "quick", False):
        cfg.n, cfg.d, cfg.runs = 2000, 100, 4
    if getattr(args, "reps", None) is not None:
        cfg.runs = args.reps
    for flag in ("n", "d", "epsilon"):
        text = getattr(args, flag, None)
        if text:
            if "," in text:
                raise ValueError(f"frontier takes one --{flag} value, got {text}")
            setattr(cfg, flag, float(text) if flag == "epsilon" else int(text))
    if cfg.n < 1 or cfg.d < 2 or cfg.epsilon <= 0 or cfg.runs < 1:
        raise ValueError(f"need n >= 1, d >= 2, ε > 0 and runs >= 1, got {cfg}")
    return cfg


def run(args: argparse.Namespace) -> int:
    """The `svtagg experiment` handler: runs the chosen experiments, prints their
    tables, writes their JSON and PNG files.  Exit 3 without matplotlib."""
    from svtagg.experiments.applications import ApplicationsConfig, applications
    from svtagg.experiments.common import MATPLOTLIB_MISSING, have_matplotlib
    from svtagg.experiments.figure1 import Figure1Config, figure1
    from svtagg.experiments.queries import queries
    from svtagg.experiments.words import words

    if not have_matplotlib():
        print(f"svtagg: experiment: {MATPLOTLIB_MISSING}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    out = Path(args.out)
    reps = args.reps if args.reps is not None else 5
    f1, q_ds, q_n, ap = (
        quick_configs() if args.quick else (Figure1Config(), None, 100_000, ApplicationsConfig())
    )
    everything = ["figure1", "words", "queries", "applications", "frontier"]
    which = everything if args.which == "all" else [args.which]
    for w in which:
        if w == "frontier":
            from svtagg.experiments.frontier import frontier

            try:
                fcfg = frontier_config(args)
            except ValueError as exc:
                print(f"frontier: {exc}", file=sys.stderr)
                return 2
            print(frontier(out, fcfg)["table"])
        elif w == "words":
            try:
                cfg = words_config(args)
                res = words(out, reps, args.seed, cfg)
            except (RuntimeError, ValueError) as exc:
                print(f"words: {exc}", file=sys.stderr)
                if args.which == "words":
                    return 2
                continue
            print(res["table"])
        elif w == "figure1":
            res = figure1(out, reps, args.seed, f1)
            print(res["table"])
            print(res["matching"])
        elif w == "queries":
            res = queries(out, reps, args.seed, q_ds, q_n)
            for a, rows in res["rows"].items():
                print(
                    f"{a:>11}: "
                    + ", ".join(
                        f"d={r['d']}: {r['median']:.0f} (sent {r['sent']['median']:.0f})"
                        for r in rows
                    )
                )
            for b in res["bounds"]:
                print(
                    f"{'bounds':>11}: d={b['d']}: d·log n={b['d_log_n']:.0f}, "
                    f"d·log*n+log³n={b['d_logstar_n_plus_log3_n']:.0f}"
                )
        else:
            res = applications(out, reps, args.seed, ap)
            for key in ("top_k", "sparse_mean", "mwem"):
                for m, rows in res[key].items():
                    x = "T" if key == "mwem" else "n"
                    xs = ", ".join(f"{x}={r[x]}: {r['median']:.3g}" for r in rows)
                    print(f"{key:>11} {m:>9}: {xs}")
            print(f"{'mwem':>11} {'uniform':>9}: {res['mwem_uniform_error_over_n']:.3g}")
        print(f"wrote {out / (w + '.json')} and {out / (w + '.png')}")
    return 0


def register(subparsers: Any) -> None:
    """Add `svtagg experiment figure1|queries|applications|all` to the CLI."""
    p = subparsers.add_parser(
        "experiment",
        help="reproduce the paper's comparisons on planted and word-frequency data (JSON + PNG)",
        description=DESCRIPTION,
    )
    p.add_argument(
        "which", choices=["figure1", "words", "queries", "applications", "frontier", "all"]
    )
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument(
        "--reps", type=int, help="repetitions per point (default: 5; frontier: runs, 100)"
    )
    p.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    p.add_argument(
        "--n",
        help="words: number of users, comma-separated (default: 100000,1000000); "
        "frontier: one value (default: 10000)",
    )
    p.add_argument(
        "--epsilon",
        help="words: ε per setting, comma-separated (default: 1,0.25); "
        "frontier: one value (default: 1)",
    )
    p.add_argument("--d", help="frontier: candidates (default: 1000)")
    p.add_argument("--window", help="words: candidate word ranks lo:hi (default: 101:1100)")
    p.add_argument(
        "--parties",
        help="words: noise models, comma-separated: 1 (one party), 2 (two servers' "
        "independent noise), joint (a joint-noise task) (default: 1,2)",
    )
    p.set_defaults(handler=run)
