"""svtagg through both servers side by side with EMP-toolkit's sh2pc, in one run.

EMP-toolkit (C++, semi-honest half-gates + IKNP) is the reference point for the
comparison engine.  This module contains no EMP code: it runs an external
driver program, built by the user against EMP-toolkit, as two processes over
loopback TCP, and svtagg through its two server processes (mutual TLS, SQLite,
native core, comparison data channel: `bench_system`'s deployment, chunk loop
and single-query loop), alternating the two in rounds, and prints one table:
comparisons/s at chunks of K = 10^3, 10^4 and 10^5, the single-comparison
latency, bytes per comparison, and the svtagg/EMP ratios; each figure is the
median over the rounds with the min–max of the rounds' own medians.

    python -m svtagg.benchmarks.bench_emp --emp /path/to/driver [--rounds 3] [--quick]

What both sides compute per chunk: K pairs of additive shares (a_j, b_j) of
width w, YES_j = NOT the sign bit of (a_j + b_j) mod 2^w (w − 1 AND gates),
then the first YES (a prefix OR, its one-hot) revealed as an index.  w is the
width svtagg's servers derive for the benchmark's streams (the task "cmp",
n_max = 10^4, ε = 1: 34 bits), and EMP is run at the same w.

The driver's interface (what this module expects; see docs/scaling.md):

    DRIVER <party 1|2> <port> --sizes K:reps,... --width w --mode MODE

party 1 listens on 127.0.0.1:<port> and garbles, party 2 connects and
evaluates; after setup each K is timed `reps` times, and party 1 prints one
JSON line per K:
{"event": "chunk", "k": K, "reps": r, "bytes_per_cmp": B, "and_per_cmp": A,
"cpu_s_per_chunk": [c1, c2], "times_s": [...]}, and first
{"event": "setup", "setup_s": s, ...}.  MODE names the driver's way of building
the circuit (for example "integer" for one EMP Integer per share, "batch" for
the inputs of many lanes fed at once); each mode given to --emp-modes is one
EMP column.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.benchmarks.bench_system import (
    CMP_N_MAX,
    CONFIGS,
    bench_chunks,
    bench_floor,
    bench_single,
    comparison_task,
)
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.dp.kinds import stream_width
from svtagg.dp.queries import Query

#: The comparison width of svtagg's chunks here, which EMP is given too.
WIDTH = stream_width(CMP_N_MAX, 16, "lap24", Fraction(1))
SIZES = (1000, 10_000, 100_000)
QUICK_SIZES = (1000, 10_000)

HOW_TO_BUILD = """\
bench_emp needs an EMP-toolkit driver program: --emp /path/to/driver.

The project does not ship or build EMP code.  To make a driver: build
emp-tool, emp-ot and emp-sh2pc (github.com/emp-toolkit, branch v0.3.x) with
CMake in Release mode and install them under one prefix outside this
repository; then write a small sh2pc program that takes
"<party 1|2> <port> --sizes K:reps,... --width w --mode MODE", sets up a
semi-honest session over NetIO on 127.0.0.1:<port> (party 1 listening), and
for each K times `reps` chunks after one untimed warm-up: both parties'
K w-bit shares as circuit inputs, the sign bit of each sum, a prefix OR and
one-hot of the first YES, the first YES index revealed to both.  Party 1
prints one JSON line per K with the times, the bytes both parties' NetIO
channels sent per comparison and the AND gates per comparison, as described
in this module's docstring and in docs/scaling.md ("Side by side with
EMP-toolkit").  Link it against the installed emp-tool with the same CMake
helpers the EMP tests use, and pass the executable's path with --emp."""


class DriverError(RuntimeError):
    """The EMP driver did not run or printed something unexpected."""


@dataclass(frozen=True)
class EmpVariant:
    """One EMP column: the driver's mode, optionally both processes on one CPU."""

    mode: str
    one_core: bool = False

    @property
    def label(self) -> str:
        return f"EMP {self.mode}" + (", one core" if self.one_core else "")


def parse_driver_output(text: str) -> dict[str, Any]:
    """Party 1's stdout → {"setup_s": float | None, "chunks": {K: line}}."""
    out: dict[str, Any] = {"setup_s": None, "chunks": {}}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise DriverError(f"unreadable driver line {line!r}: {e}") from None
        if d.get("event") == "setup":
            out["setup_s"] = float(d["setup_s"])
        elif d.get("event") == "chunk":
            times = [float(t) for t in d["times_s"]]
            if not times:
                raise DriverError(f"no timings for K = {d.get('k')}")
            out["chunks"][int(d["k"])] = {
                "times_s": times,
                "bytes_per_cmp": float(d["bytes_per_cmp"]),
                "and_per_cmp": float(d.get("and_per_cmp", 0.0)),
                "cpu_s_per_chunk": d.get("cpu_s_per_chunk"),
            }
    if not out["chunks"]:
        raise DriverError("the driver printed no chunk timings")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pin_to_one_cpu() -> None:  # runs in the child before exec
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def run_emp(
    driver: Path, plan: dict[int, int], variant: EmpVariant, timeout: float = 600.0
) -> dict[str, Any]:
    """Both driver processes over loopback; plan = {K: timed repetitions}."""
    port = _free_port()
    sizes = ",".join(f"{k}:{r}" for k, r in plan.items())
    common = ["--sizes", sizes, "--width", str(WIDTH), "--mode", variant.mode]
    pre = _pin_to_one_cpu if variant.one_core else None
    garbler = subprocess.Popen(
        [str(driver), "1", str(port), *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=pre,
    )
    evaluator = subprocess.Popen(
        [str(driver), "2", str(port), *common],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=pre,
    )
    try:
        out, err1 = garbler.communicate(timeout=timeout)
        _, err2 = evaluator.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        garbler.kill()
        evaluator.kill()
        garbler.wait()
        evaluator.wait()
        raise DriverError(f"the EMP driver did not finish within {timeout:.0f} s") from None
    if garbler.returncode or evaluator.returncode:
        raise DriverError(
            f"the EMP driver failed (exit {garbler.returncode} / {evaluator.returncode}): "
            f"{(err1 + err2).strip()[-500:]}"
        )
    return parse_driver_output(out)


def emp_plan(quick: bool) -> dict[int, int]:
    if quick:
        return {1: 50, 1000: 5, 10_000: 3}
    return {1: 200, 1000: 20, 10_000: 10, 100_000: 3}


def svtagg_round(oracle: RemoteOracle, quick: bool, dep: LocalDeployment) -> dict[str, Any]:
    """One round through both servers: single queries on one open stream (and
    the floor under them, `bench_floor`), then NO-answering chunks, a stream
    per chunk and all on one open stream."""
    before = oracle.stats().peer_bytes
    count = 30 if quick else 200
    single = bench_single(oracle, count)
    single["peer_bytes_per_query"] = round((oracle.stats().peer_bytes - before) / count, 1)
    single.update(bench_floor(dep, count))
    sizes = QUICK_SIZES if quick else SIZES
    reps = 2 if quick else 5
    per_chunk: list[dict[str, Any]] = []
    one_stream: list[dict[str, Any]] = []
    for k in sizes:
        # bench_chunks runs a third of the repetitions at K >= 10^5
        r = reps if k < 100_000 else 3 * max(1, reps // 2)
        per_chunk += bench_chunks(oracle, [k], r)
        one_stream += bench_chunks(oracle, [k], r, one_stream=True)
    return {"single_query": single, "chunks": per_chunk, "chunks_one_stream": one_stream}


def _median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _emp_row(run: dict[str, Any], k: int) -> dict[str, Any]:
    """One EMP run's figures at K ({} if not measured); K is a string key
    once the results went through JSON."""
    chunks = run["chunks"]
    row = chunks.get(k, chunks.get(str(k)))
    return row if row is not None else {}


def emp_rate(run: dict[str, Any], k: int) -> float | None:
    """Comparisons/s of one EMP run at K (K over the median chunk time)."""
    row = _emp_row(run, k) or None
    return None if row is None else k / statistics.median(row["times_s"])


def emp_latency_ms(run: dict[str, Any]) -> float | None:
    row = _emp_row(run, 1) or None
    return None if row is None else 1e3 * statistics.median(row["times_s"])


def svtagg_rate(rnd: dict[str, Any], key: str, k: int) -> float | None:
    row = next((r for r in rnd[key] if r["chunk"] == k), None)
    return None if row is None else float(row["comparisons_per_s_median"])


def svtagg_bytes(rnd: dict[str, Any], key: str, k: int) -> float | None:
    row = next((r for r in rnd[key] if r["chunk"] == k), None)
    return None if row is None else row["peer_MB_per_chunk"] * 1e6 / k


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per figure: median and min–max over the rounds of each round's median."""
    rounds = results["rounds"]
    sizes = QUICK_SIZES if results["quick"] else SIZES
    cols: dict[str, dict[str, Any]] = {}

    def put(col: str, fig: str, values: list[float | None]) -> None:
        vals = [v for v in values if v is not None]
        if vals:
            cols.setdefault(col, {})[fig] = _median_range(vals)

    for label in results["emp_variants"]:
        runs = [r["emp"][label] for r in rounds]
        put(label, "bytes:1", [_emp_row(x, 1).get("bytes_per_cmp") for x in runs])
        for k in sizes:
            put(label, f"rate:{k}", [emp_rate(x, k) for x in runs])
            put(label, f"bytes:{k}", [_emp_row(x, k).get("bytes_per_cmp") for x in runs])
            put(label, f"and:{k}", [_emp_row(x, k).get("and_per_cmp") for x in runs])
        put(label, "latency_ms", [emp_latency_ms(x) for x in runs])
        put(label, "setup_ms", [None if x["setup_s"] is None else 1e3 * x["setup_s"] for x in runs])
    for key, col in (
        ("chunks", "svtagg, stream per chunk"),
        ("chunks_one_stream", "svtagg, one stream"),
    ):
        for k in sizes:
            put(col, f"rate:{k}", [svtagg_rate(r["svtagg"], key, k) for r in rounds])
            put(col, f"bytes:{k}", [svtagg_bytes(r["svtagg"], key, k) for r in rounds])
        put(col, "latency_ms", [r["svtagg"]["single_query"]["p50_ms"] for r in rounds])
        for floor in ("grpc_unary_p50_ms", "fsync_commit_p50_ms"):
            put(col, floor, [r["svtagg"]["single_query"].get(floor) for r in rounds])
        put(col, "p99_ms", [r["svtagg"]["single_query"]["p99_ms"] for r in rounds])
        single = [r["svtagg"]["single_query"].get("peer_bytes_per_query") for r in rounds]
        put(col, "bytes:1", single if key == "chunks_one_stream" else [])
        # paired: svtagg over the first EMP column, within each round
        ref = results["emp_variants"][0]
        for k in sizes:
            put(
                col,
                f"ratio:{k}",
                [
                    _ratio(svtagg_rate(r["svtagg"], key, k), emp_rate(r["emp"][ref], k))
                    for r in rounds
                ],
            )
        put(
            col,
            "latency_ratio",
            [
                _ratio(r["svtagg"]["single_query"]["p50_ms"], emp_latency_ms(r["emp"][ref]))
                for r in rounds
            ],
        )
    return cols


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _fmt(fig: tuple[float, float, float] | None, digits: int = 0) -> str:
    if fig is None:
        return "—"
    med, lo, hi = fig
    return f"{med:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def print_table(results: dict[str, Any]) -> list[str]:
    """The side-by-side table (markdown), printed and returned as lines.  The
    ratios are svtagg's figure over the first EMP column's in the same round
    (median and min–max over the rounds)."""
    cols = summarize(results)
    sizes = QUICK_SIZES if results["quick"] else SIZES
    emp = results["emp_variants"]
    per_chunk, one = "svtagg, stream per chunk", "svtagg, one stream"
    ref = emp[0]
    head = [*emp, per_chunk, one, f"svtagg/{ref} in each round: per chunk; one stream"]
    lines = [f"| K | {' | '.join(head)} |", "|---" * (len(head) + 1) + "|"]

    def get(col: str, fig: str) -> tuple[float, float, float] | None:
        return cols.get(col, {}).get(fig)

    def ratio(fig: tuple[float, float, float] | None) -> str:
        return "—" if fig is None else f"{fig[0]:.2f}× ({fig[1]:.2f}–{fig[2]:.2f})"

    for k in sizes:
        cells = [_fmt(get(n, f"rate:{k}")) for n in [*emp, per_chunk, one]]
        r = f"{ratio(get(per_chunk, f'ratio:{k}'))}; {ratio(get(one, f'ratio:{k}'))}"
        lines.append(f"| {k:,}: comparisons/s | {' | '.join(cells)} | {r} |")

    def micro(fig: tuple[float, float, float] | None) -> tuple[float, float, float] | None:
        return None if fig is None else (1e3 * fig[0], 1e3 * fig[1], 1e3 * fig[2])

    lat = [_fmt(micro(get(n, "latency_ms"))) + " µs" for n in emp]
    p50, p99 = get(one, "latency_ms"), get(one, "p99_ms")
    p99_text = "—" if p99 is None else f"{p99[0]:.1f}"
    lat += ["—", _fmt(p50, 2) + f" ms p50 (p99 {p99_text} ms)"]
    lr = get(one, "latency_ratio")
    times = "—" if lr is None else f"{lr[0]:.0f}× ({lr[1]:.0f}–{lr[2]:.0f}) the latency"
    lines.append(f"| 1 (single comparison): latency | {' | '.join(lat)} | {times} |")
    rpc, commit = get(one, "grpc_unary_p50_ms"), get(one, "fsync_commit_p50_ms")
    if rpc is not None and commit is not None:
        text = f"{_fmt(rpc, 2)} ms a bare gRPC call to the leader; "
        floor = ["—"] * (len(emp) + 1) + [text + f"{_fmt(commit, 2)} ms an fsync'd commit"]
        lines.append(f"| 1: floor under the latency (p50) | {' | '.join(floor)} | |")
    byt1 = [_fmt(get(n, "bytes:1")) for n in [*emp, per_chunk, one]]
    lines.append(f"| 1: bytes per comparison | {' | '.join(byt1)} | |")
    big = sizes[-1]
    byt = [_fmt(get(n, f"bytes:{big}")) for n in [*emp, per_chunk, one]]
    lines.append(f"| {big:,}: bytes per comparison | {' | '.join(byt)} | |")
    ands = [_fmt(get(n, f"and:{big}"), 2) for n in emp] + ["w − 1 + prefix (< 2)"] * 2
    lines.append(f"| {big:,}: AND gates per comparison | {' | '.join(ands)} | |")
    setup = [_fmt(get(n, "setup_ms"), 1) + " ms" for n in emp] + ["—", "—"]
    lines.append(f"| EMP session setup (base OTs, first COT batch) | {' | '.join(setup)} | |")
    print("\n".join(lines))
    return lines


def pool_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results as one, their rounds pooled (same sizes and EMP
    columns required), each run's load kept."""
    if not runs:
        raise ValueError("no runs to pool")
    first = runs[0]
    for r in runs[1:]:
        if r["quick"] != first["quick"] or r["emp_variants"] != first["emp_variants"]:
            raise ValueError("the runs differ in sizes (--quick) or EMP columns")
    pooled = dict(first, rounds=[rnd for r in runs for rnd in r["rounds"]])
    pooled["loads"] = [(r["load_start"], r["load_end"]) for r in runs]
    rounds, loads = len(pooled["rounds"]), "; ".join(f"{a} → {b}" for a, b in pooled["loads"])
    print(f"{len(runs)} runs, {rounds} rounds pooled; load average per run: {loads}")
    return pooled


def _emp_variants(modes: str, one_core: bool) -> list[EmpVariant]:
    out = [EmpVariant(m.strip()) for m in modes.split(",") if m.strip()]
    if one_core and out:
        out.append(EmpVariant(out[0].mode, one_core=True))
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_rounds(
    driver: Path, variants: list[EmpVariant], rounds: int, quick: bool
) -> dict[str, Any]:
    """Alternating rounds (EMP first in even rounds, svtagg first in odd ones),
    one deployment and one warm analyst session for all of them."""
    engine, args = CONFIGS["native+data"]
    results: dict[str, Any] = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "quick": quick,
        "width": WIDTH,
        "engine": engine,
        "emp_driver": str(driver),
        "emp_variants": [v.label for v in variants],
        "load_start": _load(),
        "rounds": [],
    }
    saved = os.environ.get("SVTAGG_BACKEND")
    os.environ["SVTAGG_BACKEND"] = engine  # the server processes inherit it
    try:
        with LocalDeployment(server_args=UNCAPPED_SERVER_ARGS + args) as dep:
            comparison_task(dep)
            with RemoteOracle.from_certs(dep.address("leader"), "cmp", dep.certs) as oracle:
                oracle.open_stream(1).ask([(Query(0), 2 * oracle.n)])  # warm the session
                for i in range(rounds):
                    rnd: dict[str, Any] = {"load_start": _load(), "emp": {}}
                    order = ("emp", "svtagg") if i % 2 == 0 else ("svtagg", "emp")
                    for side in order:
                        t = time.perf_counter()
                        if side == "emp":
                            for v in variants:
                                rnd["emp"][v.label] = run_emp(driver, emp_plan(quick), v)
                        else:
                            rnd["svtagg"] = svtagg_round(oracle, quick, dep)
                        print(f"[round {i + 1}] {side}: {time.perf_counter() - t:.1f} s")
                    rnd["load_end"] = _load()
                    results["rounds"].append(rnd)
    finally:
        if saved is None:
            os.environ.pop("SVTAGG_BACKEND", None)
        else:
            os.environ["SVTAGG_BACKEND"] = saved
    results["load_end"] = _load()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--emp", type=Path, help="the EMP-toolkit driver executable (not shipped)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="K = 10^3 and 10^4 only, fewer repetitions")
    p.add_argument(
        "--emp-modes",
        default="batch,integer",
        help="driver modes, one EMP column each (default: batch,integer)",
    )
    p.add_argument(
        "--emp-one-core",
        action="store_true",
        help="one more EMP column: the first mode with both processes on one CPU",
    )
    p.add_argument("--out", default="results/bench_emp.json")
    p.add_argument(
        "--table",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="print the table of earlier runs' --out files, their rounds pooled (runs nothing)",
    )
    args = p.parse_args(argv)
    if args.table:
        try:
            print_table(pool_runs([json.loads(f.read_text()) for f in args.table]))
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--table: {e}")
        return 0
    if args.emp is None:
        p.error("no EMP driver given (--emp).\n\n" + HOW_TO_BUILD)
    driver = args.emp.resolve()
    if not driver.is_file() or not os.access(driver, os.X_OK):
        p.error(f"--emp {args.emp}: not an executable file.\n\n" + HOW_TO_BUILD)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    variants = _emp_variants(args.emp_modes, args.emp_one_core)
    if not variants:
        p.error("--emp-modes names no mode")
    print(f"load average at start: {_load()} on {os.cpu_count()} CPUs")
    results = run_rounds(driver, variants, args.rounds, args.quick)
    rounds = len(results["rounds"])
    print(
        f"\ncomparisons/s, median (min–max) over {rounds} rounds of each round's median; "
        f"w = {WIDTH}; load average {results['load_start']} → {results['load_end']}"
    )
    results["table"] = print_table(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
