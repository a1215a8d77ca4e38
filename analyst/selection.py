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
from fractions import Fraction

import numpy as np
from svtagg.analyst.kinds import StreamKind, check_epsilon
from svtagg.analyst.oracle import MAX_CHUNK, Number, Oracle, Query, Stream

#: Ratio γ of consecutive round budgets in Algorithm 8 (the paper's 3/4).
GBS_RATIO = Fraction(3, 4)
#: Phase cut-off of Algorithm 9 as written: phases run only while n/α ≥ 2^64.
PAPER_CUTOFF = 2**64
#: Rounds of Algorithm 9's final GeometricBinarySearch as written (line 15).
PAPER_FINAL_ROUNDS = 64
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


def _check_beta(beta: float) -> float:
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return float(beta)


def default_rounds(width: float) -> int:
    """T = max(1, ⌈log2 W⌉), the paper's default number of rounds for an interval W."""
    return max(1, math.ceil(math.log2(width))) if width > 1 else 1


# --------------------------------------------------------------------------- Algorithm 8


def gbs_budgets(epsilon: Fraction, rounds: int) -> list[Fraction]:
    """ε_t = (ε/Z)·γ^(T−t), t = 1..T, with Z = (1 − γ^T)/(1 − γ): they sum to ε exactly."""
    g = GBS_RATIO
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
) -> tuple[int, float, float]:
    """Algorithm 8 on candidate positions `subset`; returns (j*, ℓ', u')."""
    best = witness
    lo, hi = float(lower), float(upper)
    for eps_t in gbs_budgets(epsilon, rounds):
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
    kind: StreamKind | str = StreamKind.LAP24,
) -> SelectionResult:
    """Algorithm 8, GeometricBinarySearch(P, [ℓ, u], j0, T, ε, β).

    Requires max_{j∈P} s_j ≤ u and s_{j0} ≥ ℓ.  Defaults: P = all candidates,
    [ℓ, u] = [0, n], j0 = first of P, T = max(1, ⌈log2 n⌉).  Round t opens one
    stream of budget ε_t = (ε/Z)·γ^(T−t) and asks one chunk (all of P at the
    midpoint), with α_t = oracle.accuracy(kind, ε_t, |P|, β/T).

    Guarantee (Theorem 6.6): ε-DP; at most |P|·T queries; w.p. ≥ 1 − β,
    s_{j*} ≥ ℓ', max_P s ≤ u' and u' − ℓ' ≤ W/2^T + 2·max_t α_t-ish (the paper
    states (384/ε)·log(2|P|T/β) for its constants).
    """
    eps = check_epsilon(epsilon)
    beta = _check_beta(beta)
    cands = _candidates(oracle, candidates)
    positions = list(subset) if subset is not None else list(range(len(cands)))
    lo, hi = interval if interval is not None else (0.0, float(oracle.n))
    w0 = witness if witness is not None else positions[0]
    t_rounds = rounds if rounds is not None else default_rounds(hi - lo)
    session = _Session(oracle, kind)
    best, lo2, hi2 = _gbs(session, cands, positions, lo, hi, w0, t_rounds, eps, beta)
    return SelectionResult(best, cands.queries[best], lo2, hi2, session.spend, eps)


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

    variant: str
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
    variant: str = "paper",
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
    if variant not in ("paper", "tuned"):
        raise ValueError(f"variant must be 'paper' or 'tuned', got {variant!r}")
    if eps > 1:
        raise ValueError(f"Algorithm 9 needs epsilon <= 1, got {eps}")
    if beta > 1 / d:
        raise ValueError(f"Algorithm 9 needs beta <= 1/d = {1 / d}, got {beta}")
    log2n = math.ceil(math.log2(2 * n))
    n_rounds = 3 * math.log2(2 * n)
    beta_p = beta / n_rounds
    alpha = float(accuracy(eps, 384 * d * log2n**3, beta))
    cutoff = float(PAPER_CUTOFF if variant == "paper" else TUNED_CUTOFF)
    x = n / alpha
    phases: list[Phase] = []
    while x >= cutoff:
        t = math.ceil(math.log2(x))
        phases.append(Phase(t, eps / t**3, t**3 * alpha, 1.0 / t, t * t))
        x_next = 64.0 * t**3
        if variant == "tuned" and x_next >= x:
            break
        x = x_next
    if variant == "paper":
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
    variant: str = "paper",
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
    variant: str = "paper",
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
