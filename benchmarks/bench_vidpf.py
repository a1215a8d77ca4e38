"""The VIDPF's size and speed (vdaf/vidpf.py, the pure-Python reference):
bytes a client sends per report for its VIDPF part, and the time to make a
key pair and to evaluate one aggregator's key down one path (a prefix and its
sibling at every level, as a prefix crawl visits them).

    python -m svtagg.benchmarks.bench_vidpf [--bits 16 64 128 256] [--reps 5]

The Mastic draft's published figures are for the whole report (VIDPF and the
weight's proof; 4.77 KB at 64 bits, 9.51 KB at 128) and for its Rust code;
these rows are the VIDPF alone, in Python.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from svtagg.vdaf.field import FIELD64
from svtagg.vdaf.vidpf import KEY_SIZE, NONCE_SIZE, PROOF_SIZE, RAND_SIZE, Vidpf


def report_bytes(bits: int, value_len: int, element: int) -> int:
    """One aggregator's key plus the public correction words (each: seed,
    node proof, the weight's elements, and the two control bits, packed
    8 per byte over all levels)."""
    per_level = KEY_SIZE + PROOF_SIZE + value_len * element
    return KEY_SIZE + bits * per_level + (2 * bits + 7) // 8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    print("bits | bytes to one aggregator | gen (ms, median) | eval one path (ms, median)")
    for bits in args.bits:
        v = Vidpf(FIELD64, bits, 1)
        alpha = tuple(bool(random.getrandbits(1)) for _ in range(bits))
        gen_t, eval_t = [], []
        for _ in range(args.reps):
            nonce = os.urandom(NONCE_SIZE)
            t = time.perf_counter()
            words, keys = v.gen(alpha, [1], b"bench", nonce, os.urandom(RAND_SIZE))
            gen_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            v.eval_prefixes(0, words, keys[0], [alpha], b"bench", nonce)
            eval_t.append(time.perf_counter() - t)
        size = report_bytes(bits, 1, FIELD64.encoded_size)
        print(
            f"{bits:4d} | {size:6,d} | {1e3 * statistics.median(gen_t):8.1f}"
            f" | {1e3 * statistics.median(eval_t):8.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
