"""What every experiment shares: seeded generators, planted data, the exact
error of the exponential mechanism and its ε-equivalence, the local oracle the
SVT algorithms run on, JSON output, and the figures' plotting helpers
(matplotlib, loaded only when a figure is drawn)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.mpc.ring import encode, sensitivity

FRAC_BITS = 16
GRID = sensitivity(FRAC_BITS)
BIG_BUDGET = 10**6  # experiments account their own ε; the oracle's cap is not the point


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


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def oracle_seed(rng: np.random.Generator) -> int:
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


def local_oracle(
    scores: npt.ArrayLike, n: int, seed: int, parties: int = 1, noise: str = "independent"
) -> LocalOracle:
    """An oracle on planted scores; `noise="joint"` simulates a joint-noise task
    (with a δ budget for the sampler's δ)."""
    sums = np.asarray(scores, dtype=np.int64) * GRID
    return LocalOracle.from_sums(
        sums, n, BIG_BUDGET, "1/2" if noise == "joint" else 0, FRAC_BITS, parties, seed, noise
    )


def grid_sums(chunks: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.int64]:
    """Sum embeddings exactly as clients encode them (chunked to bound memory)."""
    total: npt.NDArray[np.int64] | None = None
    for c in chunks:
        s = encode(c, FRAC_BITS).astype(np.int64).sum(axis=0)
        total = s if total is None else total + s
    assert total is not None
    return total


def write_result(out: Path, name: str, result: dict[str, Any]) -> Path:
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


#: What a run without matplotlib says (the figures need it; it is not a core dependency).
MATPLOTLIB_MISSING = (
    "the experiments draw their figures with matplotlib, which is not installed: "
    "pip install 'svtagg[experiments]'"
)


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported (checked before an experiment starts)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(MATPLOTLIB_MISSING) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def band(
    ax: Any, xs: Sequence[float], summ: Sequence[Mapping[str, Any]], label: str, **kw: Any
) -> None:
    med = [s["median"] for s in summ]
    ax.plot(xs, med, marker="o", label=label, **kw)
    ax.fill_between(xs, [s["q25"] for s in summ], [s["q75"] for s in summ], alpha=0.2)


def error_row(
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
    row["epsilon_equivalence_90"] = _equivalence_interval(errs, datasets, eps)
    return row


#: Bootstrap resamples of a method's runs for its ε-equivalence interval.
BOOTSTRAP = 2000


def _equivalence_interval(
    errs: list[float], datasets: Sequence[npt.ArrayLike], eps: float
) -> list[float | None]:
    """A 90% bootstrap interval of the ε-equivalence: the method's mean error
    resampled over its runs (fixed seed), EM's exact expectation on the same
    datasets kept; ε-equivalence falls as the mean error falls, so the interval
    is the equivalences at the 5% and 95% quantiles of the resampled mean.
    None at an end where it is undefined (a mean of 0)."""
    a = np.asarray(errs, dtype=np.float64)
    if a.size < 2:
        return [None, None]
    means = a[np.random.default_rng(0).integers(0, a.size, (BOOTSTRAP, a.size))].mean(axis=1)
    out: list[float | None] = []
    for m in np.quantile(means, [0.05, 0.95]):
        eq = em_equivalent_epsilon(datasets, float(m))
        out.append(eps / eq if 0 < eq < math.inf else None)
    return out


def fmt(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.1f}"


def fmt_eq(row: Mapping[str, Any]) -> str:
    """ε-equivalence for tables: '≥unif' when the method is no better than a uniform pick."""
    return "≥unif" if row.get("no_better_than_uniform") else fmt(row["epsilon_equivalence"])


def fmt_eq_range(row: Mapping[str, Any]) -> str:
    """`fmt_eq` with its 90% bootstrap interval, e.g. '2.3 (1.9–2.8)'."""
    lo, hi = row.get("epsilon_equivalence_90") or (None, None)
    if row.get("no_better_than_uniform") or (lo is None and hi is None):
        return fmt_eq(row)
    return f"{fmt_eq(row)} ({fmt(lo)}–{fmt(hi) if hi is not None else '≥unif'})"
