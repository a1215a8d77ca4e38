"""Synthetic per-user data for the demo and the simulation (simulated users, not
shares or noise: numpy's seeded generator is the right tool here)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from svtagg.client.embeddings import heavy_hitters_embedding


def zipf_categories(
    users: int, d: int, exponent: float, per_user: int, seed: int
) -> list[list[int]]:
    """Each user holds up to `per_user` distinct categories drawn from Zipf(exponent) on d."""
    gen = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, d + 1) ** exponent
    label = gen.permutation(d)  # the popular categories are not simply 0, 1, 2, ...
    draws = label[gen.choice(d, size=(users, per_user), p=p / p.sum())]
    return [sorted(set(row)) for row in draws.tolist()]


def workload(name: str, n: int, d: int, seed: int) -> npt.NDArray[np.float64]:
    if name == "heavy_hitters":
        return heavy_hitters_embedding(zipf_categories(n, d, 1.1, 3, seed), d)
    return np.random.default_rng(seed).random((n, d))
