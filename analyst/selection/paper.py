"""The paper's selection algorithms (§6): Algorithm 6 (binary search), Algorithm 7
(linear scan), Algorithm 8 (geometric binary search), Corollary 6.8 (sum
estimation) and Algorithm 9 (sampling and filtering), each as written, on the
`Oracle` interface.  Algorithm 9's schedule is planned in `plans`."""

from __future__ import annotations

import math

import numpy as np

from svtagg.analyst.oracle import Oracle
from svtagg.analyst.selection.plans import PracticalOptions, SamplingPlan, plan_for
from svtagg.analyst.selection.practical import practical_selection
from svtagg.analyst.selection.records import (
    Candidates,
    Region,
    SearchSpace,
    SelectionResult,
    SumEstimate,
    Variant,
    variant_of,
)
from svtagg.analyst.selection.search import GbsSchedule, gbs
from svtagg.analyst.selection.session import Session, check_beta, default_rounds
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Epsilon, Number, Query


def _candidates(oracle: Oracle, candidates: Candidates | None) -> Candidates:
    cands = candidates if candidates is not None else Candidates.coordinates(oracle.d)
    if len(cands) == 0:
        raise ValueError("need at least one candidate")
    return cands


# --------------------------------------------------------------------------- Algorithm 8


def geometric_binary_search(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    space: SearchSpace | None = None,
    rounds: int | None = None,
    kind: StreamKind | str | None = None,
    variant: Variant | str = Variant.PAPER,
) -> SelectionResult:
    """Algorithm 8, GeometricBinarySearch(P, [ℓ, u], j0, T, ε, β).

    variant="paper" (default) runs Algorithm 8 as written with `kind` (default
    lap24); variant="practical" runs `practical_selection` with the same P, [ℓ, u],
    j0 and T for its coarse stage (`kind` default "auto").

    Requires max_{j∈P} s_j ≤ u and s_{j0} ≥ ℓ.  Defaults (`SearchSpace`): P = all
    candidates, [ℓ, u] = [0, n], j0 = first of P; T = max(1, ⌈log2 n⌉).  Round t
    opens one stream of budget ε_t = (ε/Z)·γ^(T−t) and asks one chunk (all of P at
    the midpoint), with α_t = oracle.accuracy(kind, ε_t, |P|, β/T).

    Guarantee (Theorem 6.6): ε-DP; at most |P|·T queries; w.p. ≥ 1 − β,
    s_{j*} ≥ ℓ', max_P s ≤ u' and u' − ℓ' ≤ W/2^T + 2·max_t α_t-ish (the paper
    states (384/ε)·log(2|P|T/β) for its constants).
    """
    if variant == Variant.PRACTICAL:
        options = PracticalOptions(kind=kind if kind is not None else "auto", rounds=rounds)
        return practical_selection(oracle, epsilon, beta, space=space, options=options)
    variant_of(variant, Variant.PAPER, Variant.PRACTICAL)
    eps = Epsilon.parse(epsilon).value
    beta = check_beta(beta)
    region = (space or SearchSpace()).resolve(oracle)
    t_rounds = rounds if rounds is not None else default_rounds(region.width)
    session = Session(oracle, kind if kind is not None else StreamKind.LAP24)
    best, lo, hi = gbs(session, region, GbsSchedule(t_rounds, eps, beta))
    return SelectionResult(best, region.cands.queries[best], lo, hi, session.spend, eps)


# --------------------------------------------------------------------------- Corollary 6.8


def sum_estimation(
    oracle: Oracle,
    query: Query,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SumEstimate:
    """Corollary 6.8: Algorithm 8 with the single candidate `query` on [0, n].

    T = max(1, ⌈log2 n⌉).  ε-DP; w.p. ≥ 1 − β the returned interval contains
    Σ_i f(x_i) and has length ≤ 1 + (384/ε)·log(2T/β) (paper's constants).
    The estimate is the interval's midpoint.
    """
    space = SearchSpace(Candidates.of([query]), interval=(0.0, float(oracle.n)), witness=0)
    res = geometric_binary_search(oracle, epsilon, beta, space=space, kind=kind)
    return SumEstimate(
        (res.lower + res.upper) / 2, res.lower, res.upper, res.spend, res.planned_epsilon
    )


# --------------------------------------------------------------------------- Algorithm 6


def binary_search_rounds(n: int) -> int:
    """R = ⌈log2(2n)⌉ + 1, the number of rounds of Algorithm 6."""
    return math.ceil(math.log2(2 * n)) + 1


def binary_search(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
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
    eps = Epsilon.parse(epsilon).value
    beta = check_beta(beta)
    cands = _candidates(oracle, candidates)
    d = len(cands)
    rounds = binary_search_rounds(oracle.n)
    eps_s = eps / (2 * rounds)
    session = Session(oracle, kind)
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
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    candidates: Candidates | None = None,
    interval: tuple[int, int] | None = None,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SelectionResult:
    """Algorithm 7, private linear scan: one stream of budget ε.

    For m = u, u−1, …, ℓ (default [0, n]) ask all d candidates at threshold m
    (whole levels per chunk, `Session.descend`) and return the first YES; if none
    ever answers, return the first candidate.  ≤ d·(u−ℓ+1) queries; the α
    recorded is for that many queries.
    Optimal error O(log(d n/β)/ε), at the price of O(d n) queries.
    """
    eps = Epsilon.parse(epsilon).value
    beta = check_beta(beta)
    cands = _candidates(oracle, candidates)
    d = len(cands)
    lo, hi = interval if interval is not None else (0, oracle.n)
    session = Session(oracle, kind)
    alpha = session.alpha(eps, d * (hi - lo + 1), beta)
    levels = [float(m) for m in range(hi, lo - 1, -1)]
    found = session.descend(cands, range(d), levels, eps)  # whole levels per chunk
    if found is not None:
        hit, i = found
        m = levels[i]
        return SelectionResult(
            hit, cands.queries[hit], m - alpha, m + 1 + alpha, session.spend, eps
        )
    return SelectionResult(0, cands.queries[0], float(lo), lo + alpha, session.spend, eps)


# --------------------------------------------------------------------------- Algorithm 9


def sampling_and_filtering(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
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
    session = Session(oracle, kind)
    everyone = list(range(d))
    lo, hi, j_w = 0.0, float(oracle.n), 0  # line 2
    for ph in pl.phases:  # lines 3–14
        sampled = np.flatnonzero(gen.random(d) < ph.sample_probability).tolist()  # line 5
        p_set = sorted(set(sampled) | {j_w})
        first = GbsSchedule(ph.t, ph.epsilon, pl.beta_prime)
        j_p, lo_p, _ = gbs(session, Region(cands, p_set, lo, hi, j_w), first)  # line 6
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
        second = GbsSchedule(ph.t, ph.epsilon, pl.beta_prime)
        j_w, lo, u2 = gbs(session, Region(cands, c_set, lo_p, hi, j_p), second)  # line 13
        hi = min(hi, max(u2, tau + ph.a))  # line 14
    final = GbsSchedule(pl.final_rounds, pl.final_epsilon, pl.beta_prime)
    best, lo, hi = gbs(session, Region(cands, everyone, lo, hi, j_w), final)  # line 15
    return SelectionResult(best, cands.queries[best], lo, hi, session.spend, pl.planned_epsilon)
