"""Heavy hitters over bit strings by a prefix crawl: the analyst's walk.

The walk asks, level by level, which candidate prefixes hold a noisy count of
at least τ (`dp.crawl`: ε_ℓ per level, only the answers leave), keeps those,
and extends them by the next `stride` bits; what is kept at the last level are
the heavy strings.  A level whose candidates are all below τ ends the walk
early (the levels not run are not spent).

Strings reach the walk as B-bit integers: UTF-8, padded with zero bytes to
B/8 bytes, most significant byte first, so that a prefix of the integer is a
prefix of the string (`encode_string`, `decode_string`, from
`client.strings`, where clients encode theirs); a string longer than B/8
bytes, or holding a NUL byte (which the padding could not tell apart), is
refused.

Two level oracles: `LocalCrawlOracle` counts in the clear and adds both
servers' noise (the central reference), `DpfCrawlOracle` runs two in-process
servers (`vdaf.crawl.CrawlReports`) on the reports' verifiable DPF keys, with
every level's check, and thresholds their count shares' sum.  Both charge
each level's ε_ℓ to a ledger first.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import numpy as np

from svtagg.client.strings import decode_string
from svtagg.client.strings import encode_string as encode_string  # the walk's strings, re-exported
from svtagg.dp.crawl import CrawlPlan, above, level_scale
from svtagg.dp.errors import InvalidArgument
from svtagg.dp.ledger import Ledger
from svtagg.dp.noise import RandomSource
from svtagg.vdaf.crawl import CrawlReports, PrefixDpf, level_counts, step_level
from svtagg.vdaf.sparse import NONCE_SIZE, RAND_SIZE


class LevelOracle(Protocol):
    """Answers one level of a walk: which candidates are above τ."""

    def above(
        self, level: int, candidates: Sequence[int], prefix_bits: int, epsilon: Fraction,
        threshold: int,
    ) -> list[bool]: ...  # fmt: skip


@dataclass(frozen=True)
class LevelRecord:
    level: int
    prefix_bits: int
    candidates: int
    kept: int


@dataclass
class CrawlResult:
    """What a walk found: the strings kept at the last level (as B-bit
    integers), each level's sizes, the ε spent, and why it stopped early, if
    it did."""

    plan: CrawlPlan
    found: list[int]
    levels: list[LevelRecord] = field(default_factory=list)
    epsilon_spent: Fraction = Fraction(0)
    stopped: str = ""
    #: The prefixes the last level run kept (the root's [0] before any), and
    #: their bits: where `crawl(..., resume=this)` goes on from.
    kept: list[int] = field(default_factory=lambda: [0])
    depth: int = 0
    #: Whether the walk ended (all its levels, or stopped early); a walk that
    #: failed midway has not, and may be resumed.
    done: bool = False

    def strings(self) -> list[str]:
        return [decode_string(x, self.plan.bits) for x in self.found]


def crawl(
    oracle: LevelOracle,
    plan: CrawlPlan,
    progress: Callable[[LevelRecord], None] | None = None,
    *,
    resume: CrawlResult | None = None,
) -> CrawlResult:
    """Walk the prefix tree as `plan` says (module docstring).  `resume`: the
    result of a walk of this plan, on this oracle, that failed midway (an
    exception from a level, e.g. a server lost): the walk goes on from its
    last completed level, and the level that failed is asked again (charged
    again; the servers rebuild their side of the walk from their records).
    The result is updated as the walk goes, so a caller holding it after an
    exception can resume it."""
    if resume is not None:
        if resume.done:
            raise InvalidArgument("this walk has ended; start a new one")
        if resume.plan != plan:
            raise InvalidArgument("a walk resumes with its own plan")
        result = resume
    else:
        result = CrawlResult(plan, [])
    kept, depth = result.kept, result.depth
    for level in range(len(result.levels) + 1, plan.levels + 1):
        bits = plan.prefix_bits(level)
        steps = bits - depth
        candidates = [(p << steps) | x for p in kept for x in range(1 << steps)]
        answers = oracle.above(level, candidates, bits, plan.level_epsilon, plan.threshold)
        result.epsilon_spent += plan.level_epsilon
        kept = [c for c, yes in zip(candidates, answers, strict=True) if yes]
        depth = bits
        record = LevelRecord(level, bits, len(candidates), len(kept))
        result.levels.append(record)
        result.kept, result.depth = kept, depth
        if progress is not None:
            progress(record)
        if not kept:
            result.stopped = f"no candidate of level {level} is above the threshold"
            result.done = True
            return result
        if len(kept) > plan.max_kept and level < plan.levels:
            result.stopped = (
                f"{len(kept)} prefixes of level {level} are above the threshold, more than "
                f"max_kept = {plan.max_kept}: raise the threshold (or ε), or max_kept"
            )
            result.done = True
            return result
    result.found = kept
    result.done = True
    return result


def false_positive_floor(
    level_epsilon: Fraction, candidates: int, expected: float = 0.05, parties: int = 2
) -> int:
    """The least τ at which a level of `candidates` zero-count candidates
    expects at most `expected` of them above τ (the noise's exact tail): a
    public floor for the threshold, computed from the plan alone."""
    if level_epsilon <= 0 or candidates < 1 or expected <= 0:
        raise ValueError("a positive ε, at least one candidate and a positive expectation")
    t = float(level_scale(level_epsilon))
    tau = 1
    while True:
        # P(ν₁ + ν₂ ≥ τ) ≤ P(ν₁ ≥ τ/2) + P(ν₂ ≥ τ/2) for two parties, and the
        # discrete Laplace tail P(ν ≥ x) = q^x/(1 + q), q = e^{−1/t}.
        q = math.exp(-1 / t)
        x = math.ceil(tau / parties)
        tail = parties * q**x / (1 + q)
        if candidates * tail <= expected:
            return tau
        tau = max(tau + 1, int(tau * 1.05))


class LocalCrawlOracle:
    """Counts the strings' prefixes in the clear and answers with both
    servers' noise (`parties` = 2) or one party's; charges each level."""

    def __init__(
        self,
        values: Iterable[int],
        bits: int,
        epsilon_total: Fraction | int | str,
        parties: int = 2,
        rng: RandomSource | None = None,
    ) -> None:
        self.values = list(values)
        self.bits = bits
        self.ledger = Ledger(epsilon_total)
        self.parties = parties
        self.rng = rng or RandomSource()

    def counts(self, candidates: Sequence[int], prefix_bits: int) -> list[int]:
        shift = self.bits - prefix_bits
        tally = Counter(v >> shift for v in self.values)
        return [tally.get(c, 0) for c in candidates]

    def above(
        self, level: int, candidates: Sequence[int], prefix_bits: int, epsilon: Fraction,
        threshold: int,
    ) -> list[bool]:  # fmt: skip
        self.ledger.charge(epsilon)
        c = self.counts(candidates, prefix_bits)
        return [bool(x) for x in above(c, threshold, epsilon, self.rng, self.parties)]


def make_reports(
    values: Iterable[int], bits: int
) -> list[tuple[bytes, bytes, tuple[bytes, bytes]]]:
    """Each string's report (nonce, public share, the two keys), from the CSPRNG."""
    dpf = PrefixDpf(bits)
    out = []
    for v in values:
        nonce = os.urandom(NONCE_SIZE)
        public, keys = dpf.gen(v, nonce, os.urandom(RAND_SIZE))
        out.append((nonce, public, keys))
    return out


class DpfCrawlOracle:
    """Two in-process servers holding the reports' keys: per level each
    evaluates its shares of the candidates' counts and its prep shares, the
    level's check drops the reports it refuses (on both), and the sum of the
    two count shares is thresholded with both servers' noise.  What the gRPC
    servers do (servers/crawl.py), without the transport or the garbled
    comparison."""

    def __init__(
        self,
        reports: Sequence[tuple[bytes, bytes, tuple[bytes, bytes]]],
        bits: int,
        epsilon_total: Fraction | int | str,
        rng: RandomSource | None = None,
    ) -> None:
        verify_key = os.urandom(16)
        self.servers = [
            CrawlReports(bits, agg, verify_key, [(n, pub, keys[agg]) for n, pub, keys in reports])
            for agg in (0, 1)
        ]
        self.ledger = Ledger(epsilon_total)
        self.rng = rng or RandomSource()
        self.refused_at: dict[int, int] = {}  # level → reports its check refused
        self.counts: list[int] = []  # the last level's counts (tests only: never released)

    def above(
        self, level: int, candidates: Sequence[int], prefix_bits: int, epsilon: Fraction,
        threshold: int,
    ) -> list[bool]:  # fmt: skip
        leader, helper = self.servers
        if level > 1:  # the candidates extend the prefixes kept at the last level
            steps = prefix_bits - leader.depth
            kept = list(dict.fromkeys(c >> steps for c in candidates))
            for s in self.servers:
                s.keep(kept)
        steps = prefix_bits - leader.depth
        extended = [(p << steps) | x for p in leader.candidates for x in range(1 << steps)]
        if steps < 1 or extended != list(candidates):  # refused before anything is spent
            raise InvalidArgument("the candidates must extend every kept prefix, in order")
        self.ledger.charge(epsilon)
        invalid = step_level(leader, helper, steps)
        self.refused_at[level] = int(invalid.sum())
        counts = level_counts(leader, helper)
        if any(c > len(invalid) for c in counts):  # each checked report adds 0 or 1
            raise AssertionError("a level's count exceeds its reports: the check let one through")
        self.counts = counts
        return [
            bool(x) for x in above(np.array(counts, dtype=np.int64), threshold, epsilon, self.rng)
        ]
