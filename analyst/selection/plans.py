"""Plans: every budget, round count, step and α of a selection, fixed from public
parameters and `oracle.accuracy` alone before any data is touched.

The options (`PracticalOptions`, `ScanOptions`) are what the analyst chooses; a
planner checks them and turns them into a plan (`PracticalPlan`, `ScanPlan`,
`SamplingPlan` for Algorithm 9), the only form the algorithms run from.  A plan
is a function of (n, |P|, W, ε, β, kind, …): identical on neighbouring datasets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from svtagg.analyst.oracle import Oracle, joint_noise_of
from svtagg.analyst.selection.records import Variant, variant_of
from svtagg.analyst.selection.search import GBS_RATIO, gbs_budgets, rank_schedule_length
from svtagg.analyst.selection.session import ROUNDING_SLACK, check_beta, default_rounds
from svtagg.dp.jointsvt import JOINT, JOINT_SVT_KINDS
from svtagg.dp.kinds import StreamKind, as_fraction, noise_model
from svtagg.dp.queries import Epsilon, Number

AccuracyFn = Callable[[Fraction, int, float], float]

#: Phase cut-off of Algorithm 9 as written: phases run only while n/α ≥ 2^64.
PAPER_CUTOFF = 2**64
#: Rounds of Algorithm 9's final GeometricBinarySearch as written (line 15).
PAPER_FINAL_ROUNDS = 64
#: Phase cut-off of the tuned variant of Algorithm 9: a phase can only help when its
#: filter threshold ℓ_P + 50·t³·α can fall inside [0, n], i.e. x = n/α > 50·⌈log2 x⌉³,
#: which first holds at x ≈ 2^19; below that a phase only burns ~ε/t budget and
#: ~2d queries (measured with a cut-off of 2^6: errors 5–7× Algorithm 8's).
TUNED_CUTOFF = 2**20

#: Share of ε the practical variant gives its coarse stage (paper GBS, fewer rounds).
PRACTICAL_COARSE_FRACTION = Fraction(1, 2)
#: Default fine-scan step, in units of the fine stream's query-noise scale c/ε_f
#: (measured at n = 10^5, d = 10^3, ε = 1, 30 reps: steps of 0.5–1.5 scales gave
#: median errors 3–5, 2–3 scales 7; levels, hence queries, fall as 1/step).
PRACTICAL_STEP_SCALE = Fraction(3, 2)
#: Kinds "auto" chooses from: the one with the smallest α for the fine stream.
PRACTICAL_KINDS = (StreamKind.EXP3, StreamKind.LAP3, StreamKind.LAP24)

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


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class PracticalOptions:
    """The analyst's choices for `practical_selection` (`plan_practical` checks them).

    kind: a stream kind, or "auto" for the one of `PRACTICAL_KINDS` with the
    smallest α on the fine stream.  coarse_fraction: the coarse stage's share of ε,
    in (0, 1).  rounds: the coarse stage's T (default max(1, ⌈log2 W⌉)).  step:
    the fine scan's step in score units (default max(1, ⌊1.5·c/ε_f⌋)).  ratio: γ
    of the coarse stage's budgets.
    """

    kind: StreamKind | str = "auto"
    coarse_fraction: Number | str = PRACTICAL_COARSE_FRACTION
    rounds: int | None = None
    step: int | None = None
    ratio: Fraction = GBS_RATIO


@dataclass(frozen=True)
class ScanOptions:
    """The analyst's choices for `scan_selection` / `scan_top_k` (`plan_scan`
    checks them).

    kind: a stream kind, or "auto" for the kind of exp3, lap3, lap24 with the
    smallest α on the deciding streams.  coarse_fraction, mid_fraction: the ε
    shares of the localisation's binary search and middle scan (0 skips the middle
    stage), 0 < coarse and 0 ≤ mid < 1 − coarse.  rounds: the binary search's T
    (default: the T ≤ ⌈log2 W⌉ that minimises the plan's comparisons per
    candidate).  step: the deciding scan's step in score units (default
    max(1, ⌊1.5·c/ε_f⌋)).  ratio: γ of the binary search's budgets.
    """

    kind: StreamKind | str = "auto"
    coarse_fraction: Number | str = SCAN_COARSE_FRACTION
    mid_fraction: Number | str = SCAN_MID_FRACTION
    rounds: int | None = None
    step: int | None = None
    ratio: Fraction = GBS_RATIO


# --------------------------------------------------------------------------- plans


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

    def stream_budgets(self) -> list[tuple[StreamKind, Fraction]]:
        """(kind, ε) of every stream the plan may open: the binary search's
        rounds, the middle stream (if any), one deciding stream per rank.  What a
        budget plan's group must hold for it (`analyst.oracle.plan_groups`)."""
        mid = [self.mid_epsilon] if self.mid_epsilon else []
        budgets = [*self.coarse_budgets, *mid, *[self.fine_epsilon] * self.streams]
        return [(self.kind, e) for e in budgets]

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


def plan_misfit(plan: PracticalPlan | ScanPlan, size: int, width: float) -> bool:
    """True when `plan` was made for another candidate count or interval width."""
    return plan.size != size or abs(plan.width - width) > 1e-9


# --------------------------------------------------------------------------- planning helpers


def coarse_width_bound(
    width: float, alphas: Sequence[float], up: Sequence[float] | None = None
) -> float:
    """Every GBS round leaves width ≤ min(w, w/2 + α_t) (NO: u = min(u, m + α);
    YES: ℓ = m − α only if that raises ℓ), whatever the answers.  With `up`, a NO
    moves u by up_t and a YES ℓ by α_t: the width left is ≤ w/2 + max(up_t, α_t)."""
    w = float(width)
    for a_lo, a_up in zip(alphas, up if up is not None else alphas, strict=True):
        w = min(w, w / 2 + max(a_up, a_lo) + ROUNDING_SLACK)
    return w


def stream_kind(
    oracle: Oracle, kind: StreamKind | str, epsilon: Fraction, size: int, beta: float
) -> StreamKind:
    """`kind`, or for "auto" the one of `PRACTICAL_KINDS` with the smallest α for a
    chunk of `size` queries on budget `epsilon` at failure `beta`."""
    if kind == "auto":
        # A joint-noise task's AboveThreshold kinds: lap24, lap3 and exp3 (dp/jointsvt.py).
        joint = joint_noise_of(oracle)[0] == JOINT
        kinds = [StreamKind.parse(k) for k in (JOINT_SVT_KINDS if joint else PRACTICAL_KINDS)]
        return min(kinds, key=lambda k: float(oracle.accuracy(k, epsilon, size, beta)))
    return StreamKind.parse(kind)


def scan_step(kind: StreamKind, epsilon: Fraction, step: int | None, scale: Fraction) -> int:
    """A descending scan's step: `step`, or max(1, ⌊scale·c/ε⌋), c the kind's
    query-noise coefficient (`scale` noise scales of a stream of budget ε)."""
    if step is None:
        return max(1, math.floor(scale * noise_model(kind).query_coef / epsilon))
    s = int(step)
    if s < 1:
        raise ValueError(f"step must be a positive integer, got {step}")
    return s


def dense_fixpoint(
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


def tail_levels(limit: int, width_bound: float, step: int) -> int:
    """Levels of a scan's doubling tail (steps 2s, 4s, …) after its dense levels over
    a width ≤ `width_bound`: 1 + ⌈log2((limit + width_bound)/s)⌉, at least 2, for
    the steps to reach −`limit`."""
    return max(1, math.ceil(math.log2(max(2.0, (limit + width_bound) / step))) + 1)


def one_sided(kind: StreamKind) -> bool:
    """Both noise terms of `kind` are one-sided (exp3): a NO bounds every score by
    the threshold plus γ alone."""
    m = noise_model(kind)
    return m.threshold_family == "geometric" and m.query_family == "geometric"


# --------------------------------------------------------------------------- practical


def plan_practical(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float,
    size: int,
    width: float,
    *,
    options: PracticalOptions | None = None,
) -> PracticalPlan:
    """The practical variant's plan from public parameters and `oracle.accuracy` only.

    kind="auto" picks, among `PRACTICAL_KINDS`, the kind with the smallest α for
    a chunk of |P| queries on the fine budget (`exp3`, one-sided noise, whenever
    we looked: see `accuracy`).  Coarse rounds default to T = max(1, ⌈log2 W⌉)
    as in Algorithm 8.  The step s defaults to max(1, ⌊1.5·c/ε_f⌋) score units,
    c the kind's query-noise coefficient (`PRACTICAL_STEP_SCALE` noise scales).
    """
    opts = options if options is not None else PracticalOptions()
    eps = Epsilon.parse(epsilon).value
    beta = check_beta(beta)
    frac = Fraction(opts.coarse_fraction)
    if not 0 < frac < 1:
        raise ValueError(f"coarse_fraction must be in (0, 1), got {opts.coarse_fraction}")
    eps_c = eps * frac
    eps_f = eps - eps_c
    k_kind = stream_kind(oracle, opts.kind, eps_f, size, beta / 2)
    t_max = opts.rounds if opts.rounds is not None else default_rounds(width)
    budgets = gbs_budgets(eps_c, t_max, opts.ratio)
    alphas = [float(oracle.accuracy(k_kind, e, size, beta / 2 / t_max)) for e in budgets]
    wb = coarse_width_bound(width, alphas)
    s = scan_step(k_kind, eps_f, opts.step, PRACTICAL_STEP_SCALE)
    levels, a_f = dense_fixpoint(
        wb, s, lambda n_levels: float(oracle.accuracy(k_kind, eps_f, size * n_levels, beta / 2))
    )
    return PracticalPlan(
        kind=k_kind,
        epsilon=eps,
        beta=beta,
        size=size,
        width=float(width),
        ratio=Fraction(opts.ratio),
        coarse_rounds=t_max,
        coarse_epsilon=eps_c,
        coarse_alphas=tuple(alphas),
        width_bound=wb,
        fine_epsilon=eps_f,
        fine_alpha=a_f,
        step=s,
        max_levels=levels,
    )


# --------------------------------------------------------------------------- scan


@dataclass(frozen=True)
class _Coarse:
    """The scan plan's binary search for T rounds: budgets, the up and lo bounds of
    each round, and the width it leaves at most."""

    budgets: list[Fraction]
    up: list[float]
    lo: list[float]
    width_bound: float


def plan_scan(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
    beta: float,
    size: int,
    width: float,
    *,
    k: int = 1,
    options: ScanOptions | None = None,
) -> ScanPlan:
    """The scan selection's plan for k ranks from public parameters and
    `oracle.accuracy` only.

    kind="auto": the kind (of exp3, lap3, lap24) with the smallest α for a chunk of
    |P| queries on the fine budget.  Coarse rounds: unless given, the T ≤ ⌈log2 W⌉
    that minimises T + (coarse width bound)/s, the plan's proxy for comparisons
    per candidate.  Step s: max(1, ⌊1.5·c/ε_f⌋) (`SCAN_STEP_SCALE` noise scales).
    """
    opts = options if options is not None else ScanOptions()
    eps = Epsilon.parse(epsilon).value
    beta = check_beta(beta)
    frac = as_fraction(opts.coarse_fraction, "coarse_fraction")
    mid = as_fraction(opts.mid_fraction, "mid")
    if not 0 < frac < 1 or not 0 <= mid < 1 - frac:
        raise ValueError(
            f"need 0 < coarse_fraction < 1 and 0 <= mid_fraction < 1 − coarse_fraction, "
            f"got {opts.coarse_fraction}, {opts.mid_fraction}"
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
    k_kind = stream_kind(oracle, opts.kind, eps_f, size, beta_f)
    s = scan_step(k_kind, eps_f, opts.step, SCAN_STEP_SCALE)
    sided = one_sided(k_kind)

    def coarse(t_max: int) -> _Coarse:
        budgets = gbs_budgets(eps_c, t_max, opts.ratio)
        # A round relies on its lower and (one-sided kinds) its separate upper
        # bound: each at half the round's failure probability, so the round's is b_t.
        b_t = beta_c / t_max
        b_each = b_t / 2 if sided else b_t
        lo = [float(oracle.accuracy(k_kind, e, size, b_each)) for e in budgets]
        up = [float(oracle.accuracy(k_kind, e, 1, b_each)) for e in budgets] if sided else lo
        return _Coarse(budgets, up, lo, coarse_width_bound(width, lo, up))

    s_m = scan_step(k_kind, eps_m, None, SCAN_STEP_SCALE) if mid else 0
    t_cap = default_rounds(width)
    if opts.rounds is not None:
        if opts.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {opts.rounds}")
        t_best = opts.rounds
    else:
        # comparisons per candidate the coarse width costs the next stage's scan
        t_best = min(range(1, t_cap + 1), key=lambda t: t + coarse(t).width_bound / (s_m or s))
    c = coarse(t_best)
    wb = c.width_bound
    limit = 4 * oracle.n
    m_up = m_lo = 0.0
    m_dense = m_tail = 0
    if mid:
        m_tail = tail_levels(limit, wb, s_m)
        # the stage's β/4, split between its two bounds for one-sided kinds
        b_m = beta / 8 if sided else beta / 4
        m_dense, m_lo = dense_fixpoint(
            wb,
            s_m,
            lambda dense: float(oracle.accuracy(k_kind, eps_m, size * (dense + m_tail), b_m)),
        )
        m_up = float(oracle.accuracy(k_kind, eps_m, 1, b_m)) if sided else m_lo
        # the fine stage scans from the middle YES's last NO level + its up-bound down
        # to the YES level − its lo-bound
        wb = min(wb, s_m + m_up + m_lo + 2 * ROUNDING_SLACK)
    tail = tail_levels(limit, wb, s)
    rank_levels = rank_schedule_length(width, s, limit) if k > 1 else 0
    dense, a_f = dense_fixpoint(
        wb,
        s,
        lambda n_dense: float(
            oracle.accuracy(k_kind, eps_f, size * max(n_dense + tail, rank_levels), beta_f)
        ),
    )
    return ScanPlan(
        kind=k_kind,
        epsilon=eps,
        beta=beta,
        size=size,
        width=float(width),
        coarse_fraction=frac,
        ratio=Fraction(opts.ratio),
        coarse_rounds=t_best,
        coarse_budgets=tuple(c.budgets),
        coarse_up=tuple(c.up),
        coarse_lo=tuple(c.lo),
        width_bound=wb,
        streams=k,
        fine_epsilon=eps_f,
        fine_alpha=a_f,
        step=s,
        dense_levels=dense,
        tail_levels=tail,
        rank_levels=rank_levels,
        mid_epsilon=eps_m,
        mid_step=s_m,
        mid_up=m_up,
        mid_lo=m_lo,
        mid_dense=m_dense,
        mid_tail=m_tail,
    )


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
    epsilon: Epsilon | Number | str,
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
    eps = Epsilon.parse(epsilon).value
    beta = check_beta(beta)
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
        variant=variant,
        n=n,
        d=d,
        epsilon=eps,
        beta=beta,
        n_rounds=n_rounds,
        beta_prime=beta_p,
        alpha=alpha,
        cutoff=cutoff,
        phases=tuple(phases),
        final_rounds=final_rounds,
        final_epsilon=final_eps,
    )


def plan_for(
    oracle: Oracle,
    epsilon: Epsilon | Number | str,
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
