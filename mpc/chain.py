"""The linear prefix OR p_0 = x_0, p_j = p_{j−1} ∨ x_j: K − 1 OR gates for K
inputs (the fewest possible), garbled as ONE AND layer of K − 1 gates even
though gate j needs gate j − 1's output.

Gate j − 1 of the layer (lane j − 1) computes p_j = ¬(¬p_{j−1} ∧ ¬x_j): its
tweaks and its place in the table are those of lane j − 1 of an ordinary AND
layer (`garble.py`, `threehalves.py`), so the table is exactly the one the
scheme's layer code writes for the inputs (¬p_{0..K−2}, ¬x_{1..K−1}) — three-
halves pays 24.625 bytes per gate, not a padded layer per gate.

Reference (numpy) engine: a serial pass finds the chain's labels gate by gate
(Python integers, two-block AES calls: only the hashes that depend on the
previous gate's output are serial, the others are one vectorized call), then
the scheme's layer code garbles / evaluates the whole layer in one call, which
writes / checks the table; its outputs must equal the serial pass's.  The
native core runs the chain gate by gate in one call (`native.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.mpc.aes import FIXED_KEY, Blocks
from svtagg.mpc.garble import Backend, EvalBackend, GarbleBackend, PlainBackend, Wires
from svtagg.mpc.threehalves import (
    Q_TABLE,
    R_TABLE,
    STEP,
    ThreeHalvesEvalBackend,
    ThreeHalvesGarbleBackend,
    control_bytes,
    layer_blocks,
)

_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1
_FROM = int.from_bytes
_ENC = Cipher(algorithms.AES(FIXED_KEY), modes.ECB()).encryptor()


def or_chain_and_gates(k: int) -> int:
    """AND gates of the linear prefix OR over k inputs."""
    return max(0, k - 1)


def _ints(labels: Blocks) -> list[int]:
    """(n, 2) uint64 labels as Python integers (word 0 the low 64 bits)."""
    w = np.ascontiguousarray(labels, dtype=np.uint64)
    return [lo | (hi << 64) for lo, hi in zip(w[:, 0].tolist(), w[:, 1].tolist(), strict=True)]


def _blocks(vals: list[int]) -> Blocks:
    out = np.empty((len(vals), 2), dtype=np.uint64)
    out[:, 0] = [v & _M64 for v in vals]
    out[:, 1] = [v >> 64 for v in vals]
    return out


def _hash2(x0: int, t0: int, x1: int, t1: int) -> tuple[int, int]:
    """H(x0, t0), H(x1, t1) with H(x, t) = π(π(x) ⊕ t) ⊕ π(x): two AES calls
    over both blocks, as one 256-bit integer."""
    p = _FROM(_ENC.update((x0 | x1 << 128).to_bytes(32, "little")), "little")
    h = _FROM(_ENC.update((p ^ (t0 | t1 << 128)).to_bytes(32, "little")), "little") ^ p
    return h & _M128, h >> 128


def _hash1(x: int, t: int) -> int:
    p = int.from_bytes(_ENC.update(x.to_bytes(16, "little")), "little")
    return int.from_bytes(_ENC.update((p ^ t).to_bytes(16, "little")), "little") ^ p


def _side_hashes(be: GarbleBackend | EvalBackend, labels: Blocks, tweaks: Blocks) -> list[int]:
    """The hashes that do not depend on the chain (one vectorized call)."""
    return _ints(be.hasher(np.ascontiguousarray(labels), np.ascontiguousarray(tweaks)))


def _tweak_rows(be: GarbleBackend | EvalBackend, n: int, step: int, h: int) -> Blocks:
    """Tweak h of lanes 0..n−1 of the next AND layer (not yet counted)."""
    tw = np.empty((n, 2), dtype=np.uint64)
    tw[:, 0] = np.arange(h, step * n + h, step, dtype=np.uint64) | np.uint64(be.and_layers << 32)
    tw[:, 1] = be.tweak_hi
    return tw


def _base(be: GarbleBackend | EvalBackend, step: int) -> tuple[int, int]:
    """(low word of lane 0's tweak h = 0, high word << 64) of the next layer."""
    if be.and_layers >= 1 << 32:
        raise ValueError("too many AND layers for the tweak format")
    return be.and_layers << 32, int(be.tweak_hi) << 64


# ---------------------------------------------------------------- serial passes
def _hg_garble(be: GarbleBackend, x0: list[int], b0: Blocks) -> list[int]:
    """0-labels p_0..p_{K−2} (x0: the 0-labels of x; b0: those of ¬x_1..)."""
    n = len(x0) - 1
    d = int(be.delta[0]) | (int(be.delta[1]) << 64)
    colour0 = b0 ^ ((-(b0[:, 0] & np.uint64(1)))[:, None] & be.delta)
    hb = _side_hashes(be, colour0, _tweak_rows(be, n, 2, 1))  # W_E = H(B of colour 0, τ_1)
    lo, hi = _base(be, 2)
    p = [x0[0]]
    for k in range(n):
        a0 = p[-1] ^ d  # ¬p_{k}
        pa, pb = a0 & 1, x0[k + 1] & 1 ^ 1  # colours of ¬p_k and ¬x_{k+1} (Δ has bit 0 set)
        # C0 = H(A of colour 0, τ_0) ⊕ W_E ⊕ p_a·p_b·Δ; p_{k+1} = ¬C.
        c0 = _hash1(a0 ^ (d if pa else 0), hi | lo | 2 * k) ^ hb[k] ^ (d if pa & pb else 0)
        p.append(c0 ^ d)
    return p[:-1]


def _hg_eval(be: EvalBackend, x: list[int], b: Blocks, tab: Blocks) -> list[int]:
    """Active labels p_0..p_{K−2}; tab: the layer's table (T_G of every gate, then T_E)."""
    n = len(x) - 1
    hb = _side_hashes(be, b, _tweak_rows(be, n, 2, 1))
    tg, te = _ints(tab[:n]), _ints(tab[n:])
    lo, hi = _base(be, 2)
    p = [x[0]]
    for k in range(n):
        a, bk = p[-1], x[k + 1]
        c = _hash1(a, hi | lo | 2 * k) ^ (tg[k] if a & 1 else 0)
        c ^= hb[k] ^ (te[k] ^ a if bk & 1 else 0)
        p.append(c)
    return p[:-1]


def _bits(q: int, row: int) -> tuple[int, ...]:
    return tuple(c for c in range(6) if q >> (6 * row + c) & 1)


#: Columns of Q's rows 0 and 1 (the output label's halves) by case.
_Q_ROWS = [(_bits(int(q), 0), _bits(int(q), 1)) for q in Q_TABLE.tolist()]
_R_BITS = [int(r) for r in R_TABLE.tolist()]


def _th_garble(
    be: ThreeHalvesGarbleBackend, x0: list[int], b0: Blocks, rho: list[int]
) -> list[int]:
    n = len(x0) - 1
    d = int(be.delta[0]) | (int(be.delta[1]) << 64)
    dl, dh = d & _M64, d >> 64
    colour0 = b0 ^ ((-(b0[:, 0] & np.uint64(1)))[:, None] & be.delta)
    hb = _side_hashes(be, colour0, _tweak_rows(be, n, STEP, 1))
    bs = _ints(colour0)
    lo, hi = _base(be, STEP)
    p = [x0[0]]
    for k in range(n):
        a0 = p[-1] ^ d
        ta = (a0 & 1) ^ 1
        a = a0 ^ (0 if ta else d)  # colour 0
        bk = bs[k]
        tb = x0[k + 1] & 1  # ¬x's colour is x's ⊕ 1, and t_b is that ⊕ 1
        t0 = hi | lo | 3 * k
        ha, hx = _hash2(a, t0, a ^ bk, t0 + 2)
        xs = (a & _M64, a >> 64, bk & _M64, bk >> 64, dl, dh)
        rows = _Q_ROWS[8 * ta + 4 * tb + rho[k]]
        z0 = z1 = 0
        for c in rows[0]:
            z0 ^= xs[c]
        for c in rows[1]:
            z1 ^= xs[c]
        wa, wx, wb = ha & _M64, hx & _M64, hb[k] & _M64
        c0 = (z0 ^ wa ^ wx) | ((z1 ^ wb ^ wx) << 64)
        p.append(c0 ^ d)
    return p[:-1]


def _th_eval(be: EvalBackend, x: list[int], b: Blocks, tab: Blocks) -> list[int]:
    n = len(x) - 1
    hb = _side_hashes(be, b, _tweak_rows(be, n, STEP, 1))
    words = tab.reshape(-1)
    g0, g1, g2 = words[:n].tolist(), words[n : 2 * n].tolist(), words[2 * n : 3 * n].tolist()
    raw = words.view(np.uint8)[24 * n : 24 * n + control_bytes(n)]
    bits = np.unpackbits(raw, count=5 * n, bitorder="little").reshape(n, 5)
    zs = (bits.astype(np.int64) @ np.array([1, 2, 4, 8, 16], dtype=np.int64)).tolist()
    lo, hi = _base(be, STEP)
    p = [x[0]]
    for k in range(n):
        a, bk = p[-1], x[k + 1]
        ab = a ^ bk
        t0 = hi | lo | 3 * k
        ha, hx = _hash2(a, t0, ab, t0 + 2)
        i, j = a & 1, bk & 1
        ij = i ^ j
        z = zs[k]
        ma, mb, mx = (ha >> 64) & 1, (hb[k] >> 64) & 1, (hx >> 64) & 1
        r0 = (z & 1) ^ (i & (z >> 2)) ^ (ij & (z >> 4)) ^ ma ^ mx
        r1 = ((z >> 1) & 1) ^ (j & (z >> 3)) ^ (ij & (z >> 4)) ^ mb ^ mx
        rb = _R_BITS[(i << 3) | (j << 2) | ((r0 & 1) << 1) | (r1 & 1)]
        ys = (a & _M64, a >> 64, bk & _M64, bk >> 64)
        l0 = l1 = 0
        for c in range(4):
            if rb >> c & 1:
                l0 ^= ys[c]
            if rb >> (4 + c) & 1:
                l1 ^= ys[c]
        g = g2[k] if ij else 0
        cl = (g0[k] if i else 0) ^ g ^ (ha & _M64) ^ (hx & _M64) ^ l0
        cr = (g1[k] if j else 0) ^ g ^ (hb[k] & _M64) ^ (hx & _M64) ^ l1
        p.append(cl | (cr << 64))
    return p[:-1]


# ---------------------------------------------------------------- the circuit
def or_chain(be: Backend, x: Wires) -> Wires:
    """Inclusive prefix OR p_k = x_0 ∨ … ∨ x_k over the K wires of x, linearly:
    K − 1 OR gates in one AND layer (see the module docstring)."""
    k = x.shape[0]
    if k <= 1:  # no gate
        return x.copy()
    fused: Callable[[Wires], Wires | None] | None = getattr(be, "or_chain_fused", None)
    if fused is not None:
        out = fused(x)
        if out is not None:
            return out
    n = k - 1
    gates: Backend = be
    rho = None
    if isinstance(be, PlainBackend):
        prev: Wires = np.bitwise_or.accumulate(x)[:-1]
    elif isinstance(be, ThreeHalvesGarbleBackend):
        rho = np.asarray(be.coins(n), dtype=np.uint8)
        prev = _blocks(_th_garble(be, _ints(x), x[1:] ^ be.delta, rho.tolist()))
    elif isinstance(be, GarbleBackend):
        prev = _blocks(_hg_garble(be, _ints(x), x[1:] ^ be.delta))
    elif isinstance(be, EvalBackend):
        three = isinstance(be, ThreeHalvesEvalBackend)
        size = layer_blocks(n) if three else 2 * n
        tab = be.peek(size)
        step = _th_eval if three else _hg_eval
        prev = _blocks(step(be, _ints(x), np.ascontiguousarray(x[1:]), tab))
    else:  # pragma: no cover - every backend is one of the above
        raise TypeError(f"no linear prefix OR for {type(be).__name__}")
    a, b = gates.not_(prev), gates.not_(x[1:])
    c = gates.and_(a, b) if rho is None else gates.and_(a, b, rho)  # type: ignore[call-arg]
    p = gates.not_(c)
    if not np.array_equal(p[:-1], prev[1:]):
        raise AssertionError("the linear prefix OR's serial pass disagrees with its layer")
    return np.concatenate([x[:1], p])
