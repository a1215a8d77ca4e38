"""The ring Z_2^64 and the fixed-point encoding of per-user values in [0, 1].

Every per-user value v in [0, 1] is clipped and encoded as round(v * 2^F), an
integer in [0, 2^F].  The encoded sensitivity of an additive query is therefore
2^F, and every noise scale and threshold lives on the same integer grid.  Shares
are numpy uint64 arrays, so additions wrap mod 2^64 for free.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import numpy.typing as npt

RING_BITS = 64
#: Largest magnitude a signed value may have for its sign to survive the ring.
SIGNED_LIMIT = 1 << (RING_BITS - 1)
DEFAULT_FRAC_BITS = 16
MAX_FRAC_BITS = 30

U64 = npt.NDArray[np.uint64]


def check_frac_bits(frac_bits: int) -> int:
    """Validate F: a positive integer small enough to leave room for sums and noise."""
    if not isinstance(frac_bits, int) or isinstance(frac_bits, bool):
        raise TypeError(f"frac_bits must be an int, got {type(frac_bits).__name__}")
    if not 1 <= frac_bits <= MAX_FRAC_BITS:
        raise ValueError(f"frac_bits must be in [1, {MAX_FRAC_BITS}], got {frac_bits}")
    return frac_bits


def sensitivity(frac_bits: int) -> int:
    """Encoded sensitivity of an additive query: one user moves a sum by at most 2^F."""
    return 1 << check_frac_bits(frac_bits)


def encode(values: npt.ArrayLike, frac_bits: int = DEFAULT_FRAC_BITS) -> U64:
    """Clip values to [0, 1] and encode them as uint64 integers round(v * 2^F).

    NaN is refused rather than silently mapped, since it signals a broken embedding.
    """
    scale = sensitivity(frac_bits)
    arr = np.asarray(values, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError("cannot encode NaN values")
    clipped = np.clip(arr, 0.0, 1.0)
    return np.rint(clipped * scale).astype(np.uint64)


def decode(encoded: npt.ArrayLike, frac_bits: int = DEFAULT_FRAC_BITS) -> npt.NDArray[np.float64]:
    """Inverse of `encode` for sums: integer grid units back to score units."""
    return np.asarray(encoded, dtype=np.float64) / float(sensitivity(frac_bits))


def encode_scalar(value: Fraction | int | float | str, frac_bits: int) -> int:
    """Encode a score-unit number (a threshold, an offset) to the nearest grid integer.

    Exact: the value is taken as a rational, so no float rounding enters a threshold.
    """
    v = value if isinstance(value, Fraction) else Fraction(str(value))
    return round(v * sensitivity(frac_bits))


def to_signed(x: U64) -> npt.NDArray[np.int64]:
    """Reinterpret ring elements as two's-complement signed integers."""
    return np.asarray(x, dtype=np.uint64).view(np.int64)


def from_signed(x: npt.ArrayLike) -> U64:
    """Embed signed integers (|x| < 2^63) into the ring."""
    return np.asarray(x, dtype=np.int64).astype(np.uint64)


def wrap_bound(
    n_max: int, frac_bits: int, tau_bound: int, noise_bound_per_party: int, parties: int = 2
) -> int:
    """Largest |z_L + z_H| an honest run can produce, as an exact integer.

    z = q(S) - tau + sum over parties of (query noise - threshold noise), where
    q(S) is in [0, n_max * 2^F] (a coordinate or its complement), |tau| <= tau_bound,
    and each party's noise terms are clamped to +-noise_bound_per_party in total.
    One extra unit covers the +1/-1 shift that turns a strict test into >= 0.
    """
    if n_max < 1:
        raise ValueError(f"n_max must be >= 1, got {n_max}")
    return n_max * sensitivity(frac_bits) + tau_bound + parties * noise_bound_per_party + 1


def can_wrap(
    n_max: int, frac_bits: int, tau_bound: int, noise_bound_per_party: int, parties: int = 2
) -> bool:
    """True if z_L + z_H could leave (-2^63, 2^63), i.e. a comparison could be wrong."""
    return wrap_bound(n_max, frac_bits, tau_bound, noise_bound_per_party, parties) >= SIGNED_LIMIT


#: The widths of the joint sampler's digits (`mpc.jointnoise`, `dp.joint`): one
#: b for every digit, or b_i per digit.
Widths = int | tuple[int, ...]


def widths_of(constants: tuple[int, ...], bits: Widths) -> tuple[int, ...]:
    """b_0, …, b_{K−1}: `bits` repeated, or `bits` itself (checked to match)."""
    if isinstance(bits, int):
        return (bits,) * len(constants)
    if len(bits) != len(constants):
        raise ValueError("one width per digit")
    return tuple(bits)
