"""What one report-noisy-max costs against the scan selection, on the engine and
through the one-process reference pair (`servers.reference`: a leader and a
helper driver on their own SQLite stores, the real garbled circuits; both in
this process, so the seconds are one core's).

1. Engine: AND gates and bytes per candidate of the tournament
   (`noisy_max`) and per query of a first-YES chunk (`first_yes`), both at the
   comparison width the servers derive for the task below; and the same
   tournament run as a chunked one (`--chunks` chunks, the winner carried
   between them: `noisy_max_carry`, then `noisy_max` with the carry).
2. Servers: a task of n users and d coordinates (0/1 values whose column sums
   are the experiments' planted scores); one NoisyMax chunk over every
   coordinate, the same candidates as one stream of `--chunks` NoisyMax
   chunks, and one Ask chunk of d queries that never says YES — the bytes
   between the servers (`peer_bytes`) and the time of each.
3. The scan selection's comparisons per candidate on the same sums, from the
   local two-party oracle (the same streams and noise the servers would run),
   which with (2) gives the scan's bytes through the servers.

    python -m svtagg.benchmarks.bench_noisy_max [--n 10000] [--d 1000] [--epsilon 1] [--chunks 4]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection import scan_selection
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import MAX_CHUNK
from svtagg.dp.task import TaskSpec
from svtagg.experiments.common import planted_scores
from svtagg.mpc.circuits import argmax_and_gates, plain_argmax
from svtagg.mpc.protocol import connected_pair
from svtagg.mpc.tournament import TournamentChunk, noisy_max_chunk_and_gates
from svtagg.servers.exchange.values import Ask, NoisyMax, OpenStream, Queries
from svtagg.servers.reference import reference_pair

F = 16


async def engine(k: int, width: int) -> dict[str, dict[str, float]]:
    """Per candidate (tournament) and per query (first-YES chunk) at width w."""
    rng = np.random.default_rng(k)
    a = rng.integers(0, 2**64, k, dtype=np.uint64)
    small = rng.integers(-(1 << 20), 1 << 20, k).astype(np.int64).view(np.uint64)
    g, e = await connected_pair()
    out = {}
    for name in ("noisy_max", "first_yes"):
        b = small - a  # z_L + z_H well inside the width; a NO everywhere for first_yes
        if name == "first_yes":
            b = (-(1 << 30) - np.abs(small.view(np.int64))).view(np.uint64) - a
        start = time.perf_counter()
        await asyncio.gather(getattr(g, name)(a, width), getattr(e, name)(b, width))
        seconds = time.perf_counter() - start
        st = g.last_stats
        out[name] = {
            "and_gates": st.and_gates / k,
            "bytes": (st.bytes_sent + st.bytes_received) / k,
            "seconds": seconds,
        }
    assert out["noisy_max"]["and_gates"] * k == argmax_and_gates(k, width)
    return out


async def engine_chunked(k: int, chunks: int, width: int) -> dict[str, float]:
    """Per candidate, the tournament over k candidates in `chunks` chunks: the
    winner carried XOR-shared, only the last chunk revealing the index."""
    rng = np.random.default_rng(k)
    a = rng.integers(0, 2**64, k, dtype=np.uint64)
    b = rng.integers(-(1 << 20), 1 << 20, k).astype(np.int64).view(np.uint64) - a
    g, e = await connected_pair()
    size = -(-k // chunks)
    ands = nbytes = 0
    carry: tuple[Any, Any] = (None, None)
    start = time.perf_counter()
    for lo in range(0, k, size):
        hi = min(k, lo + size)
        za, zb = a[lo:hi], b[lo:hi]
        if hi < k:
            carry = await asyncio.gather(
                g.noisy_max_carry(za, carry[0], lo, width),
                e.noisy_max_carry(zb, carry[1], lo, width),
            )
        else:
            j = await asyncio.gather(
                g.noisy_max(za, width, carry[0], lo), e.noisy_max(zb, width, carry[1], lo)
            )
        st = g.last_stats
        ands += st.and_gates
        nbytes += st.bytes_sent + st.bytes_received
        assert st.and_gates == noisy_max_chunk_and_gates(
            hi - lo, width, TournamentChunk(lo, lo > 0, hi == k)
        )
    seconds = time.perf_counter() - start
    assert j == [plain_argmax(a, b, width)] * 2
    return {"and_gates": ands / k, "bytes": nbytes / k, "seconds": seconds}


def data(n: int, d: int, seed: int = 0) -> np.ndarray:
    """0/1 rows whose column sums are the planted scores of the experiments
    (`experiments.common.planted_scores`: the best at n/2, one candidate per
    score unit below it): user i holds coordinate j iff i < s_j."""
    scores = planted_scores(n, d, np.random.default_rng(seed))
    return (np.arange(n)[:, None] < scores[None, :]).astype(np.float64)


async def servers(n: int, d: int, epsilon: str, chunks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with reference_pair(Path(tmp)) as ref:
            spec = TaskSpec("bench", d, F, n, 1, "100", "0", "1/1000")
            await ref.leader.create_task(spec)
            rows = data(n, d)
            for lo in range(0, n, 1000):
                ref.upload("bench", rows[lo : lo + 1000])
            await ref.leader.close_collection("bench")
            task = ref.leader.core.task("bench")
            every = Queries(np.arange(d))
            info = await ref.leader.open_stream(OpenStream("bench", StreamKind.NMAX, epsilon))
            stream = ref.leader.core.stream(info.stream_id)
            width = ref.leader.core.comparison_width(task, stream)
            start = time.perf_counter()
            nm = await ref.leader.noisy_max(NoisyMax(info.stream_id, every))
            nm_seconds = time.perf_counter() - start
            info = await ref.leader.open_stream(OpenStream("bench", StreamKind.NMAX, epsilon))
            size = -(-d // chunks)
            start = time.perf_counter()
            parts = []
            for lo in range(0, d, size):
                part = Queries(np.arange(lo, min(d, lo + size)))
                more = lo + size < d
                parts.append(await ref.leader.noisy_max(NoisyMax(info.stream_id, part, more)))
            chunked_seconds = time.perf_counter() - start
            lap = await ref.leader.open_stream(OpenStream("bench", StreamKind.LAP24, epsilon))
            never = np.full(d, 2 * n << F)  # τ = 2n: no YES, every query compared
            start = time.perf_counter()
            ask = await ref.leader.ask(Ask(lap.stream_id, every, never))
            ask_seconds = time.perf_counter() - start
            assert ask.index is None
            sums = ref.leader.core.query_sums(task) + ref.helper.core.query_sums(task)
    return {
        "width": width,
        "noisy_max": {"index": nm.index, "bytes": nm.peer_bytes, "seconds": nm_seconds},
        "chunked": {
            "index": parts[-1].index,
            "chunks": len(parts),
            "bytes": sum(p.peer_bytes for p in parts),
            "seconds": chunked_seconds,
        },
        "ask": {"bytes": ask.peer_bytes, "seconds": ask_seconds},
        "sums": sums.astype(np.int64),
    }


def scan_comparisons(sums: np.ndarray, n: int, epsilon: str, runs: int) -> float:
    """Queries the scan selection sends per candidate (mean over runs)."""
    per = []
    for seed in range(runs):
        oracle = LocalOracle.from_sums(sums, n, 10**6, frac_bits=F, parties=2, seed=seed)
        scan_selection(oracle, epsilon, 0.05)
        per.append(oracle.stats().queries / sums.size)
    return float(np.mean(per))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--d", type=int, default=1000)
    ap.add_argument("--epsilon", default="1")
    ap.add_argument("--scan-runs", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=4, help="chunks of the chunked tournament")
    ap.add_argument(
        "--large", type=int, default=250_000, help="engine: a tournament of this many candidates"
    )
    args = ap.parse_args()
    n, d = args.n, args.d
    srv = asyncio.run(servers(n, d, args.epsilon, args.chunks))
    w = srv["width"]
    print(f"servers' comparison width for n_max={n}, F={F}, ε={args.epsilon}: w = {w}")
    for k in (1000, 10_000):
        eng = asyncio.run(engine(k, w))
        nm, fy = eng["noisy_max"], eng["first_yes"]
        print(
            f"engine, k={k:,}: tournament {nm['and_gates']:.1f} ANDs and {nm['bytes']:,.0f} B "
            f"per candidate ({nm['seconds']:.3f} s); first-YES {fy['and_gates']:.1f} ANDs and "
            f"{fy['bytes']:,.0f} B per query ({fy['seconds']:.3f} s)"
        )
        ch = asyncio.run(engine_chunked(k, args.chunks, w))
        print(
            f"engine, k={k:,} in {args.chunks} chunks: {ch['and_gates']:.1f} ANDs and "
            f"{ch['bytes']:,.0f} B per candidate ({ch['seconds']:.3f} s)"
        )
    if args.large:
        chunks = -(-args.large // MAX_CHUNK)
        ch = asyncio.run(engine_chunked(args.large, chunks, w))
        print(
            f"engine, k={args.large:,} in {chunks} chunks of ≤ {MAX_CHUNK:,}: "
            f"{ch['and_gates']:.1f} ANDs and {ch['bytes']:,.0f} B per candidate, "
            f"{ch['bytes'] * args.large / 1e6:,.0f} MB ({ch['seconds']:.2f} s)"
        )
    nm, ask, ch = srv["noisy_max"], srv["ask"], srv["chunked"]
    print(
        f"servers, n={n:,}, d={d:,}: NoisyMax over all d: {nm['bytes'] / 1e6:.2f} MB "
        f"({nm['bytes'] / d:,.0f} B per candidate), {nm['seconds']:.3f} s; an Ask chunk of d "
        f"queries: {ask['bytes'] / 1e6:.2f} MB ({ask['bytes'] / d:,.0f} B per query), "
        f"{ask['seconds']:.3f} s"
    )
    print(
        f"servers, n={n:,}, d={d:,}: the same tournament in {ch['chunks']} NoisyMax chunks: "
        f"{ch['bytes'] / 1e6:.2f} MB ({ch['bytes'] / d:,.0f} B per candidate), "
        f"{ch['seconds']:.3f} s (index {ch['index']}; one chunk: {nm['index']})"
    )
    cmp = scan_comparisons(srv["sums"], n, args.epsilon, args.scan_runs)
    scan_bytes = cmp * d * ask["bytes"] / d
    print(
        f"scan selection at ε={args.epsilon}: {cmp:.0f} comparisons per candidate "
        f"(mean of {args.scan_runs} local two-party runs) ≈ {scan_bytes / 1e6:.0f} MB through "
        f"the servers, {scan_bytes / nm['bytes']:.0f}× the noisy-max's"
    )


if __name__ == "__main__":
    main()
