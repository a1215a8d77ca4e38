"""Applications of SVT selection (paper §7): F_p losses, top-k heavy hitters,
sparse mean estimation and MWEM, each using only an `Oracle` holding the sums of
the per-user vectors that `svtagg.client.embeddings` defines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.analyst.oracle import Oracle, PlannedOracle, adaptive_groups, planned
from svtagg.analyst.selection import (
    Candidates,
    PracticalOptions,
    RankProgress,
    ScanOptions,
    SearchSpace,
    SelectionResult,
    Spend,
    Variant,
    geometric_binary_search,
    practical_selection,
    sampling_and_filtering,
    scan_selection,
    scan_top_k,
    sum_estimation,
    variant_of,
)
from svtagg.client.embeddings import (  # noqa: F401 - the embeddings each application reads
    EMBEDDINGS,
    fp_loss_embedding,
    heavy_hitters_embedding,
    marginal_pairs,
    marginal_values,
    marginals_embedding,
    sparse_mean_clip,
    sparse_mean_embedding,
)
from svtagg.dp.accounting import advanced_composition_step
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Epsilon, Number, Query

Array = npt.NDArray[np.float64]

# =========================================================================== F_p / L_p


@dataclass(frozen=True)
class FpResult:
    """Chosen candidate for the smallest F_p loss, and the error translation."""

    index: int
    fp_error_bound: float  # additive, in F_p score units (sums of |v|^p/b^p)
    lp_error_bound: float  # b·(fp_error_bound)^(1/p) in L_p units
    selection: SelectionResult


def lp_error(fp_error: float, p: float, bound: float) -> float:
    """Additive error a on Σ|v|^p/b^p ⇒ error b·a^(1/p) on the L_p loss (‖·‖_p is 1/p-Hölder)."""
    return bound * max(fp_error, 0.0) ** (1.0 / p)


def fp_selection(
    oracle: Oracle,
    p: float,
    bound: float,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    minimize: bool = True,
    kind: StreamKind | str | None = None,
    variant: Variant | str = Variant.SCAN,
) -> FpResult:
    """Select the candidate with the smallest (or largest) F_p loss.

    The oracle holds sums of `fp_loss_embedding`.  Minimising the loss is
    maximising its complement n − s_j, so candidates are `Query(j, complement=True)`.
    variant="scan" (default): `scan_selection` (kind default "auto");
    variant="paper": Algorithm 8 as written (kind default lap24).
    """
    variant = variant_of(variant, Variant.PAPER, Variant.SCAN)
    space = SearchSpace(Candidates.of([Query(j, complement=minimize) for j in range(oracle.d)]))
    if variant == Variant.SCAN:
        options = ScanOptions(kind=kind or "auto")
        sel = scan_selection(oracle, epsilon, beta, space=space, options=options)
    else:
        sel = geometric_binary_search(
            oracle, epsilon, beta, space=space, kind=kind or StreamKind.LAP24
        )
    err = sel.upper - sel.lower
    return FpResult(sel.index, err, lp_error(err, p, bound), sel)


# =========================================================================== top-k


@dataclass(frozen=True)
class TopKResult:
    indices: list[int]
    spend: Spend
    planned_epsilon: Fraction


@dataclass(frozen=True)
class TopKOptions:
    """How `top_k_heavy_hitters` selects.

    variant: "scan" (default), "practical", "paper" or "tuned".  kind: the stream
    kind (default "auto" for scan and practical, lap24 for Algorithm 9).  rng:
    feeds Algorithm 9's samples only.  beta (scan only): the failure probability,
    default min(1/d, 0.1).  coarse_fraction, mid_fraction (scan only): the
    localisation's ε shares (default `ScanOptions`'s).
    """

    variant: Variant | str = Variant.SCAN
    kind: StreamKind | str | None = None
    rng: np.random.Generator | int | None = None
    beta: float | None = None
    coarse_fraction: Number | str | None = None
    mid_fraction: Number | str | None = None

    def scan_options(self) -> ScanOptions:
        """The scan variant's `ScanOptions`: kind default "auto", shares as given."""
        options = ScanOptions(kind=self.kind or "auto")
        if self.coarse_fraction is not None:
            options = replace(options, coarse_fraction=self.coarse_fraction)
        if self.mid_fraction is not None:
            options = replace(options, mid_fraction=self.mid_fraction)
        return options


def top_k_heavy_hitters(
    oracle: Oracle,
    k: int,
    epsilon: Epsilon | Number | str,
    *,
    options: TopKOptions | None = None,
    progress: RankProgress | None = None,
) -> TopKResult:
    """Theorem 7.1: k rounds of selection with budget ε/k each (failure 1/d for
    Algorithm 9, min(1/d, 0.1) for the practical variant), removing the chosen
    categories.  Error O(log(d)·k/ε)-ish per item, with no
    dependence on the sparsity r (each coordinate has sensitivity 1).

    variant="paper" / "tuned" (`TopKOptions`): each round is Algorithm 9 (as
    written / tuned), kind default lap24.  variant="practical": each round is
    `selection.practical_selection` on [0, n] (coarse Algorithm 8 + one fine
    descending-scan stream), kind default "auto" (the kind with the smallest α).
    Either way: k·(ε/k) = ε by basic composition, every budget fixed up front.

    variant="scan" (the default): `selection.scan_top_k` — one coarse
    localisation for all ranks and one deciding stream per rank that continues
    from the previous rank's level (docs/algorithms.md §1), failure β (default
    min(1/d, 0.1)); budget ε_c + k·ε_f = ε; `coarse_fraction` / `mid_fraction`
    are its localisation shares.  `progress(rank done, k, queries answered so
    far)` is called after each rank.
    """
    opts = options if options is not None else TopKOptions()
    eps = Epsilon.parse(epsilon)
    variant = variant_of(
        opts.variant, Variant.PAPER, Variant.TUNED, Variant.PRACTICAL, Variant.SCAN
    )
    if not 1 <= k <= oracle.d:
        raise ValueError(f"k must be in [1, d], got {k}")
    if variant == Variant.SCAN:
        fail = opts.beta if opts.beta is not None else min(1.0 / oracle.d, 0.1)
        top = scan_top_k(oracle, k, eps, fail, options=opts.scan_options(), progress=progress)
        return TopKResult(top.indices, top.spend, top.planned_epsilon)
    rng = opts.rng
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    d = oracle.d
    remaining = list(range(d))
    chosen: list[int] = []
    spend = Spend()
    planned = Fraction(0)
    for _ in range(k):
        cands = Candidates.of([Query(j) for j in remaining])
        if variant == Variant.PRACTICAL:
            res = practical_selection(
                oracle,
                eps.split(k),
                min(1.0 / d, 0.1),
                space=SearchSpace(cands),
                options=PracticalOptions(kind=opts.kind or "auto"),
            )
        else:
            res = sampling_and_filtering(
                oracle,
                eps.split(k),
                1.0 / d,
                candidates=cands,
                variant=variant,
                rng=gen,
                kind=opts.kind or StreamKind.LAP24,
            )
        chosen.append(remaining.pop(res.index))
        spend.add(res.spend)
        planned += res.planned_epsilon
        if progress is not None:  # (rank done, k, queries answered so far)
            progress(len(chosen), k, spend.queries)
    return TopKResult(chosen, spend, planned)


# =========================================================================== sparse mean


@dataclass(frozen=True)
class SparseMeanResult:
    mean: Array  # μ̂, zero off the selected support
    support: list[int]
    spend: Spend
    planned_epsilon: Fraction


def sparse_mean(
    oracle: Oracle,
    k: int,
    epsilon: Epsilon | Number | str,
    beta: float,
    clip: float,
    *,
    variant: Variant | str = Variant.SCAN,
    rng: np.random.Generator | int | None = None,
    kind: StreamKind | str = StreamKind.LAP24,
) -> SparseMeanResult:
    """Theorem 7.2: the oracle holds sums of `sparse_mean_embedding(x, clip)`.

    k rounds of Algorithm 9 over the 2d scores f_{j,σ} (σ = −1 as complement
    queries) with budget ε/(2k) and failure min(β/(4k), 1/(2d)), removing both
    scores of a chosen coordinate; then Corollary 6.8 on g_j with ε/(2k),
    β/(4k), and μ̂_j = B(2ĝ_j − n)/n.  ε-DP by basic composition.
    variant="scan" (default): the k picks are `scan_top_k` at ε/2 in total (one
    localisation, one deciding stream of ε/(2k)·(share) per pick, kind "auto",
    failure as above), a pick removing both signs of its coordinate;
    "paper" / "tuned": k rounds of Algorithm 9 with `kind`.
    """
    eps = Epsilon.parse(epsilon)
    variant = variant_of(variant, Variant.PAPER, Variant.TUNED, Variant.SCAN)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    n, d = oracle.n, oracle.d
    step = eps.split(2 * k)
    fail = min(beta / (4 * k), 1.0 / (2 * d))
    support: list[int] = []
    spend = Spend()
    planned = Fraction(0)
    if variant == Variant.SCAN:
        # one localisation for the k picks, one deciding stream each (k·ε/(2k) = ε/2);
        # a pick removes both signs of its coordinate
        queries = [Query(j, c) for j in range(d) for c in (False, True)]
        signs = Candidates.of(queries, groups=[j for j in range(d) for _ in (False, True)])
        top = scan_top_k(oracle, k, eps.split(2), k * fail, space=SearchSpace(signs))
        support = [queries[p].index for p in top.indices]
        spend.add(top.spend)
        planned += top.planned_epsilon
    remaining = list(range(d))
    for _ in range(k if variant != Variant.SCAN else 0):
        queries = [Query(j, c) for j in remaining for c in (False, True)]
        res = sampling_and_filtering(
            oracle,
            step,
            fail,
            candidates=Candidates.of(queries),
            variant=variant,
            rng=gen,
            kind=kind,
        )
        j = res.query.index
        support.append(j)
        remaining.remove(j)
        spend.add(res.spend)
        planned += res.planned_epsilon
    mean = np.zeros(d)
    for j in support:
        est = sum_estimation(oracle, Query(j), step, beta / (4 * k), kind=kind)
        mean[j] = clip * (2 * est.estimate - n) / n
        spend.add(est.spend)
        planned += est.planned_epsilon
    return SparseMeanResult(mean, support, spend, planned)


# =========================================================================== MWEM

#: (binary-search share, middle-stage share) of MWEM's scan selection step: the cheap
#: end (measured, docs/algorithms.md: same max error as ε/8 + ε/16 at T = 8 and 32,
#: n = 10⁶, with 40–60% of the comparisons).
MWEM_SCAN_SHARES: tuple[Fraction, Fraction] = (Fraction(1, 2), Fraction(0))


@dataclass(frozen=True)
class MarginalWorkload:
    """Two-way marginals over `attributes` binary attributes: domain {0,1}^a, the
    query matrix q(x) for every x in the domain, and the pair order of coordinates."""

    attributes: int
    domain: npt.NDArray[np.int8]  # |D| × a
    matrix: Array  # |Q| × |D|

    @classmethod
    def build(cls, attributes: int) -> MarginalWorkload:
        size = 2**attributes
        dom = ((np.arange(size)[:, None] >> np.arange(attributes)[None, :]) & 1).astype(np.int8)
        return cls(attributes, dom, marginal_values(dom).T.copy())

    def histogram(self, x: npt.ArrayLike) -> Array:
        """Counts of records per domain element (for the truth and central baselines)."""
        xb = np.asarray(x).astype(np.int64)
        codes = (xb << np.arange(self.attributes)[None, :]).sum(axis=1)
        return np.bincount(codes, minlength=2**self.attributes).astype(np.float64)

    def answers(self, hist: Array) -> Array:
        """q(A) = Σ_x q(x)·A(x) for every query."""
        return self.matrix @ hist


@dataclass(frozen=True)
class MwemResult:
    synthetic: Array  # Ā = (1/T) Σ_t A_t over the domain, total mass n
    chosen: list[int]
    rounds: int
    step_epsilon: Fraction
    spend: Spend
    planned_epsilon: Fraction


def mwem_rounds(n: int, epsilon: float, domain_size: int, queries: int, beta: float) -> int:
    """T = min(n, ⌈(nε)^(2/3)(ln|D|)^(1/3) L^(−2/3)⌉), L = ln(2n|Q|/β) (Theorem 7.7)."""
    big_l = math.log(2 * n * queries / beta)
    t = math.ceil((n * epsilon) ** (2 / 3) * math.log(domain_size) ** (1 / 3) * big_l ** (-2 / 3))
    return max(1, min(n, t))


def mwem_step_epsilon(epsilon: Epsilon | Number | str, rounds: int, delta: float = 0.0) -> Fraction:
    """Budget of each of the 2T steps: ε/(2T) (Theorem 7.7, basic composition), or with
    δ > 0 the largest ε0 whose 2T-fold advanced composition is (ε, δ) (Theorem 7.8)."""
    eps = Epsilon.parse(epsilon)
    if delta <= 0:
        return eps.split(2 * rounds).value
    return advanced_composition_step(eps, delta, 2 * rounds)


def mwem_loop(
    n: int,
    workload: MarginalWorkload,
    rounds: int,
    select: Callable[[Array, int], int],
    measure: Callable[[int, int], float],
) -> tuple[Array, list[int]]:
    """Algorithm 10's multiplicative-weights skeleton, shared by the SVT and central
    versions: `select(q(A_{t−1}), t)` picks a query, `measure(q, t)` estimates q(B)."""
    size = workload.matrix.shape[1]
    hist = np.full(size, n / size)
    total = np.zeros(size)
    chosen: list[int] = []
    for t in range(1, rounds + 1):
        qa = workload.answers(hist)
        q = select(qa, t)
        m_t = measure(q, t)
        chosen.append(q)
        # log-space update keeps large (m_t − q(A)) from overflowing
        logw = np.log(hist) + workload.matrix[q] * (m_t - qa[q]) / (2 * n)
        w = np.exp(logw - logw.max())
        hist = n * w / w.sum()
        total += hist
    return total / rounds, chosen


def mwem_svt(
    oracle: Oracle,
    workload: MarginalWorkload,
    epsilon: Epsilon | Number | str,
    beta: float,
    *,
    rounds: int | None = None,
    delta: float = 0.0,
    kind: StreamKind | str | None = None,
    variant: Variant | str = Variant.SCAN,
) -> MwemResult:
    """MWEM in the SVT model (Algorithm 10; Theorem 7.7, or 7.8 when δ > 0).

    The oracle holds sums of `marginals_embedding` (coordinate q is Σ(1+q(x))/2).
    Selection: Algorithm 8 over the 2|Q| candidates (q, σ) — σ = −1 as the
    complement — with public offsets w = (n − σ·q(A_{t−1}))/2, so the shifted score
    is n + σ(q(B) − q(A))/2 ∈ [0, 2n]; range [0, 2n], ⌈log2(2n)⌉ rounds, failure
    β/(2T).  Measurement: Corollary 6.8 on coordinate q, m_t = 2ĝ − n.  Each of
    the 2T steps gets `mwem_step_epsilon(ε, T, δ)`.
    variant="scan" (default): the selection step is `scan_selection` on the same
    candidates, offsets and range (kind default "auto"); "paper": Algorithm 8
    (kind default lap24).  The measurement is Corollary 6.8 either way (lap24
    unless `kind` says otherwise).
    """
    variant = variant_of(variant, Variant.PAPER, Variant.SCAN)
    n = oracle.n
    nq = workload.matrix.shape[0]
    if oracle.d != nq:
        raise ValueError(f"oracle has {oracle.d} coordinates, workload {nq} queries")
    eps = Epsilon.parse(epsilon)
    t_rounds = (
        rounds
        if rounds is not None
        else mwem_rounds(n, float(eps.value), workload.matrix.shape[1], nq, beta)
    )
    step = Epsilon(mwem_step_epsilon(eps, t_rounds, delta))
    # The plan, fixed before any data is touched: 2T steps of ε0 each, charged by
    # the cheapest composition the servers accept (zCDP when δ > 0).
    groups = adaptive_groups(oracle, [step.value] * (2 * t_rounds))
    with planned(oracle, groups, Fraction(str(delta)) if delta > 0 else 0) as plan_oracle:
        steps = _MwemSteps(plan_oracle, workload, step, beta / (2 * t_rounds), kind, variant)
        synth, chosen = mwem_loop(n, workload, t_rounds, steps.select, steps.measure)
    return MwemResult(synth, chosen, t_rounds, step.value, steps.spend, 2 * t_rounds * step.value)


@dataclass
class _MwemSteps:
    """MWEM's 2T steps on a planned oracle: step 2(t−1) selects, 2t − 1 measures,
    each with budget `step` and failure probability `fail`; `spend` adds them up."""

    oracle: PlannedOracle
    workload: MarginalWorkload
    step: Epsilon
    fail: float
    kind: StreamKind | str | None
    variant: Variant
    spend: Spend = field(default_factory=Spend)

    def select(self, qa: Array, t: int) -> int:
        oracle, n = self.oracle, self.oracle.n
        nq = self.workload.matrix.shape[0]
        oracle.group = 2 * (t - 1)
        queries = [Query(q, c) for q in range(nq) for c in (False, True)]
        offsets = [(n - (-1 if c else 1) * qa[q]) / 2 for q in range(nq) for c in (False, True)]
        space = SearchSpace(Candidates.of(queries, offsets), interval=(0.0, 2.0 * n))
        if self.variant == Variant.SCAN:
            options = ScanOptions(
                kind=self.kind or "auto",
                coarse_fraction=MWEM_SCAN_SHARES[0],
                mid_fraction=MWEM_SCAN_SHARES[1],
            )
            res = scan_selection(oracle, self.step, self.fail, space=space, options=options)
        else:
            res = geometric_binary_search(
                oracle,
                self.step,
                self.fail,
                space=space,
                rounds=math.ceil(math.log2(2 * n)),
                kind=self.kind or StreamKind.LAP24,
            )
        self.spend.add(res.spend)
        return res.query.index

    def measure(self, q: int, t: int) -> float:
        self.oracle.group = 2 * t - 1
        kind = self.kind or StreamKind.LAP24
        est = sum_estimation(self.oracle, Query(q), self.step, self.fail, kind=kind)
        self.spend.add(est.spend)
        return 2 * est.estimate - self.oracle.n


def max_query_error(workload: MarginalWorkload, truth_hist: Array, synthetic: Array) -> float:
    """max_q |q(B) − q(Ā)|, in counts."""
    return float(np.max(np.abs(workload.answers(truth_hist) - workload.answers(synthetic))))
