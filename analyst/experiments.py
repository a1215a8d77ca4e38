"""Experiments reproducing the paper's comparisons: Figure 1 (selection error vs d
and n, planted data), selection on real word frequencies (`words`, needs the
`wordfreq` package), query counts, and the §7 applications.

Each writes `<name>.json` (configuration, every run, medians with quartiles) and
`<name>.png` into the output folder.  SVT algorithms run against `LocalOracle`
(exact samplers, central noise); baselines are simulation baselines (see
`baselines`).  Run with `svtagg experiment figure1|words|queries|applications|all`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.analyst import applications as apps
from svtagg.analyst import baselines
from svtagg.analyst.applications import TopKOptions
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import (
    ScanOptions,
    binary_search,
    geometric_binary_search,
    plan_for,
    plan_practical,
    plan_scan,
    practical_selection,
    sampling_and_filtering,
    scan_selection,
)
from svtagg.mpc.ring import encode, sensitivity

FRAC_BITS = 16
GRID = sensitivity(FRAC_BITS)
BIG_BUDGET = 10**6  # experiments account their own ε; the oracle's cap is not the point

#: The paper's Figure 1 (selection error, per-user scores in [0,1]^d), as printed.
PAPER_FIGURE1 = [
    ("central DP (exponential mechanism)", "O(log d / ε)", "em"),
    ("SVT API (this paper, Thm 2.2)", "O(log d / ε) for n poly(d)", "alg9"),
    (
        "aggregation API (SecAgg / Gaussian, Thm 4.4)",
        "o(n) impossible unless n ≥ Ω(√d/ε)",
        "gaussian",
    ),
    ("shuffle DP (Thms 3.3, 3.4)", "same √d/ε barrier", None),
]

MATCHING = (
    "SVT selection (Alg 8, Alg 9) and the exponential mechanism are pure ε-DP at the same ε; "
    "the Gaussian aggregation baseline gets (ε, δ = 1/n²) — one release of all d sums at the "
    "zCDP ρ that converts to exactly that (ε, δ) — a strictly weaker guarantee, which only "
    "favours the baseline."
)


# --------------------------------------------------------------------------- plumbing


class Progress:
    """A plain stderr progress bar (no extra dependencies).  On a terminal it
    redraws one line; elsewhere (a log file, a pipe) it writes one line per step,
    so the file holds no carriage returns."""

    def __init__(self, total: int, label: str, stream: Any = None):
        self.total, self.label, self.done = max(total, 1), label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        isatty = getattr(self.stream, "isatty", None)
        self.redraw = bool(isatty is not None and isatty())

    def tick(self, note: str = "") -> None:
        self.done += 1
        frac = self.done / self.total
        bar = "#" * int(30 * frac)
        el = time.monotonic() - self.start
        line = f"{self.label:>12} [{bar:<30}] {self.done}/{self.total} {el:5.0f}s {note}"
        if self.redraw:
            self.stream.write(f"\r{line:<80}")
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line.rstrip() + "\n")
        self.stream.flush()


def summarize(values: list[float]) -> dict[str, float]:
    """Median with quartiles and extremes over repetitions."""
    a = np.asarray(values, dtype=np.float64)
    q25, med, q75 = np.percentile(a, [25, 50, 75])
    return {
        "median": float(med),
        "mean": float(a.mean()),
        "q25": float(q25),
        "q75": float(q75),
        "min": float(a.min()),
        "max": float(a.max()),
        "reps": len(values),
    }


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def _oracle_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**62))


def planted_scores(n: int, d: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Column sums of planted 0/1 data: one candidate, at a random position (SVT
    scans answer the *first* YES, so a fixed position would favour them), has score
    ⌊n/2⌋; the others ⌊n/2 − d·u_j⌋ (clipped at 0) with u_j uniform on (0, 1].  The
    density near the top is one candidate per score unit whatever d is, so the
    error of a method reads directly as the size of its noise.  Any integer vector
    in [0, n]^d is the column sum of some 0/1 data: the n × d matrix is never built."""
    top = n // 2
    scores = np.floor(top - d * (1.0 - rng.random(d)))
    scores[rng.integers(d)] = top
    return np.clip(scores, 0, n).astype(np.int64)


def em_expected_error(scores: npt.ArrayLike, epsilon: float) -> float:
    """Exact expected error of the exponential mechanism (P(j) ∝ exp(ε·s_j/2)) on `scores`."""
    s = np.asarray(scores, dtype=np.float64)
    w = float(epsilon) * s / 2.0
    p = np.exp(w - w.max())
    p /= p.sum()
    return float((p * (s.max() - s)).sum())


def em_equivalent_epsilon(datasets: Sequence[npt.ArrayLike], mean_error: float) -> float:
    """The ε at which the exponential mechanism's mean error over `datasets` (exact
    expectations) equals `mean_error`: how much budget EM needs for the same error.
    `inf` when the error is 0 (EM never reaches it exactly); 0 when the error is at
    least that of a uniformly random choice (EM's limit as ε → 0)."""
    if mean_error <= 0:
        return math.inf

    def f(e: float) -> float:
        return float(np.mean([em_expected_error(s, e) for s in datasets]))

    lo, hi = 1e-6, 1e4
    if f(0.0) <= mean_error:
        return 0.0
    if f(hi) >= mean_error:
        return hi
    for _ in range(60):  # EM's expected error decreases in ε: bisect on a log scale
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > mean_error else (lo, mid)
    return math.sqrt(lo * hi)


def word_frequencies(lo: int, hi: int, lang: str = "en") -> npt.NDArray[np.float64]:
    """Frequencies of the words ranked lo..hi (1-based) in `wordfreq`'s English list.

    `wordfreq` ships its frequency tables inside the package (no network); it is in
    the `experiments` and `test` extras."""
    if not 1 <= lo <= hi:
        raise ValueError(f"word window must satisfy 1 <= lo <= hi, got {lo}:{hi}")
    try:
        import wordfreq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "word-frequency experiments need the wordfreq package: "
            "pip install 'svtagg[experiments]'"
        ) from exc
    words = wordfreq.top_n_list(lang, hi)
    if len(words) < hi:
        raise ValueError(f"wordfreq lists only {len(words)} {lang} words; window ends at {hi}")
    return np.array([wordfreq.word_frequency(w, lang) for w in words[lo - 1 : hi]])


def word_scores(
    n: int, freqs: npt.NDArray[np.float64], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """Candidate scores when each of n users holds one word drawn from real English
    frequencies: counts of the window's words (the other words are one "elsewhere"
    cell), in a random candidate order (SVT scans answer the first YES)."""
    rest = max(0.0, 1.0 - float(freqs.sum()))
    p = np.append(freqs, rest)
    counts = rng.multinomial(n, p / p.sum())[:-1]
    return counts[rng.permutation(freqs.size)].astype(np.int64)


def _oracle(scores: npt.ArrayLike, n: int, seed: int, parties: int = 1) -> LocalOracle:
    sums = np.asarray(scores, dtype=np.int64) * GRID
    return LocalOracle.from_sums(
        sums, n, BIG_BUDGET, frac_bits=FRAC_BITS, seed=seed, parties=parties
    )


def _grid_sums(chunks: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.int64]:
    """Sum embeddings exactly as clients encode them (chunked to bound memory)."""
    total: npt.NDArray[np.int64] | None = None
    for c in chunks:
        s = encode(c, FRAC_BITS).astype(np.int64).sum(axis=0)
        total = s if total is None else total + s
    assert total is not None
    return total


def _write(out: Path, name: str, result: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=_json_default))
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Fraction):
        return float(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _band(
    ax: Any, xs: Sequence[float], summ: Sequence[Mapping[str, Any]], label: str, **kw: Any
) -> None:
    med = [s["median"] for s in summ]
    ax.plot(xs, med, marker="o", label=label, **kw)
    ax.fill_between(xs, [s["q25"] for s in summ], [s["q75"] for s in summ], alpha=0.2)


# --------------------------------------------------------------------------- figure 1

SelectFn = Callable[[npt.NDArray[np.int64], int, float, np.random.Generator], int]


def _sel_alg8(parties: int = 1) -> SelectFn:
    def f(scores: npt.NDArray[np.int64], n: int, eps: float, rng: np.random.Generator) -> int:
        oracle = _oracle(scores, n, _oracle_seed(rng), parties)
        return geometric_binary_search(oracle, eps, 0.1).index

    return f


def _sel_practical(parties: int = 1) -> SelectFn:
    def f(scores: npt.NDArray[np.int64], n: int, eps: float, rng: np.random.Generator) -> int:
        return practical_selection(_oracle(scores, n, _oracle_seed(rng), parties), eps, 0.1).index

    return f


def _sel_scan(parties: int = 1, coarse_fraction: str | None = None) -> SelectFn:
    def f(scores: npt.NDArray[np.int64], n: int, eps: float, rng: np.random.Generator) -> int:
        oracle = _oracle(scores, n, _oracle_seed(rng), parties)
        if coarse_fraction is None:
            return scan_selection(oracle, eps, 0.1).index
        options = ScanOptions(coarse_fraction=coarse_fraction)
        return scan_selection(oracle, eps, 0.1, options=options).index

    return f


def _sel_alg9(variant: str) -> SelectFn:
    def f(scores: npt.NDArray[np.int64], n: int, eps: float, rng: np.random.Generator) -> int:
        oracle = _oracle(scores, n, _oracle_seed(rng))
        beta = 1.0 / (2 * len(scores))
        return sampling_and_filtering(oracle, eps, beta, variant=variant, rng=rng).index

    return f


def _sel_gauss(scores: npt.NDArray[np.int64], n: int, eps: float, rng: np.random.Generator) -> int:
    return baselines.gaussian_selection(scores, eps, 1.0 / n**2, rng)


def _sel_em(scores: npt.NDArray[np.int64], n: int, eps: float, rng: np.random.Generator) -> int:
    return baselines.exponential_mechanism(scores, eps, 1.0, rng)


FIG1_METHODS: dict[str, tuple[str, SelectFn]] = {
    "alg8": ("SVT: Alg 8 (GeometricBinarySearch)", _sel_alg8()),
    "alg9": ("SVT: Alg 9 as written", _sel_alg9("paper")),
    "alg9_tuned": ("SVT: Alg 9 tuned", _sel_alg9("tuned")),
    "gaussian": ("Gaussian aggregation, (ε, 1/n²)", _sel_gauss),
    "em": ("central exponential mechanism", _sel_em),
    # later entries, so that the ones above keep the seeds they had before these
    "practical": ("SVT: practical (Alg 8 + fine scan)", _sel_practical()),
    "scan": ("SVT: scan selection (default)", _sel_scan()),
    "alg8_2p": ("SVT: Alg 8, two-server noise", _sel_alg8(2)),
    "practical_2p": ("SVT: practical, two-server noise", _sel_practical(2)),
    "scan_2p": ("SVT: scan selection, two-server noise", _sel_scan(2)),
}
#: Methods whose mean-error ratio and ε-equivalence to EM the printed table shows.
RATIO_METHODS = ("alg8", "practical", "scan", "alg8_2p", "practical_2p", "scan_2p")


@dataclass
class Figure1Config:
    epsilon: float = 1.0
    ds: list[int] = field(default_factory=lambda: [10, 100, 1000, 10000])
    n_for_d: int = 100_000
    ns: list[int] = field(default_factory=lambda: [1000, 10_000, 100_000, 1_000_000])
    d_for_n: int = 1000


def _sweep(
    points: list[tuple[int, int]], reps: int, seed: int, eps: float, tag: int, bar: Progress
) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in FIG1_METHODS}
    for i, (n, d) in enumerate(points):
        errs: dict[str, list[float]] = {m: [] for m in FIG1_METHODS}
        datasets = []
        for r in range(reps):
            data_rng = _rng(seed, tag, i, r)
            scores = planted_scores(n, d, data_rng)
            datasets.append(scores)
            best = float(scores.max())
            for k, (m, (_, fn)) in enumerate(FIG1_METHODS.items()):
                j = fn(scores, n, eps, _rng(seed, tag, i, r, k + 1))
                errs[m].append(best - float(scores[j]))
            bar.tick(f"n={n} d={d}")
        em_mean = float(np.mean([em_expected_error(sc, eps) for sc in datasets]))
        for m in FIG1_METHODS:
            rows[m].append(_error_row({"n": n, "d": d}, errs[m], em_mean, datasets, eps))
    return rows


def _error_row(
    head: dict[str, Any],
    errs: list[float],
    em_mean: float,
    datasets: Sequence[npt.ArrayLike],
    eps: float,
) -> dict[str, Any]:
    """One method's errors with two comparisons to the exponential mechanism: the ratio
    of mean errors (EM's is its exact expected error on the same datasets) and the
    ε-equivalence ε/ε_EM, ε_EM the budget at which EM's mean error equals the
    method's: how many times EM's budget the method needs for its error.  Both are
    None (JSON null) where undefined (EM's error 0, or the method's error 0)."""
    summ = summarize(errs)
    row: dict[str, Any] = {**head, "errors": errs, **summ}
    row["em_mean"] = em_mean
    row["mean_ratio_to_em"] = summ["mean"] / em_mean if em_mean > 0 else None
    eq = em_equivalent_epsilon(datasets, summ["mean"])
    row["em_equivalent_epsilon"] = eq if math.isfinite(eq) else None
    row["epsilon_equivalence"] = eps / eq if 0 < eq < math.inf else None
    row["no_better_than_uniform"] = eq == 0.0
    return row


def figure1(
    out: Path, reps: int = 5, seed: int = 0, cfg: Figure1Config | None = None
) -> dict[str, Any]:
    """Selection error (max_j s_j − s_chosen, score units) vs d and vs n."""
    cfg = cfg or Figure1Config()
    pts_d = [(cfg.n_for_d, d) for d in cfg.ds]
    pts_n = [(n, cfg.d_for_n) for n in cfg.ns]
    bar = Progress(reps * (len(pts_d) + len(pts_n)), "figure1")
    vs_d = _sweep(pts_d, reps, seed, cfg.epsilon, 1, bar)
    vs_n = _sweep(pts_n, reps, seed, cfg.epsilon, 2, bar)
    result: dict[str, Any] = {
        "experiment": "figure1",
        "config": {**cfg.__dict__, "reps": reps, "seed": seed},
        "error": "max_j s_j − s_chosen in score units (sums of per-user [0,1] values)",
        "data": "column sums of 0/1 data: one candidate at a random position has score ⌊n/2⌋, "
        "the others ⌊n/2 − d·u⌋ (≥ 0), u uniform on (0, 1]: one candidate per score unit "
        "near the top",
        "matching": MATCHING,
        "betas": "Alg 8 and practical: β = 0.1; Alg 9: β = 1/(2d) (it requires β ≤ 1/d)",
        "methods": {m: label for m, (label, _) in FIG1_METHODS.items()},
        "vs_d": vs_d,
        "vs_n": vs_n,
    }
    result["table"] = figure1_table(result)
    _write(out, "figure1", result)
    _plot_figure1(out, result)
    return result


def figure1_table(result: dict[str, Any]) -> str:
    """The paper's Figure 1 next to the measured median errors (vs d at fixed n)."""
    vs_d = result["vs_d"]
    ds = [row["d"] for row in vs_d["em"]]
    n = vs_d["em"][0]["n"]
    head = f"{'API':<46} {'paper':<38} " + " ".join(f"{'d=' + str(d):>9}" for d in ds)
    lines = [f"Figure 1 — median selection error at n={n}, ε={result['config']['epsilon']}", head]
    for api, bound, key in PAPER_FIGURE1:
        if key is None:
            lines.append(f"{api:<46} {bound:<38} " + " ".join(f"{'—':>9}" for _ in ds))
            continue
        keys = [key] + (
            ["alg8", "alg9_tuned", "practical", "scan", "scan_2p"] if key == "alg9" else []
        )
        for k in keys:
            name = api if k == key else f"  {FIG1_METHODS[k][0]}"
            vals = " ".join(f"{row['median']:>9.1f}" for row in vs_d[k])
            lines.append(f"{name:<46} {bound if k == key else '':<38} {vals}")
    lines.append(
        "mean error / EM's exact expected error, and ε-equivalence (the ε at which EM's mean "
        "error equals the method's, as a multiple of ε); '—' where undefined:"
    )
    for k in RATIO_METHODS:
        vals = " ".join(f"{_fmt(r['mean_ratio_to_em']):>4}/{_fmt_eq(r):<5}" for r in vs_d[k])
        lines.append(f"  {FIG1_METHODS[k][0]:<44} {'ratio/ε-equiv.':<38} {vals}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.1f}"


def _fmt_eq(row: Mapping[str, Any]) -> str:
    """ε-equivalence for tables: '≥unif' when the method is no better than a uniform pick."""
    return "≥unif" if row.get("no_better_than_uniform") else _fmt(row["epsilon_equivalence"])


def _plot_figure1(out: Path, result: dict[str, Any]) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, key, xkey in ((axes[0], "vs_d", "d"), (axes[1], "vs_n", "n")):
        for m, rows in result[key].items():
            xs = [row[xkey] for row in rows]
            style = {"ls": "--"} if m.endswith("_2p") else {}
            _band(ax, xs, rows, result["methods"][m], **style)
        if key == "vs_d" and len(result[key]["em"]) > 1:
            # reference shapes anchored at the second point (the first, d = 10, is
            # capped: with one candidate per unit, no error can exceed d)
            xs = [row["d"] for row in result[key]["em"]]
            a8 = result[key]["alg8"][1]["median"] or 1.0
            g1 = result[key]["gaussian"][1]["median"] or 1.0
            ax.plot(xs, [a8 * math.log(x) / math.log(xs[1]) for x in xs], "k:", label="∝ log d")
            ax.plot(xs, [g1 * math.sqrt(x / xs[1]) for x in xs], "k--", label="∝ √d")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xkey)
        ax.set_ylabel("selection error, score units (symlog: linear below 1)")
        fixed = result["config"]["n_for_d"] if key == "vs_d" else result["config"]["d_for_n"]
        ax.set_title(f"error vs {xkey} ({'n' if key == 'vs_d' else 'd'} = {fixed})")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(
        f"Figure 1 reproduction, ε = {result['config']['epsilon']}; medians, IQR bands; "
        "dashed: two-server noise.\nError = best score − chosen score; a score unit is one "
        "user's full contribution (scores are sums of per-user values in [0, 1])."
    )
    fig.tight_layout(rect=(0, 0, 0.78, 0.92))
    path = out / "figure1.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- words


@dataclass
class WordsConfig:
    """Selection on real word frequencies: each user holds one English word."""

    settings: list[tuple[int, float]] = field(
        default_factory=lambda: [(100_000, 1.0), (1_000_000, 0.25)]
    )
    window: tuple[int, int] = (101, 1100)
    parties: tuple[int, ...] = (1, 2)


#: The two ends of the scan selection's localisation shares (docs/algorithms.md §6).
CHEAP_SHARES = ScanOptions(coarse_fraction="1/2", mid_fraction=0)
ACCURATE_SHARES = ScanOptions(coarse_fraction="1/16", mid_fraction="1/32")

#: (key, label, run) of the SVT methods the words experiment runs.
WORD_METHODS: list[tuple[str, str, Callable[[LocalOracle, float], Any]]] = [
    (
        "scan",
        "scan selection, ε/8 + ε/16 localisation (default)",
        lambda o, e: scan_selection(o, e, 0.1),
    ),
    (
        "scan_cheap",
        "scan selection, ε/2 search, no middle stage (cheap end)",
        lambda o, e: scan_selection(o, e, 0.1, options=CHEAP_SHARES),
    ),
    (
        "scan_accurate",
        "scan selection, ε/16 + ε/32 (accurate end)",
        lambda o, e: scan_selection(o, e, 0.1, options=ACCURATE_SHARES),
    ),
    (
        "practical",
        "practical (Alg 8 at ε/2 + fine scan)",
        lambda o, e: practical_selection(o, e, 0.1),
    ),
    ("alg8", "Alg 8 (GeometricBinarySearch)", lambda o, e: geometric_binary_search(o, e, 0.1)),
]


def words(
    out: Path, reps: int = 60, seed: int = 0, cfg: WordsConfig | None = None
) -> dict[str, Any]:
    """Selection error on real English word frequencies, one- and two-server noise.

    Candidates are the words ranked `window` (default 101–1100); each of n users holds
    one word drawn from the full frequency list.  Every SVT method is compared with
    the exponential mechanism at the same ε by its mean-error ratio and its
    ε-equivalence (see `_error_row`), and by the comparisons it sent per candidate.
    """
    cfg = cfg or WordsConfig()
    freqs = word_frequencies(*cfg.window)
    bar = Progress(reps * len(cfg.settings), "words")
    rows: list[dict[str, Any]] = []
    for i, (n, eps) in enumerate(cfg.settings):
        datasets = [word_scores(n, freqs, _rng(seed, 8, i, r)) for r in range(reps)]
        em_mean = float(np.mean([em_expected_error(sc, eps) for sc in datasets]))
        errs: dict[tuple[str, int], list[float]] = {}
        sent: dict[tuple[str, int], list[float]] = {}
        for r, scores in enumerate(datasets):
            best = float(scores.max())
            k = 0
            for p in cfg.parties:
                for key, _, fn in WORD_METHODS:
                    k += 1
                    res = fn(_oracle(scores, n, _oracle_seed(_rng(seed, 8, i, r, k)), p), eps)
                    errs.setdefault((key, p), []).append(best - float(scores[res.index]))
                    sent.setdefault((key, p), []).append(res.spend.queries_sent / len(scores))
            bar.tick(f"n={n} ε={eps}")
        head = {"n": n, "epsilon": eps}
        em_errs = [
            float(scores.max() - scores[baselines.exponential_mechanism(scores, eps, 1.0, g)])
            for scores, g in ((sc, _rng(seed, 9, i, r)) for r, sc in enumerate(datasets))
        ]
        rows.append({**_error_row(head, em_errs, em_mean, datasets, eps), "method": "em"})
        sh_errs = [
            float(scores.max() - scores[baselines.shuffled_rr_select(scores, n, eps, 1 / n**2, g)])
            for scores, g in ((sc, _rng(seed, 13, i, r)) for r, sc in enumerate(datasets))
        ]
        rows.append({**_error_row(head, sh_errs, em_mean, datasets, eps), "method": "shuffle"})
        for p in cfg.parties:
            for key, _, _ in WORD_METHODS:
                row = _error_row(head, errs[(key, p)], em_mean, datasets, eps)
                row.update(method=key, parties=p, sent_per_candidate=summarize(sent[(key, p)]))
                rows.append(row)
    result: dict[str, Any] = {
        "experiment": "words",
        "config": {**cfg.__dict__, "reps": reps, "seed": seed},
        "data": "each user holds one English word drawn from wordfreq's frequencies; "
        f"candidates are the words ranked {cfg.window[0]}–{cfg.window[1]}, in random order",
        "error": "best count − chosen count (users)",
        "em": "EM's mean error is its exact expectation on the same datasets; the 'em' row "
        "samples it once per dataset",
        "shuffle": "each user sends K-ary randomized response (K = d + 1) at the largest ε₀ "
        "whose shuffled guarantee (Feldman–McMillan–Talwar 2021, Thm 3.1) is (ε, 1/n²); "
        "a weaker guarantee than the pure ε of the others, which only favours it",
        "methods": {key: label for key, label, _ in WORD_METHODS}
        | {
            "em": "exponential mechanism",
            "shuffle": "shuffled K-RR histogram, (ε, 1/n²) by FMT21 Thm 3.1",
        },
        "rows": rows,
    }
    result["table"] = words_table(result)
    _write(out, "words", result)
    _plot_words(out, result)
    return result


def words_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'n':>8} {'ε':>5} {'method':<58} {'parties':>7} {'mean':>7} {'median':>6} "
        f"{'/EM':>6} {'ε-equiv':>7} {'cmp/cand':>8}"
    ]
    for r in result["rows"]:
        label = result["methods"][r["method"]]
        sent = r.get("sent_per_candidate", {}).get("mean")
        lines.append(
            f"{r['n']:>8} {r['epsilon']:>5} {label:<58} {r.get('parties', '—')!s:>7} "
            f"{r['mean']:>7.2f} {r['median']:>6.1f} {_fmt(r['mean_ratio_to_em']):>6} "
            f"{_fmt_eq(r):>7} {_fmt(sent):>8}"
        )
    return "\n".join(lines)


def _plot_words(out: Path, result: dict[str, Any]) -> Path:
    plt = _plt()
    settings = sorted({(r["n"], r["epsilon"]) for r in result["rows"]})
    fig, axes = plt.subplots(1, len(settings), figsize=(8 * len(settings), 5), squeeze=False)
    for ax, (n, eps) in zip(axes[0], settings, strict=True):
        rows = [r for r in result["rows"] if (r["n"], r["epsilon"]) == (n, eps)]
        labels = [
            result["methods"][r["method"]]
            + (
                ""
                if "parties" not in r
                else f" ({r['parties']} party)"
                if r["parties"] == 1
                else " (two servers)"
            )
            for r in rows
        ]
        ys = [r["mean"] for r in rows]
        ax.barh(range(len(rows)), ys, color=[f"C{i % 10}" for i in range(len(rows))])
        for y, r in enumerate(rows):
            eq = _fmt_eq(r)
            ax.text(r["mean"], y, f"  {r['mean']:.1f}  (ε-equiv. {eq}×)", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, max(ys) * 30 + 10)
        ax.set_xlabel("mean error, users (best count − chosen count); symlog: linear below 1")
        ax.set_title(f"n = {n}, ε = {eps}, {result['config']['reps']} datasets")
    fig.suptitle(f"selection on real word frequencies ({result['data']})", fontsize=9)
    fig.tight_layout()
    path = out / "words.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- queries


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
            scores = planted_scores(n, d, _rng(seed, 3, i, r))
            for k, (a, fn) in enumerate(algs.items()):
                g = _rng(seed, 3, i, r, k + 1)
                res = fn(_oracle(scores, n, _oracle_seed(g)), d, g)
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
        probe = _oracle(np.zeros(d, dtype=np.int64), n, 0)
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
    _write(out, "queries", result)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for a, rs in rows.items():
        _band(ax, ds, rs, QUERY_LABELS.get(a, a))
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


# --------------------------------------------------------------------------- applications


@dataclass
class ApplicationsConfig:
    epsilon: float = 1.0
    hh_ns: list[int] = field(default_factory=lambda: [3000, 10_000, 30_000, 100_000])
    hh_d: int = 1000
    hh_r: int = 8
    hh_k: int = 10
    sm_ns: list[int] = field(default_factory=lambda: [10_000, 30_000, 100_000])
    sm_d: int = 1000
    sm_k: int = 4
    mwem_n: int = 1_000_000
    mwem_attributes: int = 8
    mwem_ts: list[int] = field(default_factory=lambda: [2, 4, 8, 16, 32, 64])
    mwem_delta: float = 1e-6


def _zipf_records(
    n: int, d: int, r: int, rng: np.random.Generator, chunk: int = 20_000
) -> list[Any]:
    """r distinct categories per user, drawn ∝ 1/rank^1.1 without replacement (Gumbel
    top-r).  Ranks are assigned to categories by a random permutation: SVT scans
    answer the first YES, so popularity must not follow the scan order."""
    logp = -1.1 * np.log(np.arange(1, d + 1))[rng.permutation(d)]
    out = []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        keys = logp[None, :] + rng.gumbel(size=(m, d))
        out.append(np.argpartition(-keys, r - 1, axis=1)[:, :r])
    return out


def _hh_embed_chunks(recs: list[Any], d: int) -> list[npt.NDArray[np.float64]]:
    return [apps.heavy_hitters_embedding(c.tolist(), d) for c in recs]


def _recall(chosen: list[int], truth: set[int]) -> float:
    return len(set(chosen) & truth) / len(truth)


def applications(
    out: Path, reps: int = 5, seed: int = 0, cfg: ApplicationsConfig | None = None
) -> dict[str, Any]:
    """Top-k recall vs n, sparse-mean ℓ2 error vs n, MWEM max query error vs T."""
    cfg = cfg or ApplicationsConfig()
    eps = cfg.epsilon
    total = reps * (len(cfg.hh_ns) + len(cfg.sm_ns) + len(cfg.mwem_ts))
    bar = Progress(total, "applications")

    # Heavy hitters (Theorem 7.1) vs Laplace-on-all-counts (2r/ε) and Gaussian top-k.
    # "svt" is Theorem 7.1 as implemented (k rounds of Alg 9 tuned), "svt_practical"
    # k rounds of `practical_selection`; both ε/k per round, pure ε in total.
    hh: dict[str, list[dict[str, Any]]] = {
        "svt": [],
        "svt_practical": [],
        "laplace": [],
        "gaussian": [],
        "svt_scan": [],
    }
    for i, n in enumerate(cfg.hh_ns):
        rec: dict[str, list[float]] = {m: [] for m in hh}
        hh_q: dict[str, list[float]] = {"svt": [], "svt_practical": [], "svt_scan": []}
        for r in range(reps):
            g = _rng(seed, 4, i, r)
            recs = _zipf_records(n, cfg.hh_d, cfg.hh_r, g)
            sums = _grid_sums(_hh_embed_chunks(recs, cfg.hh_d))
            counts = sums // GRID
            # ties at the k-th count make "the" top-k ambiguous; use a stable order
            truth = set(np.argsort(-counts, kind="stable")[: cfg.hh_k].tolist())
            oracle = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(g))
            res = apps.top_k_heavy_hitters(
                oracle, cfg.hh_k, eps, options=TopKOptions("tuned", rng=g)
            )
            rec["svt"].append(_recall(res.indices, truth))
            hh_q["svt"].append(res.spend.queries)
            # its own seed stream, so the other methods keep the draws they had before
            o2 = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(_rng(seed, 7, i, r)))
            res = apps.top_k_heavy_hitters(o2, cfg.hh_k, eps, options=TopKOptions("practical"))
            rec["svt_practical"].append(_recall(res.indices, truth))
            hh_q["svt_practical"].append(res.spend.queries)
            rec["laplace"].append(
                _recall(baselines.laplace_top_k(counts, cfg.hh_k, eps, cfg.hh_r, g), truth)
            )
            rec["gaussian"].append(
                _recall(baselines.gaussian_top_k(counts, cfg.hh_k, eps, 1 / n**2, g), truth)
            )
            o3 = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(_rng(seed, 10, i, r)))
            res = apps.top_k_heavy_hitters(o3, cfg.hh_k, eps, options=TopKOptions("scan"))
            rec["svt_scan"].append(_recall(res.indices, truth))
            hh_q["svt_scan"].append(res.spend.queries)
            bar.tick(f"top-k n={n}")
        for m in hh:
            row: dict[str, Any] = {"n": n, "recall": rec[m], **summarize(rec[m])}
            if m in hh_q:
                row["queries"] = summarize(hh_q[m])
            hh[m].append(row)

    # Sparse mean (Theorem 7.2) vs Gaussian aggregation of the same embedding.
    # "svt" is the default (scan selection per round), "svt_alg9" Theorem 7.2's Alg 9 tuned
    sm: dict[str, list[dict[str, Any]]] = {"svt": [], "gaussian": [], "svt_alg9": []}
    for i, n in enumerate(cfg.sm_ns):
        errs: dict[str, list[float]] = {m: [] for m in sm}
        beta = 0.1
        clip = apps.sparse_mean_clip(n, cfg.sm_d, beta)
        for r in range(reps):
            g = _rng(seed, 5, i, r)
            mu = np.zeros(cfg.sm_d)
            support = g.choice(cfg.sm_d, cfg.sm_k, replace=False)
            mu[support] = g.choice([-1.0, 1.0], cfg.sm_k) * g.uniform(0.5, 1.0, cfg.sm_k)
            chunks = []
            for start in range(0, n, 5000):
                rows_ = min(5000, n - start)
                x = g.normal(mu, 1.0, (rows_, cfg.sm_d))
                chunks.append(apps.sparse_mean_embedding(x, clip))
            sums = _grid_sums(chunks)
            oracle = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(g))
            smr = apps.sparse_mean(oracle, cfg.sm_k, eps, beta, clip, rng=g)
            errs["svt"].append(float(np.linalg.norm(smr.mean - mu)))
            gm = baselines.gaussian_sparse_mean(sums / GRID, n, cfg.sm_k, clip, eps, 1 / n**2, g)
            errs["gaussian"].append(float(np.linalg.norm(gm - mu)))
            g9 = _rng(seed, 11, i, r)
            o9 = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(g9))
            res9 = apps.sparse_mean(o9, cfg.sm_k, eps, beta, clip, variant="tuned", rng=g9)
            errs["svt_alg9"].append(float(np.linalg.norm(res9.mean - mu)))
            bar.tick(f"sparse mean n={n}")
        for m in sm:
            sm[m].append({"n": n, "l2_error": errs[m], **summarize(errs[m])})

    # MWEM (Theorems 7.7, 7.8) vs central MWEM, two-way marginals.
    wl = apps.MarginalWorkload.build(cfg.mwem_attributes)
    # "svt"/"svt_adv": scan selection (the default); "svt_alg8": the paper's Alg 8
    mw: dict[str, list[dict[str, Any]]] = {
        "svt": [],
        "svt_adv": [],
        "central": [],
        "svt_alg8": [],
    }
    n = cfg.mwem_n
    for i, t_rounds in enumerate(cfg.mwem_ts):
        errs = {m: [] for m in mw}
        for r in range(reps):
            g = _rng(seed, 6, i, r)
            hist = _marginal_data(n, cfg.mwem_attributes, _rng(seed, 6, r))
            sums = _marginal_sums(wl, hist)
            for m, delta in (("svt", 0.0), ("svt_adv", cfg.mwem_delta)):
                oracle = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(g))
                mwr = apps.mwem_svt(oracle, wl, eps, 0.1, rounds=t_rounds, delta=delta)
                errs[m].append(apps.max_query_error(wl, hist, mwr.synthetic) / n)
            central = baselines.central_mwem(hist, wl, eps, t_rounds, g)
            errs["central"].append(apps.max_query_error(wl, hist, central) / n)
            g8 = _rng(seed, 12, i, r)
            o8 = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=_oracle_seed(g8))
            res8 = apps.mwem_svt(o8, wl, eps, 0.1, rounds=t_rounds, variant="paper")
            errs["svt_alg8"].append(apps.max_query_error(wl, hist, res8.synthetic) / n)
            bar.tick(f"MWEM T={t_rounds}")
        for m in mw:
            mw[m].append({"T": t_rounds, "max_error_over_n": errs[m], **summarize(errs[m])})
    uniform = (
        apps.max_query_error(
            wl,
            _marginal_data(n, cfg.mwem_attributes, _rng(seed, 6, 0)),
            np.full(2**cfg.mwem_attributes, n / 2**cfg.mwem_attributes),
        )
        / n
    )
    result: dict[str, Any] = {
        "experiment": "applications",
        "config": {**cfg.__dict__, "reps": reps, "seed": seed},
        "matching": "SVT and Laplace/central baselines pure ε; Gaussian baselines (ε, 1/n²); "
        "MWEM svt_adv is (ε, δ) by advanced composition over the 2T steps (Theorem 7.8).",
        "top_k": hh,
        "sparse_mean": sm,
        "mwem": mw,
        "mwem_uniform_error_over_n": uniform,
        "mwem_theorem_T": apps.mwem_rounds(n, eps, 2**cfg.mwem_attributes, wl.matrix.shape[0], 0.1),
    }
    _write(out, "applications", result)
    _plot_applications(out, result)
    return result


def _marginal_data(n: int, attributes: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Histogram of n records over {0,1}^a with correlated attributes: a latent bit
    drives attribute probabilities (so two-way marginals are far from uniform)."""
    probs_hi = np.linspace(0.9, 0.5, attributes)
    probs_lo = np.linspace(0.1, 0.4, attributes)
    latent = rng.random(n) < 0.4
    p = np.where(latent[:, None], probs_hi[None, :], probs_lo[None, :])
    x = (rng.random((n, attributes)) < p).astype(np.int64)
    wl = apps.MarginalWorkload.build(attributes)
    return wl.histogram(x)


def _marginal_sums(
    wl: apps.MarginalWorkload, hist: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """Grid sums of `marginals_embedding` over the records: Σ_x hist(x)·encode((1+q(x))/2)."""
    per_elem = encode(apps.marginals_embedding(wl.domain), FRAC_BITS).astype(np.int64)
    return (hist.astype(np.int64)[:, None] * per_elem).sum(axis=0)


def _plot_applications(out: Path, result: dict[str, Any]) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for m, rows in result["top_k"].items():
        _band(axes[0], [r["n"] for r in rows], rows, m)
    axes[0].set_xscale("log")
    axes[0].set_ylabel("top-k recall")
    axes[0].set_xlabel("n")
    axes[0].set_title("heavy hitters (Thm 7.1)")
    for m, rows in result["sparse_mean"].items():
        _band(axes[1], [r["n"] for r in rows], rows, m)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ℓ2 error of μ̂")
    axes[1].set_xlabel("n")
    axes[1].set_title("sparse mean (Thm 7.2)")
    for m, rows in result["mwem"].items():
        _band(axes[2], [r["T"] for r in rows], rows, m)
    axes[2].axhline(result["mwem_uniform_error_over_n"], color="k", ls=":", label="uniform")
    axes[2].set_xscale("log", base=2)
    axes[2].set_ylabel("max query error / n")
    axes[2].set_xlabel("T")
    axes[2].set_title("MWEM, two-way marginals (Thms 7.7, 7.8)")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"applications, ε = {result['config']['epsilon']}; medians, IQR bands")
    fig.tight_layout()
    path = out / "applications.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- CLI


def quick_configs() -> tuple[Figure1Config, list[int], int, ApplicationsConfig]:
    """Tiny sizes for smoke tests (`--quick`); points repeat so α caches are shared."""
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
        cfg.parties = tuple(int(x) for x in args.parties.split(","))
        if not set(cfg.parties) <= {1, 2}:
            raise ValueError("--parties takes 1, 2 or 1,2")
    for n, e in cfg.settings:
        if n < 1 or e <= 0:
            raise ValueError(f"need n >= 1 and ε > 0, got n={n}, ε={e}")
    return cfg


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    f1, q_ds, q_n, ap = (
        quick_configs() if args.quick else (Figure1Config(), None, 100_000, ApplicationsConfig())
    )
    which = ["figure1", "words", "queries", "applications"] if args.which == "all" else [args.which]
    for w in which:
        if w == "words":
            try:
                cfg = words_config(args)
                res = words(out, args.reps, args.seed, cfg)
            except (RuntimeError, ValueError) as exc:
                print(f"words: {exc}", file=sys.stderr)
                if args.which == "words":
                    return 2
                continue
            print(res["table"])
        elif w == "figure1":
            res = figure1(out, args.reps, args.seed, f1)
            print(res["table"])
            print(res["matching"])
        elif w == "queries":
            res = queries(out, args.reps, args.seed, q_ds, q_n)
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
            res = applications(out, args.reps, args.seed, ap)
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
        description=__doc__,
    )
    p.add_argument("which", choices=["figure1", "words", "queries", "applications", "all"])
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per point (default: 5)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    p.add_argument("--n", help="words: number of users, comma-separated (default: 100000,1000000)")
    p.add_argument("--epsilon", help="words: ε per setting, comma-separated (default: 1,0.25)")
    p.add_argument("--window", help="words: candidate word ranks lo:hi (default: 101:1100)")
    p.add_argument("--parties", help="words: noise models, 1, 2 or 1,2 (default: 1,2)")
    p.set_defaults(handler=run)
