"""Fuzzer of every entry point of the native cores (svtagg.vdaf._field and
svtagg.mpc._gc): random and boundary arguments — sizes 0, 1, huge and ones
whose products overflow, negative sizes, offsets near 2^63, buffers empty,
short, read-only, non-contiguous, of other dtypes or at odd addresses, and
non-buffers — asserting only that each call returns or raises an ordinary
Python exception.  A crash, a hang or (in scripts/sanitize.sh, which runs this
under ASan+UBSan) a sanitizer report ends the process and fails the run;
SystemError (a C function misusing the C-API) fails it too.

About half the calls get shapes that agree with their buffers (so the work
itself runs, on small inputs), the rest one or more arguments drawn from the
boundary values.  Call i depends only on the seed and i: rerun with
`--start i --iterations 1 --verbose` to see one call again.

    python scripts/fuzz_native.py [--iterations N] [--seed S] [--start I]
                                  [--core all|field|gc] [--verbose]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

# Sizes at the edges: negative, the 32-bit limits, and ones whose products
# with small sizes pass 2^63 (or wrap 2^64 to 0); 2^63 and up do not fit an
# "n" argument at all.
EDGES = [
    -(1 << 63), -(1 << 62), -1, 0, 1, 2, 3, 4, 7, 8, 15, 16, 63, 64, 65,
    (1 << 31) - 1, 1 << 31, 1 << 32, 1 << 40, (1 << 60) + 1, 1 << 61, (1 << 61) + 1,
    1 << 62, (1 << 62) + 1, (1 << 63) - 4, (1 << 63) - 1, 1 << 63, 1 << 64,
]  # fmt: skip


class Gen:
    """The arguments of one call, from one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def small(self, hi: int = 8) -> int:
        return self.rng.randrange(0, hi + 1)

    def dim(self, hi: int) -> int:
        """A dimension: 1 .. hi, sometimes 0."""
        return self.rng.randrange(1, hi + 1) if self.rng.random() < 0.9 else 0

    def size(self, fit: int) -> int:
        """`fit` (the size the buffers agree with) most of the time, else an edge."""
        r = self.rng.random()
        if r < 0.75:
            return fit
        if r < 0.85:
            return self.small(64)
        return self.rng.choice(EDGES)

    def count(self, fit: int) -> int:
        """A buffer's length in units: usually `fit`, sometimes one off, or 0."""
        r = self.rng.random()
        if r < 0.8:
            return fit
        return max(0, self.rng.choice([0, fit - 1, fit + 1, 2 * fit + 1]))

    def buffer(self, nbytes: int, zero: bool = False) -> Any:
        """nbytes of random contents (or zeros) in one of the forms a caller might pass."""
        rng = self.rng
        if zero:
            data = bytes(nbytes)
        else:
            data = rng.randbytes(nbytes) if rng.random() < 0.9 else b"\xff" * nbytes
        form = rng.random()
        if form < 0.55:  # an aligned numpy array (what the Python side passes)
            arr = np.frombuffer(bytearray(data), dtype=np.uint8)
            return arr.view(np.uint64) if nbytes % 8 == 0 else arr
        if form < 0.85:  # at an odd address
            shift = rng.randrange(1, 8)
            raw = bytearray(nbytes + 8)
            view = memoryview(raw)[shift : shift + nbytes]
            view[:] = data
            return view
        if form < 0.90:  # read-only
            return data
        if form < 0.93:  # not contiguous
            return np.frombuffer(bytearray(data + data), dtype=np.uint8)[::2]
        if form < 0.96 and nbytes % 8 == 0:  # another dtype of the same bytes
            return np.frombuffer(bytearray(data), dtype=np.float64)
        return rng.choice([None, 0, "buffer", [1, 2], bytearray(nbytes)[: max(0, nbytes - 3)]])

    def vec(self, fid: int, n: int) -> Any:
        """A vector of n elements of field fid (8 or 16 bytes each)."""
        return self.buffer((16 if fid == 1 else 8) * self.count(n))

    def blocks(self, n: int, zero: bool = False) -> Any:
        """n 16-byte blocks (zeros: a three-halves table's padding must be)."""
        return self.buffer(16 * self.count(n), zero)

    def bytes_(self, n: int) -> Any:
        return self.buffer(self.count(n))

    def fid(self) -> Any:
        if self.rng.random() < 0.9:
            return self.rng.randrange(2)
        return self.rng.choice([2, -1, 1 << 31, "x"])

    def word(self) -> int:
        """A value for an unsigned 64-bit argument (tweaks, nonces, counters)."""
        edges = [0, 1, 7, (1 << 64) - 1, 1 << 63, -1, 1 << 64]
        return self.rng.choice([*edges, self.rng.getrandbits(64)])


Call = tuple[Callable[..., Any], tuple[Any, ...]]


# ------------------------------------------------------------- vdaf._field


def field_calls(f: ModuleType) -> dict[str, Callable[[Gen], Call]]:
    """Per entry point of svtagg.vdaf._field, a maker of one call's arguments."""

    def binop(name: str) -> Callable[[Gen], Call]:
        def make(g: Gen) -> Call:
            fid, n = g.fid(), g.small(9)
            la, lb = (n if g.chance(0.7) else 1 for _ in range(2))
            return getattr(f, name), (fid, g.vec(fid, la), g.vec(fid, lb), g.vec(fid, n))

        return make

    def sum_rows(g: Gen) -> Call:
        fid, rows, cols = g.fid(), g.small(), g.small()
        return f.sum_rows, (fid, g.vec(fid, rows * cols), g.size(rows), g.vec(fid, cols))

    def sum_last(g: Gen) -> Call:
        fid, rows, n = g.fid(), g.small(), g.small()
        return f.sum_last, (fid, g.vec(fid, rows * n), g.size(n), g.vec(fid, rows))

    def fold_rows(g: Gen) -> Call:
        fid, rows, row_len, n = g.fid(), g.small(4), g.dim(12), g.dim(6)
        offset = g.small(row_len)
        length = g.small(row_len - offset)
        a, o = g.vec(fid, rows * row_len), g.vec(fid, rows * n)
        sizes = (g.size(row_len), g.size(offset), g.size(length), g.size(n))
        return f.fold_rows, (fid, a, *sizes, o)

    def bits_value(g: Gen) -> Call:
        fid, groups, group = g.fid(), g.small(5), g.dim(70)
        count = g.small(min(group, 63))
        a, o = g.vec(fid, groups * group), g.vec(fid, groups)
        return f.bits_value, (fid, a, g.size(group), g.size(count), o)

    def powers(g: Gen) -> Call:
        fid = g.fid()
        return f.powers, (fid, g.vec(fid, 1), g.vec(fid, 1), g.vec(fid, g.small(20)))

    def ntt(g: Gen) -> Call:
        fid, n, rows = g.fid(), 1 << g.small(5), g.small(3)
        scale = None if g.chance(0.5) else g.vec(fid, 1)
        return f.ntt, (fid, g.vec(fid, rows * n), g.size(n), g.vec(fid, 1), scale)

    def poly_eval(g: Gen) -> Call:
        fid, rows, n = g.fid(), g.small(4), g.small(9)
        c, o = g.vec(fid, rows * n), g.vec(fid, rows)
        return f.poly_eval, (fid, c, g.size(n), g.vec(fid, 1), o)

    def dot_rows(g: Gen) -> Call:
        fid, groups, rows, n = g.fid(), g.small(3), g.small(3), g.small(5)
        a, b = g.vec(fid, groups * rows * n), g.vec(fid, rows * n)
        return f.dot_rows, (fid, a, b, g.vec(fid, groups * rows))

    def powers_rows(g: Gen) -> Call:
        fid, rows, n = g.fid(), g.small(6), g.small(6)
        first = g.rng.choice([0, 1, 1, 2, -1, 1 << 40])
        return f.powers_rows, (fid, g.vec(fid, rows), first, g.vec(fid, rows * n))

    def weighted_rows(g: Gen) -> Call:
        fid, rows, ni, nj = g.fid(), g.dim(3), g.dim(4), g.dim(4)
        m, w = g.vec(fid, rows * ni * nj), g.vec(fid, rows * ni)
        return f.weighted_rows, (fid, m, w, g.vec(fid, rows * nj), g.size(rows))

    def bit_pairs(g: Gen) -> Call:
        fid, rows, length = g.fid(), g.dim(3), g.small(6)
        k = length + g.small(3)
        m, r, s = g.vec(fid, rows * length), g.vec(fid, rows), g.vec(fid, 1)
        return f.bit_pairs, (fid, m, r, s, g.vec(fid, rows * k * 2), g.size(rows))

    def pair_products(name: str) -> Callable[[Gen], Call]:
        def make(g: Gen) -> Call:
            fid, count, m = g.fid(), g.dim(5), g.dim(6)
            return getattr(f, name), (fid, g.vec(fid, count * 2 * m), g.size(count), g.vec(fid, m))

        return make

    def mul_cols(g: Gen) -> Call:
        fid, rows, n = g.fid(), g.small(4), g.dim(5)
        a, b = g.vec(fid, rows * n), g.vec(fid, n)
        return f.mul_cols, (fid, a, b, g.vec(fid, rows * n))

    def mul_gadget_poly(g: Gen) -> Call:
        fid = 1 if g.chance(0.85) else g.fid()
        p, count, rows = 1 << g.dim(3), g.dim(3), g.dim(3)
        wires, consts, out = (
            g.vec(fid, rows * p * 2 * count),
            g.vec(fid, 6),
            g.vec(fid, rows * (2 * p - 1)),
        )
        return f.mul_gadget_poly, (fid, wires, g.size(count), consts, out)

    def bit_check_at(g: Gen) -> Call:
        fid = 1 if g.chance(0.85) else g.fid()
        rows, chunk, calls = g.dim(3), g.dim(9), g.dim(4)
        length = g.small(chunk * calls)
        lam_len = calls + 1 + g.small(2)
        args = (
            fid,
            g.vec(fid, rows * length),
            g.vec(fid, rows),
            g.vec(fid, 1),
            g.vec(fid, rows * lam_len),
            g.size(chunk),
            g.size(calls),
            g.vec(fid, rows * 2 * chunk),
            g.size(rows),
        )
        return f.bit_check_at, args

    def sample(g: Gen) -> Call:
        fid, n = g.fid(), g.small(12)
        raw = g.vec(fid, n)
        out = raw if g.chance(0.3) else g.vec(fid, n + g.small(2))
        return f.sample, (fid, raw, out)

    def copy_rows(g: Gen) -> Call:
        rows, width = g.small(5), g.small(20)
        offset = g.small(10)
        blobs = [g.bytes_(offset + width + g.small(3)) for _ in range(rows)]
        seq: Any = blobs if g.chance(0.8) else tuple(blobs) if g.chance(0.5) else 17
        return f.copy_rows, (seq, g.size(offset), g.size(width), g.bytes_(rows * width))

    def shake_rows(g: Gen) -> Call:
        rows, length = g.small(10), g.small(200)
        pieces: list[Any] = []
        for _ in range(g.rng.choice([0, 1, 2, 3, 9])):
            width, stride = g.small(300), g.small(300) if g.chance(0.6) else 0
            offset = g.small(8)
            buf = g.bytes_(offset + max(0, rows - 1) * stride + width)
            piece = (buf, g.size(offset), g.size(width), g.size(stride))
            pieces.append(piece if g.chance(0.95) else list(piece) if g.chance(0.5) else piece[:3])
        return f.shake_rows, (tuple(pieces), g.size(rows), g.bytes_(rows * length))

    def simd(g: Gen) -> Call:
        return f.simd, tuple(g.rng.sample([-2, -1, 0, 1, 2, 5, 1 << 40], k=g.small(1)))

    def keccak_width(g: Gen) -> Call:
        return f.keccak_width, tuple(g.rng.sample([-2, -1, 0, 1, 2, 4, 8, 16], k=g.small(1)))

    return {
        "add": binop("add"),
        "sub": binop("sub"),
        "mul": binop("mul"),
        "sum_rows": sum_rows,
        "sum_last": sum_last,
        "fold_rows": fold_rows,
        "bits_value": bits_value,
        "powers": powers,
        "ntt": ntt,
        "poly_eval": poly_eval,
        "dot_rows": dot_rows,
        "powers_rows": powers_rows,
        "weighted_rows": weighted_rows,
        "bit_pairs": bit_pairs,
        "pair_products": pair_products("pair_products"),
        "pair_products_last": pair_products("pair_products_last"),
        "mul_cols": mul_cols,
        "mul_gadget_poly": mul_gadget_poly,
        "bit_check_at": bit_check_at,
        "sample": sample,
        "copy_rows": copy_rows,
        "shake_rows": shake_rows,
        "simd": simd,
        "keccak_width": keccak_width,
    }


# ---------------------------------------------------------------- mpc._gc


def _th_blocks(n: int) -> int:
    """16-byte blocks of an n-gate three-halves layer (mpc/threehalves.layer_blocks)."""
    return (24 * n + (5 * n + 7) // 8 + 15) // 16


def gc_calls(c: ModuleType) -> dict[str, Callable[[Gen], Call]]:
    """Per entry point of svtagg.mpc._gc, a maker of one call's arguments."""

    def delta(g: Gen) -> Any:
        return g.buffer(16 if g.chance(0.9) else g.small(20))

    def tccr(g: Gen) -> Call:
        n = g.small(20)
        return c.tccr, (g.blocks(n), g.blocks(n), g.blocks(n))

    def garble_and(g: Gen) -> Call:
        n = g.small(40)
        a, b, d = g.blocks(n), g.blocks(n), delta(g)
        return c.garble_and, (a, b, d, g.word(), g.word(), g.blocks(n), g.blocks(2 * n))

    def eval_and(g: Gen) -> Call:
        n = g.small(40)
        a, b, t = g.blocks(n), g.blocks(n), g.blocks(2 * n)
        return c.eval_and, (a, b, t, g.word(), g.word(), g.blocks(n))

    def garble_and_const(g: Gen) -> Call:
        n = g.small(40)
        bits, b, d = g.bytes_(n), g.blocks(n), delta(g)
        return c.garble_and_const, (bits, b, d, g.word(), g.word(), g.blocks(n), g.blocks(n))

    def eval_and_const(g: Gen) -> Call:
        n = g.small(40)
        return c.eval_and_const, (g.blocks(n), g.blocks(n), g.word(), g.word(), g.blocks(n))

    def width(g: Gen) -> int:
        if g.chance(0.3):
            return g.rng.choice([2, 3, 4, 8, 64, 1, 0, 65, -1, 1 << 31])
        return g.small(6) + 2

    def sign(name: str, three: bool, garbler: bool) -> Callable[[Gen], Call]:
        def make(g: Gen) -> Call:
            n, w = g.small(40), width(g)
            wn = max(0, w) * n if w < 1000 else n
            tab = n + (w - 2) * _th_blocks(n) if three else (2 * w - 3) * n
            tables = g.blocks(max(0, min(tab, 10_000)), zero=three and g.chance(0.5))
            yes = g.blocks(n)
            if not garbler:
                return getattr(c, name), (g.blocks(wn), tables, g.word(), g.word(), w, yes)
            head = (g.bytes_(wn), g.blocks(wn), delta(g), g.word(), g.word(), w)
            rho = (g.bytes_(max(0, w - 2) * n if w < 1000 else n),) if three else ()
            return getattr(c, name), (*head, *rho, yes, tables)

        return make

    def transpose128(g: Gen) -> Call:
        nb, pad = g.small(70), g.small(3)
        rows_shape = (128 if g.chance(0.9) else g.small(130), nb + pad)
        rows = np.frombuffer(bytearray(g.rng.randbytes(rows_shape[0] * rows_shape[1])), np.uint8)
        mat: Any = rows.reshape(rows_shape)[:, :nb] if g.chance(0.9) else g.bytes_(nb)
        return c.transpose128, (mat, g.buffer(128 * g.count(nb)))

    def expand_keys(g: Gen) -> Call:
        return c.expand_keys, (g.rng.randbytes(16 * g.small(4) + (0 if g.chance(0.9) else 1)),)

    def prg_rows(g: Gen) -> Call:
        m, nblk = g.small(4), g.small(6)
        stride = 16 * nblk + g.small(20)
        out = g.buffer(max(0, (m - 1) * stride + 16 * nblk) if m else g.small(16))
        sizes = (g.size(nblk), out, g.size(stride))
        return c.prg_rows, (g.bytes_(176 * m), g.word(), g.word(), *sizes)

    def ss_k(g: Gen) -> tuple[int, bool, int, int]:
        k = g.rng.choice([1, 2, 4, 8] if g.chance(0.9) else [0, 3, 16, -1])
        skip0 = g.chance(0.5)
        n = 128 // k if k in (1, 2, 4, 8) else 1
        per = (1 << k) - (1 if skip0 else 0) if k in (1, 2, 4, 8) else 1
        return k, skip0, n, per

    def ss_expand(g: Gen) -> Call:
        k, skip0, n, per = ss_k(g)
        nblk = g.small(5)
        vs, us = 16 * nblk + g.small(16), 16 * nblk + g.small(16)
        v = g.buffer(127 * vs + 16 * nblk)
        u = None if g.chance(0.4) else g.buffer((n - 1) * us + 16 * nblk)
        sizes = (g.size(nblk), v, g.size(vs), u, g.size(us))
        return c.ss_expand, (g.bytes_(176 * n * per), k, skip0, g.word(), g.word(), *sizes)

    def ss_labels(g: Gen) -> Call:
        k, skip0, n, per = ss_k(g)
        w = g.small(40) + 1
        garbler = g.chance(0.5)
        c_, s_ = (g.bytes_(n * w), g.bytes_(16)) if garbler else (None, None)
        u_, r_ = (None, None) if garbler else (g.bytes_(n * w), g.bytes_(w))
        if g.chance(0.1):  # a mixed-up role
            c_, u_ = u_, c_
        head = (g.bytes_(176 * n * per), k, skip0, g.word(), g.word(), g.size(w))
        return c.ss_labels, (*head, c_, s_, u_, r_, g.buffer(128 * g.count(w)))

    def fr_lpn(g: Gen) -> Call:
        k = 1 << g.small(6)
        count = 2 * g.small(10)
        mask = k - 1 if g.chance(0.9) else g.rng.choice([3, 5, (1 << 32) - 1, -1, 1 << 32])
        base, noise, out = g.blocks(k), g.blocks(count), g.blocks(count)
        first = 2 * g.small(10) if g.chance(0.9) else g.rng.choice([1, 1 << 41, -2, 1 << 64])
        head = (g.bytes_(176), first, g.size(count), mask, base, noise, out)
        bits = () if g.chance(0.5) else (g.bytes_(k), g.bytes_(count), g.bytes_(count))
        return c.fr_lpn, (*head, *bits)

    def fr_ggm(g: Gen) -> Call:
        recv, trees = g.chance(0.5), g.small(4)
        depth = g.small(5) + 1 if g.chance(0.9) else g.rng.choice([0, 25, 24, -1])
        d = min(max(depth, 0), 6)
        seeds = g.blocks(trees * (d if recv else 1))
        leaves = g.blocks(trees << d)
        alphas = g.buffer(8 * g.count(trees)) if recv else None
        if recv and isinstance(alphas, np.ndarray) and g.chance(0.8):
            alphas = np.array([g.small((1 << d) - 1) for _ in range(trees)], dtype=np.int64)
        phi = g.blocks(trees) if recv else None
        sums = None if recv else g.blocks(2 * trees * d)
        return c.fr_ggm, (recv, depth, g.word(), seeds, alphas, phi, leaves, sums)

    def th_tables(g: Gen) -> Call:
        return c.th_tables, (g.bytes_(128), g.bytes_(128))

    def th_and(garbler: bool) -> Callable[[Gen], Call]:
        def make(g: Gen) -> Call:
            n = g.small(40)
            a, b, out = g.blocks(n), g.blocks(n), g.blocks(n)
            tab = g.blocks(_th_blocks(n), zero=g.chance(0.5))
            if garbler:
                head = (a, b, delta(g), g.word(), g.word(), g.bytes_(n))
                return c.th_garble_and, (*head, out, tab)
            return c.th_eval_and, (a, b, tab, g.word(), g.word(), out)

        return make

    def chain(name: str, three: bool, garbler: bool) -> Callable[[Gen], Call]:
        def make(g: Gen) -> Call:
            k = g.small(30)
            gates = max(0, k - 1)
            x, p = g.blocks(k), g.blocks(k)
            tab = g.blocks(_th_blocks(gates) if three else 2 * gates, zero=three and g.chance(0.5))
            if not garbler:
                return getattr(c, name), (x, tab, g.word(), g.word(), p)
            rho = (g.bytes_(gates),) if three else ()
            return getattr(c, name), (x, delta(g), g.word(), g.word(), *rho, p, tab)

        return make

    def settings(g: Gen) -> Call:
        which = g.small(3)
        if which == 0:
            return c.set_threads, (g.rng.choice([1, 2, 4, 0, -1, 65, 1 << 31]),)
        if which == 1:
            return c.set_vaes, (g.rng.choice([True, False, 0, 1, None]),)
        if which == 2:
            return c.features, ()
        return c.set_key, (g.bytes_(16),)

    return {
        "tccr": tccr,
        "garble_and": garble_and,
        "eval_and": eval_and,
        "garble_and_const": garble_and_const,
        "eval_and_const": eval_and_const,
        "garble_sign": sign("garble_sign", False, True),
        "eval_sign": sign("eval_sign", False, False),
        "transpose128": transpose128,
        "expand_keys": expand_keys,
        "prg_rows": prg_rows,
        "ss_expand": ss_expand,
        "ss_labels": ss_labels,
        "fr_lpn": fr_lpn,
        "fr_ggm": fr_ggm,
        "th_tables": th_tables,
        "th_garble_and": th_and(True),
        "th_eval_and": th_and(False),
        "th_garble_sign": sign("th_garble_sign", True, True),
        "th_eval_sign": sign("th_eval_sign", True, False),
        "chain_garble": chain("chain_garble", False, True),
        "chain_eval": chain("chain_eval", False, False),
        "th_chain_garble": chain("th_chain_garble", True, True),
        "th_chain_eval": chain("th_chain_eval", True, False),
        "settings": settings,
    }


# ------------------------------------------------------------------ driver


def _describe(arg: Any) -> str:
    """A short, content-free description of one argument (its kind and size)."""
    if isinstance(arg, np.ndarray):
        return f"ndarray({arg.dtype},{arg.shape},c={arg.flags.c_contiguous})"
    if isinstance(arg, memoryview):
        addr = np.frombuffer(arg, np.uint8).ctypes.data if arg.nbytes else 0
        return f"memoryview({arg.nbytes}, address % 8 = {addr % 8})"
    if isinstance(arg, bytes | bytearray):
        return f"{type(arg).__name__}({len(arg)})"
    if isinstance(arg, tuple | list):
        return "(" + ", ".join(_describe(a) for a in arg) + ")"
    return repr(arg)


def makers(core: str) -> dict[str, Callable[[Gen], Call]]:
    """The entry points to fuzz: every one of the chosen cores (each must be built)."""
    out: dict[str, Callable[[Gen], Call]] = {}
    if core in ("all", "field"):
        from svtagg.vdaf import native as vdaf_native

        out.update({f"_field.{k}": v for k, v in field_calls(vdaf_native.core()).items()})
    if core in ("all", "gc"):
        from svtagg.mpc import native as mpc_native  # sets the AES key and three-halves tables

        out.update({f"_gc.{k}": v for k, v in gc_calls(mpc_native.core()).items()})
    return out


def run(iterations: int, seed: int, start: int, core: str, verbose: bool) -> int:
    """Calls start .. start + iterations - 1; returns how many raised."""
    table = makers(core)
    names = sorted(table)
    raised = 0
    for i in range(start, start + iterations):
        gen = Gen(random.Random(f"{seed}:{i}"))
        name = gen.rng.choice(names)
        fn, args = table[name](gen)
        if verbose:
            print(f"[{i}] {name}{_describe(args)}", file=sys.stderr, flush=True)
        try:
            fn(*args)
        except SystemError as exc:  # a C function returned NULL without an exception
            raise AssertionError(f"call {i}: {name} misused the C-API: {exc}") from exc
        except Exception:  # refused: what every bad argument should get
            raised += 1
    return raised


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iterations", type=int, default=4000)
    p.add_argument("--seed", type=int, default=20261205)
    p.add_argument("--start", type=int, default=0, help="index of the first call")
    p.add_argument("--core", choices=("all", "field", "gc"), default="all")
    p.add_argument("--verbose", action="store_true", help="name each call on stderr first")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    raised = run(args.iterations, args.seed, args.start, args.core, args.verbose)
    print(
        f"fuzz_native: {args.iterations} calls (seed {args.seed}, from {args.start}, "
        f"core {args.core}): {args.iterations - raised} returned, {raised} raised, "
        f"none crashed ({time.perf_counter() - t0:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
