"""The §7 applications: top-k recall against n (heavy hitters), sparse-mean ℓ2
error against n, and MWEM's largest query error against T, each next to its
aggregation or central baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.analyst import applications as apps
from svtagg.analyst import baselines
from svtagg.analyst.applications import TopKOptions
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.experiments.common import (
    BIG_BUDGET,
    FRAC_BITS,
    GRID,
    Progress,
    band,
    grid_sums,
    oracle_seed,
    pyplot,
    seeded_rng,
    summarize,
    write_result,
)
from svtagg.mpc.ring import encode


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
            g = seeded_rng(seed, 4, i, r)
            recs = _zipf_records(n, cfg.hh_d, cfg.hh_r, g)
            sums = grid_sums(_hh_embed_chunks(recs, cfg.hh_d))
            counts = sums // GRID
            # ties at the k-th count make "the" top-k ambiguous; use a stable order
            truth = set(np.argsort(-counts, kind="stable")[: cfg.hh_k].tolist())
            oracle = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=oracle_seed(g))
            res = apps.top_k_heavy_hitters(
                oracle, cfg.hh_k, eps, options=TopKOptions("tuned", rng=g)
            )
            rec["svt"].append(_recall(res.indices, truth))
            hh_q["svt"].append(res.spend.queries)
            # its own seed stream, so the other methods keep the draws they had before
            o2 = LocalOracle.from_sums(
                sums, n, BIG_BUDGET, seed=oracle_seed(seeded_rng(seed, 7, i, r))
            )
            res = apps.top_k_heavy_hitters(o2, cfg.hh_k, eps, options=TopKOptions("practical"))
            rec["svt_practical"].append(_recall(res.indices, truth))
            hh_q["svt_practical"].append(res.spend.queries)
            rec["laplace"].append(
                _recall(baselines.laplace_top_k(counts, cfg.hh_k, eps, cfg.hh_r, g), truth)
            )
            rec["gaussian"].append(
                _recall(baselines.gaussian_top_k(counts, cfg.hh_k, eps, 1 / n**2, g), truth)
            )
            o3 = LocalOracle.from_sums(
                sums, n, BIG_BUDGET, seed=oracle_seed(seeded_rng(seed, 10, i, r))
            )
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
            g = seeded_rng(seed, 5, i, r)
            mu = np.zeros(cfg.sm_d)
            support = g.choice(cfg.sm_d, cfg.sm_k, replace=False)
            mu[support] = g.choice([-1.0, 1.0], cfg.sm_k) * g.uniform(0.5, 1.0, cfg.sm_k)
            chunks = []
            for start in range(0, n, 5000):
                rows_ = min(5000, n - start)
                x = g.normal(mu, 1.0, (rows_, cfg.sm_d))
                chunks.append(apps.sparse_mean_embedding(x, clip))
            sums = grid_sums(chunks)
            oracle = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=oracle_seed(g))
            smr = apps.sparse_mean(oracle, cfg.sm_k, eps, beta, clip, rng=g)
            errs["svt"].append(float(np.linalg.norm(smr.mean - mu)))
            gm = baselines.gaussian_sparse_mean(sums / GRID, n, cfg.sm_k, clip, eps, 1 / n**2, g)
            errs["gaussian"].append(float(np.linalg.norm(gm - mu)))
            g9 = seeded_rng(seed, 11, i, r)
            o9 = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=oracle_seed(g9))
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
            g = seeded_rng(seed, 6, i, r)
            hist = _marginal_data(n, cfg.mwem_attributes, seeded_rng(seed, 6, r))
            sums = _marginal_sums(wl, hist)
            for m, delta in (("svt", 0.0), ("svt_adv", cfg.mwem_delta)):
                oracle = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=oracle_seed(g))
                mwr = apps.mwem_svt(oracle, wl, eps, 0.1, rounds=t_rounds, delta=delta)
                errs[m].append(apps.max_query_error(wl, hist, mwr.synthetic) / n)
            central = baselines.central_mwem(hist, wl, eps, t_rounds, g)
            errs["central"].append(apps.max_query_error(wl, hist, central) / n)
            g8 = seeded_rng(seed, 12, i, r)
            o8 = LocalOracle.from_sums(sums, n, BIG_BUDGET, seed=oracle_seed(g8))
            res8 = apps.mwem_svt(o8, wl, eps, 0.1, rounds=t_rounds, variant="paper")
            errs["svt_alg8"].append(apps.max_query_error(wl, hist, res8.synthetic) / n)
            bar.tick(f"MWEM T={t_rounds}")
        for m in mw:
            mw[m].append({"T": t_rounds, "max_error_over_n": errs[m], **summarize(errs[m])})
    uniform = (
        apps.max_query_error(
            wl,
            _marginal_data(n, cfg.mwem_attributes, seeded_rng(seed, 6, 0)),
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
    write_result(out, "applications", result)
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
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for m, rows in result["top_k"].items():
        band(axes[0], [r["n"] for r in rows], rows, m)
    axes[0].set_xscale("log")
    axes[0].set_ylabel("top-k recall")
    axes[0].set_xlabel("n")
    axes[0].set_title("heavy hitters (Thm 7.1)")
    for m, rows in result["sparse_mean"].items():
        band(axes[1], [r["n"] for r in rows], rows, m)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ℓ2 error of μ̂")
    axes[1].set_xlabel("n")
    axes[1].set_title("sparse mean (Thm 7.2)")
    for m, rows in result["mwem"].items():
        band(axes[2], [r["T"] for r in rows], rows, m)
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
