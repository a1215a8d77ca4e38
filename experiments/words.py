"""Selection on real word frequencies: each of n users holds one English word
(`wordfreq`'s frequency tables, in the `experiments` and `test` extras), and the
SVT methods are compared with the exponential mechanism and a shuffle-model
baseline at the same ε."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.analyst import baselines
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import (
    ScanOptions,
    geometric_binary_search,
    noisy_max_selection,
    practical_selection,
    scan_selection,
)
from svtagg.experiments.common import (
    Progress,
    em_expected_error,
    error_row,
    fmt,
    fmt_eq,
    fmt_eq_range,
    local_oracle,
    oracle_seed,
    pyplot,
    seeded_rng,
    summarize,
    write_result,
)


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


@dataclass
class WordsConfig:
    """Selection on real word frequencies: each user holds one English word."""

    settings: list[tuple[int, float]] = field(
        default_factory=lambda: [(100_000, 1.0), (1_000_000, 0.25)]
    )
    window: tuple[int, int] = (101, 1100)
    #: Noise models: 1 (one party), 2 (two servers, independent), "joint" (a
    #: joint-noise task: one draw of the garbled sampler per term).
    parties: tuple[int | str, ...] = (1, 2)


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
    (
        "noisy_max",
        "report-noisy-max (one tournament)",
        lambda o, e: noisy_max_selection(o, e, 0.1),
    ),
]


def words(
    out: Path, reps: int = 60, seed: int = 0, cfg: WordsConfig | None = None
) -> dict[str, Any]:
    """Selection error on real English word frequencies, one- and two-server noise.

    Candidates are the words ranked `window` (default 101–1100); each of n users holds
    one word drawn from the full frequency list.  Every SVT method is compared with
    the exponential mechanism at the same ε by its mean-error ratio and its
    ε-equivalence (see `error_row`), and by the comparisons it sent per candidate.
    """
    cfg = cfg or WordsConfig()
    freqs = word_frequencies(*cfg.window)
    bar = Progress(reps * len(cfg.settings), "words")
    rows: list[dict[str, Any]] = []
    for i, (n, eps) in enumerate(cfg.settings):
        datasets = [word_scores(n, freqs, seeded_rng(seed, 8, i, r)) for r in range(reps)]
        em_mean = float(np.mean([em_expected_error(sc, eps) for sc in datasets]))
        errs: dict[tuple[str, int | str], list[float]] = {}
        sent: dict[tuple[str, int | str], list[float]] = {}
        for r, scores in enumerate(datasets):
            best = float(scores.max())
            k = 0
            for p in cfg.parties:
                for key, _, fn in WORD_METHODS:
                    k += 1
                    seed_k = oracle_seed(seeded_rng(seed, 8, i, r, k))
                    oracle = (
                        local_oracle(scores, n, seed_k, 2, "joint")
                        if p == "joint"
                        else local_oracle(scores, n, seed_k, int(p))
                    )
                    res = fn(oracle, eps)
                    errs.setdefault((key, p), []).append(best - float(scores[res.index]))
                    spend = getattr(res, "spend", None)  # noisy-max: one tournament lane each
                    per = spend.queries_sent / len(scores) if spend is not None else 1.0
                    sent.setdefault((key, p), []).append(per)
            bar.tick(f"n={n} ε={eps}")
        head = {"n": n, "epsilon": eps}
        em_errs = [
            float(scores.max() - scores[baselines.exponential_mechanism(scores, eps, 1.0, g)])
            for scores, g in ((sc, seeded_rng(seed, 9, i, r)) for r, sc in enumerate(datasets))
        ]
        rows.append({**error_row(head, em_errs, em_mean, datasets, eps), "method": "em"})
        sh_errs = [
            float(scores.max() - scores[baselines.shuffled_rr_select(scores, n, eps, 1 / n**2, g)])
            for scores, g in ((sc, seeded_rng(seed, 13, i, r)) for r, sc in enumerate(datasets))
        ]
        rows.append({**error_row(head, sh_errs, em_mean, datasets, eps), "method": "shuffle"})
        for p in cfg.parties:
            for key, _, _ in WORD_METHODS:
                if (key, p) not in errs:
                    continue
                row = error_row(head, errs[(key, p)], em_mean, datasets, eps)
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
    write_result(out, "words", result)
    _plot_words(out, result)
    return result


def words_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'n':>8} {'ε':>5} {'method':<58} {'parties':>7} {'mean':>7} {'median':>6} "
        f"{'/EM':>6} {'ε-equiv (90%)':>16} {'cmp/cand':>8}"
    ]
    for r in result["rows"]:
        label = result["methods"][r["method"]]
        sent = r.get("sent_per_candidate", {}).get("mean")
        lines.append(
            f"{r['n']:>8} {r['epsilon']:>5} {label:<58} {r.get('parties', '—')!s:>7} "
            f"{r['mean']:>7.2f} {r['median']:>6.1f} {fmt(r['mean_ratio_to_em']):>6} "
            f"{fmt_eq_range(r):>16} {fmt(sent):>8}"
        )
    return "\n".join(lines)


#: Short names for the words figure's axis (the table keeps the long labels).
PLOT_NAMES = {
    "em": "EM (central)",
    "shuffle": "shuffled K-RR, (ε, 1/n²)",
    "scan": "scan, default",
    "scan_cheap": "scan, cheap end",
    "scan_accurate": "scan, accurate end",
    "practical": "practical",
    "alg8": "Alg 8",
    "noisy_max": "report-noisy-max",
}


def plot_label(row: dict[str, Any]) -> str:
    """A row's name on the words figure: the method's short name and its noise."""
    name = PLOT_NAMES.get(row["method"], row["method"])
    parties = row.get("parties")
    if parties is None:
        return name
    noise = {1: "1 party", 2: "2 servers", "joint": "joint noise"}.get(parties, str(parties))
    return f"{name} · {noise}"


def _plot_words(out: Path, result: dict[str, Any]) -> Path:
    plt = pyplot()
    settings = sorted({(r["n"], r["epsilon"]) for r in result["rows"]})
    height = 1.6 + 0.34 * max(
        sum(1 for r in result["rows"] if (r["n"], r["epsilon"]) == s) for s in settings
    )
    fig, axes = plt.subplots(
        1,
        len(settings),
        figsize=(1.8 + 5.2 * len(settings), height),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, (n, eps) in zip(axes[0], settings, strict=True):
        rows = [r for r in result["rows"] if (r["n"], r["epsilon"]) == (n, eps)]
        ys = [r["mean"] for r in rows]
        ax.barh(range(len(rows)), ys, color=[f"C{i % 10}" for i in range(len(rows))])
        for y, r in enumerate(rows):
            eq = fmt_eq(r)
            text = (
                f"  {r['mean']:.1f}  ("
                + ("no better than uniform" if eq == "≥unif" else f"ε-eq. {eq}×")
                + ")"
            )
            ax.text(r["mean"], y, text, va="center", fontsize=7.5)
        ax.set_yticks(range(len(rows)), [plot_label(r) for r in rows], fontsize=8)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, max(ys) * 150 + 10)  # room for the longest note
        ax.set_xlabel("mean error, users (symlog)", fontsize=9)
        ax.set_title(f"n = {n:,}, ε = {eps:g}, {result['config']['reps']} datasets", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()  # shared: once
    lo, hi = result["config"]["window"]
    fig.suptitle(
        f"Selection on word frequencies: one English word per user, candidates ranked {lo}–{hi}",
        fontsize=10,
    )
    path = out / "words.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
