"""What a query, a budget and an answer are, and the checks every oracle applies
to a chunk before any noise is drawn (chunk size, CompareToThresholds gap,
threshold encoding): one implementation for the local oracle and both servers.
`Epsilon` is an ε parsed once where it enters (the command line, a public
function) and trusted from there inward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from svtagg.dp.errors import ChunkTooLarge, InvalidArgument, ResourceExhausted
from svtagg.dp.jointsvt import joint_ctt_gap
from svtagg.dp.kinds import as_fraction, check_epsilon, ctt_gap
from svtagg.mpc.ring import encode_scalar, sensitivity

Number = Fraction | int | float

#: Largest chunk a stream accepts in one call.
MAX_CHUNK = 100_000
#: Most chunks one stream answers.  Every noise draw is clamped (kinds.TAIL_SCALES),
#: which costs a δ of at most 2(K + 1)·e^−4096 for a stream of K queries; it is
#: stated rather than charged (docs/privacy.md) because K ≤ MAX_STREAM_CHUNKS ·
#: MAX_CHUNK keeps it below 2^−5800, so the bound is enforced, not assumed.
MAX_STREAM_CHUNKS = 2**40
#: Candidates of one report-noisy-max stream, all its chunks counted: its
#: tournament carries and reveals a 32-bit index (mpc/tournament.py).
MAX_TOURNAMENT = 2**32 - 1


@dataclass(frozen=True)
class Query:
    """A public query on the aggregate: coordinate `index` of S, or its complement.

    The complement is n − S_index, the sum of 1 − v_index: a score with per-user
    value in [0, 1] (the σ = −1 scores of sparse mean and MWEM).
    """

    index: int
    complement: bool = False


class Outcome(StrEnum):
    """Answer of one CompareToThresholds query."""

    HIGH = "high"
    LOW = "low"
    CLOSE = "close"


@dataclass(frozen=True)
class Epsilon:
    """A privacy budget ε > 0 as an exact rational.

    `Epsilon.parse` turns outside input (text such as "1/2", a number) into one,
    once, where the budget enters: the command line or a public function.  Code
    further in takes an `Epsilon` as checked and never parses it again, so ε keeps
    one form (a Fraction) from the boundary to the stream budgets an algorithm
    plans; parsing an `Epsilon` returns it unchanged.  The parts an algorithm
    derives (`split`, `share`) are exact and positive by construction.
    """

    value: Fraction

    def __post_init__(self) -> None:
        if not isinstance(self.value, Fraction) or self.value <= 0:
            raise TypeError(f"Epsilon holds a Fraction > 0 (see Epsilon.parse): {self.value!r}")

    @classmethod
    def parse(cls, value: Epsilon | Number | str) -> Epsilon:
        """ε from input (decimal or p/q text, a number): ValueError unless a number
        > 0 of bounded size (`check_epsilon`); an `Epsilon` is returned as it is."""
        if isinstance(value, Epsilon):
            return value
        return cls(check_epsilon(value))

    def split(self, parts: int) -> Epsilon:
        """ε/parts: one of `parts` equal budgets (basic composition)."""
        return Epsilon(self.value / parts)

    def share(self, fraction: Fraction) -> Epsilon:
        """ε·fraction for a fraction in (0, 1]."""
        if not 0 < fraction <= 1:
            raise ValueError(f"a share of ε must be in (0, 1], got {fraction}")
        return Epsilon(self.value * fraction)

    def __str__(self) -> str:
        return str(self.value)


@dataclass
class Budget:
    """Remaining and total privacy budget of a dataset."""

    epsilon_total: Fraction
    delta_total: Fraction
    epsilon_spent: Fraction = Fraction(0)
    delta_spent: Fraction = Fraction(0)

    @property
    def epsilon_left(self) -> Fraction:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_left(self) -> Fraction:
        return self.delta_total - self.delta_spent


def check_chunk_size(k: int) -> None:
    """A chunk holds 1..MAX_CHUNK queries (more is a capacity bound: the same
    queries split into smaller chunks are fine)."""
    if k < 1:
        raise InvalidArgument("a chunk needs at least one query")
    if k > MAX_CHUNK:
        raise ChunkTooLarge(f"a chunk holds at most {MAX_CHUNK} queries, got {k}")


def tournament_chunks(k: int, chunk_size: int | None = None) -> list[tuple[int, int]]:
    """The chunks [lo, hi) a report-noisy-max over k candidates is sent in:
    1..MAX_TOURNAMENT candidates, chunks of `chunk_size` (default and at most
    MAX_CHUNK), the last one shorter."""
    size = MAX_CHUNK if chunk_size is None else chunk_size
    if not 1 <= size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be in [1, {MAX_CHUNK}], got {size}")
    if not 1 <= k <= MAX_TOURNAMENT:
        raise ValueError(f"a report-noisy-max takes 1..{MAX_TOURNAMENT:,} candidates, got {k:,}")
    return [(lo, min(k, lo + size)) for lo in range(0, k, size)]


def check_stream_chunks(answered: int) -> None:
    """A stream that has answered MAX_STREAM_CHUNKS chunks answers no more."""
    top = MAX_STREAM_CHUNKS
    if answered >= top:
        most = f"2^{top.bit_length() - 1}" if top & (top - 1) == 0 else f"{top:,}"
        raise ResourceExhausted(
            f"a stream answers at most {most} chunks (the clamped-noise δ of "
            "docs/privacy.md is bounded up to there); open a new stream"
        )


def check_ctt_gaps(
    chunk: Sequence[tuple[Query, Number, Number]],
    epsilon: Fraction,
    delta: Fraction,
    parties: int,
    joint_frac_bits: int | None = None,
) -> None:
    """Every (τL, τH) of a CompareToThresholds chunk must be at least the gap apart."""
    for _, lo, hi in chunk:
        check_ctt_width(
            as_fraction(hi, "tau_high") - as_fraction(lo, "tau_low"),
            epsilon,
            delta,
            parties,
            joint_frac_bits,
        )


def check_ctt_width(
    width: Fraction,
    epsilon: Fraction,
    delta: Fraction,
    parties: int,
    joint_frac_bits: int | None = None,
) -> None:
    """The one CompareToThresholds gap rule: τH − τL (score units, exact) must be at
    least `ctt_gap(ε, δ, parties)`, read as the exact rational of its decimal, or
    on a joint-noise task (`joint_frac_bits` = its F) `dp.jointsvt.joint_ctt_gap`."""
    if joint_frac_bits is not None:
        gap: float | int = joint_ctt_gap(epsilon, delta, joint_frac_bits)
    else:
        gap = ctt_gap(epsilon, delta, parties)
    if width < Fraction(str(gap)):
        raise InvalidArgument(
            f"CompareToThresholds requires τH − τL ≥ {gap:.6g} (score units); "
            f"got {float(width):.6g}"
        )


def encode_thresholds(
    taus: Sequence[Number], frac_bits: int, bound: int | None = None
) -> npt.NDArray[np.int64]:
    """Thresholds (score units) onto the grid, exactly; refused beyond ±bound grid units.

    Whole numbers take a fast path; anything else goes through its exact rational.
    """
    unit = sensitivity(frac_bits)
    ints = np.asarray(taus) if len(taus) else None
    if ints is not None and ints.dtype.kind in "iub" and ints.ndim == 1:
        # whole numbers that fit int64 (numpy made no object array): one array op
        whole, lim = ints.astype(np.int64), (2**63 - 1) // unit
        if -lim <= int(whole.min()) and int(whole.max()) <= lim:
            out = whole * unit
            if bound is not None and int(np.abs(out).max()) > bound:
                raise InvalidArgument(f"|threshold| must be at most {bound / unit:g} score units")
            return out
    if taus and all(isinstance(t, (int, np.integer)) for t in taus):
        grid = [int(t) * unit for t in taus]
    else:
        grid = [encode_scalar(as_fraction(t, "threshold"), frac_bits) for t in taus]
    if bound is not None and any(abs(g) > bound for g in grid):
        raise InvalidArgument(f"|threshold| must be at most {bound / unit:g} score units")
    return np.asarray(grid, dtype=np.int64)


# ---------------------------------------------------------------- a chunk's progress
class Progress(NamedTuple):
    """What one chunk's result did to its stream."""

    answered: int
    closes: bool


def ask_progress(first_yes: int | None, k: int) -> Progress:
    """An Ask chunk of k queries: up to and including the first YES, which
    closes the stream; all k, the stream open, when there is none."""
    return Progress(k, False) if first_yes is None else Progress(first_yes + 1, True)


def noisy_max_progress(index: int | None, k: int) -> Progress:
    """A report-noisy-max chunk of k candidates: all k answered; the one index,
    which only the stream's last chunk reveals, closes the stream (one
    selection per stream and charge).  A chunk with more to follow (None)
    leaves it open."""
    return Progress(k, index is not None)
