"""A top-k through two server processes on a task with independent noise and
on tasks with joint noise, side by side in one run (`LocalDeployment`: two
`svtagg server` processes with the default flags, the CLI as a user runs it).

Rows, in this order:
1. independent task, first run;
2. joint task A, first run, cold (the noise made during the run);
3. the leader's preparation of A's shapes between runs (off the run's path);
4. joint task A, second run (what the leader prepared between runs);
5. joint task B, created afterwards: `analyst prepare-noise --like` A's first
   summary, `--wait`, while B's collection is open (off the run's path);
6. joint task B, first run (noise prepared while collecting);
7. independent task, second run.

Each row starts once the helper has been quiet for 6 s (the leader's
preparation of earlier runs' shapes done).  Time is the `analyst run`
command's wall clock; bytes are what the helper
process read and wrote (/proc/PID/io: it talks to the leader and to its own
store only, so this is the traffic between the servers plus the helper's
store).  Data: d categories with a Zipf(1.1) popularity, one per user, a
`sparse-onehot` task; "found" is how many of the true top-k the run returned.

    python -m svtagg.benchmarks.bench_joint_topk [--d 2000] [--n 20000] [--k 10] [--epsilon 1]

Linux only (/proc); about two minutes at the defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _io(pid: int) -> int:
    fields = dict(
        line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines() if line
    )
    return int(fields["rchar"]) + int(fields["wchar"])


def _quiet(pid: int, still: float = 6.0) -> float:
    """Wait until the helper has moved under 200 kB for `still` seconds; the
    seconds it was busy."""
    start, last, calm = time.perf_counter(), _io(pid), 0.0
    while calm < still:
        time.sleep(0.5)
        now = _io(pid)
        calm = calm + 0.5 if now - last < 200_000 else 0.0
        last = now
    return time.perf_counter() - start - still


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d", type=int, default=2000)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--epsilon", default="1")
    args = p.parse_args(argv)

    import svtagg
    from svtagg.deploy.launch import LocalDeployment

    rng = np.random.default_rng(7)
    weights = 1.0 / np.arange(1, args.d + 1) ** 1.1
    items = rng.choice(args.d, size=args.n, p=weights / weights.sum())
    values = np.zeros((args.n, args.d))
    values[np.arange(args.n), items] = 1.0
    true = set(np.argsort(-np.bincount(items, minlength=args.d))[: args.k].tolist())
    cli = [sys.executable, "-m", "svtagg.deploy.cli"]
    rows: list[tuple[str, float, int, str]] = []

    with tempfile.TemporaryDirectory() as tmp, LocalDeployment(Path(tmp) / "dep") as dep:
        common = ["--leader", dep.address("leader"), "--certs", str(dep.certs)]
        helper = dep.procs["helper"].pid
        conn = svtagg.connect(dep.address("leader"), certs=dep.certs, helper=dep.address("helper"))

        def create(task: str, noise: str) -> None:
            r = subprocess.run(
                [*cli, "analyst", "create-task", *common, "--task", task, "--d", str(args.d),
                 "--min-batch", "1", "--noise", noise, "--validity", "sparse-onehot",
                 "--epsilon", "10", "--epsilon-min", "1/64"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if r.returncode:
                raise SystemExit(r.stderr)

        def collect(task: str) -> None:
            conn.upload(task, values)
            conn.task(task).close_collection()

        def run(task: str, label: str) -> dict[str, Any]:
            _quiet(helper)  # nothing else running (a preparation) when the run starts
            before, start = _io(helper), time.perf_counter()
            r = subprocess.run(
                [*cli, "analyst", "run", *common, "--task", task, "--algorithm", "top-k",
                 "--k", str(args.k), "--epsilon", args.epsilon],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            seconds, moved = time.perf_counter() - start, _io(helper) - before
            if r.returncode:
                raise SystemExit(r.stderr)
            out: dict[str, Any] = json.loads(r.stdout)
            found = len(true & set(out["selected"]))
            drawn = out.get("noise_drawn_in_chunks")
            note = f"found {found}/{args.k}" + (
                "" if drawn is None else f", noise drawn in chunks for {drawn:,} queries"
            )
            rows.append((label, seconds, moved, note))
            out["_text"] = r.stdout
            return out

        create("ind", "independent")
        collect("ind")
        create("a", "joint")
        collect("a")
        run("ind", "independent, first run")
        first = run("a", "joint A, first run, cold")
        before = _io(helper)
        busy = _quiet(helper)
        rows.append(("  preparing A's shapes between runs", busy, _io(helper) - before, ""))
        run("a", "joint A, second run (prepared between runs)")
        create("b", "joint")
        summary = Path(tmp) / "a.json"
        summary.write_text(first["_text"])
        _quiet(helper)
        before, start = _io(helper), time.perf_counter()
        r = subprocess.run(
            [*cli, "analyst", "prepare-noise", *common, "--task", "b", "--like", str(summary),
             "--wait", "--json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if r.returncode:
            raise SystemExit(r.stderr)
        held = sum(s["held"] for s in json.loads(r.stdout)["shapes"].values())
        rows.append(
            (
                "  prepare-noise --like A, --wait (B collecting)",
                time.perf_counter() - start,
                _io(helper) - before,
                f"{held:,} samples",
            )
        )
        collect("b")
        run("b", "joint B, first run (prepared while collecting)")
        run("ind", "independent, second run")
        conn.close()

    ind = [r for r in rows if r[0].startswith("independent")]
    t_ind = float(np.median([r[1] for r in ind]))
    b_ind = float(np.median([r[2] for r in ind]))
    print(
        f"top-{args.k}, d = {args.d:,}, n = {args.n:,}, epsilon = {args.epsilon}; "
        "two server processes"
    )
    print(f"{'':50s} {'time':>8s} {'bytes':>10s} {'vs ind.':>13s}")
    for label, seconds, moved, note in rows:
        ratio = "" if label.startswith(" ") else f"{seconds / t_ind:5.2f}× {moved / b_ind:5.2f}×"
        print(f"{label:50s} {seconds:7.1f}s {moved / 1e6:8.0f}MB {ratio:>13s}  {note}")
    print("vs ind.: time and bytes over the median of the two independent runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
