"""Sampler throughput: exact discrete Laplace / geometric draws per second,
and joint noise generated ahead of time next to independent noise.

Run: python -m svtagg.benchmarks.bench_noise [--draws N] [--repeats R]
         [--chunks 1000,10000] [--joint-repeats R] [--joint-only]
Prints the median wall time of R runs of N draws for grid scales that occur in
practice (c·2^F/ε for F = 16 and ε from 10 down to 0.01).  Then, through the
one-process reference pair (both servers in this process, native engine,
SQLite stores, F = 16, lap24 at ε = 1): the offline generation of joint noise
(`LeaderDriver.fill_pool`: AND gates, bytes and seconds per sample), and the
online Ask chunks of each size, independent noise, joint noise from the pool
and joint noise drawn in the chunk interleaved, comparisons/s median (min–max)
over the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.dp.noise import RandomSource, discrete_laplace, geometric
from svtagg.dp.task import TaskSpec
from svtagg.mpc.jointnoise import and_gates_per_sample
from svtagg.servers.exchange.joint import shapes
from svtagg.servers.exchange.values import Ask, OpenStream, Queries
from svtagg.servers.reference import reference_pair
from svtagg.servers.store.jointpool import MAX_BATCH

F = 16
D = 1000
USERS = 100


def measure(fn, scale: Fraction, draws: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    rng = RandomSource()
    fn(scale, 1000, rng)  # warm the digit cache
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(scale, draws, rng)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def joint_vs_independent(sizes: list[int], repeats: int) -> dict[str, Any]:
    """Offline generation of every joint sample the pooled chunks use, then the
    chunks: for each size, `repeats` rounds of (an independent-noise chunk, a
    joint-noise chunk served wholly from the pool, and for reference one that
    draws its joint noise in the chunk), every answer NO (τ above every score),
    so all k queries are compared."""
    out: dict[str, Any] = {"sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        async with reference_pair(Path(tmp), frac_bits=F) as ref:
            ref.leader.noise_pool = None  # generation is timed here, not in the background
            for task_id, noise in (("ind", "independent"), ("joint", "joint")):
                spec = TaskSpec(task_id, D, F, USERS, 1, "1000", "1/1000", "1/100", noise=noise)
                await ref.leader.create_task(spec)
                ref.upload(task_id, np.random.default_rng(4).random((USERS, D)))
                await ref.leader.close_collection(task_id)
            _, nu_shape = shapes(joint_stream_noise(StreamKind.LAP24, Fraction(1), F))
            out["and_gates_per_sample"] = and_gates_per_sample(nu_shape)
            gen_seconds = gen_bytes = gen_samples = 0.0
            for k in sizes:
                streams = {}
                for name, task_id in (("ind", "ind"), ("joint", "joint"), ("chunk", "joint")):
                    info = await ref.leader.open_stream(OpenStream(task_id, StreamKind.LAP24, "1"))
                    streams[name] = info.stream_id
                need, first = k * repeats, True
                while need:
                    batch = min(need, MAX_BATCH)
                    t = time.perf_counter()
                    sent = await ref.leader.fill_pool(streams["joint"], batch, gamma=first)
                    gen_seconds += time.perf_counter() - t
                    assert sent is not None
                    gen_bytes += sent
                    gen_samples += batch + first
                    need -= batch
                    first = False
                index = Queries(np.arange(k) % D)
                never = np.full(k, 4 * USERS << F)
                walls: dict[str, list[float]] = {name: [] for name in streams}
                peer: dict[str, int] = {}
                for _ in range(repeats):
                    for name, sid in streams.items():
                        t = time.perf_counter()
                        answer = await ref.leader.ask(Ask(sid, index, never))
                        walls[name].append(time.perf_counter() - t)
                        assert answer.index is None
                        peer[name] = answer.peer_bytes
                pool = ref.leader.core.store.joint_pool(streams["joint"])
                assert pool.used == k * repeats  # every joint ν came from the pool
                out["sizes"][k] = {
                    name: {"rate": _rate(k, walls[name]), "bytes": peer[name]} for name in walls
                }
            out["generation"] = {
                "samples": gen_samples,
                "seconds": gen_seconds,
                "bytes_per_sample": gen_bytes / gen_samples,
                "samples_per_second": gen_samples / gen_seconds,
            }
    return out


def _rate(k: int, seconds: list[float]) -> tuple[float, float, float]:
    """k per second: median, min (slowest run), max (fastest run)."""
    return k / statistics.median(seconds), k / max(seconds), k / min(seconds)


def print_joint(r: dict[str, Any], repeats: int) -> None:
    g = r["generation"]
    print()
    print("joint noise ahead of time (reference pair, one process, lap24, eps = 1, F = 16)")
    print(
        f"offline generation: {r['and_gates_per_sample']:,} AND gates/sample, "
        f"{g['bytes_per_sample']:,.0f} bytes/sample, {g['samples_per_second']:,.0f} samples/s "
        f"({g['samples']:,.0f} samples in {g['seconds']:.1f} s, batches of <= {MAX_BATCH:,})"
    )
    print(f"online Ask chunks, comparisons/s, median (min-max) of {repeats}, interleaved:")
    heads = ("independent noise", "joint, from the pool", "joint, drawn in chunk")
    print(f"{'chunk':>8}  {heads[0]:>34}  {heads[1]:>34}  {'pool/ind':>8}  {heads[2]:>34}")
    for k, row in r["sizes"].items():
        cells = []
        for name in ("ind", "joint", "chunk"):
            med, lo, hi = row[name]["rate"]
            cells.append(f"{med:,.0f} ({lo:,.0f}-{hi:,.0f}), {row[name]['bytes'] / k:,.0f} B/q")
        ratio = row["joint"]["rate"][0] / row["ind"]["rate"][0]
        print(f"{k:>8,}  {cells[0]:>34}  {cells[1]:>34}  {ratio:>8.2f}  {cells[2]:>34}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--draws", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunks", default="1000,10000", help="Ask chunk sizes, comma-separated")
    p.add_argument("--joint-repeats", type=int, default=5)
    p.add_argument("--joint-only", action="store_true", help="skip the plaintext samplers")
    args = p.parse_args(argv)
    if not args.joint_only:
        samplers(args.draws, args.repeats)
    sizes = [int(x) for x in args.chunks.split(",")]
    print_joint(asyncio.run(joint_vs_independent(sizes, args.joint_repeats)), args.joint_repeats)
    return 0


def samplers(draws: int, repeats: int) -> None:
    print(f"exact samplers, {draws:,} draws, median of {repeats} runs")
    print(f"{'sampler':<18}{'scale (grid)':>16}{'seconds':>10}{'M draws/s':>11}")
    for eps in (Fraction(10), Fraction(1), Fraction(1, 100)):
        scale = 4 * Fraction(2**16) / eps
        for name, fn in (("discrete_laplace", discrete_laplace), ("geometric", geometric)):
            t = measure(fn, scale, draws, repeats)
            print(f"{name:<18}{float(scale):>16.4g}{t:>10.3f}{draws / t / 1e6:>11.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
