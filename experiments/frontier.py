"""The selection frontier: for the same planted data and ε, the error of every
selection method next to what it costs between the two servers.

Methods: the scan selection at its cheap, default and accurate localisation
shares and report-noisy-max (both with two servers' independent noise on
`LocalOracle`, the law the servers' answers follow); the default scan on a
joint-noise task (`LocalOracle(noise="joint")`: one draw per term of the
garbled sampler's exact law, `dp.joint.sample`, as the servers' joint answers
follow) and, for reference, with one party's noise (central DP, what joint
noise is meant to reach); the Gaussian aggregation baseline
((ε, 1/n²), all d sums), Laplace on all d sums (pure ε, ℓ1 sensitivity d) and
the central exponential mechanism (simulation baselines, `analyst.baselines`).

Error columns: mean and median of max_j s_j − s_chosen over the runs (EM's mean
is its exact expectation on the same datasets), and the ε-equivalence ε/ε_EM,
ε_EM the budget at which EM's mean error equals the method's (`error_row`).

Cost columns are computed from constants the garbled-circuit engine measures
when the experiment starts (`engine_costs`: a first-YES chunk and a noisy-max
tournament on a small instance over an in-memory channel, at the comparison
width the servers derive for this n and ε): comparisons sent per candidate
(scan: measured on each run), AND gates and bytes between the servers per
candidate, and the engine's seconds for all d candidates.  The joint-noise
row adds the sampler's cost (one ν drawn in the garbled circuit per
comparison, measured on the same engine at the lap24 scale of ε): its online
comparisons are the independent ones'; the noise generation is the extra work.
The baselines that do not run through the servers (and the one-party
reference) have no cost columns.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.analyst import baselines
from svtagg.analyst.selection import ScanOptions, noisy_max_selection, scan_selection
from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind, stream_width
from svtagg.experiments.common import (
    FRAC_BITS,
    Progress,
    em_equivalent_epsilon,
    em_expected_error,
    error_row,
    fmt_eq,
    fmt_eq_range,
    local_oracle,
    oracle_seed,
    planted_scores,
    pyplot,
    seeded_rng,
    write_result,
)
from svtagg.experiments.words import ACCURATE_SHARES, CHEAP_SHARES

#: The scan selection's localisation shares: (key, label, options).  The default
#: is `plan_scan`'s (ε/8 search + ε/16 middle stage).
SCAN_SETTINGS: list[tuple[str, str, ScanOptions | None]] = [
    ("scan_cheap", "scan, cheap end (ε/2 search, no middle)", CHEAP_SHARES),
    ("scan", "scan, default (ε/8 + ε/16)", None),
    ("scan_accurate", "scan, accurate end (ε/16 + ε/32)", ACCURATE_SHARES),
]

#: The default scan with other noise: (key, label, LocalOracle noise, parties).
NOISE_SETTINGS: list[tuple[str, str, str, int]] = [
    ("scan_joint", "scan, default, joint noise (one draw, garbled sampler)", "joint", 2),
    ("scan_central", "scan, default, one party's noise (central reference)", "independent", 1),
]

#: (key, label) of the other methods, in table order.
OTHER_METHODS: list[tuple[str, str]] = [
    ("noisy_max", "report-noisy-max (one tournament)"),
    ("gaussian", "Gaussian aggregation, (ε, 1/n²)"),
    ("laplace", "Laplace on all d sums"),
    ("em", "exponential mechanism (central)"),
]

#: Candidates in the engine's measuring instance (its per-candidate figures move
#: by < 0.1% between 10³ and 10⁴: benchmarks/bench_noisy_max.py).
ENGINE_INSTANCE = 512
#: Timed runs of each circuit on that instance (the fastest is kept).
REPEATS = 3


@dataclass
class FrontierConfig:
    """n users, d candidates, ε, runs (a fresh planted dataset and oracle seeds
    each), base seed, β of the SVT methods."""

    n: int = 10_000
    d: int = 1000
    epsilon: float = 1.0
    runs: int = 100
    seed: int = 0
    beta: float = 0.05


@dataclass(frozen=True)
class EngineCosts:
    """Per first-YES query and per tournament candidate, measured on the engine."""

    width: int
    instance: int
    and_per_query: float
    bytes_per_query: float
    seconds_per_query: float
    and_per_candidate: float
    bytes_per_candidate: float
    seconds_per_candidate: float
    #: One joint ν sample (lap24 at ε), drawn in the garbled sampler.
    and_per_sample: float = 0.0
    bytes_per_sample: float = 0.0
    seconds_per_sample: float = 0.0


def comparison_width(n_max: int, kind: StreamKind, epsilon: Fraction) -> int:
    """The comparison width the servers derive for a stream (docs/mpc.md,
    "Width"): `dp.kinds.stream_width` at the experiments' F."""
    return stream_width(n_max, FRAC_BITS, kind, epsilon)


async def _measure(k: int, width: int, epsilon: Fraction) -> dict[str, dict[str, float]]:
    from svtagg.mpc.jointnoise import SamplerShape, evaluate_joint_noise, garble_joint_noise
    from svtagg.mpc.protocol import connected_pair

    rng = np.random.default_rng(k)
    a = rng.integers(0, 2**64, k, dtype=np.uint64)
    small = rng.integers(-(1 << 20), 1 << 20, k).astype(np.int64)
    g, e = await connected_pair()
    out: dict[str, dict[str, float]] = {}
    # first_yes: every sum negative, so no YES and the whole chunk is compared.
    sums = {"noisy_max": small, "first_yes": -(1 << 30) - np.abs(small)}
    for name, s in sums.items():
        b = s.view(np.uint64) - a
        seconds = []
        for _ in range(REPEATS):  # the fastest of a few: the first pays for warm-up
            start = time.perf_counter()
            await asyncio.gather(getattr(g, name)(a, width), getattr(e, name)(b, width))
            seconds.append(time.perf_counter() - start)
        st = g.last_stats
        out[name] = {
            "and": st.and_gates / k,
            "bytes": (st.bytes_sent + st.bytes_received) / k,
            "seconds": min(seconds) / k,
        }
    noise = joint_stream_noise(StreamKind.LAP24, epsilon, FRAC_BITS)
    shape = SamplerShape(noise.query_constants, noise.query_widths, noise.shift)
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        await asyncio.gather(garble_joint_noise(g, k, shape), evaluate_joint_noise(e, k, shape))
        seconds.append(time.perf_counter() - start)
    st = g.last_stats
    out["sample"] = {
        "and": st.and_gates / k,
        "bytes": (st.bytes_sent + st.bytes_received) / k,
        "seconds": min(seconds) / k,
    }
    return out


def engine_costs(n_max: int, epsilon: float, k: int = ENGINE_INSTANCE) -> EngineCosts:
    """Measure one first-YES chunk and one tournament of k lanes at the width the
    servers use for a LAP24 stream and an NMAX stream at ε (the larger of the two)."""
    eps = Fraction(epsilon).limit_denominator(10**6)
    width = max(comparison_width(n_max, kind, eps) for kind in (StreamKind.LAP24, StreamKind.NMAX))
    m = asyncio.run(_measure(k, width, eps))
    q, t, j = m["first_yes"], m["noisy_max"], m["sample"]
    return EngineCosts(
        width, k, q["and"], q["bytes"], q["seconds"], t["and"], t["bytes"], t["seconds"],
        j["and"], j["bytes"], j["seconds"],
    )  # fmt: skip


def cost_columns(
    costs: EngineCosts, d: int, comparisons: float | None, joint: bool = False
) -> dict[str, Any]:
    """A method's cost per candidate and for all d: `comparisons` first-YES queries
    per candidate (an SVT scan), or None for one tournament (noisy-max); `joint`:
    each comparison also draws its ν in the garbled sampler."""
    if comparisons is None:
        per = (costs.and_per_candidate, costs.bytes_per_candidate, costs.seconds_per_candidate)
    else:
        extra = (
            (costs.and_per_sample, costs.bytes_per_sample, costs.seconds_per_sample)
            if joint
            else (0.0, 0.0, 0.0)
        )
        per = (
            comparisons * (costs.and_per_query + extra[0]),
            comparisons * (costs.bytes_per_query + extra[1]),
            comparisons * (costs.seconds_per_query + extra[2]),
        )
    return {
        "comparisons_per_candidate": comparisons,
        "and_per_candidate": per[0],
        "bytes_per_candidate": per[1],
        "bytes_total": per[1] * d,
        "engine_seconds": per[2] * d,
    }


def _runs(cfg: FrontierConfig, datasets: list[npt.NDArray[np.int64]]) -> dict[str, Any]:
    """Every run's error per method, and the scans' comparisons per candidate."""
    errs: dict[str, list[float]] = {k: [] for k, _, _ in SCAN_SETTINGS}
    errs.update({k: [] for k, _, _, _ in NOISE_SETTINGS})
    errs.update({k: [] for k, _ in OTHER_METHODS})
    sent: dict[str, list[float]] = {k: [] for k, _, _ in SCAN_SETTINGS}
    sent.update({k: [] for k, _, _, _ in NOISE_SETTINGS})
    n, eps = cfg.n, cfg.epsilon
    bar = Progress(len(datasets), "frontier")
    for r, scores in enumerate(datasets):
        best = float(scores.max())
        rng = seeded_rng(cfg.seed, 31, r)
        for key, _, options in SCAN_SETTINGS:
            o = local_oracle(scores, n, oracle_seed(rng), parties=2)
            res = scan_selection(o, eps, cfg.beta, options=options)
            errs[key].append(best - float(scores[res.index]))
            sent[key].append(res.spend.queries_sent / scores.size)
        for key, _, noise, parties in NOISE_SETTINGS:
            o = local_oracle(scores, n, oracle_seed(rng), parties=parties, noise=noise)
            res = scan_selection(o, eps, cfg.beta)
            errs[key].append(best - float(scores[res.index]))
            sent[key].append(res.spend.queries_sent / scores.size)
        o = local_oracle(scores, n, oracle_seed(rng), parties=2)
        picks = {
            "noisy_max": noisy_max_selection(o, eps, cfg.beta).index,
            "gaussian": baselines.gaussian_selection(scores, eps, 1 / n**2, rng),
            "laplace": baselines.laplace_selection(scores, eps, float(scores.size), rng),
            "em": baselines.exponential_mechanism(scores, eps, 1.0, rng),
        }
        for key, j in picks.items():
            errs[key].append(best - float(scores[j]))
        bar.tick()
    return {"errors": errs, "sent": sent}


def frontier(
    out: Path | None, cfg: FrontierConfig | None = None, costs: EngineCosts | None = None
) -> dict[str, Any]:
    """Run the comparison; write frontier.json and frontier.png into `out` (None:
    neither).  `costs` defaults to a measurement on the engine now."""
    cfg = cfg or FrontierConfig()
    costs = costs or engine_costs(cfg.n, cfg.epsilon)
    datasets = [planted_scores(cfg.n, cfg.d, seeded_rng(cfg.seed, 30, r)) for r in range(cfg.runs)]
    em_mean = float(np.mean([em_expected_error(s, cfg.epsilon) for s in datasets]))
    measured = _runs(cfg, datasets)
    labels = (
        {k: label for k, label, _ in SCAN_SETTINGS}
        | {k: label for k, label, _, _ in NOISE_SETTINGS}
        | dict(OTHER_METHODS)
    )
    rows = []
    for key, label in labels.items():
        row = error_row(
            {"method": key, "label": label},
            measured["errors"][key],
            em_mean,
            datasets,
            cfg.epsilon,
        )
        if key == "em":  # EM's mean is its exact expectation; the median is sampled
            _set_mean(row, em_mean, datasets, cfg.epsilon)
        if key in measured["sent"]:
            row["comparisons_range"] = [
                float(np.min(measured["sent"][key])),
                float(np.max(measured["sent"][key])),
            ]
        if key == "scan_central":  # a reference, not a deployment: no server cost
            row["comparisons_per_candidate"] = float(np.mean(measured["sent"][key]))
        elif key in measured["sent"]:
            sent = float(np.mean(measured["sent"][key]))
            row.update(cost_columns(costs, cfg.d, sent, joint=key == "scan_joint"))
        elif key == "noisy_max":
            row.update(cost_columns(costs, cfg.d, None))
        rows.append(row)
    result: dict[str, Any] = {
        "experiment": "frontier",
        "config": asdict(cfg),
        "engine": asdict(costs),
        "em_mean": em_mean,
        "data": "planted column sums (experiments.common.planted_scores): the best candidate "
        "at n/2, one candidate per score unit below it",
        "noise": "scan and noisy-max: two servers' independent noise (LocalOracle, "
        "parties=2); scan_joint: a joint-noise task's law (one draw of the garbled "
        "sampler per term); scan_central: one party's noise; the others are simulation "
        "baselines",
        "rows": rows,
    }
    result["table"] = frontier_table(result)
    if out is not None:
        write_result(out, "frontier", result)
        plot_frontier(out, result)
    return result


def _set_mean(row: dict[str, Any], mean: float, datasets: list[Any], eps: float) -> None:
    row["mean"] = mean
    row["mean_ratio_to_em"] = 1.0 if mean > 0 else None
    eq = em_equivalent_epsilon(datasets, mean)
    row["em_equivalent_epsilon"] = eq if math.isfinite(eq) else None
    row["epsilon_equivalence"] = eps / eq if 0 < eq < math.inf else None
    row["no_better_than_uniform"] = eq == 0.0


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def frontier_table(result: dict[str, Any]) -> str:
    """The frontier as a Markdown table (one line per method), with its setting."""
    cfg, eng = result["config"], result["engine"]
    lines = [
        f"n = {cfg['n']:,}, d = {cfg['d']:,}, ε = {cfg['epsilon']:g}, {cfg['runs']} runs, "
        f"seed {cfg['seed']}; engine constants at w = {eng['width']} "
        f"({eng['and_per_query']:.1f} ANDs, {eng['bytes_per_query']:,.0f} B per first-YES query; "
        f"{eng['and_per_candidate']:.1f} ANDs, {eng['bytes_per_candidate']:,.0f} B per "
        f"tournament candidate; {eng.get('and_per_sample', 0):,.0f} ANDs, "
        f"{eng.get('bytes_per_sample', 0):,.0f} B per joint ν sample; "
        f"instance of {eng['instance']})",
        "",
        "| method | mean / median error | ε-eq. (×ε_EM, 90% interval) "
        "| comparisons per candidate (min–max) | ANDs per candidate | bytes per candidate "
        "| MB between servers | engine s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cmp = r.get("comparisons_per_candidate")
        has_cost = "bytes_per_candidate" in r
        cmp_text = "1 tournament" if has_cost and cmp is None else _num(cmp, ".0f")
        if "comparisons_range" in r:
            lo, hi = r["comparisons_range"]
            cmp_text += f" ({lo:.0f}–{hi:.0f})"
        lines.append(
            f"| {r['label']} | {r['mean']:.2f} / {r['median']:.1f} | {fmt_eq_range(r)} "
            f"| {cmp_text} | "
            f"{_num(r.get('and_per_candidate'), ',.0f')} | "
            f"{_num(r.get('bytes_per_candidate'), ',.0f')} | "
            f"{_num(r['bytes_total'] / 1e6 if has_cost else None, ',.2f')} | "
            f"{_num(r.get('engine_seconds'), '.2f')} |"
        )
    return "\n".join(lines)


def plot_frontier(out: Path, result: dict[str, Any]) -> Path:
    """Mean error against bytes between the servers per candidate (log–log); the
    methods without server cost are horizontal reference lines."""
    plt = pyplot()
    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    rows = {r["method"]: r for r in result["rows"]}
    scans = [rows[k] for k, _, _ in SCAN_SETTINGS]
    ax.plot(
        [r["bytes_per_candidate"] for r in scans],
        [r["mean"] for r in scans],
        marker="o",
        color="C0",
        label="SVT scan selection (cheap → default → accurate)",
    )
    nm = rows["noisy_max"]
    ax.plot([nm["bytes_per_candidate"]], [nm["mean"]], "s", color="C3", ms=8, label=nm["label"])
    jt = rows["scan_joint"]
    ax.plot([jt["bytes_per_candidate"]], [jt["mean"]], "D", color="C1", ms=7, label=jt["label"])
    # label offsets (points): cheap end above left, default below, accurate above
    # right, noisy-max above right, joint below right, so equal errors do not overlap
    offsets = [
        ((-10, 9), "right"),
        ((0, -20), "center"),
        ((10, 9), "left"),
        ((12, 8), "left"),
        ((-10, -16), "right"),
    ]
    short = {id(nm): "noisy-max", id(jt): "default, joint noise"}
    for r, (xy, ha) in zip([*scans, nm, jt], offsets, strict=True):
        name = short.get(id(r)) or r["label"].split(",")[1].split("(")[0].strip()
        ax.annotate(
            f"{name}: {r['mean']:.2f}, ε-eq. {fmt_eq(r)}×",
            (r["bytes_per_candidate"], r["mean"]),
            textcoords="offset points",
            xytext=xy,
            ha=ha,
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
        )
    lines = (("em", "k", "--"), ("scan_central", "C7", (0, (1, 3))), ("gaussian", "C2", ":"))
    for key, color, style in (*lines, ("laplace", "C4", "-.")):
        r = rows[key]
        ax.axhline(r["mean"], color=color, ls=style, lw=1.2, label=f"{r['label']}: {r['mean']:.3g}")
    xs = [r["bytes_per_candidate"] for r in [*scans, nm, jt]]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(xs) / 3, max(xs) * 6)
    ax.set_ylim(min(r["mean"] for r in result["rows"] if r["mean"] > 0) / 2, None)
    ax.set_xlabel("bytes between the servers per candidate (log)")
    ax.set_ylabel("mean selection error, score units (log)")
    ax.set_title(
        f"Selection frontier: n = {cfg['n']:,}, d = {cfg['d']:,}, ε = {cfg['epsilon']:g}, "
        f"{cfg['runs']} runs, two servers (independent noise unless marked)",
        fontsize=10,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    path = out / "frontier.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
