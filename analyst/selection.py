"""Selection in the SVT model (paper §6): Algorithms 6, 7, 8, 9 and Corollary 6.8.

Every algorithm here touches data only through `Oracle` streams: it learns the
index of the first YES of each chunk, nothing else.  Privacy is therefore basic
composition of the stream budgets it opens, and every accuracy figure α it uses
comes from `oracle.accuracy` for the stream's own noise model.

Candidates are `Query` objects (a coordinate of the aggregate or its complement)
with an optional public *offset* w: the candidate's score is q(S) + w, and
comparing it with a threshold τ is the SVT query (q, τ − w).  Offsets are how
MWEM's shifted scores fold into thresholds (algorithms.md §3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

import numpy as np

from svtagg.analyst.oracle import Oracle, Stream
from svtagg.dp.kinds import StreamKind, check_epsilon
from svtagg.dp.queries import MAX_CHUNK, Number, Query

#: Ratio γ of consecutive round budgets in Algorithm 8 (the paper's 3/4).
GBS_RATIO = Fraction(3, 4)
#: Phase cut-off of Algorithm 9 as written: phases run only while n/α ≥ 2^64.
PAPER_CUTOFF = 2**64
#: Rounds of Algorithm 9's final GeometricBinarySearch as written (line 15).
PAPER_FINAL_ROUNDS = 64


class Variant(StrEnum):
    """Which version of an algorithm runs: as the paper writes it, with the tuned
    constants of Algorithm 9, the practical selection (`practical_selection`), or
    the scan selection (`scan_selection`, `scan_top_k`)."""

    PAPER = "paper"
    TUNED = "tuned"
    PRACTICAL = "practical"
    SCAN = "scan"


def variant_of(value: Variant | str, *allowed: Variant) -> Variant:
    """`value` as a Variant, refused unless it is one of `allowed`."""
    if value not in allowed:
        names = " or ".join(repr(a.value) for a in allowed)
        raise ValueError(f"variant must be {names}, got {value!r}")
    return Variant(value)


#: Phase cut-off of the tuned variant of Algorithm 9: a phase can only help when its
#: filter threshold ℓ_P + 50·t³·α can fall inside [0, n], i.e. x = n/α > 50·⌈log2 x⌉³,
#: which first holds at x ≈ 2^19; below that a phase only burns ~ε/t budget and
#: ~2d queries (measured with a cut-off of 2^6: errors 5–7× Algorithm 8's).
TUNED_CUTOFF = 2**20

#: Thresholds are sent as whole score units (see `_Session._tau`), which moves
#: each by at most 1/2; the interval bookkeeping widens every α by that much.
ROUNDING_SLACK = 0.5

AccuracyFn = Callable[[Fraction, int, float], float]


# --------------------------------------------------------------------------- records


@dataclass
class Spend:
    """What an algorithm spent: streams opened, queries answered, budget, α's used.

    `queries` counts answered queries (a chunk answers up to and including its
    first YES, as in batch SVT); `queries_sent` counts every (query, τ) pair sent.
    """

    streams: int = 0
    queries: int = 0
    queries_sent: int = 0
    chunks: int = 0
    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    alphas: list[float] = field(default_factory=list)

    def add(self, other: Spend) -> None:
        self.streams += other.streams
        self.queries += other.queries
        self.queries_sent += other.queries_sent
        self.chunks += other.chunks
        self.epsilon += other.epsilon
        self.delta += other.delta
        self.alphas.extend(other.alphas)


@dataclass(frozen=True)
class Candidates:
    """Candidate scores q_j(S) + w_j: queries with public offsets (default 0)."""

    queries: tuple[Query, ...]
    offsets: tuple[float, ...]

    @classmethod
    def coordinates(cls, d: int) -> Candidates:
        """The d coordinates of the aggregate, no offsets: the plain selection problem."""
        return cls(tuple(Query(j) for j in range(d)), (0.0,) * d)

    @classmethod
    def of(cls, queries: Sequence[Query], offsets: Sequence[float] | None = None) -> Candidates:
        offs = tuple(float(w) for w in offsets) if offsets is not None else (0.0,) * len(queries)
        if len(offs) != len(queries):
            raise ValueError("one offset per query is required")
        return cls(tuple(queries), offs)

    def __len__(self) -> int:
        return len(self.queries)


@dataclass(frozen=True)
class SelectionResult:
    """Chosen candidate (position in the candidate list and its query) and the record.

    `lower`/`upper` is the interval the algorithm certifies: w.p. ≥ 1 − β the chosen
    score is ≥ lower and every candidate's score is ≤ upper (Algorithm 8 and 9);
    Algorithms 6 and 7 report their final search interval.
    """

    index: int
    query: Query
    lower: float
    upper: float
    spend: Spend
    planned_epsilon: Fraction


@dataclass(frozen=True)
class SumEstimate:
    """Corollary 6.8: an interval [lower, upper] containing the sum w.p. ≥ 1 − β."""

    estimate: float
    lower: float
    upper: float
    spend: Spend
    planned_epsilon: Fraction


# --------------------------------------------------------------------------- plumbing


class _Session:
    """Opens streams and asks chunks on behalf of one algorithm run, recording spend."""

    def __init__(self, oracle: Oracle, kind: StreamKind | str, spend: Spend | None = None):
        self.oracle = oracle
        self.kind = StreamKind.parse(kind)
        self.spend = spend if spend is not None else Spend()
        # Thresholds beyond what a server accepts carry no information (see `_tau`).
        self.tau_limit = 4 * oracle.n - 1

    def open(self, epsilon: Fraction) -> Stream:
        stream = self.oracle.open_stream(epsilon, self.kind)
        self.spend.streams += 1
        self.spend.epsilon += epsilon
        return stream

    def alpha(self, epsilon: Fraction, k: int, beta: float) -> float:
        """α from the oracle (recorded as is) plus the threshold rounding slack."""
        a = float(self.oracle.accuracy(self.kind, epsilon, k, beta))
        self.spend.alphas.append(a)
        return a + ROUNDING_SLACK

    def _tau(self, tau: float) -> int:
        """The threshold actually sent: τ rounded to a whole score unit, within ±4n.

        Whole units take the oracle's exact integer path (no per-threshold rational
        encoding, which dominated run time); the ±1/2 this moves a threshold is
        covered by `ROUNDING_SLACK`, added to every α the bookkeeping uses.
        Servers refuse |τ| > 4n; such a threshold already lies far outside every
        score, so clamping only matters when the noise is of the order of 4n, i.e.
        when the stream is useless anyway.  Both are data-independent.
        """
        return min(max(math.floor(tau + 0.5), -self.tau_limit), self.tau_limit)

    def ask(
        self, stream: Stream, cands: Candidates, positions: Sequence[int], m: float
    ) -> int | None:
        """Batch SVT of candidates `positions` at threshold m (score units) on `stream`.

        Returns the position in `positions` of the first YES, or None.  Chunks longer
        than MAX_CHUNK are split: consecutive chunks on one stream are the same
        online AboveThreshold mechanism.
        """
        for start in range(0, len(positions), MAX_CHUNK):
            part = positions[start : start + MAX_CHUNK]
            chunk = [(cands.queries[p], self._tau(m - cands.offsets[p])) for p in part]
            hit = stream.ask(chunk)
            self.spend.chunks += 1
            self.spend.queries_sent += len(chunk)
            self.spend.queries += len(chunk) if hit is None else hit + 1
            if hit is not None:
                return start + hit
        return None


def _candidates(oracle: Oracle, candidates: Candidates | None) -> Candidates:
    cands = candidates if candidates is not None else Candidates.coordinates(oracle.d)
    if len(cands) == 0:
        raise ValueError("need at least one candidate")
    return cands


def _positions(
    oracle: Oracle,
    candidates: Candidates | None,
    subset: Sequence[int] | None,
    interval: tuple[float, float] | None,
) -> tuple[Candidates, list[int], float, float]:
    """The candidates, the positions searched (`subset`, default all) and [ℓ, u]
    (`interval`, default [0, n])."""
    cands = _candidates(oracle, candidates)
    positions = list(subset) if subset is not None else list(range(len(cands)))
    lo, hi = interval if interval is not None else (0.0, float(oracle.n))
    return cands, positions, lo, hi


def _plan_misfit(plan: PracticalPlan | ScanPlan, size: int, width: float) -> bool:
    """True when `plan` was made for another candidate count or interval width."""
    return plan.size != size or abs(plan.width - width) > 1e-9


def _check_beta(beta: float) -> float:
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return float(beta)


def default_rounds(width: float) -> int:
    """T = max(1, ⌈log2 W⌉), the paper's default number of rounds for an interval W."""
    return max(1, math.ceil(math.log2(width))) if width > 1 else 1


# --------------------------------------------------------------------------- Algorithm 8


def gbs_budgets(epsilon: Fraction, rounds: int, ratio: Fraction = GBS_RATIO) -> list[Fraction]:
    """ε_t = (ε/Z)·γ^(T−t), t = 1..T, with Z = (1 − γ^T)/(1 − γ): they sum to ε exactly."""
    g = Fraction(ratio)
    if not 0 < g < 1:
        raise ValueError(f"ratio must be in (0, 1), got {ratio}")
    z = (1 - g**rounds) / (1 - g)
    return [epsilon / z * g ** (rounds - t) for t in range(1, rounds + 1)]


def _gbs(
    session: _Session,
    cands: Candidates,
    subset: Sequence[int],
    lower: float,
    upper: float,
    witness: int,
    rounds: int,
    epsilon: Fraction,
    beta: float,
    ratio: Fraction = GBS_RATIO,
) -> tuple[int, float, float]:
    """Algorithm 8 on candidate positions `subset`; returns (j*, ℓ', u').

    j* moves only when a YES raises ℓ (m − α_t > ℓ): it is the YES with the best
    certified lower bound so far.  (We also measured "the YES at the highest
    threshold" as a witness rule: at d = 10³ its mean error was 15–25× worse, because
    the highest thresholds are asked by the first, noisiest rounds.)
    """
    best = witness
    lo, hi = float(lower), float(upper)
    for eps_t in gbs_budgets(epsilon, rounds, ratio):
        alpha_t = session.alpha(eps_t, len(subset), beta / rounds)
        m = (lo + hi) / 2
        stream = session.open(eps_t)
        hit = session.ask(stream, cands, subset, m)
        if hit is None:
            hi = min(hi, m + alpha_t)
        elif m - alpha_t > lo:
            lo = m - alpha_t
            best = subset[hit]
    return best, lo, hi


def geometric_binary_search(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    subset: Sequence[int] | None = None,
    interval: tuple[float, float] | None = None,
    witness: int | None = None,
    rounds: int | None = None,
    kind: StreamKind | str | None = None,
    variant: Variant | str = Variant.PAPER,
) -> SelectionResult:
    """Algorithm 8, GeometricBinarySearch(P, [ℓ, u], j0, T, ε, β).

    variant="paper" (default) runs Algorithm 8 as written with `kind` (default
    lap24); variant="practical" runs `practical_selection` with the same P, [ℓ, u],
    j0 and T for its coarse stage (`kind` default "auto").

    Requires max_{j∈P} s_j ≤ u and s_{j0} ≥ ℓ.  Defaults: P = all candidates,
    [ℓ, u] = [0, n], j0 = first of P, T = max(1, ⌈log2 n⌉).  Round t opens one
    stream of budget ε_t = (ε/Z)·γ^(T−t) and asks one chunk (all of P at the
    midpoint), with α_t = oracle.accuracy(kind, ε_t, |P|, β/T).

    Guarantee (Theorem 6.6): ε-DP; at most |P|·T queries; w.p. ≥ 1 − β,
    s_{j*} ≥ ℓ', max_P s ≤ u' and u' − ℓ' ≤ W/2^T + 2·max_t α_t-ish (the paper
    states (384/ε)·log(2|P|T/β) for its constants).
    """
    if variant == Variant.PRACTICAL:
        return practical_selection(
            oracle,
            epsilon,
            beta,
            candidates=candidates,
            subset=subset,
            interval=interval,
            witness=witness,
            rounds=rounds,
            kind=kind if kind is not None else "auto",
        )
    variant_of(variant, Variant.PAPER, Variant.PRACTICAL)
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    cands, positions, lo, hi = _positions(oracle, candidates, subset, interval)
    w0 = witness if witness is not None else positions[0]
    t_rounds = rounds if rounds is not None else default_rounds(hi - lo)
    session = _Session(oracle, kind if kind is not None else StreamKind.LAP24)
    best, lo2, hi2 = _gbs(session, cands, positions, lo, hi, w0, t_rounds, eps, beta)
    return SelectionResult(best, cands.queries[best], lo2, hi2, session.spend, eps)


# --------------------------------------------------------------------------- practical variant

#: Share of ε the practical variant gives its coarse stage (paper GBS, fewer rounds).
PRACTICAL_COARSE_FRACTION = Fraction(1, 2)
#: Default fine-scan step, in units of the fine stream's query-noise scale c/ε_f
#: (measured at n = 10^5, d = 10^3, ε = 1, 30 reps: steps of 0.5–1.5 scales gave
#: median errors 3–5, 2–3 scales 7; levels, hence queries, fall as 1/step).
PRACTICAL_STEP_SCALE = Fraction(3, 2)
#: Kinds "auto" chooses from: the one with the smallest α for the fine stream.
PRACTICAL_KINDS = (StreamKind.EXP3, StreamKind.LAP3, StreamKind.LAP24)


@dataclass(frozen=True)
class PracticalPlan:
    """Every parameter of `practical_selection`, fixed before any data is touched.

    Coarse stage: Algorithm 8 (ratio γ, `coarse_rounds` rounds, budget
    `coarse_epsilon`, failure β/2) on [ℓ, u].  Fine stage: ONE stream of budget
    `fine_epsilon` that asks all of P at thresholds u_c, u_c − s, u_c − 2s, … (u_c
    the coarse upper bound) down to ℓ_c − α_f, at most `max_levels` levels
    (Algorithm 7 restricted to the coarse interval); α_f is for |P|·max_levels
    queries at failure β/2.  Everything here depends on (n, |P|, W, ε, β, kind) only.
    """

    kind: StreamKind
    epsilon: Fraction
    beta: float
    size: int
    width: float
    ratio: Fraction
    coarse_rounds: int
    coarse_epsilon: Fraction
    coarse_alphas: tuple[float, ...]  # α_t (oracle's, without the rounding slack)
    width_bound: float  # the coarse interval's width is ≤ this on every run
    fine_epsilon: Fraction
    fine_alpha: float  # α_f (oracle's, without the rounding slack)
    step: int
    max_levels: int

    @property
    def planned_epsilon(self) -> Fraction:
        return self.coarse_epsilon + self.fine_epsilon

    def max_queries(self) -> int:
        """|P|·(T_c + L): one chunk of |P| per coarse round and per fine level."""
        return self.size * (self.coarse_rounds + self.max_levels)

    def error_bound(self) -> float:
        """When the fine stream answers YES below its first level (w.p. ≥ 1 − β when
        the coarse interval is correct), u' − ℓ' ≤ s + 2·(α_f + 1/2)."""
        return self.step + 2 * (self.fine_alpha + ROUNDING_SLACK)


def _coarse_width_bound(
    width: float, alphas: Sequence[float], up: Sequence[float] | None = None
) -> float:
    """Every GBS round leaves width ≤ min(w, w/2 + α_t) (NO: u = min(u, m + α);
    YES: ℓ = m − α only if that raises ℓ), whatever the answers.  With `up`, a NO
    moves u by up_t and a YES ℓ by α_t: the width left is ≤ w/2 + max(up_t, α_t)."""
    w = float(width)
    for a_lo, a_up in zip(alphas, up if up is not None else alphas, strict=True):
        w = min(w, w / 2 + max(a_up, a_lo) + ROUNDING_SLACK)
    return w


def _stream_kind(
    oracle: Oracle, kind: StreamKind | str, epsilon: Fraction, size: int, beta: float
) -> StreamKind:
    """`kind`, or for "auto" the one of `PRACTICAL_KINDS` with the smallest α for a
    chunk of `size` queries on budget `epsilon` at failure `beta`."""
    if kind == "auto":
        kinds = [StreamKind.parse(k) for k in PRACTICAL_KINDS]
        return min(kinds, key=lambda k: float(oracle.accuracy(k, epsilon, size, beta)))
    return StreamKind.parse(kind)


def _scan_step(kind: StreamKind, epsilon: Fraction, step: int | None, scale: Fraction) -> int:
    """A descending scan's step: `step`, or max(1, ⌊scale·c/ε⌋), c the kind's
    query-noise coefficient (`scale` noise scales of a stream of budget ε)."""
    from svtagg.dp.kinds import noise_model

    if step is None:
        return max(1, math.floor(scale * noise_model(kind).query_coef / epsilon))
    s = int(step)
    if s < 1:
        raise ValueError(f"step must be a positive integer, got {step}")
    return s


def _dense_fixpoint(
    width_bound: float, step: int, alpha_for: Callable[[int], float]
) -> tuple[int, float]:
    """(levels, α) of a scan at `step` that must reach width_bound + α below its start,
    α = `alpha_for(levels)` (the oracle's, for the queries those levels may send).
    α depends on the number of levels, which depends on α: iterate to a fixpoint."""
    levels = max(2, math.ceil(width_bound / step) + 1)
    for _ in range(20):
        alpha = alpha_for(levels)
        new_levels = math.ceil((width_bound + alpha + ROUNDING_SLACK) / step) + 1
        if new_levels <= levels:
            break
        levels = new_levels
    return levels, alpha_for(levels)


def _tail_levels(limit: int, width_bound: float, step: int) -> int:
    """Levels of a scan's doubling tail (steps 2s, 4s, …) after its dense levels over
    a width ≤ `width_bound`: 1 + ⌈log2((limit + width_bound)/s)⌉, at least 2, for
    the steps to reach −`limit`."""
    return max(1, math.ceil(math.log2(max(2.0, (limit + width_bound) / step))) + 1)


def plan_practical(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    size: int,
    width: float,
    *,
    kind: StreamKind | str = "auto",
    coarse_fraction: Fraction = PRACTICAL_COARSE_FRACTION,
    ratio: Fraction = GBS_RATIO,
    rounds: int | None = None,
    step: int | None = None,
) -> PracticalPlan:
    """The practical variant's plan from public parameters and `oracle.accuracy` only.

    kind="auto" picks, among `PRACTICAL_KINDS`, the kind with the smallest α for
    a chunk of |P| queries on the fine budget (`exp3`, one-sided noise, whenever
    we looked: see `accuracy`).  Coarse rounds default to T = max(1, ⌈log2 W⌉)
    as in Algorithm 8.  The step s defaults to max(1, ⌊1.5·c/ε_f⌋) score units,
    c the kind's query-noise coefficient (`PRACTICAL_STEP_SCALE` noise scales).
    """
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    frac = Fraction(coarse_fraction)
    if not 0 < frac < 1:
        raise ValueError(f"coarse_fraction must be in (0, 1), got {coarse_fraction}")
    eps_c = eps * frac
    eps_f = eps - eps_c
    k_kind = _stream_kind(oracle, kind, eps_f, size, beta / 2)
    t_max = rounds if rounds is not None else default_rounds(width)
    budgets = gbs_budgets(eps_c, t_max, ratio)
    alphas = [float(oracle.accuracy(k_kind, e, size, beta / 2 / t_max)) for e in budgets]
    wb = _coarse_width_bound(width, alphas)
    s = _scan_step(k_kind, eps_f, step, PRACTICAL_STEP_SCALE)
    levels, a_f = _dense_fixpoint(
        wb, s, lambda n_levels: float(oracle.accuracy(k_kind, eps_f, size * n_levels, beta / 2))
    )
    return PracticalPlan(
        k_kind,
        eps,
        beta,
        size,
        float(width),
        Fraction(ratio),
        t_max,
        eps_c,
        tuple(alphas),
        wb,
        eps_f,
        a_f,
        s,
        levels,
    )


def practical_selection(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    subset: Sequence[int] | None = None,
    interval: tuple[float, float] | None = None,
    witness: int | None = None,
    rounds: int | None = None,
    kind: StreamKind | str = "auto",
    coarse_fraction: Fraction = PRACTICAL_COARSE_FRACTION,
    step: int | None = None,
    plan: PracticalPlan | None = None,
) -> SelectionResult:
    """Practical selection: coarse Algorithm 8, then a fine descending scan on one stream.

    Not in the paper; built from its pieces.  See `PracticalPlan` for the stages.
    Witness rule: the fine stream's first YES; if it never answers YES (only when
    the coarse certificate failed or the noise was extreme), the coarse stage's
    witness — the YES with the best certified lower bound, Algorithm 8's rule —
    and if no stream ever said YES, the given witness.
    Privacy: basic composition of T_c + 1 streams whose budgets sum to ε exactly,
    all fixed by the plan before data is touched (thresholds are adaptive, which
    AboveThreshold allows).  Queries ≤ `plan.max_queries()`.  W.p. ≥ 1 − β: the
    chosen score is ≥ ℓ' and every score ≤ u', and u' − ℓ' ≤ `plan.error_bound()`.
    """
    cands, positions, lo, hi = _positions(oracle, candidates, subset, interval)
    pl = (
        plan
        if plan is not None
        else plan_practical(
            oracle,
            epsilon,
            beta,
            len(positions),
            hi - lo,
            kind=kind,
            coarse_fraction=coarse_fraction,
            rounds=rounds,
            step=step,
        )
    )
    if _plan_misfit(pl, len(positions), hi - lo):
        raise ValueError("plan was made for another candidate count or interval")
    w0 = witness if witness is not None else positions[0]
    session = _Session(oracle, pl.kind)
    best, lo_c, hi_c = _gbs(
        session,
        cands,
        positions,
        lo,
        hi,
        w0,
        pl.coarse_rounds,
        pl.coarse_epsilon,
        pl.beta / 2,
        pl.ratio,
    )
    a_f = session.alpha(pl.fine_epsilon, pl.size * pl.max_levels, pl.beta / 2)
    levels = _dense_levels(hi_c, lo_c - a_f, pl.step, pl.max_levels)
    found = _scan_stream(session, cands, positions, levels, pl.fine_epsilon)
    if found is not None:
        hit, i = found
        j = positions[hit]
        lower, upper = _level_certificate(levels, i, a_f, hi_c)
        return SelectionResult(j, cands.queries[j], lower, upper, session.spend, pl.planned_epsilon)
    # No YES down to ℓ_c − α_f contradicts the coarse certificate (max ≥ ℓ_c), so one
    # of the two stages failed; report the coarse stage's witness and certificate.
    return SelectionResult(best, cands.queries[best], lo_c, hi_c, session.spend, pl.planned_epsilon)


# --------------------------------------------------------------------------- Corollary 6.8


def sum_estimation(
    oracle: Oracle,
    query: Query,
    epsilon: Number | str,
    beta: float,
    *,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SumEstimate:
    """Corollary 6.8: Algorithm 8 with the single candidate `query` on [0, n].

    T = max(1, ⌈log2 n⌉).  ε-DP; w.p. ≥ 1 − β the returned interval contains
    Σ_i f(x_i) and has length ≤ 1 + (384/ε)·log(2T/β) (paper's constants).
    The estimate is the interval's midpoint.
    """
    res = geometric_binary_search(
        oracle,
        epsilon,
        beta,
        candidates=Candidates.of([query]),
        interval=(0.0, float(oracle.n)),
        witness=0,
        kind=kind,
    )
    return SumEstimate(
        (res.lower + res.upper) / 2, res.lower, res.upper, res.spend, res.planned_epsilon
    )


# --------------------------------------------------------------------------- Algorithm 6


def binary_search_rounds(n: int) -> int:
    """R = ⌈log2(2n)⌉ + 1, the number of rounds of Algorithm 6."""
    return math.ceil(math.log2(2 * n)) + 1


def binary_search(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SelectionResult:
    """Algorithm 6, private binary search on [0, n].

    R = ⌈log2(2n)⌉ + 1 rounds, each opening ≤ 2 streams of budget ε/(2R) with
    α = oracle.accuracy(kind, ε/(2R), d, β/(2R)).  Round: m = (ℓ+u)/2; stream 1
    over all candidates at m; if it returns j (not the last), stream 2 over the
    candidates after j.  One index returned → return it; two → ℓ = m − α; none →
    u = m + α.  Stops when u − ℓ ≤ 3α (or after R rounds) with the last returned
    index.  ε-DP (≤ 2R streams of ε/(2R)); ≤ d·R answered queries.
    """
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    cands = _candidates(oracle, candidates)
    d = len(cands)
    rounds = binary_search_rounds(oracle.n)
    eps_s = eps / (2 * rounds)
    session = _Session(oracle, kind)
    alpha = session.alpha(eps_s, d, beta / (2 * rounds))
    lo, hi = 0.0, float(oracle.n)
    last = 0
    for _ in range(rounds):
        if hi - lo <= 3 * alpha:
            break
        m = (lo + hi) / 2
        first = session.ask(session.open(eps_s), cands, range(d), m)
        if first is None:
            hi = m + alpha
            continue
        last = first
        if first == d - 1:
            break  # exactly one index above m: it is the answer
        rest = list(range(first + 1, d))
        second = session.ask(session.open(eps_s), cands, rest, m)
        if second is None:
            break
        last = rest[second]
        lo = m - alpha
    return SelectionResult(last, cands.queries[last], lo, hi, session.spend, eps)


# --------------------------------------------------------------------------- Algorithm 7


def linear_scan(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    interval: tuple[int, int] | None = None,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SelectionResult:
    """Algorithm 7, private linear scan: one stream of budget ε.

    For m = u, u−1, …, ℓ (default [0, n]) ask one chunk — all d candidates at
    threshold m — and return the first YES; if none ever answers, return the first
    candidate.  ≤ d·(u−ℓ+1) queries; the α recorded is for that many queries.
    Optimal error O(log(d n/β)/ε), at the price of O(d n) queries.
    """
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    cands = _candidates(oracle, candidates)
    d = len(cands)
    lo, hi = interval if interval is not None else (0, oracle.n)
    session = _Session(oracle, kind)
    alpha = session.alpha(eps, d * (hi - lo + 1), beta)
    stream = session.open(eps)
    for m in range(hi, lo - 1, -1):
        hit = session.ask(stream, cands, range(d), float(m))
        if hit is not None:
            return SelectionResult(
                hit, cands.queries[hit], m - alpha, m + 1 + alpha, session.spend, eps
            )
    return SelectionResult(0, cands.queries[0], float(lo), lo + alpha, session.spend, eps)


# --------------------------------------------------------------------------- Algorithm 9


@dataclass(frozen=True)
class Phase:
    """One phase of Algorithm 9 (lines 4–14), fixed before any data is touched."""

    t: int
    epsilon: Fraction  # ε' = ε/t³, per stream and per GeometricBinarySearch call
    a: float  # t³·α
    sample_probability: float  # 1/t
    max_filter_streams: int  # t²

    @property
    def planned_epsilon(self) -> Fraction:
        """Worst case of Lemma 6.9: two GBS calls plus ≤ t² filtering streams."""
        return (self.max_filter_streams + 2) * self.epsilon


@dataclass(frozen=True)
class SamplingPlan:
    """Every parameter of Algorithm 9, a function of (n, d, ε, β) and the noise model."""

    variant: Variant
    n: int
    d: int
    epsilon: Fraction
    beta: float
    n_rounds: float  # N = 3·log2(2n)
    beta_prime: float  # β' = β/N
    alpha: float
    cutoff: float
    phases: tuple[Phase, ...]
    final_rounds: int
    final_epsilon: Fraction

    @property
    def planned_epsilon(self) -> Fraction:
        return sum((p.planned_epsilon for p in self.phases), Fraction(0)) + self.final_epsilon

    def max_queries(self) -> int:
        """Worst-case answered queries (Lemma-style bound, data-independent).

        A phase asks ≤ |P|·t ≤ (d+1)·t in its first search, ≤ d in filtering and
        ≤ max(d, t²+1)·t in its second search; the final search asks ≤ d·rounds.
        """
        total = self.d * self.final_rounds
        for p in self.phases:
            total += (self.d + 1) * p.t + self.d + max(self.d, p.t**2 + 1) * p.t
        return total


def plan_sampling_and_filtering(
    n: int,
    d: int,
    epsilon: Number | str,
    beta: float,
    accuracy: AccuracyFn,
    *,
    variant: Variant | str = Variant.PAPER,
) -> SamplingPlan:
    """Lines 1–4 and 14 of Algorithm 9: the whole phase schedule, before any data.

    `accuracy(ε, k, β)` is the oracle's α for the stream kind used (it depends only
    on public parameters).  α = accuracy(ε, K, β) with K = 384·d·⌈log2(2n)⌉³, the
    α the paper writes as (8/ε)·log(384·d·log³(2n)/β) but for the noise actually
    used.  A phase runs while x ≥ cutoff, with t = ⌈log2 x⌉ and next x = 64·t³.

    variant="paper": cut-off 2^64, final search 64 rounds at ε/2 (as written).
    variant="tuned": cut-off 2^20 (`TUNED_CUTOFF`: the smallest x at which a
    phase's filter threshold can be below n), a phase stops the schedule when it
    would not shrink x (64·t³ ≥ x; the paper's cut-off never reaches that point),
    the final search uses ⌈log2 x⌉ + 2 rounds — enough to bring the width x·α
    down to O(α) — and gets all the budget the phases do not plan.
    Both are basic composition of data-independent budgets.
    """
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    variant = variant_of(variant, Variant.PAPER, Variant.TUNED)
    if eps > 1:
        raise ValueError(f"Algorithm 9 needs epsilon <= 1, got {eps}")
    if beta > 1 / d:
        raise ValueError(f"Algorithm 9 needs beta <= 1/d = {1 / d}, got {beta}")
    log2n = math.ceil(math.log2(2 * n))
    n_rounds = 3 * math.log2(2 * n)
    beta_p = beta / n_rounds
    alpha = float(accuracy(eps, 384 * d * log2n**3, beta))
    cutoff = float(PAPER_CUTOFF if variant == Variant.PAPER else TUNED_CUTOFF)
    x = n / alpha
    phases: list[Phase] = []
    while x >= cutoff:
        t = math.ceil(math.log2(x))
        phases.append(Phase(t, eps / t**3, t**3 * alpha, 1.0 / t, t * t))
        x_next = 64.0 * t**3
        if variant == Variant.TUNED and x_next >= x:
            break
        x = x_next
    if variant == Variant.PAPER:
        final_rounds, final_eps = PAPER_FINAL_ROUNDS, eps / 2
    else:
        final_rounds = max(1, math.ceil(math.log2(max(x, 2.0)))) + 2
        final_eps = eps - sum((p.planned_epsilon for p in phases), Fraction(0))
        if final_eps <= 0:
            raise ValueError("tuned plan leaves no budget for the final search")
    return SamplingPlan(
        variant,
        n,
        d,
        eps,
        beta,
        n_rounds,
        beta_p,
        alpha,
        cutoff,
        tuple(phases),
        final_rounds,
        final_eps,
    )


def plan_for(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    d: int | None = None,
    variant: Variant | str = Variant.PAPER,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SamplingPlan:
    """`plan_sampling_and_filtering` with the oracle's public n and accuracy function."""

    def acc(e: Fraction, k: int, b: float) -> float:
        return float(oracle.accuracy(kind, e, k, b))

    return plan_sampling_and_filtering(
        oracle.n, d if d is not None else oracle.d, epsilon, beta, acc, variant=variant
    )


def sampling_and_filtering(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    variant: Variant | str = Variant.PAPER,
    rng: np.random.Generator | int | None = None,
    kind: StreamKind | str = StreamKind.LAP24,
    plan: SamplingPlan | None = None,
) -> SelectionResult:
    """Algorithm 9, selection by sampling and filtering (t² reading of lines 11–12).

    Needs ε ∈ (0, 1] and β ≤ 1/d.  The plan (`plan_sampling_and_filtering`) fixes
    every phase's t, ε' and a from (n, d, ε, β) alone; `rng` only draws the
    data-independent samples P' of line 5.  ε-DP by basic composition: phase
    budget ≤ (t² + 2)·ε/t³ (Lemma 6.9) plus the final search.  Expected queries
    O(d·log* n + log³ n); error O(log(d log n/β)/ε) w.p. ≥ 1 − β.
    """
    cands = _candidates(oracle, candidates)
    d = len(cands)
    pl = (
        plan
        if plan is not None
        else plan_for(oracle, epsilon, beta, d=d, variant=variant, kind=kind)
    )
    if pl.d != d or pl.n != oracle.n:
        raise ValueError("plan was made for other (n, d)")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    session = _Session(oracle, kind)
    everyone = list(range(d))
    lo, hi, j_w = 0.0, float(oracle.n), 0  # line 2
    for ph in pl.phases:  # lines 3–14
        sampled = np.flatnonzero(gen.random(d) < ph.sample_probability).tolist()  # line 5
        p_set = sorted(set(sampled) | {j_w})
        j_p, lo_p, _ = _gbs(session, cands, p_set, lo, hi, j_w, ph.t, ph.epsilon, pl.beta_prime)
        tau = lo_p + 50 * ph.a  # line 7
        found: list[int] = []
        start = 0
        stream = session.open(ph.epsilon)
        while start < d:  # lines 8–11: one stream per YES, at most t² of them
            rest = everyone[start:]
            hit = session.ask(stream, cands, rest, tau)
            if hit is None:
                break
            found.append(rest[hit])
            if len(found) == ph.max_filter_streams:
                break
            start = rest[hit] + 1
            if start < d:
                stream = session.open(ph.epsilon)
        c_set = everyone if len(found) == ph.max_filter_streams else sorted(set(found) | {j_p})
        j_w, lo, u2 = _gbs(session, cands, c_set, lo_p, hi, j_p, ph.t, ph.epsilon, pl.beta_prime)
        hi = min(hi, max(u2, tau + ph.a))  # line 14
    best, lo, hi = _gbs(  # line 15
        session, cands, everyone, lo, hi, j_w, pl.final_rounds, pl.final_epsilon, pl.beta_prime
    )
    return SelectionResult(best, cands.queries[best], lo, hi, session.spend, pl.planned_epsilon)


# --------------------------------------------------------------------------- scan selection

#: Default share of ε of the scan selection's binary-search stage, and (below) of its
#: middle stage.  Measured on word-frequency data (docs/algorithms.md §6): 1/8 + 1/16
#: gave a lower ε-equivalence to the exponential mechanism *and* fewer comparisons
#: than 1/4 with no middle stage; larger shares are cheaper and less accurate.
SCAN_COARSE_FRACTION = Fraction(1, 8)
#: Default fine step, in units of the fine stream's query-noise scale c/ε_f.
SCAN_STEP_SCALE = Fraction(3, 2)
#: Default share of ε of the middle stage (a coarse descending scan between the
#: binary search and the deciding stream); 0 runs without it.
SCAN_MID_FRACTION = Fraction(1, 16)


def _one_sided(kind: StreamKind) -> bool:
    from svtagg.dp.kinds import noise_model

    m = noise_model(kind)
    return m.threshold_family == "geometric" and m.query_family == "geometric"


@dataclass(frozen=True)
class ScanPlan:
    """Every parameter of `scan_selection` / `scan_top_k`, fixed before data.

    Coarse stage (budget `coarse_epsilon`, failure β/2, or β/4 with a middle
    stage, which gets the other β/4): `coarse_rounds` rounds of
    geometric binary search with budgets `coarse_budgets` (ratio γ).  After a NO at
    m the upper end moves to m + `coarse_up[t]`; after a YES the lower end to
    m − `coarse_lo[t]`.  For one-sided noise (exp3: ν, γ ≥ 0) a NO means every
    s_j < m + γ, so `coarse_up` bounds the threshold noise γ alone (no union over
    the |P| queries); otherwise it is the usual α for |P| queries.
    Fine stage: `streams` streams of `fine_epsilon` each (one per rank), descending
    in steps of `step` from the coarse upper end (rank 1) or from the previous
    rank's last NO level (later ranks), `dense_levels` levels at most down to
    ℓ_c − α_f, then `tail_levels` doubling steps down to −4n, so that a stream ends
    at a YES whatever the coarse stage did.  α_f is for |P|·(dense + tail) queries
    at failure β/(2·streams).  Everything depends on (n, |P|, W, ε, β, kind, k).
    """

    kind: StreamKind
    epsilon: Fraction
    beta: float
    size: int
    width: float
    coarse_fraction: Fraction
    ratio: Fraction
    coarse_rounds: int
    coarse_budgets: tuple[Fraction, ...]
    coarse_up: tuple[float, ...]
    coarse_lo: tuple[float, ...]
    width_bound: float
    streams: int
    fine_epsilon: Fraction
    fine_alpha: float
    step: int
    dense_levels: int
    tail_levels: int
    rank_levels: int  # a later rank's schedule from the top of [ℓ, u] to −4n, counted
    # Middle stage (none when mid_epsilon is 0): one stream scanning [ℓ_c, u_c] at a
    # step `mid_step`, its YES narrowing the fine stage's start and floor.
    mid_epsilon: Fraction = Fraction(0)
    mid_step: int = 0
    mid_up: float = 0.0
    mid_lo: float = 0.0
    mid_dense: int = 0
    mid_tail: int = 0

    @property
    def coarse_epsilon(self) -> Fraction:
        return sum(self.coarse_budgets, Fraction(0))

    @property
    def planned_epsilon(self) -> Fraction:
        return self.coarse_epsilon + self.mid_epsilon + self.streams * self.fine_epsilon

    @property
    def stages(self) -> int:
        """Streams before the first fine stream: coarse rounds plus the middle stream."""
        return self.coarse_rounds + (1 if self.mid_epsilon else 0)

    def max_queries(self) -> int:
        """|P|·T_c + Σ_r |P_r|·L_r: every query the plan may send (L_1 = dense + tail,
        L_r = `rank_levels` for later ranks)."""
        first = self.dense_levels + self.tail_levels
        mid = self.size * (self.mid_dense + self.mid_tail)
        return (
            mid
            + self.size * self.coarse_rounds
            + sum(
                (self.size - r) * (first if r == 0 else self.rank_levels)
                for r in range(self.streams)
            )
        )

    def error_bound(self) -> float:
        """Top-1: w.p. ≥ 1 − β the chosen score is within s + 2·(α_f + 1/2) of the max
        (the stream's first YES at level m: chosen ≥ m − α_f, max < m + s + α_f)."""
        return self.step + 2 * (self.fine_alpha + ROUNDING_SLACK)


def plan_scan(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    size: int,
    width: float,
    *,
    k: int = 1,
    kind: StreamKind | str = "auto",
    coarse_fraction: Number | str = SCAN_COARSE_FRACTION,
    ratio: Fraction = GBS_RATIO,
    rounds: int | None = None,
    step: int | None = None,
    mid_fraction: Number | str | None = None,
) -> ScanPlan:
    """The scan selection's plan from public parameters and `oracle.accuracy` only.

    kind="auto": the kind (of exp3, lap3, lap24) with the smallest α for a chunk of
    |P| queries on the fine budget.  Coarse rounds: unless given, the T ≤ ⌈log2 W⌉
    that minimises T + (coarse width bound)/s, the plan's proxy for comparisons
    per candidate.  Step s: max(1, ⌊1.5·c/ε_f⌋) (`SCAN_STEP_SCALE` noise scales).
    """
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    from svtagg.dp.kinds import as_fraction

    frac = as_fraction(coarse_fraction, "coarse_fraction")
    mid = as_fraction(mid_fraction if mid_fraction is not None else SCAN_MID_FRACTION, "mid")
    if not 0 < frac < 1 or not 0 <= mid < 1 - frac:
        raise ValueError(
            f"need 0 < coarse_fraction < 1 and 0 <= mid_fraction < 1 − coarse_fraction, "
            f"got {coarse_fraction}, {mid_fraction}"
        )
    if size < 1:
        raise ValueError("need at least one candidate")
    if not 1 <= k <= size:
        raise ValueError(f"k must be in [1, {size}], got {k}")
    eps_c = eps * frac
    eps_m = eps * mid
    eps_f = (eps - eps_c - eps_m) / k
    beta_f = beta / 2 / k
    beta_c = beta / 4 if mid else beta / 2
    k_kind = _stream_kind(oracle, kind, eps_f, size, beta_f)
    s = _scan_step(k_kind, eps_f, step, SCAN_STEP_SCALE)
    one_sided = _one_sided(k_kind)

    def coarse(t_max: int) -> tuple[list[Fraction], list[float], list[float], float]:
        budgets = gbs_budgets(eps_c, t_max, ratio)
        # A round relies on its lower and (one-sided kinds) its separate upper
        # bound: each at half the round's failure probability, so the round's is b_t.
        b_t = beta_c / t_max
        b_each = b_t / 2 if one_sided else b_t
        lo = [float(oracle.accuracy(k_kind, e, size, b_each)) for e in budgets]
        up = [float(oracle.accuracy(k_kind, e, 1, b_each)) for e in budgets] if one_sided else lo
        return budgets, up, lo, _coarse_width_bound(width, lo, up)

    s_m = _scan_step(k_kind, eps_m, None, SCAN_STEP_SCALE) if mid else 0
    t_cap = default_rounds(width)
    if rounds is not None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        t_best = rounds
    else:
        # comparisons per candidate the coarse width costs the next stage's scan
        t_best = min(range(1, t_cap + 1), key=lambda t: t + coarse(t)[3] / (s_m or s))
    budgets, up, lo, wb = coarse(t_best)
    limit = 4 * oracle.n
    m_up = m_lo = 0.0
    m_dense = m_tail = 0
    if mid:
        m_tail = _tail_levels(limit, wb, s_m)
        # the stage's β/4, split between its two bounds for one-sided kinds
        b_m = beta / 8 if one_sided else beta / 4
        m_dense, m_lo = _dense_fixpoint(
            wb,
            s_m,
            lambda dense: float(oracle.accuracy(k_kind, eps_m, size * (dense + m_tail), b_m)),
        )
        m_up = float(oracle.accuracy(k_kind, eps_m, 1, b_m)) if one_sided else m_lo
        # the fine stage scans from the middle YES's last NO level + its up-bound down
        # to the YES level − its lo-bound
        wb = min(wb, s_m + m_up + m_lo + 2 * ROUNDING_SLACK)
    tail = _tail_levels(limit, wb, s)
    rank_levels = _rank_schedule_length(width, s, limit) if k > 1 else 0
    dense, a_f = _dense_fixpoint(
        wb,
        s,
        lambda n_dense: float(
            oracle.accuracy(k_kind, eps_f, size * max(n_dense + tail, rank_levels), beta_f)
        ),
    )
    return ScanPlan(
        k_kind,
        eps,
        beta,
        size,
        float(width),
        frac,
        Fraction(ratio),
        t_best,
        tuple(budgets),
        tuple(up),
        tuple(lo),
        wb,
        k,
        eps_f,
        a_f,
        s,
        dense,
        tail,
        rank_levels,
        eps_m,
        s_m,
        m_up,
        m_lo,
        m_dense,
        m_tail,
    )


def _rank_schedule_length(width: float, step: int, limit: int) -> int:
    """Levels of a later rank's schedule in the worst case: from the top of the
    interval (height `width` above its lower end) down to −4n (`_scan_levels` with
    `base`), plus the `SCAN_RANK_DENSE` fine levels."""
    m, gap, count = float(width), 2 * step, SCAN_RANK_DENSE
    m -= (SCAN_RANK_DENSE - 1) * step
    while m > -limit:
        g = gap
        if m > 0:
            g = min(gap, max(step, math.floor(float(SCAN_RANK_RELATIVE) * m)))
        m -= g
        count += 1
        gap = 2 * g
    return count + 1


def _scan_coarse(
    session: _Session,
    cands: Candidates,
    positions: Sequence[int],
    lower: float,
    upper: float,
    plan: ScanPlan,
) -> tuple[int | None, float, float]:
    """The coarse stage: returns (witness or None, ℓ_c, u_c).

    Witness: the YES with the best certified lower bound (Algorithm 8's rule); when
    no YES raised ℓ, the most recent YES; None when no stream said YES.  All three
    depend only on released outputs.
    """
    lo, hi = float(lower), float(upper)
    best: int | None = None
    last: int | None = None
    for e_t, a_up, a_lo in zip(plan.coarse_budgets, plan.coarse_up, plan.coarse_lo, strict=True):
        session.spend.alphas.append(a_lo)
        m = (lo + hi) / 2
        hit = session.ask(session.open(e_t), cands, positions, m)
        if hit is None:
            hi = min(hi, m + a_up + ROUNDING_SLACK)
            continue
        last = positions[hit]
        if m - a_lo - ROUNDING_SLACK > lo:
            lo = m - a_lo - ROUNDING_SLACK
            best = positions[hit]
    return (best if best is not None else last), lo, hi


#: Levels a later rank of `scan_top_k` scans at the fine step before its steps grow.
SCAN_RANK_DENSE = 4
#: A later rank's step grows (doubling) up to this fraction of the level's height
#: above the interval's lower end, never below the fine step: on skewed data the
#: next score may be far below, and consecutive ranks differ by a fraction of it.
SCAN_RANK_RELATIVE = Fraction(1, 16)


def _scan_levels(
    top: float,
    floor_level: float,
    plan: ScanPlan,
    tau_limit: int,
    dense: int | None = None,
    base: float | None = None,
) -> list[float]:
    """The thresholds one fine stream may ask, in order: from `top` down by the step
    to `floor_level` (at most `dense` ≤ `dense_levels` levels), then doubling steps
    to −4n.  With `base` (later ranks of `scan_top_k`), each doubled step is capped
    at max(step, `SCAN_RANK_RELATIVE`·(m − base)) while the level m is above `base`,
    for at most `plan.rank_levels` levels in all."""
    count = plan.dense_levels if dense is None else min(dense, plan.dense_levels)
    levels = _dense_levels(top, floor_level, plan.step, count)
    cap = plan.tail_levels if base is None else plan.rank_levels - len(levels)
    _extend_doubling(levels, plan.step, cap, tau_limit, base)
    return levels


def _dense_levels(top: float, floor_level: float, step: int, count: int) -> list[float]:
    """⌊top⌋, ⌊top⌋ − step, … : at most `count` levels, the last the first one at
    or below `floor_level`."""
    levels = []
    m = float(math.floor(top))
    for _ in range(count):
        levels.append(m)
        if m <= floor_level:
            break
        m -= step
    return levels


def _extend_doubling(
    levels: list[float], step: int, cap: int, tau_limit: int, base: float | None = None
) -> None:
    """Append at most `cap` levels below the last of `levels`, each step double the
    one before (starting at 2·step), stopping at −`tau_limit`.  With `base`, a step
    taken from a level m above `base` is at most max(step, `SCAN_RANK_RELATIVE`·(m −
    base))."""
    gap = 2 * step
    for _ in range(max(cap, 0)):
        last = levels[-1]
        g = gap
        if base is not None and last > base:
            g = min(gap, max(step, math.floor(float(SCAN_RANK_RELATIVE) * (last - base))))
        m = max(last - g, -float(tau_limit))
        if m >= last:
            break
        levels.append(m)
        gap = 2 * g


def _mid_stage(
    session: _Session,
    cands: Candidates,
    positions: Sequence[int],
    lo_c: float,
    hi_c: float,
    plan: ScanPlan,
) -> tuple[int | None, float, float]:
    """The middle stream: descend from u_c at `mid_step` (then doubling) until a YES
    at level m_i; returns (its candidate or None, max(ℓ_c, m_i − mid_lo),
    min(u_c, m_{i−1} + mid_up)).  For one-sided noise the NO at m_{i−1} bounds
    every score by m_{i−1} + γ, so `mid_up` bounds γ alone."""
    floor_level = lo_c - plan.mid_lo - ROUNDING_SLACK
    levels = _dense_levels(hi_c, floor_level, plan.mid_step, plan.mid_dense)
    _extend_doubling(levels, plan.mid_step, plan.mid_tail, session.tau_limit)
    session.spend.alphas.append(plan.mid_lo)
    found = _scan_stream(session, cands, positions, levels, plan.mid_epsilon)
    if found is None:
        return None, lo_c, hi_c
    hit, i = found
    lower = max(lo_c, levels[i] - plan.mid_lo - ROUNDING_SLACK)
    upper = hi_c if i == 0 else min(hi_c, levels[i - 1] + plan.mid_up + ROUNDING_SLACK)
    return positions[hit], lower, max(upper, lower)


def _level_certificate(
    levels: Sequence[float], i: int, alpha: float, bound: float
) -> tuple[float, float]:
    """[lower, upper] after a descending scan's first YES at `levels[i]`: the pick is
    ≥ levels[i] − α, and every score is ≤ levels[i − 1] + α (the NO just before)
    or, at the first level, ≤ `bound`."""
    return levels[i] - alpha, bound if i == 0 else min(bound, levels[i - 1] + alpha)


def _scan_stream(
    session: _Session,
    cands: Candidates,
    positions: Sequence[int],
    levels: Sequence[float],
    epsilon: Fraction,
) -> tuple[int, int] | None:
    """One fine stream over `levels`: (position in `positions`, level index) of its
    YES, or None if it never said YES."""
    stream = session.open(epsilon)
    for i, m in enumerate(levels):
        hit = session.ask(stream, cands, positions, m)
        if hit is not None:
            return hit, i
    return None


def _scan_localise(
    session: _Session,
    cands: Candidates,
    positions: Sequence[int],
    lower: float,
    upper: float,
    plan: ScanPlan,
) -> tuple[int | None, float, float]:
    """The coarse stage, then the middle stage if the plan has one: returns (witness
    or None, ℓ_c, u_c), the witness being the middle stage's YES if it had one."""
    witness, lo_c, hi_c = _scan_coarse(session, cands, positions, lower, upper, plan)
    if plan.mid_epsilon:
        mid_pick, lo_c, hi_c = _mid_stage(session, cands, positions, lo_c, hi_c, plan)
        witness = mid_pick if mid_pick is not None else witness
    return witness, lo_c, hi_c


def _scan_ranks(
    session: _Session,
    cands: Candidates,
    positions: list[int],
    lower: float,
    lo_c: float,
    hi_c: float,
    plan: ScanPlan,
    k: int,
    groups: Sequence[int] | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> tuple[list[int], list[float], list[float]]:
    """The fine streams of up to k ranks (see `scan_top_k`): the picks (positions in
    the candidate list) in rank order and their certificates' lower and upper ends.
    A stream that never says YES ends the ranking early."""
    a_f = plan.fine_alpha + ROUNDING_SLACK
    start = hi_c
    chosen: list[int] = []
    lowers: list[float] = []
    uppers: list[float] = []
    remaining = positions
    for rank in range(k):
        session.spend.alphas.append(plan.fine_alpha)
        if rank == 0:
            levels = _scan_levels(start, lo_c - a_f, plan, session.tau_limit)
        else:
            levels = _scan_levels(
                start, lo_c - a_f, plan, session.tau_limit, SCAN_RANK_DENSE, base=lower
            )
        found = _scan_stream(session, cands, remaining, levels, plan.fine_epsilon)
        if found is None:
            break
        hit, i = found
        chosen.append(remaining[hit])
        low, up = _level_certificate(levels, i, a_f, hi_c if rank == 0 else uppers[-1])
        lowers.append(low)
        uppers.append(up)
        if groups is None:
            remaining = remaining[:hit] + remaining[hit + 1 :]
        else:
            label = groups[remaining[hit]]
            remaining = [p for p in remaining if groups[p] != label]
            if not remaining:
                break
        start = levels[i - 1] if i > 0 else levels[0]
        if progress is not None:
            progress(len(chosen), k, session.spend.queries)
    return chosen, lowers, uppers


def _scan_setup(
    oracle: Oracle,
    k: int,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None,
    subset: Sequence[int] | None,
    interval: tuple[float, float] | None,
    kind: StreamKind | str,
    coarse_fraction: Number | str,
    rounds: int | None,
    step: int | None,
    plan: ScanPlan | None,
    mid_fraction: Number | str | None,
) -> tuple[Candidates, list[int], float, float, ScanPlan]:
    """Candidates, positions, [ℓ, u] and the plan (given, or `plan_scan`'s for k
    ranks) of `scan_selection` / `scan_top_k`; refuses a plan made for other ones."""
    cands, positions, lo, hi = _positions(oracle, candidates, subset, interval)
    pl = (
        plan
        if plan is not None
        else plan_scan(
            oracle,
            epsilon,
            beta,
            len(positions),
            hi - lo,
            k=k,
            kind=kind,
            coarse_fraction=coarse_fraction,
            rounds=rounds,
            step=step,
            mid_fraction=mid_fraction,
        )
    )
    if _plan_misfit(pl, len(positions), hi - lo) or pl.streams != k:
        raise ValueError("plan was made for another candidate count, interval or k")
    return cands, positions, lo, hi, pl


def scan_selection(
    oracle: Oracle,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    subset: Sequence[int] | None = None,
    interval: tuple[float, float] | None = None,
    kind: StreamKind | str = "auto",
    coarse_fraction: Number | str = SCAN_COARSE_FRACTION,
    rounds: int | None = None,
    step: int | None = None,
    plan: ScanPlan | None = None,
    mid_fraction: Number | str | None = None,
) -> SelectionResult:
    """Scan selection: a short localisation, then one deciding descending-scan stream.

    Not in the paper; built from its pieces (`ScanPlan` describes the stages).  The
    localisation only places the deciding scan's start, so it gets a small share of
    ε: a geometric binary search (`coarse_fraction`, default 1/8) and a middle
    descending scan at a coarse step (`mid_fraction`, default 1/16; 0 skips it).
    The trade-off is the analyst's: larger shares send fewer comparisons and leave
    the deciding stream less budget (docs/algorithms.md §6 has both ends measured).
    The deciding scan continues below the localised interval with doubling steps,
    so it ends at a YES even when the localisation failed; only if no stream ever
    says YES (every threshold down to −4n answered NO, probability below
    e^(−4n·ε_f/c)) is an earlier stage's YES — or, with none, the first candidate —
    returned.  Privacy: basic composition of T_c + 2 (or + 1) streams whose budgets
    sum to ε exactly, all fixed by the plan before data (thresholds adapt, which
    AboveThreshold allows).  W.p. ≥ 1 − β the chosen score is within
    `plan.error_bound()` of the max.
    """
    cands, positions, lo, hi, pl = _scan_setup(
        oracle,
        1,
        epsilon,
        beta,
        candidates=candidates,
        subset=subset,
        interval=interval,
        kind=kind,
        coarse_fraction=coarse_fraction,
        rounds=rounds,
        step=step,
        plan=plan,
        mid_fraction=mid_fraction,
    )
    session = _Session(oracle, pl.kind)
    witness, lo_c, hi_c = _scan_localise(session, cands, positions, lo, hi, pl)
    chosen, lowers, uppers = _scan_ranks(session, cands, positions, lo, lo_c, hi_c, pl, 1)
    if not chosen:
        j = witness if witness is not None else positions[0]
        return SelectionResult(j, cands.queries[j], lo_c, hi_c, session.spend, pl.planned_epsilon)
    j = chosen[0]
    return SelectionResult(
        j, cands.queries[j], lowers[0], uppers[0], session.spend, pl.planned_epsilon
    )


@dataclass(frozen=True)
class ScanTopK:
    """`scan_top_k`'s picks in rank order (positions in the candidate list) and record.

    Per rank r, w.p. ≥ 1 − β for all ranks together: the pick's score is ≥ lowers[r]
    and every candidate not chosen before rank r scores ≤ uppers[r]."""

    indices: list[int]
    lowers: list[float]
    uppers: list[float]
    spend: Spend
    planned_epsilon: Fraction


def scan_top_k(
    oracle: Oracle,
    k: int,
    epsilon: Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    interval: tuple[float, float] | None = None,
    kind: StreamKind | str = "auto",
    coarse_fraction: Number | str = SCAN_COARSE_FRACTION,
    rounds: int | None = None,
    step: int | None = None,
    plan: ScanPlan | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    mid_fraction: Number | str | None = None,
    groups: Sequence[int] | None = None,
) -> ScanTopK:
    """Top-k by one coarse localisation and a descending scan that continues.

    Rank 1 is `scan_selection`.  Rank r + 1 opens its own stream (budget ε_f, every
    rank's YES paid as its own stream) over the candidates not yet chosen and
    starts at the last level rank r answered NO at, not from the top: that level
    was NO for every remaining candidate, so nothing is skipped w.p. ≥ 1 − β.  A
    later rank scans `SCAN_RANK_DENSE` levels at the fine step, then doubles its
    step (the next score may be far below on skewed data); its certificate
    [lower, upper] is as wide as the step it answered YES at, plus 2·α_f.
    Budget: ε_c + k·ε_f = ε, basic composition, all fixed by the plan.  A stream
    that never says YES (see `scan_selection`) ends the ranking early.
    `groups` (one public label per candidate): a pick removes every candidate of
    its group (sparse mean's two signs of a coordinate).
    """
    cands, positions, lo, hi, pl = _scan_setup(
        oracle,
        k,
        epsilon,
        beta,
        candidates=candidates,
        subset=None,
        interval=interval,
        kind=kind,
        coarse_fraction=coarse_fraction,
        rounds=rounds,
        step=step,
        plan=plan,
        mid_fraction=mid_fraction,
    )
    if groups is not None and len(groups) != len(positions):
        raise ValueError("one group label per candidate is required")
    session = _Session(oracle, pl.kind)
    _, lo_c, hi_c = _scan_localise(session, cands, positions, lo, hi, pl)
    chosen, lowers, uppers = _scan_ranks(
        session, cands, positions, lo, lo_c, hi_c, pl, k, groups, progress
    )
    return ScanTopK(chosen, lowers, uppers, session.spend, pl.planned_epsilon)
