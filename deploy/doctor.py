"""`svtagg doctor`: what this installation runs on, and a self-check.

Names the comparison engine in use (the native core or the numpy reference,
and why), its AES path and thread count, the base-OT group, then
runs a short comparison chunk on every available engine in this process and
checks each against the plaintext answer (and the engines against each other).
Exit code 0 when every check passes, 3 (local environment) otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any

EXIT_ENVIRONMENT = 3


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="name the comparison engine and self-check it")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--k", type=int, default=5000, help="comparisons in the check chunk")
    p.set_defaults(handler=run_doctor)


def engine_line() -> str:
    """`svtagg --version`'s second part: the engine in use."""
    from svtagg.mpc import native

    return native.describe()


async def _check(engine: str, k: int) -> dict[str, Any]:
    import numpy as np

    from svtagg.mpc import native
    from svtagg.mpc.circuits import plain_first_yes
    from svtagg.mpc.protocol import connected_pair

    before = native.active()
    native.use(engine)
    try:
        g, e = await connected_pair()
    finally:
        native.use(before)
    rng = np.random.default_rng()
    sums = -rng.integers(1, 2**30, k)
    sums[rng.integers(k // 2, k)] = 0  # one YES in the second half
    z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
    z_h = sums.astype(np.int64).view(np.uint64) - z_l
    t = time.perf_counter()
    got = await asyncio.gather(g.first_yes(z_l, 40), e.first_yes(z_h, 40))
    seconds = time.perf_counter() - t
    want = plain_first_yes(z_l, z_h)
    return {
        "engine": engine,
        "ok": got == [want, want],
        "seconds": round(seconds, 4),
        "comparisons_per_s": round(k / seconds),
        "bytes_per_comparison": round((g.last_stats.bytes_sent + g.last_stats.bytes_received) / k),
    }


def run_doctor(args: argparse.Namespace) -> int:
    from svtagg import __version__
    from svtagg.mpc import native

    if args.k < 1:
        raise ValueError("--k must be >= 1")
    from svtagg.mpc.ot import default_group

    try:
        import gmpy2  # noqa: F401

        gmp = True
    except ImportError:
        gmp = False
    group = default_group()
    engines = ["numpy"] + (["native"] if native.available() else [])
    checks = [asyncio.run(_check(name, args.k)) for name in engines]
    report: dict[str, Any] = {
        "version": __version__,
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "engine": native.active(),
        "engine_detail": native.describe(),
        "native_available": native.available(),
        "threads": native.threads(),
        "base_ot_group": group,
        "gmp": gmp,
        "checks": checks,
        "ok": all(c["ok"] for c in checks),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"svtagg {__version__} on Python {report['python']}, {report['machine']}")
        print(f"comparison engine: {report['engine_detail']}")
        ref = "GMP (gmpy2)" if gmp else "Python integers (gmpy2 not installed)"
        group_text = (
            "Ed25519 (libsodium)" if group == "ed25519" else "3072-bit MODP (PyNaCl missing)"
        )
        print(f"base OTs: {group_text}; the reference MODP group on {ref}")
        for c in checks:
            verdict = "ok" if c["ok"] else "WRONG ANSWER"
            print(
                f"check {c['engine']:>6}: {verdict}; {args.k:,} comparisons in "
                f"{c['seconds']:.3f} s ({c['comparisons_per_s']:,}/s, "
                f"{c['bytes_per_comparison']:,} bytes each, both parties in this process)"
            )
    return 0 if report["ok"] else EXIT_ENVIRONMENT
