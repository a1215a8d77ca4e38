"""Benchmarks of the secure-comparison engine: garbling and evaluation speed,
end-to-end comparisons per second over the in-memory channel, bytes per
comparison, base-OT setup time. Medians of several runs.

    python -m svtagg.benchmarks.bench_mpc [--runs N] [--max-k K]

Throughput is reported against wall-clock time and against this process's CPU
time; on a shared machine the CPU-time figure is the per-core rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.circuits import bit_planes, planes, sign_yes
from svtagg.mpc.garble import EvalBackend, GarbleBackend
from svtagg.mpc.protocol import connected_pair


def _timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn` over `runs` runs."""
    walls, cpus = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return statistics.median(walls), statistics.median(cpus)


def bench_gates(k: int, runs: int) -> dict[str, float]:
    """AND gates/s of the sign circuit (63 AND per lane), garbling and evaluating."""
    rng = np.random.default_rng(1)
    delta = rng.integers(0, 2**64, 2, dtype=np.uint64)
    delta[0] |= np.uint64(1)
    a_bits = bit_planes(rng.integers(0, 2**64, k, dtype=np.uint64))
    b_bits = bit_planes(rng.integers(0, 2**64, k, dtype=np.uint64))
    b0 = rng.integers(0, 2**64, (64, k, 2), dtype=np.uint64)
    b = b0 ^ ((-(b_bits.astype(np.uint64)))[..., None] & delta)
    hasher = TweakableHash()
    state: dict[str, Any] = {}
    # The protocol reuses its table buffer across chunks; so does the benchmark
    # (first-touch page faults of a fresh buffer would otherwise halve the rate).
    buf = np.zeros((126 * k, 2), dtype=np.uint64)

    def garble() -> None:
        g = GarbleBackend(delta, hasher, 1, 126 * k - 1, buf)
        sign_yes(g, a_bits, planes(b0), k)
        state["g"] = g

    def evaluate() -> None:
        e = EvalBackend(hasher, 1, tables)
        sign_yes(e, None, planes(b), k)

    gw, gc = _timed(garble, runs)
    tables = state["g"].table_bytes()
    ew, ec = _timed(evaluate, runs)
    n_and = state["g"].and_gates
    return {
        "garble_wall": n_and / gw,
        "garble_cpu": n_and / gc,
        "eval_wall": n_and / ew,
        "eval_cpu": n_and / ec,
    }


async def bench_protocol(ks: list[int], runs: int, width: int = 64) -> dict[str, Any]:
    setups, setup_cpu = [], []
    for _ in range(max(3, runs)):
        t, c = time.perf_counter(), time.process_time()
        g, e = await connected_pair()
        setup_cpu.append(time.process_time() - c)
        setups.append(time.perf_counter() - t)
    out: dict[str, Any] = {
        "base_ot": statistics.median(setups),
        "base_ot_cpu": statistics.median(setup_cpu),
        "cmp": {},
    }
    rng = np.random.default_rng(2)
    for k in ks:
        # All NO: the worst case (the whole chunk is evaluated in every case anyway).
        sums = -rng.integers(1, min(2**40, 2 ** (width - 2)), k)  # |z| < 2^(w-1)
        z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
        z_h = sums.astype(np.int64).view(np.uint64) - z_l
        walls, cpus = [], []
        for _ in range(runs):
            w, c = time.perf_counter(), time.process_time()
            res = await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))
            cpus.append(time.process_time() - c)
            walls.append(time.perf_counter() - w)
            assert res == [None, None]
        st = g.last_stats
        out["cmp"][k] = {
            "wall": k / statistics.median(walls),
            "wall_min": k / max(walls),
            "wall_max": k / min(walls),
            "cpu": k / statistics.median(cpus),
            "bytes": (st.bytes_sent + st.bytes_received) / k,
            "and": st.and_gates / k,
            "messages": st.messages,
        }
    return out


async def bench_robust(ds: list[int], runs: int) -> dict[int, dict[str, float]]:
    """The close's robust-aggregate pass (g(S) re-shared) over d coordinates, in
    the leader's chunks of ROBUST_LANES: wall seconds and bytes between the parties."""
    from svtagg.servers.leader import ROBUST_LANES

    g, e = await connected_pair()
    rng = np.random.default_rng(3)
    out: dict[int, dict[str, float]] = {}
    for d in ds:
        s_l = rng.integers(0, 2**64, d, dtype=np.uint64)
        s_h = rng.integers(0, 2**64, d, dtype=np.uint64)
        walls, cpus = [], []
        traffic = 0
        for _ in range(runs):
            before = g.channel.bytes_sent + g.channel.bytes_received
            w, c = time.perf_counter(), time.process_time()
            for lo in range(0, d, ROBUST_LANES):
                hi = min(d, lo + ROBUST_LANES)
                await asyncio.gather(
                    g.clamp_reshare(s_l[lo:hi], d << 16), e.clamp_reshare(s_h[lo:hi], d << 16)
                )
            cpus.append(time.process_time() - c)
            walls.append(time.perf_counter() - w)
            traffic = g.channel.bytes_sent + g.channel.bytes_received - before
        out[d] = {
            "wall": statistics.median(walls),
            "cpu": statistics.median(cpus),
            "bytes": float(traffic),
            "and": float(e.last_stats.and_gates) / ((d - 1) % ROBUST_LANES + 1),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-k", type=int, default=100_000)
    ap.add_argument(
        "--robust-d", default="1000,10000", help="d values for the robust-aggregate pass"
    )
    ap.add_argument(
        "--width", type=int, default=40, help="narrow comparison width measured beside 64"
    )
    args = ap.parse_args(argv)
    ks = [k for k in (1_000, 10_000, 100_000) if k <= args.max_k]
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    gates = bench_gates(min(ks[-1], 65_536), args.runs)
    print(
        f"garbling   : {gates['garble_cpu'] / 1e6:6.2f} M AND/s per core (CPU time), "
        f"{gates['garble_wall'] / 1e6:6.2f} M AND/s wall   [target >= 5]"
    )
    print(
        f"evaluating : {gates['eval_cpu'] / 1e6:6.2f} M AND/s per core (CPU time), "
        f"{gates['eval_wall'] / 1e6:6.2f} M AND/s wall   [target >= 15]"
    )
    prot = asyncio.run(bench_protocol(ks, args.runs))
    narrow = asyncio.run(bench_protocol(ks, args.runs, args.width))
    print(
        f"base-OT setup (128 Chou–Orlandi OTs, both parties in one process):"
        f" {prot['base_ot']:.3f} s wall, {prot['base_ot_cpu']:.3f} s CPU   [target <= 2 s]"
    )
    for k, r in prot["cmp"].items():
        print(
            f"K = {k:>7,}: {r['wall']:>9,.0f} comparisons/s wall "
            f"(min {r['wall_min']:,.0f}, max {r['wall_max']:,.0f}), {r['cpu']:>9,.0f} per CPU-s;"
            f" {r['bytes']:,.0f} bytes/comparison, {r['and']:.1f} AND/comparison,"
            f" {r['messages']} messages"
        )
    for k, r in narrow["cmp"].items():
        full = prot["cmp"][k]
        print(
            f"K = {k:>7,}, w = {args.width}: {r['wall']:>9,.0f} comparisons/s wall "
            f"(min {r['wall_min']:,.0f}, max {r['wall_max']:,.0f}) "
            f"({r['wall'] / full['wall']:.2f}x the 64-bit run), {r['bytes']:,.0f} bytes/comparison "
            f"({r['bytes'] / full['bytes']:.2f}x), {r['and']:.1f} AND/comparison"
        )
    print("targets: >= 50,000 comparisons/s at K = 100,000; <= 4,096 bytes/comparison")
    robust = asyncio.run(bench_robust([int(x) for x in args.robust_d.split(",")], args.runs))
    for d, r in robust.items():
        print(
            f"robust aggregates, d = {d:>6,}: {r['wall']:.3f} s wall, {r['cpu']:.3f} s CPU "
            f"(both parties), {r['bytes'] / 1e6:,.1f} MB between them "
            f"({r['bytes'] / d:,.0f} bytes and {r['and']:.0f} AND per coordinate)"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
