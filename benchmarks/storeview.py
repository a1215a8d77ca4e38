"""A read-only view of one task in a server's SQLite store, for tests and the
load benchmark: the only place the share sums exist, so the only way to check
that S_L + S_H equals the plaintext sum (no RPC ever reveals a sum).  Safe to
use while the server runs (SQLite WAL, read-only connection).  Not for
production monitoring: it reads secret shares."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np


@dataclass
class StoreView:
    n: int
    sums: np.ndarray
    report_ids: set[bytes]
    epsilon_spent: Fraction
    delta_spent: Fraction
    streams: dict[str, str]


def store_view(path: str | Path, task_id: str) -> StoreView:
    """A read-only snapshot of one task in one server's store (safe while it runs)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        n, sums, eps, dl = db.execute(
            "SELECT n, sums, epsilon_spent, delta_spent FROM tasks WHERE task_id=?", (task_id,)
        ).fetchone()
        ids = {
            r[0] for r in db.execute("SELECT report_id FROM reports WHERE task_id=?", (task_id,))
        }
        streams = dict(
            db.execute(
                "SELECT stream_id, state FROM streams WHERE task_id=?", (task_id,)
            ).fetchall()
        )
    finally:
        db.close()
    return StoreView(
        int(n),
        np.frombuffer(sums, dtype=np.uint64).copy(),
        ids,
        Fraction(eps),
        Fraction(dl),
        streams,
    )


def encoded_sum(values: np.ndarray, frac_bits: int) -> np.ndarray:
    """Σ of the clients' encoded vectors mod 2^64: what S_L + S_H must equal."""
    from svtagg.mpc.ring import encode

    return np.asarray(encode(np.atleast_2d(values), frac_bits), dtype=np.uint64).sum(
        axis=0, dtype=np.uint64
    )
