"""Per-user embeddings: raw records → vectors in [0,1]^d, one per workload of the
paper.  Clients apply them before sharing; the analyst's local experiments apply
the same functions, so both sides agree on what a coordinate means."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


def fp_loss_embedding(residuals: npt.ArrayLike, bound: float, p: float) -> Array:
    """F_p losses: user value for candidate j is |v_ij|^p / b^p, clipped to [0, 1]."""
    v = np.abs(np.asarray(residuals, dtype=np.float64))
    return np.clip((v / bound) ** p, 0.0, 1.0)


def heavy_hitters_embedding(records: Iterable[Iterable[int]] | npt.ArrayLike, d: int) -> Array:
    """Heavy hitters with categories: an r-sparse 0/1 vector per user (coordinate j = 1
    iff the user holds category j).  Accepts a 0/1 matrix or lists of category ids."""
    if isinstance(records, np.ndarray):
        return np.clip(records.astype(np.float64), 0.0, 1.0)
    rows: list[list[int]] = [list(cats) for cats in records]  # type: ignore[arg-type,union-attr]
    out = np.zeros((len(rows), d))
    for i, cats in enumerate(rows):
        out[i, cats] = 1.0
    return out


def sparse_mean_clip(n: int, d: int, beta: float) -> float:
    """B = 1 + √(2 ln(8nd/β)) (Theorem 7.2): Gaussian entries exceed it w.p. ≤ β/(4nd)."""
    return 1.0 + math.sqrt(2 * math.log(8 * n * d / beta))


def sparse_mean_embedding(x: npt.ArrayLike, clip: float) -> Array:
    """Sparse mean: g_j(x) = (B + x̃_j)/(2B), x̃ = x clipped to [−B, B].  This is the
    σ = +1 score; the σ = −1 score (B − x̃_j)/(2B) is its complement (`Query(j, True)`)."""
    xc = np.clip(np.asarray(x, dtype=np.float64), -clip, clip)
    return (clip + xc) / (2 * clip)


def marginal_pairs(attributes: int) -> list[tuple[int, int]]:
    """The two-way marginal queries q_(a,b), a < b, in coordinate order."""
    return [(a, b) for a in range(attributes) for b in range(a + 1, attributes)]


def marginal_values(x: npt.ArrayLike) -> Array:
    """q_(a,b)(x) = 1[x_a = x_b = 1] for every pair, one row per record."""
    xb = np.asarray(x).astype(bool)
    pairs = marginal_pairs(xb.shape[1])
    return np.stack([xb[:, a] & xb[:, b] for a, b in pairs], axis=1).astype(np.float64)


def marginals_embedding(x: npt.ArrayLike) -> Array:
    """MWEM on two-way marginals: coordinate (q, σ=+1) is (1 + q(x))/2 ∈ [0, 1]; the
    σ = −1 score (1 − q(x))/2 is its complement."""
    return (1.0 + marginal_values(x)) / 2.0


#: Raw user records → [0,1]^d vectors, by workload name (shared with the client).
EMBEDDINGS: dict[str, Callable[..., Array]] = {
    "heavy_hitters": heavy_hitters_embedding,
    "sparse_mean": sparse_mean_embedding,
    "marginals": marginals_embedding,
    "fp_loss": fp_loss_embedding,
}
