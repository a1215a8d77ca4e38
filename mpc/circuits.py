"""The SVT comparison circuits, written once against `garble.Backend`.

Inputs: the garbler's ring values a (known to it in the clear) and wires for the
evaluator's values b, as 64 bit-planes × n lanes.  Under the overflow bound
|a + b| < 2^63 (as signed int64), "YES" means a + b ≥ 0, the complement of the
sign bit of the 64-bit sum.

Sizes per comparison: the carry chain needs 63 AND gates (one garbler-half gate
for bit 0, 62 full half-gates), i.e. 125 ciphertexts = 2000 bytes; the garbler's
inputs cost nothing (they are folded into labels by free XOR with a constant).
The chunk circuits add the linear prefix-OR (`chain.py`: (K − 1)/K AND per
lane) and, for CompareToThresholds, 2 more ANDs per query.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from svtagg.mpc.chain import or_chain
from svtagg.mpc.garble import Backend, Bits, Wires
from svtagg.mpc.ring import RING_BITS

#: Lanes per pass of the carry chain: small enough that a layer's buffers
#: (4 × 16 bytes per lane on the garbler) stay in L2, large enough that
#: numpy's per-call overhead is amortized.
LANE_BATCH = 4096


class CttCode(enum.IntEnum):
    """Outcome of one CompareToThresholds query; the value is also its byte in
    the evaluator's result message."""

    HIGH = 0
    LOW = 1
    CLOSE = 2


HIGH, LOW, CLOSE = CttCode.HIGH, CttCode.LOW, CttCode.CLOSE


#: Up to this many elements, `bit_planes` unpacks and transposes in one step
#: (≈ 1.7 µs at n = 1 against ≈ 12 µs for the eight shifts; the shifts win from
#: n ≈ 500 on, ≈ 15x at n = 10^4).
_SMALL_PLANES = 256


def bit_planes(z: npt.NDArray[np.uint64]) -> Bits:
    """(64, n) uint8 array: row i holds bit i of every element of z."""
    le = np.ascontiguousarray(z, dtype="<u8").view(np.uint8).reshape(-1, 8)
    if le.shape[0] <= _SMALL_PLANES:  # one call: faster while the (n, 64) copy is small
        return np.ascontiguousarray(np.unpackbits(le, axis=1, bitorder="little").T)
    # Byte b of every element in a row (one small transpose), then row 8b + t
    # is that row shifted by t: 8 shifts of n bytes instead of unpacking to
    # (n, 64) and transposing 64·n bytes (≈ 14x faster at n = 10^5).
    cols = np.ascontiguousarray(le.T)
    out = np.empty((64, cols.shape[1]), dtype=np.uint8)
    for t in range(8):
        np.right_shift(cols, t, out=out[t::8])
    np.bitwise_and(out, 1, out=out)
    return out


WireSource = Callable[[int, int], Wires]
"""(lo, hi) → the evaluator-input wires of lanes lo..hi−1, as 64 × (hi − lo).
Called once per lane batch, in order, so labels can be produced just in time."""


def planes(b: Wires) -> WireSource:
    """A WireSource over a whole (64, n, …) array of wires or bits."""
    return lambda lo, hi: b[:, lo:hi]


@functools.lru_cache(maxsize=256)
def lane_batches(n: int) -> tuple[tuple[int, int], ...]:
    """The lane batches of an n-lane circuit; the OT extension uses the same split."""
    return tuple((lo, min(lo + LANE_BATCH, n)) for lo in range(0, n, LANE_BATCH))


def check_width(width: int) -> int:
    """A comparison width: any whole number of bits in [2, 64] (the OT extension
    packs a lane batch's w bits per lane into whole bytes, padding the last)."""
    if not (2 <= width <= RING_BITS):
        raise ValueError(f"comparison width must be in [2, 64] bits, got {width}")
    return width


def sign_yes(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, width: int = RING_BITS
) -> Wires:
    """YES_k = [a_k + b_k ≥ 0], for every lane k < n, on the low `width` bits.

    Correct whenever |a_k + b_k| < 2^(width−1) as integers (docs/mpc.md): the sign
    of (a + b) mod 2^w is then the sign of the sum.  a_bits: (≥ width, n)
    garbler bits (None on the evaluator); b: the width × n wires of the
    evaluator's bits. Carry chain with the majority trick, one AND per bit:
    c_{i+1} = c_i ⊕ ((a_i ⊕ c_i) ∧ (b_i ⊕ c_i)), c_0 = 0; sign = a_{w−1} ⊕ b_{w−1}
    ⊕ c_{w−1}: width − 1 ANDs.  Lanes are independent, so they are processed in
    cache-sized batches.
    """
    parts = []
    done = getattr(be, "batch_done", None)  # the garbler streams each batch's tables
    for lo, hi in lane_batches(n):
        a = None if a_bits is None else a_bits[:, lo:hi]
        parts.append(_sign_yes_batch(be, a, b(lo, hi), width))
        if done is not None:
            done()
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _sign_yes_batch(be: Backend, a_bits: Bits | None, b: Wires, width: int) -> Wires:
    fused = getattr(be, "sign_batch", None)  # the native core runs the chain in one call
    if fused is not None:
        yes = fused(a_bits, b, width)
        if yes is not None:
            return yes

    def a(i: int) -> Bits | None:
        return None if a_bits is None else a_bits[i]

    c = be.and_const(a(0), b[0])  # c_1 = a_0 ∧ b_0 (c_0 = 0)
    for i in range(1, width - 1):
        x = be.xor_const(c, a(i))
        y = be.xor(b[i], c)
        c = be.xor(c, be.and_(x, y))
    sign = be.xor_const(be.xor(b[width - 1], c), a(width - 1))
    return be.not_(sign)


def prefix_or(be: Backend, x: Wires) -> Wires:
    """Inclusive prefix OR p_k = x_0 ∨ … ∨ x_k, linear (`chain.or_chain`):
    K − 1 ORs, the fewest, in one AND layer garbled gate after gate."""
    return or_chain(be, x)


def prefix_or_tree(be: Backend, x: Wires) -> Wires:
    """Inclusive prefix OR p_k = x_0 ∨ … ∨ x_k, Brent–Kung: < 2n ORs in
    2·log2(n) layers, each layer one vectorized gate call over all its gates.
    Not used by the chunk circuits: the baseline `prefix_or` was measured
    against (`bench_mpc --prefix both`, docs/mpc.md)."""
    p = x.copy()
    n = p.shape[0]
    d = 1
    while 2 * d <= n:  # up-sweep: p[i] covers (i − 2d, i] for i ≡ −1 mod 2d
        idx = np.arange(2 * d - 1, n, 2 * d)
        p[idx] = be.or_(p[idx], p[idx - d])
        d *= 2
    d //= 2
    while d >= 1:  # down-sweep: complete the prefixes in between
        idx = np.arange(3 * d - 1, n, 2 * d)
        if idx.size:
            p[idx] = be.or_(p[idx], p[idx - d])
        d //= 2
    return p


def _first_one(be: Backend, p: Wires) -> Wires:
    """One-hot of the first 1 of a prefix-OR p: f_k = p_k ⊕ p_{k−1} (free)."""
    f = p.copy()
    f[1:] = be.xor(p[1:], p[:-1])
    return f


def first_yes_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, width: int = RING_BITS
) -> Wires:
    """Chunk circuit of AboveThreshold over n lanes: outputs the one-hot of the
    first YES (all zeros if none). Lanes after the first YES output 0 whatever
    their inputs."""
    return first_yes_logic(be, sign_yes(be, a_bits, b, n, width))


def first_yes_logic(be: Backend, yes: Wires) -> Wires:
    """The one-hot of the first YES among the YES wires (the chunk logic after
    the sign tests, shared by the garbled and the OT-based path)."""
    return _first_one(be, prefix_or(be, yes))


def ctt_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, width: int = RING_BITS
) -> tuple[Wires, Wires]:
    """CompareToThresholds chunk circuit over n queries.

    Lanes 0..n−1 of the inputs carry z_high, lanes n..2n−1 carry z_low.
    high_j, low_j = YES of each; close_j = ¬high_j ∧ ¬low_j.
    Outputs (m, f): f = one-hot of the first CLOSE; m_j = high_j ∧ ¬(a CLOSE
    before j). Before the first CLOSE, m_j tells HIGH from LOW; from the first
    CLOSE on, m_j = 0 and after it f_j = 0, so later queries reveal nothing.
    """
    return ctt_logic(be, sign_yes(be, a_bits, b, 2 * n, width), n)


def ctt_logic(be: Backend, yes: Wires, n: int) -> tuple[Wires, Wires]:
    """`ctt_circuit` after its sign tests: yes = the n high then the n low YES wires."""
    high, low = yes[:n], yes[n:]
    close = be.and_(be.not_(high), be.not_(low))
    p = prefix_or(be, close)
    m = high.copy()
    if n > 1:
        m[1:] = be.and_(high[1:], be.not_(p[:-1]))
    return m, _first_one(be, p)


def first_yes_index(f: Bits) -> int | None:
    """Decode the one-hot output of `first_yes_circuit`."""
    hits = np.flatnonzero(f)
    return int(hits[0]) if hits.size else None


def ctt_outcomes(m: Bits, f: Bits) -> list[int]:
    """Decode (m, f) of `ctt_circuit`: HIGH or LOW per query, up to and including
    the first CLOSE."""
    hits = np.flatnonzero(f)
    stop = int(hits[0]) if hits.size else m.shape[0]
    out: list[int] = [HIGH if v else LOW for v in m[:stop].tolist()]
    if hits.size:
        out.append(CLOSE)
    return out


def plain_first_yes(z_l: npt.NDArray[np.uint64], z_h: npt.NDArray[np.uint64]) -> int | None:
    """Plaintext reference: first j with signed(z_l[j] + z_h[j]) ≥ 0."""
    hits = np.flatnonzero((z_l + z_h).view(np.int64) >= 0)
    return int(hits[0]) if hits.size else None


def plain_compare_to_thresholds(
    z_high: npt.NDArray[np.uint64], z_low: npt.NDArray[np.uint64]
) -> list[int]:
    """Plaintext reference for CompareToThresholds on reconstructed values."""
    out: list[int] = []
    for hi, lo in zip(z_high.view(np.int64).tolist(), z_low.view(np.int64).tolist(), strict=True):
        out.append(HIGH if hi >= 0 else LOW if lo >= 0 else CLOSE)
        if out[-1] == CLOSE:
            break
    return out


# ---------------------------------------------------------------- robust aggregates
Rows = list[Wires]
ConstBits = Callable[[int], "Bits | None"]


def _add_const(be: Backend, x: Rows, k: ConstBits, carry_out: bool = False) -> Rows:
    """x + k mod 2^w for w = len(x) bit rows (w + 1 rows, the carry on top, with
    `carry_out`); k is known to the garbler (None on the evaluator).
    Carry c_{i+1} = c_i ⊕ ((k_i ⊕ c_i) ∧ (x_i ⊕ c_i)): w − 1 ANDs per lane (w
    with the carry out), the first a garbler-half gate."""
    n = len(x)
    out = [be.xor_const(x[0], k(0))]
    c = be.and_const(k(0), x[0])
    for i in range(1, n):
        out.append(be.xor_const(be.xor(x[i], c), k(i)))
        if i < n - 1 or carry_out:
            c = be.xor(c, be.and_(be.xor_const(c, k(i)), be.xor(x[i], c)))
    if carry_out:
        out.append(c)
    return out


def _abs(be: Backend, s: Rows, keep: int | None = None) -> Rows:
    """|s| for s read as a signed w-bit number (w = len(s)), i.e. min(s, 2^w − s):
    (s ⊕ sign) + sign, w − 1 ANDs; only the low `keep` rows when the caller
    knows the rest are 0 (one AND fewer per dropped row).  −2^(w−1) maps to
    2^(w−1), which is tri's value there."""
    n = len(s)
    keep = n if keep is None else keep
    sign = s[n - 1]
    u = [be.xor(si, sign) for si in s[:keep]]
    out = []
    c = sign
    for i in range(keep):
        out.append(be.xor(u[i], c))
        if i < keep - 1:
            c = be.and_(u[i], c)
    return out


def _min_const(be: Backend, t: Rows, bound: ConstBits, not_bound: ConstBits) -> Rows:
    """min(t, N) for 0 ≤ t ≤ 2^63 and a public 0 ≤ N < 2^63: the sign of
    t + (2^64 − N − 1) = t − N − 1 (which cannot wrap) says t ≤ N; a mux picks."""
    c = be.and_const(not_bound(0), t[0])
    for i in range(1, RING_BITS - 1):
        c = be.xor(c, be.and_(be.xor_const(c, not_bound(i)), be.xor(t[i], c)))
    top = RING_BITS - 1
    at_most = be.xor_const(be.xor(t[top], c), not_bound(top))
    greater = be.not_(at_most)
    return [be.xor(ti, be.and_(greater, be.xor_const(ti, bound(i)))) for i, ti in enumerate(t)]


def _public_bits(value: int, m: int, garbler: bool) -> ConstBits:
    rows = [np.full(m, (value >> i) & 1, dtype=np.uint8) for i in range(RING_BITS)]
    return (lambda i: rows[i]) if garbler else (lambda i: None)


def clamp_reshare_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, bound: int
) -> tuple[Wires, ...]:
    """y = g(a + b) − r mod 2^64 for every lane, with g(s) = min(tri(s), bound):
    the robust aggregate, re-shared (the garbler keeps r, the evaluator learns y).

    a_bits: the garbler's (64, 2n) bits, lanes 0..n−1 its share a and lanes
    n..2n−1 the constant −r (None on the evaluator); b: the evaluator's share.
    Outputs 64 bundles of n wires, bit i of y in bundle i.  About 315 ANDs per lane.
    """
    if not 0 <= bound < 1 << (RING_BITS - 1):
        raise ValueError("the clamp bound must be in [0, 2^63)")
    garbler = a_bits is not None
    parts: list[Rows] = []
    for lo, hi in lane_batches(n):
        m = hi - lo
        bw = b(lo, hi)
        x = [bw[i] for i in range(RING_BITS)]

        def share(i: int, lo: int = lo, hi: int = hi) -> Bits | None:
            return None if a_bits is None else a_bits[i, lo:hi]

        def neg_r(i: int, lo: int = lo, hi: int = hi) -> Bits | None:
            return None if a_bits is None else a_bits[i, n + lo : n + hi]

        t = _abs(be, _add_const(be, x, share))
        g = _min_const(
            be,
            t,
            _public_bits(bound, m, garbler),
            _public_bits((1 << RING_BITS) - bound - 1, m, garbler),
        )
        parts.append(_add_const(be, g, neg_r))
    if len(parts) == 1:
        return tuple(parts[0])
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(RING_BITS))


def ring_from_bits(rows: list[Bits]) -> npt.NDArray[np.uint64]:
    """64 bit rows (bit i of every lane in row i) back to ring elements."""
    packed = np.packbits(np.stack(rows).astype(np.uint8), axis=0, bitorder="little")
    return np.ascontiguousarray(packed.T).view("<u8").reshape(-1).astype(np.uint64)


def plain_clamp(s: npt.NDArray[np.uint64], bound: int) -> npt.NDArray[np.uint64]:
    """Plaintext reference: g(s) = min(tri(s), bound), tri(s) = min(s, 2^64 − s)."""
    s = np.asarray(s, dtype=np.uint64)
    tri = np.minimum(s, np.uint64(0) - s)
    return np.minimum(tri, np.uint64(bound))


# ---------------------------------------------------------------- report validation
def any_per_group_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, group: int, width: int = RING_BITS
) -> Wires:
    """For lanes laid out as n/group consecutive groups: the OR of each group's
    YES bits (sign of a + b ≥ 0), one output wire per group.  Range validation
    puts a report's 2d sign tests in one group, so only "this report is
    invalid" is revealed — not which value, nor which side.  < group ORs per group."""
    if group < 1 or n % group:
        raise ValueError(f"{n} lanes do not split into groups of {group}")
    yes = sign_yes(be, a_bits, b, n, width)
    x = yes.reshape((n // group, group) + yes.shape[1:])
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        left = x[:, :half].reshape((-1,) + x.shape[2:])
        right = x[:, half : 2 * half].reshape((-1,) + x.shape[2:])
        merged = be.or_(left, right).reshape((x.shape[0], half) + x.shape[2:])
        x = np.concatenate([merged, x[:, 2 * half :]], axis=1)
    return x[:, 0]


# ---------------------------------------------------------------- field to ring
@dataclass(frozen=True)
class PrimeField:
    """A prime field of the Prio3 reports, as the field-to-ring pass sees it:
    the modulus p and how many 64-bit words a share in [0, p) takes."""

    name: str
    modulus: int
    words: int

    @property
    def bits(self) -> int:
        """w_p: the width of a share (64 or 128)."""
        return RING_BITS * self.words


#: The moduli of draft-irtf-cfrg-vdaf-07 §6.1.2 (the same as `svtagg.vdaf.field`,
#: which mpc does not import: it sits below the report layer).
FIELD64 = PrimeField("Field64", 2**32 * 4294967295 + 1, 1)
FIELD128 = PrimeField("Field128", 2**66 * 4611686018427387897 + 1, 2)
PRIME_FIELDS = {f.name: f for f in (FIELD64, FIELD128)}
_WORD = (1 << RING_BITS) - 1


def prime_field(field: object) -> PrimeField:
    """The field named by `field`: "Field64", "Field128", a `PrimeField`, or any
    object with the same `name` and `modulus` (e.g. `svtagg.vdaf.field.FIELD64`)."""
    name = field if isinstance(field, str) else getattr(field, "name", None)
    f = PRIME_FIELDS.get(name) if isinstance(name, str) else None
    if f is None:
        raise ValueError(f"unknown field {field!r}; expected Field64 or Field128")
    if getattr(field, "modulus", f.modulus) != f.modulus:
        raise ValueError(f"{name} with a modulus other than draft-07's")
    return f


def field_words(share: npt.ArrayLike, field: PrimeField) -> npt.NDArray[np.uint64]:
    """A vector of k field elements as a (k, words) uint64 array, least
    significant word first.  Accepts uint64 words ((k,) for Field64, (k, words))
    or a 1-D vector of Python integers (the `svtagg.vdaf` representation);
    refuses anything outside [0, p)."""
    # Python sequences as integers: numpy would pick int64, uint64 or object by value.
    arr = share if isinstance(share, np.ndarray) else np.array(share, dtype=object)
    if arr.dtype == np.uint64:
        w = arr.reshape(-1, 1) if arr.ndim == 1 and field.words == 1 else arr
        if w.ndim != 2 or w.shape[1] != field.words:
            raise ValueError(f"{field.name} shares are (k, {field.words}) uint64 words")
        w = np.ascontiguousarray(w)
    elif arr.dtype == object or np.issubdtype(arr.dtype, np.integer):
        if arr.ndim != 1:
            raise ValueError("expected a 1-D vector of field elements")
        vals = [int(v) for v in arr.tolist()]
        if any(not 0 <= v < field.modulus for v in vals):
            raise ValueError(f"a share is not an element of {field.name}")
        rows = [[(v >> (RING_BITS * j)) & _WORD for j in range(field.words)] for v in vals]
        return np.array(rows, dtype=np.uint64).reshape(-1, field.words)
    else:
        raise TypeError(f"expected uint64 words or integers, got {arr.dtype}")
    below, equal = np.zeros(w.shape[0], bool), np.ones(w.shape[0], bool)
    for j in reversed(range(field.words)):  # lexicographic, most significant word first
        pj = np.uint64((field.modulus >> (RING_BITS * j)) & _WORD)
        below |= equal & (w[:, j] < pj)
        equal &= w[:, j] == pj
    if not below.all():
        raise ValueError(f"a share is not an element of {field.name}")
    return w


def _ge_public(be: Backend, x: Rows, k: int) -> Wires:
    """[x ≥ K] for a public 1 ≤ K < 2^n (n = len(x) rows): the carry out of
    x + (2^n − K).  With the addend public, c_{i+1} is x_i ∨ c_i or x_i ∧ c_i,
    one AND, and free while the carry is still the constant 0: n − 1 − tz(K)
    ANDs, tz the trailing zero bits."""
    n = len(x)
    if not 1 <= k < 1 << n:
        raise ValueError("comparison constant out of range")
    addend = (1 << n) - k
    c: Wires | None = None
    for i in range(n):
        bit = (addend >> i) & 1
        if c is None:
            c = x[i] if bit else None
        else:
            c = be.or_(x[i], c) if bit else be.and_(x[i], c)
    assert c is not None  # addend ≥ 1, so some bit set the carry
    return c


def _add_wires(be: Backend, x: Rows, y: Rows) -> Rows:
    """x + y mod 2^n over n = len(x) rows of two wire vectors: n − 1 ANDs."""
    out = [be.xor(x[0], y[0])]
    c = be.and_(x[0], y[0])
    n = len(x)
    for i in range(1, n):
        out.append(be.xor(be.xor(x[i], y[i]), c))
        if i < n - 1:
            c = be.xor(c, be.and_(be.xor(x[i], c), be.xor(y[i], c)))
    return out


def _min_public(be: Backend, u: Rows, bound: int, zero: Wires) -> Rows:
    """min(u, N) as 64 rows, for u below 2^len(u) and a public 0 ≤ N < 2^63 (so
    bit 63 of the result is 0 and rows of u from 63 up only enter the test).
    The test u > N is `_ge_public`; the mux rows are u_i ∨ gt where N_i = 1 and
    u_i ∧ ¬gt where N_i = 0 — one AND each, all 63 in one layer."""
    low = RING_BITS - 1
    if bound + 1 >= 1 << len(u):  # u ≤ N always: nothing to clamp
        return list(u[:low]) + [zero] * (RING_BITS - len(u[:low]))
    gt = _ge_public(be, u, bound + 1)
    ng = be.not_(gt)
    ones = [(bound >> i) & 1 for i in range(low)]
    lhs = [be.not_(u[i]) if ones[i] else u[i] for i in range(low)]
    prod = be.and_(np.concatenate(lhs), np.concatenate([ng] * low))
    m = ng.shape[0]
    rows = [prod[i * m : (i + 1) * m] for i in range(low)]
    return [be.not_(r) if ones[i] else r for i, r in enumerate(rows)] + [zero]


def _field_clamp_batch(
    be: Backend, x: Rows, share: ConstBits, neg_r: ConstBits, bound: int, field: PrimeField
) -> Rows:
    """One lane batch of `field_clamp_reshare_circuit` (x: the evaluator's w_p rows)."""
    w, p = field.bits, field.modulus
    t = _add_const(be, x, share, carry_out=True)  # a + b < 2p − 1: w + 1 rows
    half = (p + 1) // 2
    g1 = _ge_public(be, t, half)  # t ≥ (p+1)/2: nearest multiple of p is p or 2p
    g2 = _ge_public(be, t, p + half)  # t ≥ (3p+1)/2: it is 2p (g2 implies g1)
    once = be.xor(g1, g2)  # exactly one p
    zero = be.xor(g1, g1)
    minus_p, minus_2p = (-p) % (1 << w), (-2 * p) % (1 << w)

    def term(i: int) -> Wires:  # bit i of −m·p mod 2^w: public bits selected by once, g2
        a, b = (minus_p >> i) & 1, (minus_2p >> i) & 1
        return be.xor(once, g2) if a and b else once if a else g2 if b else zero

    c = _add_wires(be, t[:w], [term(i) for i in range(w)])  # t − m·p ∈ (−p/2, p/2)
    u = _abs(be, c, keep=w - 1)  # tri_p(s) ≤ (p − 1)/2 < 2^(w−1)
    return _add_const(be, _min_public(be, u, bound, zero), neg_r)


def field_clamp_reshare_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, bound: int, field: PrimeField
) -> tuple[Wires, ...]:
    """y = g_p(a + b mod p) − r mod 2^64 for every coordinate: the field-to-ring
    pass.  g_p(s) = min(tri_p(s), bound) with tri_p(s) = min(s, p − s), the
    distance of s to 0 on Z_p — the ring pass's g read on the field (s in
    (p/2, p) counts as negative), so g_p is 1-Lipschitz on Z_p as g is on Z_2^64.

    Lanes are 64-bit words, `field.words` per coordinate, least significant
    first: n = words·k.  a_bits: the garbler's (64, 2n) bits, lanes 0..n−1 its
    share a, lanes n..2n−1 the constant −r in word 0 of each coordinate (other
    words 0); None on the evaluator.  b: the evaluator's share.

    Circuit: t = a + b (w_p + 1 bits); the nearest multiple m·p of p to t from
    two public comparisons; c = t − m·p, the centered representative of s;
    |c| = tri_p(s); clamp; subtract r.  6·w_p + 120 ANDs per coordinate at
    most (504 for Field64, 888 for Field128; docs/mpc.md).
    """
    if not 0 <= bound < 1 << (RING_BITS - 1):
        raise ValueError("the clamp bound must be in [0, 2^63)")
    words = field.words
    if n % words or LANE_BATCH % words:
        raise ValueError(f"{n} lanes are not whole {field.name} elements")
    parts: list[Rows] = []
    for lo, hi in lane_batches(n):
        bw = b(lo, hi)
        x = [bw[i, j::words] for j in range(words) for i in range(RING_BITS)]

        def share(i: int, lo: int = lo, hi: int = hi) -> Bits | None:
            j, bit = divmod(i, RING_BITS)
            return None if a_bits is None else a_bits[bit, lo + j : hi : words]

        def neg_r(i: int, lo: int = lo, hi: int = hi) -> Bits | None:
            return None if a_bits is None else a_bits[i, n + lo : n + hi : words]

        parts.append(_field_clamp_batch(be, x, share, neg_r, bound, field))
    if len(parts) == 1:
        return tuple(parts[0])
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(RING_BITS))


def plain_field_clamp(a: list[int], b: list[int], field: PrimeField, bound: int) -> list[int]:
    """Plaintext reference: g_p((a + b) mod p) = min(s, p − s, bound)."""
    p = field.modulus
    out = []
    for x, y in zip(a, b, strict=True):
        s = (x + y) % p
        out.append(min(s, p - s, bound))
    return out


# ---------------------------------------------------------------- report-noisy-max
def index_bits(k: int) -> int:
    """Output wires of the argmax over k lanes: ⌈log2 k⌉, at least 1."""
    return max(1, (k - 1).bit_length())


def _signed_ge(be: Backend, x: Wires, y: Wires) -> Wires:
    """[x ≥ y] for x, y read as signed w-bit numbers, (w, n, …) wire arrays:
    the carry out of x' + ¬y' + 1, where ' flips the sign bit (free), so the
    signed order becomes the unsigned one.  Carry c_{i+1} = c_i ⊕ ((x_i ⊕ c_i)
    ∧ (¬y_i ⊕ c_i)) from c_0 = 1, whose first step is c_1 = ¬(¬x_0 ∧ y_0):
    w ANDs per pair, one layer per bit."""
    w = x.shape[0]
    c = be.not_(be.and_(be.not_(x[0]), y[0]))
    for i in range(1, w):
        xi, ny = (be.not_(x[i]), y[i]) if i == w - 1 else (x[i], be.not_(y[i]))
        c = be.xor(c, be.and_(be.xor(xi, c), be.xor(ny, c)))
    return c


def _tournament(be: Backend, v: Wires, idx: Rows, keep_value: bool) -> tuple[Wires, Rows]:
    """Knock-out rounds over the n candidates of v ((w, n, …) value wires) until
    one is left.  idx: the L rows of each candidate's index relative to the
    first of the 2^L lanes it stands for.  In a round candidates 2i and 2i + 1
    meet; the right one wins only if strictly greater (ties go to the smaller
    index); the winner's index is its muxed L rows with [right won] on top; an
    odd one out passes on with a 0 on top.  Per match: w ANDs to compare, w to
    mux the value (not in the final unless `keep_value`) and L to mux the
    index, the muxes in one layer."""
    while v.shape[1] > 1:
        n = v.shape[1]
        m = n // 2
        left, right = v[:, 0 : 2 * m : 2], v[:, 1 : 2 * m : 2]
        gt = be.not_(_signed_ge(be, left, right))
        final = n == 2 and not keep_value
        lo = [r[0 : 2 * m : 2] for r in idx] + ([] if final else list(left))
        hi = [r[1 : 2 * m : 2] for r in idx] + ([] if final else list(right))
        picked: Rows = []
        if lo:  # winner = lo ⊕ (gt ∧ (lo ⊕ hi)), every row in one AND layer
            diff = be.and_(
                np.concatenate([be.xor(a, b) for a, b in zip(lo, hi, strict=True)]),
                np.concatenate([gt] * len(lo)),
            )
            picked = [be.xor(a, diff[j * m : (j + 1) * m]) for j, a in enumerate(lo)]
        new_idx = [*picked[: len(idx)], gt]
        new_v = v[:, :1] if final else np.stack(picked[len(idx) :])
        if n % 2:  # the bye: its rows unchanged, a 0 on top
            bye = v[:, n - 1 : n]
            tail = [r[n - 1 : n] for r in idx] + [be.xor(bye[0], bye[0])]
            new_idx = [np.concatenate([r, t]) for r, t in zip(new_idx, tail, strict=True)]
            new_v = np.concatenate([new_v, bye], axis=1)
        v, idx = new_v, new_idx
    return v, idx


def argmax_circuit(
    be: Backend, a_bits: Bits | None, b: WireSource, n: int, width: int = RING_BITS
) -> tuple[Wires, ...]:
    """Report-noisy-max's chunk circuit: the index of the largest z_j = a_j + b_j
    over n lanes, each z_j read as a signed `width`-bit number (correct when
    every |a_j + b_j| < 2^(w−1), as for `sign_yes`); ties go to the smaller index.

    The sum costs w − 1 ANDs per lane (`_add_const`), then a knock-out
    tournament (`_tournament`): n − 1 matches of 2w ANDs (the final w) plus the
    index muxes, < 1 AND per lane in all — about 3w ANDs per lane.  Lanes are
    summed and knocked out batch by batch (`LANE_BATCH` = 2^12 lanes, so each
    batch is a whole subtree of the one binary tree), the garbler streaming each
    batch's tables; the batch winners then meet.  Outputs `index_bits(n)`
    bundles of one wire, bit i of the index in bundle i.
    """
    w = check_width(width)
    if n == 1:  # index 0 whatever the value: a constant wire, no gates
        bw = b(0, 1)
        return (be.xor(bw[0], bw[0]),)
    vals: list[Wires] = []
    rows: list[Rows] = []
    batches = lane_batches(n)
    full = (LANE_BATCH - 1).bit_length()
    done = getattr(be, "batch_done", None)  # the garbler streams each batch's tables
    for lo, hi in batches:
        bw = b(lo, hi)
        x = [bw[i] for i in range(w)]

        def share(i: int, lo: int = lo, hi: int = hi) -> Bits | None:
            return None if a_bits is None else a_bits[i, lo:hi]

        v, idx = _tournament(be, np.stack(_add_const(be, x, share)), [], len(batches) > 1)
        if len(batches) > 1:  # a short last batch: its index padded to 12 rows
            idx += [be.xor(v[0], v[0])] * (full - len(idx))
        vals.append(v)
        rows.append(idx)
        if done is not None:
            done()
    if len(batches) > 1:
        cat = [np.concatenate([r[i] for r in rows]) for i in range(full)]
        _, idx = _tournament(be, np.concatenate(vals, axis=1), cat, False)
    else:
        idx = rows[0]
    return tuple(idx)


def argmax_index(bits: list[Bits]) -> int:
    """Decode `argmax_circuit`'s output bundles (bit i of the index in bundle i)."""
    return sum(int(b[0]) << i for i, b in enumerate(bits))


def argmax_and_gates(n: int, width: int = RING_BITS) -> int:
    """The AND gates of `argmax_circuit` over n lanes, counted from its public
    shape (the tournament tree), for the cost tables and to check the circuit."""

    def rounds(n: int, levels: int, keep: bool) -> int:
        ands = 0
        while n > 1:
            m, final = n // 2, n == 2 and not keep
            ands += m * (width + levels + (0 if final else width))
            n, levels = n - m, levels + 1
        return ands

    if n == 1:
        return 0
    total = (width - 1) * n
    batches = lane_batches(n)
    if len(batches) == 1:
        return total + rounds(n, 0, False)
    total += sum(rounds(hi - lo, 0, True) for lo, hi in batches)
    return total + rounds(len(batches), (LANE_BATCH - 1).bit_length(), False)


def plain_argmax(
    z_l: npt.NDArray[np.uint64], z_h: npt.NDArray[np.uint64], width: int = RING_BITS
) -> int:
    """Plaintext reference: the first j maximizing the signed w-bit z_l[j] + z_h[j]."""
    s = (np.asarray(z_l, dtype=np.uint64) + np.asarray(z_h, dtype=np.uint64)).astype(object)
    half = 1 << (width - 1)
    signed = [((int(v) + half) % (1 << width)) - half for v in s]
    return max(range(len(signed)), key=lambda j: (signed[j], -j))
