"""Sampler throughput: exact discrete Laplace / geometric draws per second.

Run: python -m svtagg.benchmarks.bench_noise [--draws N] [--repeats R]
Prints the median wall time of R runs of N draws for grid scales that occur in
practice (c·2^F/ε for F = 16 and ε from 10 down to 0.01).
"""

from __future__ import annotations

import argparse
import statistics
import time
from fractions import Fraction

from svtagg.dp.noise import RandomSource, discrete_laplace, geometric


def measure(fn, scale: Fraction, draws: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    rng = RandomSource()
    fn(scale, 1000, rng)  # warm the digit cache
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(scale, draws, rng)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--draws", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    print(f"exact samplers, {args.draws:,} draws, median of {args.repeats} runs")
    print(f"{'sampler':<18}{'scale (grid)':>16}{'seconds':>10}{'M draws/s':>11}")
    for eps in (Fraction(10), Fraction(1), Fraction(1, 100)):
        scale = 4 * Fraction(2**16) / eps
        for name, fn in (("discrete_laplace", discrete_laplace), ("geometric", geometric)):
            t = measure(fn, scale, args.draws, args.repeats)
            print(f"{name:<18}{float(scale):>16.4g}{t:>10.3f}{args.draws / t / 1e6:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
