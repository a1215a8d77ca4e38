"""Benchmarks of the secure-comparison engine, both engines side by side in one
run: the numpy reference and the native core (AES-NI).  Garbling and
evaluation of the comparison circuit, end-to-end comparisons per second over
the in-memory channel (both parties in this one process, so one core does all
the work), a single comparison's latency, bytes per comparison, base-OT setup
and the close's robust-aggregate pass.  Medians with min–max over the runs;
every line prints its target.  The comparison rows run once per OT extension
of `--ot` (default IKNP, SoftSpoken with k = 4 and Ferret, side by side).

    python -m svtagg.benchmarks.bench_mpc [--runs N] [--max-k K] [--width W] [--ot LIST]
        [--ot-path] [--schemes both [--schemes-only]] [--prefix both [--prefix-only]]

`--ot-path` adds the OT-based comparison path (`mpc.millionaire`) beside the
garbled rows: comparisons/s at K ≥ 10^3 and bytes per comparison, slot fills
included.

`--schemes both` adds half-gates and three-halves garbling side by side (AND/s,
comparisons/s at K = 10^3 and 10^4, bytes per comparison, on both engines),
their runs interleaved so that load drifts hit both schemes alike.
`--prefix both` sets the first-YES chunk's linear prefix OR (the circuit's)
beside the Brent–Kung one it replaced (`circuits.prefix_or_tree`), both
schemes, both engines, interleaved the same way: comparisons/s at K = 10^3 and
10^4, bytes and ANDs per comparison, and the prefix OR alone (garble +
evaluate) at K = 10^3, 10^4 and 10^5.

Throughput is wall-clock; on a shared machine compare the ratios (measured in
the same run) rather than absolute figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from svtagg.mpc import circuits, native
from svtagg.mpc.aes import TweakableHash
from svtagg.mpc.circuits import bit_planes, planes, sign_yes
from svtagg.mpc.protocol import connected_pair
from svtagg.mpc.threehalves import SCHEMES

Stat = tuple[float, float, float]  # median, min, max


def _stat(xs: list[float]) -> Stat:
    return statistics.median(xs), min(xs), max(xs)


def _rate(k: float, seconds: list[float]) -> Stat:
    """k per second: median, min (slowest run), max (fastest run)."""
    return k / statistics.median(seconds), k / max(seconds), k / min(seconds)


def _timed(fn: Callable[[], Any], runs: int) -> list[float]:
    walls = []
    for _ in range(runs):
        w = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w)
    return walls


def bench_gates(k: int, runs: int, width: int, scheme: str = "halfgates") -> dict[str, Stat]:
    """AND gates/s of the comparison's carry chain (width − 1 AND per lane)."""
    rng = np.random.default_rng(1)
    delta = rng.integers(0, 2**64, 2, dtype=np.uint64)
    delta[0] |= np.uint64(1)
    a_bits = bit_planes(rng.integers(0, 2**64, k, dtype=np.uint64))
    b0 = rng.integers(0, 2**64, (width, k, 2), dtype=np.uint64)
    b_bits = bit_planes(rng.integers(0, 2**64, k, dtype=np.uint64))[:width]
    b = b0 ^ ((-(b_bits.astype(np.uint64)))[..., None] & delta)
    nat = native.active() == "native"
    hasher: Any = native.NativeHash() if nat else TweakableHash()
    gcls, ecls = native.backends(native.active(), scheme)
    # The protocol reuses its table buffer across chunks; so does the benchmark.
    buf = np.zeros((2 * width * k + 1, 2), dtype=np.uint64)
    state: dict[str, Any] = {}

    def garble() -> None:
        g = gcls(delta, hasher, 1, 2 * width * k, buf)
        sign_yes(g, a_bits, planes(b0), k, width)
        state["g"] = g

    def evaluate() -> None:
        sign_yes(ecls(hasher, 1, tables), None, planes(b), k, width)

    gw = _timed(garble, runs)
    tables = state["g"].table_bytes()
    ew = _timed(evaluate, runs)
    n_and = state["g"].and_gates
    return {"garble": _rate(n_and, gw), "eval": _rate(n_and, ew)}


async def bench_protocol(
    ks: list[int],
    runs: int,
    width: int,
    ots: list[str | None],
    scheme: str = "halfgates",
    path: str = "garbled",
) -> dict[str | None, dict[int, dict[str, Any]]]:
    """First-YES chunks per OT extension, on the comparison `path` ("garbled" or
    "ot", `mpc.millionaire`); the extensions take turns within each repetition,
    so a change in the machine's load falls on all of them alike.  The OT
    path's bytes include its slot fills (each chunk fills the next one's)."""
    pairs = {ot: await connected_pair(scheme=scheme, ot=ot, path=path) for ot in ots}
    rng = np.random.default_rng(2)
    out: dict[str | None, dict[int, dict[str, Any]]] = {ot: {} for ot in ots}
    for k in ks:
        # All NO: the worst case (the whole chunk is evaluated in every case anyway).
        sums = -rng.integers(1, min(2**40, 2 ** (width - 2)), k)  # |z| < 2^(w-1)
        z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
        z_h = sums.astype(np.int64).view(np.uint64) - z_l
        reps = runs if k > 1 else max(200, runs)
        walls: dict[str | None, list[float]] = {ot: [] for ot in ots}
        for g, e in pairs.values():
            await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))  # warm
        traffic = {
            ot: g.channel.bytes_sent + g.channel.bytes_received for ot, (g, _) in pairs.items()
        }
        for _ in range(reps):
            for ot, (g, e) in pairs.items():
                w = time.perf_counter()
                res = await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))
                walls[ot].append(time.perf_counter() - w)
                assert res == [None, None]
        for ot, (g, _) in pairs.items():
            st = g.last_stats
            out[ot][k] = {
                "rate": _rate(k, walls[ot]),
                "latency_ms": _stat([1e3 * x for x in walls[ot]]),
                # amortized over the runs: a Ferret refill lands in some chunks only
                "bytes": (g.channel.bytes_sent + g.channel.bytes_received - traffic[ot])
                / (k * reps),
                "and": st.and_gates / k,
            }
    return out


async def bench_amortized(k: int, width: int, ot: str, refills: int = 3) -> Stat:
    """Comparisons/s over enough chunks of k for `refills` Ferret extensions (20
    chunks at least): all the comparisons over all the time, refills included."""
    from svtagg.mpc import ferret
    from svtagg.mpc.softspoken import parse_ot

    spec = parse_ot(ot)
    chunks = 20
    if spec[0] == "ferret":
        s = ferret.LPN_SETS[ferret.SET_NAMES[spec[1]]]
        chunks = max(chunks, -(-refills * (s.n - s.base) // (k * width)) + 1)
    g, e = await connected_pair(ot=ot)
    rng = np.random.default_rng(4)
    z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
    z_h = (-rng.integers(1, 2 ** (width - 2), k)).astype(np.int64).view(np.uint64) - z_l
    walls = []
    for _ in range(chunks):
        w = time.perf_counter()
        await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))
        walls.append(time.perf_counter() - w)
    rate = k * chunks / sum(walls)
    return rate, k / max(walls), k / min(walls)


async def bench_setup(runs: int, group: str | None = None, ext: str | None = None) -> Stat:
    """Seconds to set up a garbler/evaluator pair (128 base OTs, the extension's setup)."""
    from svtagg.mpc import ot

    walls = []
    saved = ot.default_group
    if group is not None:
        ot.default_group = lambda: group  # type: ignore[assignment]
    try:
        for _ in range(max(3, runs)):
            t = time.perf_counter()
            await connected_pair(ot=ext)
            walls.append(time.perf_counter() - t)
    finally:
        ot.default_group = saved  # type: ignore[assignment]
    return _stat(walls)


async def bench_robust(d: int, runs: int) -> dict[str, Any]:
    """The close's robust-aggregate pass (g(S) re-shared) over d coordinates, in
    the leader's chunks of ROBUST_LANES: wall seconds and bytes between the parties."""
    from svtagg.servers.leader import ROBUST_LANES

    g, e = await connected_pair()
    rng = np.random.default_rng(3)
    s_l = rng.integers(0, 2**64, d, dtype=np.uint64)
    s_h = rng.integers(0, 2**64, d, dtype=np.uint64)
    walls = []
    traffic = 0
    for _ in range(runs):
        before = g.channel.bytes_sent + g.channel.bytes_received
        w = time.perf_counter()
        for lo in range(0, d, ROBUST_LANES):
            hi = min(d, lo + ROBUST_LANES)
            await asyncio.gather(
                g.clamp_reshare(s_l[lo:hi], d << 16), e.clamp_reshare(s_h[lo:hi], d << 16)
            )
        walls.append(time.perf_counter() - w)
        traffic = g.channel.bytes_sent + g.channel.bytes_received - before
    return {"seconds": _stat(walls), "bytes": traffic / d}


def _fmt(s: Stat, scale: float = 1.0, digits: int = 0) -> str:
    m, lo, hi = (x * scale for x in s)
    return f"{m:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def bench_schemes(engines: list[str], runs: int, width: int) -> dict[tuple[str, str], Any]:
    """Both schemes on every engine, one run of each per round (interleaved)."""
    out: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for _ in range(runs):
        for eng in engines:
            native.use(eng)
            for scheme in SCHEMES:
                r = out.setdefault((eng, scheme), {"g": [], "e": [], "k3": [], "k4": []})
                gates = bench_gates(10_000, 1, width, scheme)
                r["g"].append(gates["garble"][0])
                r["e"].append(gates["eval"][0])
                p = asyncio.run(bench_protocol([1_000, 10_000], 1, width, [None], scheme))[None]
                r["k3"].append(p[1_000]["rate"][0])
                r["k4"].append(p[10_000]["rate"][0])
                r["bytes"] = [p[1_000]["bytes"], p[10_000]["bytes"]]
    return out


def print_schemes(res: dict[tuple[str, str], Any], runs: int, width: int) -> None:
    print(
        f"\nhalf-gates vs three-halves, w = {width}: median (min–max) over {runs} interleaved runs"
    )
    print(
        "engine  scheme       garble M AND/s     eval M AND/s       "
        "cmp/s K=10^3              cmp/s K=10^4              bytes/cmp (K=10^3, 10^4)"
    )
    for (eng, scheme), r in res.items():
        b3, b4 = r["bytes"]
        print(
            f"{eng:<7} {scheme:<12} {_fmt(_stat(r['g']), 1e-6, 2):<18} "
            f"{_fmt(_stat(r['e']), 1e-6, 2):<18} {_fmt(_stat(r['k3'])):<25} "
            f"{_fmt(_stat(r['k4'])):<25} {b3:,.1f}, {b4:,.1f}"
        )


PREFIXES = {"linear": circuits.prefix_or, "tree": circuits.prefix_or_tree}


@contextlib.contextmanager
def _prefix(name: str) -> Iterator[None]:
    """Run the chunk circuits with the named prefix OR."""
    before = circuits.prefix_or
    circuits.prefix_or = PREFIXES[name]  # type: ignore[assignment]
    try:
        yield
    finally:
        circuits.prefix_or = before  # type: ignore[assignment]


def _prefix_alone(k: int, scheme: str, name: str) -> float:
    """Seconds to garble and evaluate the prefix OR alone over k wires."""
    rng = np.random.default_rng(3)
    d = rng.integers(0, 2**64, 2, dtype=np.uint64)
    d[0] |= np.uint64(1)
    x = rng.integers(0, 2**64, (k, 2), dtype=np.uint64)
    gb, eb = native.backends(native.active(), scheme)
    h = native.NativeHash() if native.active() == "native" else TweakableHash()
    t = time.perf_counter()
    g = gb(d, h, 5)
    PREFIXES[name](g, x)
    PREFIXES[name](eb(h, 5, g.table_bytes()), x)
    return time.perf_counter() - t


def bench_prefix(engines: list[str], runs: int, width: int) -> dict[tuple[str, ...], Any]:
    """Linear vs Brent–Kung prefix OR, every engine and scheme, interleaved."""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for _ in range(runs):
        for eng in engines:
            native.use(eng)
            for scheme in SCHEMES:
                for name in PREFIXES:
                    r = out.setdefault((eng, scheme, name), {"k3": [], "k4": [], "alone": {}})
                    with _prefix(name):
                        p = asyncio.run(bench_protocol([1_000, 10_000], 1, width, [None], scheme))[
                            None
                        ]
                    r["k3"].append(p[1_000]["rate"][0])
                    r["k4"].append(p[10_000]["rate"][0])
                    r["bytes"] = p[10_000]["bytes"]
                    r["and"] = p[10_000]["and"]
                    for k in (1_000, 10_000, 100_000):
                        r["alone"].setdefault(k, []).append(_prefix_alone(k, scheme, name))
    return out


def print_prefix(res: dict[tuple[str, ...], Any], runs: int, width: int) -> None:
    print(f"\nlinear vs Brent–Kung prefix OR, w = {width}: median (min–max) over {runs} runs")
    print(
        "engine  scheme       prefix  cmp/s K=10^3              cmp/s K=10^4              "
        "bytes/cmp  AND/cmp  prefix alone ms, K=10^3 | 10^4 | 10^5"
    )
    for (eng, scheme, name), r in res.items():
        alone = " | ".join(_fmt(_stat(r["alone"][k]), 1e3, 1) for k in (1_000, 10_000, 100_000))
        print(
            f"{eng:<7} {scheme:<12} {name:<7} {_fmt(_stat(r['k3'])):<25} "
            f"{_fmt(_stat(r['k4'])):<25} {r['bytes']:>9,.1f}  {r['and']:>7.2f}  {alone}"
        )
    for eng, scheme in {(e, s) for e, s, _ in res}:
        lin, tree = res[(eng, scheme, "linear")], res[(eng, scheme, "tree")]
        ratios = [a / b for a, b in zip(lin["k4"], tree["k4"], strict=True)]
        print(
            f"{eng} {scheme}: linear/tree cmp/s at K=10^4, per-round ratio "
            f"{_fmt(_stat(ratios), 1.0, 3)}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-k", type=int, default=100_000)
    ap.add_argument("--width", type=int, default=40, help="comparison width (40: typical task)")
    ap.add_argument("--robust-d", type=int, default=1000, help="d of the robust-aggregate pass")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="native-core threads (1: the one-core figures; the servers default to all cores)",
    )
    ap.add_argument(
        "--cpus",
        type=int,
        default=1,
        help="pin this process to this many CPUs (1: the one-core figures; both parties "
        "and every thread share them)",
    )
    ap.add_argument(
        "--ot",
        default="iknp,softspoken:4,ferret",
        help="comma-separated OT extensions for the comparison rows: iknp, softspoken:k "
        "(k in 1, 2, 4, 8), ferret[:set] (set in b10, b11, b12, b13)",
    )
    ap.add_argument(
        "--ot-path",
        action="store_true",
        help="add the OT-based comparison path's rows (comparisons/s, bytes) at K > 1",
    )
    ap.add_argument("--schemes", choices=["halfgates", "both"], default="halfgates")
    ap.add_argument("--schemes-only", action="store_true", help="only the scheme comparison")
    ap.add_argument("--prefix", choices=["linear", "both"], default="linear")
    ap.add_argument("--prefix-only", action="store_true", help="only the prefix comparison")
    args = ap.parse_args(argv)
    ots = args.ot.split(",")
    if hasattr(os, "sched_setaffinity") and args.cpus > 0:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cpus]))
    ks = [k for k in (1, 1_000, 10_000, 100_000) if k <= args.max_k]
    engines = ["numpy"] + (["native"] if native.available() else [])
    threads_before = native.threads()
    native.set_threads(args.threads)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"engines: {', '.join(engines)}; native core: {native.describe()}")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"native-core threads for this run: {args.threads}; pinned to {cpus} CPU(s)")
    before = native.active()
    res: dict[str, dict[str, Any]] = {}
    if args.prefix == "both":
        try:
            pre = bench_prefix(engines, args.runs, args.width)
        finally:
            native.use(before)
        print_prefix(pre, args.runs, args.width)
        if args.prefix_only:
            native.set_threads(threads_before)
            return
    if args.schemes == "both":
        try:
            sch = bench_schemes(engines, args.runs, args.width)
        finally:
            native.use(before)
        print_schemes(sch, args.runs, args.width)
        if args.schemes_only:
            native.set_threads(threads_before)
            return
    try:
        for eng in engines:
            native.use(eng)
            r: dict[str, Any] = {}
            r["gates"] = bench_gates(min(ks[-1], 65_536), args.runs, args.width)
            r["cmp"] = asyncio.run(bench_protocol(ks, args.runs, args.width, list(ots)))
            r["amortized"] = {
                (ot, k): asyncio.run(bench_amortized(k, args.width, ot))
                for ot in ots
                for k in ks
                if k > 1
            }
            r["cmp64"] = asyncio.run(bench_protocol([ks[-1]], args.runs, 64, [None]))[None]
            if args.ot_path:  # the OT-based comparison path, default OT extension
                r["ot_path"] = asyncio.run(
                    bench_protocol(ks[1:], args.runs, args.width, [None], path="ot")
                )[None]
            r["robust"] = asyncio.run(bench_robust(args.robust_d, args.runs))
            res[eng] = r
    finally:
        native.use(before)
        native.set_threads(threads_before)
    setup = asyncio.run(bench_setup(args.runs, "ed25519", "iknp"))
    setups = {ot: asyncio.run(bench_setup(args.runs, "ed25519", ot)) for ot in ots}
    setup_modp = asyncio.run(bench_setup(args.runs, "modp3072"))
    w = args.width
    best = engines[-1]

    def row(name: str, get: Callable[[dict[str, Any]], Stat], target: str, **kw: Any) -> None:
        cells = [f"{eng}: {_fmt(get(res[eng]), **kw)}" for eng in engines]
        ratio = ""
        if len(engines) == 2:
            a, b = get(res["numpy"])[0], get(res["native"])[0]
            ratio = f"  native/numpy {b / a:.2f}x"
        print(f"{name}\n    {'   '.join(cells)}{ratio}   [target {target}]")

    print(f"\nmedian (min–max) over {args.runs} runs; K = 1 over ≥ 200 runs; width w = {w}")
    row(
        f"garbling, M AND/s (carry chain, w = {w})",
        lambda r: r["gates"]["garble"],
        "none (component)",
        scale=1e-6,
        digits=2,
    )
    row(
        f"evaluating, M AND/s (carry chain, w = {w})",
        lambda r: r["gates"]["eval"],
        "none (component)",
        scale=1e-6,
        digits=2,
    )
    for k in ks:
        for ot in ots:
            if k == 1:

                def latency(r: dict[str, Any], ot: str = ot) -> Stat:
                    return r["cmp"][ot][1]["latency_ms"]  # type: ignore[no-any-return]

                row(
                    f"single comparison in-process (K = 1), ms, OT {ot}",
                    latency,
                    "<= 0.1 ms",
                    digits=3,
                )
                continue
            tgt = ">= 250,000 (K = 100,000, one core)" if k == 100_000 else "none"

            def rate(r: dict[str, Any], k: int = k, ot: str = ot) -> Stat:
                return r["cmp"][ot][k]["rate"]  # type: ignore[no-any-return]

            row(f"comparisons/s in-process, K = {k:,}, w = {w}, OT {ot}", rate, tgt)
    for k in ks[1:]:
        for ot in ots:

            def amortized(r: dict[str, Any], k: int = k, ot: str = ot) -> Stat:
                return r["amortized"][(ot, k)]  # type: ignore[no-any-return]

            row(
                f"comparisons/s in-process, K = {k:,}, OT {ot}, amortized over ≥ 20 chunks "
                "(Ferret: 3 refills), slowest–fastest chunk",
                amortized,
                "none",
            )
    kmax = ks[-1]
    row(
        f"comparisons/s in-process, K = {kmax:,}, w = 64 (default OT)",
        lambda r: r["cmp64"][kmax]["rate"],
        "none",
    )
    for ot in ots:
        cmp = res[best]["cmp"][ot][kmax]
        print(
            f"bytes/comparison at w = {w}, OT {ot}: {cmp['bytes']:,.0f} "
            f"({cmp['and']:.1f} AND/comparison)   [target <= 2,000]"
        )
        if ot.startswith("ferret"):
            from svtagg.mpc import ferret
            from svtagg.mpc.softspoken import parse_ot

            name = ferret.SET_NAMES[parse_ot(ot)[1]]
            print(
                f"    OT bytes/comparison once the pool runs on {name}: "
                f"{ferret.steady_bytes_per_ot(name) * w:.2f} (w = {w})"
            )
    print(f"bytes/comparison at w = 64 (default OT): {res[best]['cmp64'][kmax]['bytes']:,.0f}")
    if args.ot_path:
        for k in ks[1:]:

            def ot_rate(r: dict[str, Any], k: int = k) -> Stat:
                return r["ot_path"][k]["rate"]  # type: ignore[no-any-return]

            row(
                f"comparisons/s in-process, K = {k:,}, w = {w}, OT path (default OT)",
                ot_rate,
                "none",
            )
        ot_bytes = res[best]["ot_path"][kmax]["bytes"]
        print(
            f"bytes/comparison at w = {w}, OT path (default OT): {ot_bytes:,.1f}   [target <= 300]"
        )
    row(
        f"robust-aggregate pass, d = {args.robust_d:,}, seconds",
        lambda r: r["robust"]["seconds"],
        "none",
        digits=3,
    )
    print(
        f"base-OT setup (128 Chou–Orlandi OTs on Ed25519, both parties here): "
        f"{_fmt(setup, digits=3)} s   [target <= 0.1 s]; in the 3072-bit MODP group "
        f"(the reference): {_fmt(setup_modp, digits=3)} s"
    )
    for ot in ots:
        print(
            f"setup with OT {ot} (base OTs, the extension's setup): {_fmt(setups[ot], digits=3)} s"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
