"""Prio3 cost per report (svtagg.vdaf, draft-irtf-cfrg-vdaf-07): proof generation
(sharding) on the client, preparation on both aggregators, upload bytes.

Run: python -m svtagg.benchmarks.bench_vdaf [--reports N]
Prints, per instance, the median and min–max over N reports of the shard time
and of the preparation time (prep_init on both aggregators, combining the prep
shares, prep_next on both), and the bytes a client uploads (public share plus
both input shares, in the draft's encoding).  The chunk length of ParallelSum
is the one giving the shortest proof (draft §7.4.3.1: found by trial).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from svtagg.vdaf.circuits import Histogram, SumVec
from svtagg.vdaf.flp import FlpGeneric, Valid
from svtagg.vdaf.prio3 import NONCE_SIZE, Prio3, prio3_histogram, prio3_sum_vec


def best_chunk(meas_len: int, make: Callable[[int], Valid]) -> int:
    """The ParallelSum chunk length with the shortest proof for this measurement length."""
    return min(range(1, meas_len + 1), key=lambda c: FlpGeneric(make(c)).proof_len)


def measure(vdaf: Prio3, measurement: object, reports: int) -> dict[str, float | int]:
    key = os.urandom(16)
    shard_t, prep_t, upload = [], [], 0
    for _ in range(reports + 1):  # the first report warms caches and is not counted
        nonce = os.urandom(NONCE_SIZE)
        t0 = time.perf_counter()
        public, inputs = vdaf.shard(measurement, nonce)
        t1 = time.perf_counter()
        states, shares = [], []
        for j in range(vdaf.shares):
            st, ps = vdaf.prep_init(key, j, nonce, public, inputs[j])
            states.append(st)
            shares.append(ps)
        msg = vdaf.prep_shares_to_prep(shares)
        for st in states:
            vdaf.prep_next(st, msg)
        t2 = time.perf_counter()
        shard_t.append(t1 - t0)
        prep_t.append(t2 - t1)
        upload = len(vdaf.encode_public_share(public)) + sum(
            len(vdaf.encode_input_share(s)) for s in inputs
        )
    shard_t, prep_t = shard_t[1:], prep_t[1:]
    return {
        "shard_ms": statistics.median(shard_t) * 1e3,
        "shard_min": min(shard_t) * 1e3,
        "shard_max": max(shard_t) * 1e3,
        "prep_ms": statistics.median(prep_t) * 1e3,
        "prep_min": min(prep_t) * 1e3,
        "prep_max": max(prep_t) * 1e3,
        "upload": upload,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reports", type=int, default=20)
    args = p.parse_args(argv)

    d_vec, bits, d_hist = 100, 17, 1000
    c_vec = best_chunk(d_vec * bits, lambda c: SumVec(d_vec, bits, c))
    c_hist = best_chunk(d_hist, lambda c: Histogram(d_hist, c))
    cases = [
        (
            f"SumVec d={d_vec} bits={bits} chunk={c_vec}",
            prio3_sum_vec(d_vec, bits, c_vec),
            [(1 << 16) - i for i in range(d_vec)],
        ),
        (f"Histogram d={d_hist} chunk={c_hist}", prio3_histogram(d_hist, c_hist), 417),
    ]
    print(f"Prio3 (draft-07, two aggregators), {args.reports} reports each; ms: median [min–max]")
    print(f"{'instance':<34}{'shard (client)':>24}{'prepare (both)':>24}{'upload B':>10}")
    for name, vdaf, m in cases:
        r = measure(vdaf, m, args.reports)
        shard = f"{r['shard_ms']:.2f} [{r['shard_min']:.2f}–{r['shard_max']:.2f}]"
        prep = f"{r['prep_ms']:.2f} [{r['prep_min']:.2f}–{r['prep_max']:.2f}]"
        print(f"{name:<34}{shard:>24}{prep:>24}{r['upload']:>10,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
