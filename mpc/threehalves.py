"""Three-halves garbling (Rosulek–Roy, CRYPTO 2021): free XOR and AND gates of
1.5κ + 5 bits — three half-labels of 64 bits and five control bits — instead
of the 2κ of half-gates.  A selectable scheme of the engine: the backends here
replace `and_` of the half-gates backends and keep everything else (free XOR,
point-and-permute, the one-ciphertext garbler half-gate `and_const`, output
decoding), so every circuit of `circuits.py` runs unchanged.

Notation (docs/mpc.md, "Three-halves garbling").  A label X is two halves
(X_L, X_R) = (word 0, word 1); its colour is bit 0 of X_L; Δ_L has bit 0 set.
For an AND gate with input 0-labels A0, B0 (colours α, β) let A, B be the
labels of colour 0 (A = A0 ⊕ α·Δ) and (a, b) = (α ⊕ 1, β ⊕ 1): the colours at
which the gate's output is 1.  The evaluator holds A ⊕ i·Δ and B ⊕ j·Δ for
public colours (i, j).

Evaluator (3 hashes): with h_A = H(A_i, τ_0), h_B = H(B_j, τ_1),
h_X = H(A_i ⊕ B_j, τ_2) — each the low word of the hash as a half-label mask
and bit 0 of its high word as a control-bit mask m —
    r = (z_0 ⊕ i·z_2 ⊕ (i⊕j)·z_4 ⊕ m_A ⊕ m_X,  z_1 ⊕ j·z_3 ⊕ (i⊕j)·z_4 ⊕ m_B ⊕ m_X),
    R = P_ij ⊕ r_0·S_1 ⊕ r_1·S_2                        (a 2×4 bit matrix),
    C_L = i·G_0 ⊕ (i⊕j)·G_2 ⊕ h_A ⊕ h_X ⊕ R_0·(A_L, A_R, B_L, B_R),
    C_R = j·G_1 ⊕ (i⊕j)·G_2 ⊕ h_B ⊕ h_X ⊕ R_1·(A_L, A_R, B_L, B_R).
Written as one linear map, (C_L, C_R) = V_ij·(0, 0, G_0, G_1, G_2) ⊕ M·(h_A,
h_B, h_X) ⊕ R·(halves of A_i, B_j), with V_ij = [[1,0,i,0,i⊕j],[0,1,0,j,i⊕j]].

Garbler (6 hashes): it draws ρ ∈ {0,1}² (CSPRNG) per gate and needs, over the
four rows (i, j) at once, V·Z = (hash terms) ⊕ (R_ij·(A_i, B_j) ⊕ t_ij·Δ)_ij
with t_ij = [i = a ∧ j = b] and the evaluator's r_ij = V_ij·ζ,
ζ = (ρ_0, ρ_1, a, b, a ⊕ b).  The stacked 8×5 V has full column rank and the
8×6 right-hand side lies in its column space for every (a, b, ρ) — that is
what P, S_1, S_2 are chosen for — so Z = K·h ⊕ Q_{a,b,ρ}·(A_L, A_R, B_L, B_R,
Δ_L, Δ_R) with K·h = (h_A0 ⊕ h_X0, h_B0 ⊕ h_X0, h_A0 ⊕ h_A1, h_B0 ⊕ h_B1,
h_X0 ⊕ h_X1) (h_A1 = H(A ⊕ Δ, τ_0), h_X0 = H(A ⊕ B, τ_2), …) and the 16 matrices
Q solved below at import.  The output 0-label is (Z_0, Z_1); the garbler sends
G = (Z_2, Z_3, Z_4) and the control bits z = ζ ⊕ K·m.  The evaluator's R is
P_ij ⊕ (uniform r)·S: independent of (a, b), so it learns nothing of the
colours' meaning (the "dicing" of Rosulek–Roy).

Per AND layer of n gates the table is G_0 of every gate (n words), then G_1,
then G_2, then the 5n control bits (gate-major, little-endian bit order),
zero-padded to whole 16-byte blocks.  Tweaks: pair h ∈ {0, 1, 2} of the gate
in lane k of layer L has the low tweak word L·2^32 + 3k + h.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from svtagg.mpc.aes import Blocks
from svtagg.mpc.garble import Bits, EvalBackend, GarbleBackend

SCHEMES = ("halfgates", "threehalves")
#: Tweak pairs per gate (A, B, A ⊕ B) and the tweak layout's lane step.
PAIRS = (0, 1, 2)
STEP = 3
U64 = npt.NDArray[np.uint64]

# Public colour-dependent part P_ij and the two directions S_1, S_2 of the
# evaluator's control matrix R: rows (C_L, C_R), columns (A_L, A_R, B_L, B_R).
P = {
    (0, 0): ((0, 0, 1, 0), (0, 1, 0, 0)),
    (0, 1): ((0, 0, 1, 0), (0, 0, 0, 0)),
    (1, 0): ((0, 0, 0, 0), (0, 1, 0, 0)),
    (1, 1): ((0, 0, 0, 0), (0, 0, 0, 0)),
}
S1 = ((1, 1, 1, 0), (1, 0, 0, 1))
S2 = ((1, 0, 0, 1), (0, 1, 1, 1))


def v_rows(i: int, j: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """V_ij over (C_L, C_R, G_0, G_1, G_2)."""
    return (1, 0, i, 0, i ^ j), (0, 1, 0, j, i ^ j)


def control_matrix(i: int, j: int, r0: int, r1: int) -> list[list[int]]:
    """The evaluator's R for colours (i, j) and decoded control bits r."""
    return [[P[(i, j)][k][c] ^ (r0 & S1[k][c]) ^ (r1 & S2[k][c]) for c in range(4)] for k in (0, 1)]


def _solve_gf2(a: list[list[int]], b: list[list[int]]) -> list[list[int]] | None:
    """x with a·x = b over GF(2) (a of full column rank), or None if inconsistent."""
    rows = [ra + rb for ra, rb in zip(a, b, strict=True)]
    n = len(a[0])
    piv = []
    r = 0
    for c in range(n):
        k = next((k for k in range(r, len(rows)) if rows[k][c]), None)
        if k is None:
            continue
        rows[r], rows[k] = rows[k], rows[r]
        for m in range(len(rows)):
            if m != r and rows[m][c]:
                rows[m] = [x ^ y for x, y in zip(rows[m], rows[r], strict=True)]
        piv.append(c)
        r += 1
    if any(any(row[n:]) for row in rows[r:]):
        return None
    x = [[0] * len(b[0]) for _ in range(n)]
    for k, c in enumerate(piv):
        x[c] = rows[k][n:]
    return x


def garbler_matrix(a: int, b: int, rho0: int, rho1: int) -> list[list[int]]:
    """Q (5×6 over (A_L, A_R, B_L, B_R, Δ_L, Δ_R)) with V·Q = the stacked
    R_ij·(A_i, B_j) ⊕ t_ij·Δ of the four rows."""
    zeta = (rho0, rho1, a, b, a ^ b)
    lhs, rhs = [], []
    for i, j in itertools.product((0, 1), repeat=2):
        v = v_rows(i, j)
        r = [sum(x & y for x, y in zip(row, zeta, strict=True)) & 1 for row in v]
        ctl = control_matrix(i, j, r[0], r[1])
        t = int(i == a and j == b)
        for k in (0, 1):
            # A_i = A ⊕ i·Δ, B_j = B ⊕ j·Δ: the Δ_L / Δ_R coefficients of row k.
            d = [i & ctl[k][0] ^ j & ctl[k][2], i & ctl[k][1] ^ j & ctl[k][3]]
            d[k] ^= t
            lhs.append(list(v[k]))
            rhs.append(ctl[k] + d)
    q = _solve_gf2(lhs, rhs)
    if q is None:  # pragma: no cover - the matrices above are chosen so it cannot be
        raise AssertionError("three-halves system inconsistent")
    return q


def _tables() -> tuple[U64, U64]:
    """Per-gate lookups: Q by 8a + 4b + 2ρ_0 + ρ_1 (bit 6·row + column), and R by
    8i + 4j + 2r_0 + r_1 (bit 4·row + column)."""
    qt = np.zeros(16, dtype=np.uint64)
    rt = np.zeros(16, dtype=np.uint64)
    for x, y, u, w in itertools.product((0, 1), repeat=4):
        case = 8 * x + 4 * y + 2 * u + w
        q = garbler_matrix(x, y, u, w)
        qt[case] = sum(q[r][c] << (6 * r + c) for r in range(5) for c in range(6))
        ctl = control_matrix(x, y, u, w)
        rt[case] = sum(ctl[k][c] << (4 * k + c) for k in (0, 1) for c in range(4))
    return qt, rt


Q_TABLE, R_TABLE = _tables()
_SHIFT30 = np.arange(30, dtype=np.uint64)[:, None]
_SHIFT8 = np.arange(8, dtype=np.uint64)[:, None]
_ONE = np.uint64(1)


def control_bytes(n: int) -> int:
    return (5 * n + 7) // 8


def layer_blocks(n: int) -> int:
    """16-byte blocks of an n-gate layer's table: 3n half-labels, 5n bits, padding."""
    return (24 * n + control_bytes(n) + 15) // 16


_PAIR_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)


def os_coins(n: int) -> Bits:
    """ρ of n gates (two bits each, values 0..3) from the OS CSPRNG, four per byte."""
    raw = np.frombuffer(os.urandom((n + 3) // 4), dtype=np.uint8)
    return ((raw[:, None] >> _PAIR_SHIFTS) & np.uint8(3)).reshape(-1)[:n]


def _neg(bits: U64) -> U64:
    return np.negative(bits)


class ThreeHalvesGarbleBackend(GarbleBackend):
    """The garbler's side of three-halves AND gates (`garble.GarbleBackend` otherwise)."""

    scheme = "threehalves"
    #: ρ of the next n gates; tests replace it to compare engines byte for byte.
    coins: Callable[[int], Bits] = staticmethod(os_coins)

    def _hash_six(self, a0: Blocks, b0: Blocks) -> tuple[Blocks, Blocks, Blocks, U64, U64]:
        """Colour-0 labels A, B and the six hashes h_A0, h_A1, h_B0, h_B1, h_X0, h_X1."""
        n = a0.shape[0]
        d = self.delta
        al, be = a0[:, 0] & _ONE, b0[:, 0] & _ONE
        x = self._workspace("x", 6 * n)[: 6 * n]
        a, b = x[:n], x[2 * n : 3 * n]
        np.bitwise_xor(a0, _neg(al)[:, None] & d, out=a)
        np.bitwise_xor(b0, _neg(be)[:, None] & d, out=b)
        np.bitwise_xor(a, b, out=x[4 * n : 5 * n])
        for k in (0, 2, 4):
            np.bitwise_xor(x[k * n : (k + 1) * n], d, out=x[(k + 1) * n : (k + 2) * n])
        a, b = a.copy(), b.copy()
        h = self.hasher(x, self._tweaks(n, (0, 0, 1, 1, 2, 2), STEP), self._workspace("h", 6 * n))
        return a, b, h, al, be

    def and_(self, a0: Blocks, b0: Blocks, rho: Bits | None = None) -> Blocks:
        """rho: the gates' coins when already drawn (`chain.or_chain`), else drawn here."""
        n = a0.shape[0]
        a, b, h, al, be = self._hash_six(a0, b0)
        w = h[:, 0].reshape(6, n)  # half-label masks
        m = (h[:, 1] & _ONE).astype(np.uint8).reshape(6, n)  # control-bit masks
        rho = np.asarray(self.coins(n) if rho is None else rho, dtype=np.uint8)
        ta, tb = (al ^ _ONE).astype(np.uint8), (be ^ _ONE).astype(np.uint8)
        case = (ta << 3) | (tb << 2) | rho
        q = Q_TABLE[case]
        xs = np.empty((6, n), dtype=np.uint64)
        xs[0], xs[1], xs[2], xs[3] = a[:, 0], a[:, 1], b[:, 0], b[:, 1]
        xs[4], xs[5] = self.delta[0], self.delta[1]
        sel = _neg((q[None, :] >> _SHIFT30) & _ONE).reshape(5, 6, n)
        z = np.bitwise_xor.reduce(sel & xs[None], axis=1)
        z[0] ^= w[0] ^ w[4]
        z[1] ^= w[2] ^ w[4]
        z[2] ^= w[0] ^ w[1]
        z[3] ^= w[2] ^ w[3]
        z[4] ^= w[4] ^ w[5]
        ctl = np.empty((n, 5), dtype=np.uint8)
        ctl[:, 0] = (rho >> 1) ^ m[0] ^ m[4]
        ctl[:, 1] = (rho & 1) ^ m[2] ^ m[4]
        ctl[:, 2] = ta ^ m[0] ^ m[1]
        ctl[:, 3] = tb ^ m[2] ^ m[3]
        ctl[:, 4] = ta ^ tb ^ m[4] ^ m[5]
        tab = self._alloc(layer_blocks(n)).reshape(-1)
        tab[: 3 * n] = z[2:].reshape(-1)
        raw = tab.view(np.uint8)
        raw[24 * n :] = 0
        raw[24 * n : 24 * n + control_bytes(n)] = np.packbits(ctl.reshape(-1), bitorder="little")
        c0 = np.empty((n, 2), dtype=np.uint64)
        c0[:, 0], c0[:, 1] = z[0], z[1]
        self.and_gates += n
        return self._log(c0)


class ThreeHalvesEvalBackend(EvalBackend):
    """The evaluator's side of three-halves AND gates."""

    scheme = "threehalves"

    def and_(self, a: Blocks, b: Blocks) -> Blocks:
        n = a.shape[0]
        x = self._workspace("x", 3 * n)[: 3 * n]
        x[:n] = a
        x[n : 2 * n] = b
        np.bitwise_xor(a, b, out=x[2 * n :])
        h = self.hasher(x, self._tweaks(n, PAIRS, STEP), self._workspace("h", 3 * n))
        w = h[:, 0].reshape(3, n)
        mb = (h[:, 1] & _ONE).reshape(3, n)
        tab = self._take(layer_blocks(n)).reshape(-1)
        g = tab[: 3 * n].reshape(3, n)
        raw = tab.view(np.uint8)
        if raw[24 * n + control_bytes(n) :].any() or (
            5 * n % 8 and raw[24 * n + control_bytes(n) - 1] >> (5 * n % 8)
        ):
            raise ValueError("three-halves table padding is not zero")
        zb = np.unpackbits(raw[24 * n : 24 * n + control_bytes(n)], count=5 * n, bitorder="little")
        z = zb.reshape(n, 5).T.astype(np.uint64)
        i, j = a[:, 0] & _ONE, b[:, 0] & _ONE
        ij = i ^ j
        r0 = z[0] ^ (i & z[2]) ^ (ij & z[4]) ^ mb[0] ^ mb[2]
        r1 = z[1] ^ (j & z[3]) ^ (ij & z[4]) ^ mb[1] ^ mb[2]
        rb = R_TABLE[(i << np.uint64(3)) | (j << np.uint64(2)) | (r0 << _ONE) | r1]
        ys = np.empty((4, n), dtype=np.uint64)
        ys[0], ys[1], ys[2], ys[3] = a[:, 0], a[:, 1], b[:, 0], b[:, 1]
        sel = _neg((rb[None, :] >> _SHIFT8) & _ONE).reshape(2, 4, n)
        lin = np.bitwise_xor.reduce(sel & ys[None], axis=1)
        gij = _neg(ij) & g[2]
        c = np.empty((n, 2), dtype=np.uint64)
        c[:, 0] = (_neg(i) & g[0]) ^ gij ^ w[0] ^ w[2] ^ lin[0]
        c[:, 1] = (_neg(j) & g[1]) ^ gij ^ w[1] ^ w[2] ^ lin[1]
        self.and_gates += n
        return self._log(c)


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown garbling scheme {scheme!r}; choose {' or '.join(SCHEMES)}")
    return scheme


def and_bytes(scheme: str) -> float:
    """Table bytes per full AND gate (layer padding aside)."""
    return 32.0 if check_scheme(scheme) == "halfgates" else 24 + 5 / 8
