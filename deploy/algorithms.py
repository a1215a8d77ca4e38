"""What `svtagg analyst run` runs: the registry of algorithms, each with its name,
its typed options (read from the command line's flags and checked) and its runner.

`RunFlags` are the flags as given.  `prepare` checks every one of them against the
oracle before any budget is reserved, parsing ε once into an `Epsilon`, and
returns the algorithm and its `Run`; `run_algorithm` then runs it inside one plan
of ε (MWEM reserves its own plan of 2T steps) and returns a JSON-ready summary.
The task's data must have been uploaded with the embedding the algorithm reads
(`svtagg client upload --embedding fp_loss | sparse_mean | marginals`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any, Generic, TypeVar

from svtagg.analyst import applications
from svtagg.analyst.applications import TopKOptions
from svtagg.analyst.oracle import Oracle, adaptive_groups, planned
from svtagg.analyst.selection import (
    ScanOptions,
    SelectionResult,
    binary_search,
    check_candidates,
    geometric_binary_search,
    linear_scan,
    noisy_max_selection,
    sampling_and_filtering,
    scan_selection,
    sum_estimation,
)
from svtagg.dp.jointsvt import INDEPENDENT, JOINT, JOINT_SVT_KINDS
from svtagg.dp.kinds import ABOVE_THRESHOLD_KINDS, StreamKind
from svtagg.dp.queries import MAX_CHUNK, Epsilon, Number, Query

#: A run's JSON-ready summary.
Summary = dict[str, Any]
#: (ranks chosen so far, k, queries answered so far), after each rank of top-k.
Progress = Callable[[int, int, int], None]
#: Stream kinds every `run` algorithm accepts: the AboveThreshold kinds (no run
#: algorithm opens a CompareToThresholds stream).
RUN_KINDS = tuple(k.value for k in StreamKind if k in ABOVE_THRESHOLD_KINDS)


@dataclass(frozen=True)
class RunFlags:
    """The flags of one run as given (`svtagg analyst run`, the demo, the
    simulation), before any check; the defaults are the command line's."""

    algorithm: str = "top-k"
    epsilon: Number | str = "1"
    beta: float = 0.05
    #: top-k and sparse-mean: how many (None: DEFAULT_K); refused elsewhere.
    k: int | None = None
    index: int | None = None
    kind: str | None = None
    seed: int | None = None
    shares: str | None = None
    p: float = 2.0
    bound: float = 1.0
    clip: float | None = None
    attributes: int | None = None
    rounds: int | None = None
    delta: float = 0.0
    #: top-k: ε for each selected item's count with an interval (Corollary
    #: 6.8's binary-search sum, ε/k each), charged in the same plan (None: none).
    counts: Number | str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunFlags:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


O = TypeVar("O")


@dataclass(frozen=True)
class Run(Generic[O]):
    """One run with every flag checked: what a runner gets.  `kind` None means
    the algorithm's own default."""

    oracle: Oracle
    epsilon: Epsilon
    beta: float
    kind: str | None
    options: O
    progress: Progress | None = None


@dataclass(frozen=True)
class Algorithm(Generic[O]):
    """One algorithm `svtagg analyst run` offers.

    `options` reads (and checks) its typed options from the flags; `run` runs it.
    `auto_kind`: --kind auto lets the selection pick the kind.  `shares`: it takes
    --shares.  `needs_index`: it needs --index (and no other algorithm takes it).
    `own_plan`: it reserves its own budget plan instead of one plan of ε.
    `kinds`: it opens AboveThreshold streams, so --kind applies (noisy-max
    opens its own kind, nmax, and takes no --kind).
    """

    name: str
    options: Callable[[RunFlags, Oracle], O]
    run: Callable[[Run[O]], Summary]
    auto_kind: bool = False
    shares: bool = False
    needs_index: bool = False
    own_plan: bool = False
    kinds: bool = True
    #: It takes --k (top-k, sparse-mean; noisy-max checks its own).
    takes_k: bool = False


# --------------------------------------------------------------------------- options


#: top-k's and sparse-mean's k when none is given.
DEFAULT_K = 10


def _check_k(k: int | None, oracle: Oracle) -> int:
    k = DEFAULT_K if k is None else k
    if not 1 <= k <= oracle.d:
        raise ValueError(f"--k must be in [1, {oracle.d}], got {k}")
    return k


@dataclass(frozen=True)
class NoOptions:
    """The paper's selections take nothing beyond ε, β and the kind."""

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> NoOptions:
        return cls()


@dataclass(frozen=True)
class Shares:
    """--shares SEARCH,MIDDLE: the ε shares of the scan's localisation, as given
    (the plan checks them; a missing MIDDLE is 0)."""

    search: str
    middle: str

    @classmethod
    def parse(cls, text: str | None) -> Shares | None:
        if not text:
            return None
        search, _, middle = text.partition(",")
        return cls(search.strip(), middle.strip() or "0")


def _scan_options(kind: str | None, shares: Shares | None) -> ScanOptions:
    """`ScanOptions` from --kind (default auto) and --shares (default the plan's)."""
    options = ScanOptions(kind=kind or "auto")
    if shares is None:
        return options
    return replace(options, coarse_fraction=shares.search, mid_fraction=shares.middle)


@dataclass(frozen=True)
class ScanJob:
    """scan: the localisation's shares."""

    shares: Shares | None

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> ScanJob:
        return cls(Shares.parse(flags.shares))


@dataclass(frozen=True)
class TopKJob:
    """top-k: how many, the seed, the localisation's shares, and the ε of the
    selected items' counts (None: ids only)."""

    k: int
    seed: int | None
    shares: Shares | None
    counts: Epsilon | None = None

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> TopKJob:
        counts = None
        if flags.counts is not None:
            counts = Epsilon.parse(flags.counts)
            k = _check_k(flags.k, oracle)
            floor = getattr(oracle, "epsilon_min", None) or Fraction(0)
            if counts.value / k < floor:
                raise ValueError(
                    f"--counts {counts.value} gives each of the {k} counts ε "
                    f"{counts.value / k}, below the task's epsilon_min={floor}"
                )
        return cls(_check_k(flags.k, oracle), flags.seed, Shares.parse(flags.shares), counts)

    @property
    def extra_epsilon(self) -> Fraction:
        """What the run spends beyond its selection's ε."""
        return self.counts.value if self.counts is not None else Fraction(0)


@dataclass(frozen=True)
class SamplingJob:
    """sf (Algorithm 9): the seed of its samples."""

    seed: int | None

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> SamplingJob:
        return cls(flags.seed)


@dataclass(frozen=True)
class SumJob:
    """sum: the coordinate (checked by `check_run_options`)."""

    index: int

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> SumJob:
        return cls(flags.index or 0)


@dataclass(frozen=True)
class FpJob:
    """fp: the loss exponent p and the residual bound b."""

    p: float
    bound: float

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> FpJob:
        return cls(float(flags.p), float(flags.bound))


@dataclass(frozen=True)
class SparseMeanJob:
    """sparse-mean: how many coordinates, the seed, and the clients' clip B (None:
    from n, d and β, as `sparse_mean_clip`)."""

    k: int
    seed: int | None
    clip: float | None

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> SparseMeanJob:
        return cls(_check_k(flags.k, oracle), flags.seed, flags.clip)


@dataclass(frozen=True)
class NoisyMaxJob:
    """noisy-max: every coordinate is a candidate (d ≤ MAX_TOURNAMENT, in chunks
    of MAX_CHUNK: one tournament, one ε)."""

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> NoisyMaxJob:
        if flags.k not in (None, 1):
            raise ValueError(
                f"noisy-max selects one index, not --k {flags.k}: for the k largest use "
                "--algorithm top-k (nothing was reserved)"
            )
        check_candidates(oracle.d)
        return cls()


@dataclass(frozen=True)
class MwemJob:
    """mwem: the binary attributes (the task's d is their pair count), T (None:
    Theorem 7.7's) and δ (> 0: advanced composition, Theorem 7.8)."""

    attributes: int
    rounds: int | None
    delta: float

    @classmethod
    def from_flags(cls, flags: RunFlags, oracle: Oracle) -> MwemJob:
        if flags.attributes is None:
            raise ValueError("mwem needs --attributes (the task's d must be their pair count)")
        return cls(int(flags.attributes), flags.rounds, float(flags.delta))


# --------------------------------------------------------------------------- runners


def _selected(sel: SelectionResult) -> Summary:
    return {"selected": sel.query.index, "lower": sel.lower, "upper": sel.upper}


def _run_top_k(run: Run[TopKJob]) -> Summary:
    job, shares = run.options, run.options.shares
    options = TopKOptions(
        kind=run.kind,
        rng=job.seed,
        coarse_fraction=shares.search if shares is not None else None,
        mid_fraction=shares.middle if shares is not None else None,
    )
    res = applications.top_k_heavy_hitters(
        run.oracle, job.k, run.epsilon, options=options, progress=run.progress
    )
    out: Summary = {"selected": res.indices}
    if job.counts is not None and res.indices:
        # Each count ε/k, β/k: the k intervals hold together w.p. ≥ 1 − β.
        each, beta = job.counts.value / len(res.indices), run.beta / len(res.indices)
        counts = []
        for j in res.indices:
            est = sum_estimation(run.oracle, Query(int(j)), each, beta, kind=StreamKind.LAP24)
            counts.append(
                {"index": int(j), "estimate": est.estimate, "lower": est.lower,
                 "upper": est.upper, "epsilon": str(each)}
            )  # fmt: skip
        out |= {"counts": counts, "counts_epsilon": str(job.counts.value)}
    return out


def _run_scan(run: Run[ScanJob]) -> Summary:
    options = _scan_options(run.kind, run.options.shares)
    return _selected(scan_selection(run.oracle, run.epsilon, run.beta, options=options))


def _run_gbs(run: Run[NoOptions]) -> Summary:
    return _selected(geometric_binary_search(run.oracle, run.epsilon, run.beta, kind=run.kind))


def _run_sf(run: Run[SamplingJob]) -> Summary:
    # Algorithm 9 needs β ≤ 1/d
    beta = min(run.beta, 1.0 / run.oracle.d)
    kind = run.kind or StreamKind.LAP24
    sel = sampling_and_filtering(run.oracle, run.epsilon, beta, rng=run.options.seed, kind=kind)
    return _selected(sel)


def _run_binary_search(run: Run[NoOptions]) -> Summary:
    kind = run.kind or StreamKind.LAP24
    return _selected(binary_search(run.oracle, run.epsilon, run.beta, kind=kind))


def _run_linear_scan(run: Run[NoOptions]) -> Summary:
    kind = run.kind or StreamKind.LAP24
    return _selected(linear_scan(run.oracle, run.epsilon, run.beta, kind=kind))


def _run_sum(run: Run[SumJob]) -> Summary:
    index = run.options.index
    kind = run.kind or StreamKind.LAP24
    est = sum_estimation(run.oracle, Query(index), run.epsilon, run.beta, kind=kind)
    return {"index": index, "estimate": est.estimate, "lower": est.lower, "upper": est.upper}


def _run_fp(run: Run[FpJob]) -> Summary:
    job = run.options
    fp = applications.fp_selection(
        run.oracle, job.p, job.bound, run.epsilon, run.beta, kind=run.kind
    )
    return {
        "selected": fp.index,
        "fp_error_bound": fp.fp_error_bound,
        "lp_error_bound": fp.lp_error_bound,
    }


def _run_sparse_mean(run: Run[SparseMeanJob]) -> Summary:
    job, oracle = run.options, run.oracle
    clip = job.clip
    if clip is None:
        clip = applications.sparse_mean_clip(oracle.n, oracle.d, run.beta)
    kind = run.kind or StreamKind.LAP24
    sm = applications.sparse_mean(
        oracle, job.k, run.epsilon, run.beta, float(clip), rng=job.seed, kind=kind
    )
    return {
        "support": sm.support,
        "mean": {j: float(sm.mean[j]) for j in sm.support},
        "clip": float(clip),
    }


def _run_noisy_max(run: Run[NoisyMaxJob]) -> Summary:
    report = run.progress

    def sent(done: int, total: int) -> None:  # (chunks done, chunks, candidates sent)
        if report is not None:
            report(-(-done // MAX_CHUNK), -(-total // MAX_CHUNK), done)

    res = noisy_max_selection(run.oracle, run.epsilon, run.beta, progress=sent)
    return {"selected": res.query.index, "alpha": res.alpha}


def _run_mwem(run: Run[MwemJob]) -> Summary:
    job = run.options
    workload = applications.MarginalWorkload.build(job.attributes)
    mw = applications.mwem_svt(
        run.oracle,
        workload,
        run.epsilon,
        run.beta,
        rounds=job.rounds,
        delta=job.delta,
        kind=run.kind,
    )
    return {
        "rounds": mw.rounds,
        "chosen_queries": [int(q) for q in mw.chosen],
        "synthetic_histogram": [float(v) for v in mw.synthetic],
    }


#: Every algorithm `svtagg analyst run --algorithm` offers, in the order --help lists them.
ALGORITHMS: dict[str, Algorithm[Any]] = {
    a.name: a
    for a in (
        Algorithm(
            "top-k", TopKJob.from_flags, _run_top_k, auto_kind=True, shares=True, takes_k=True
        ),
        Algorithm("scan", ScanJob.from_flags, _run_scan, auto_kind=True, shares=True),
        Algorithm("gbs", NoOptions.from_flags, _run_gbs),
        Algorithm("sf", SamplingJob.from_flags, _run_sf),
        Algorithm("binary-search", NoOptions.from_flags, _run_binary_search),
        Algorithm("linear-scan", NoOptions.from_flags, _run_linear_scan),
        Algorithm("noisy-max", NoisyMaxJob.from_flags, _run_noisy_max, kinds=False),
        Algorithm("sum", SumJob.from_flags, _run_sum, needs_index=True),
        Algorithm("fp", FpJob.from_flags, _run_fp, auto_kind=True),
        Algorithm("sparse-mean", SparseMeanJob.from_flags, _run_sparse_mean, takes_k=True),
        Algorithm("mwem", MwemJob.from_flags, _run_mwem, own_plan=True),
    )
}


# --------------------------------------------------------------------------- checks and runs


def check_run_options(
    oracle: Oracle,
    algorithm: Algorithm[Any],
    epsilon: Epsilon,
    kind: str | None,
    index: int | None,
) -> None:
    """Refuse, before any budget is reserved, the options no run could finish
    with: a kind the algorithm does not open, a total ε below the task's smallest
    stream ε, `sum` without its coordinate.  ValueError, naming the option."""
    accepted = [*RUN_KINDS, *(["auto"] if algorithm.auto_kind else [])]
    if kind is not None and not algorithm.kinds:
        raise ValueError(
            f"--kind does not apply to --algorithm {algorithm.name} (it opens one stream of "
            "its own kind)"
        )
    if kind is not None and kind not in accepted:
        raise ValueError(
            f"--kind {kind} is not a stream kind --algorithm {algorithm.name} opens; "
            f"expected one of {', '.join(accepted)}"
        )
    if getattr(oracle, "noise", INDEPENDENT) == JOINT:
        joint_kinds = [k.value for k in JOINT_SVT_KINDS]
        if kind is not None and kind != "auto" and kind not in joint_kinds:
            raise ValueError(
                f"--kind {kind} cannot take this task's joint noise; expected one of "
                f"{', '.join(joint_kinds + (['auto'] if algorithm.auto_kind else []))}"
            )
    floor = getattr(oracle, "epsilon_min", None) or Fraction(0)
    if epsilon.value < floor:
        raise ValueError(
            f"--epsilon {epsilon.value} is below the task's epsilon_min={floor} "
            "(the smallest ε one stream may use)"
        )
    if algorithm.needs_index:
        if index is None:
            raise ValueError(
                f"--algorithm {algorithm.name} needs --index (the coordinate to estimate)"
            )
        if not 0 <= index < oracle.d:
            raise ValueError(f"--index {index} is out of range [0, {oracle.d})")
    elif index is not None:
        raise ValueError(f"--index applies to --algorithm sum only, not {algorithm.name}")


def prepare(
    oracle: Oracle, flags: RunFlags, progress: Progress | None = None
) -> tuple[Algorithm[Any], Run[Any]]:
    """The algorithm and its checked run: every flag is checked here, before any
    budget is reserved, and ε is parsed once."""
    algorithm = ALGORITHMS.get(flags.algorithm)
    if algorithm is None:
        raise ValueError(
            f"unknown algorithm {flags.algorithm!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    if flags.shares and not algorithm.shares:
        raise ValueError("--shares applies to the scan and top-k algorithms only")
    if flags.k is not None and not algorithm.takes_k and algorithm.name != "noisy-max":
        raise ValueError(f"--k applies to top-k and sparse-mean only, not {algorithm.name}")
    if flags.counts is not None and algorithm.name != "top-k":
        raise ValueError(f"--counts applies to top-k only, not {algorithm.name}")
    epsilon = Epsilon.parse(flags.epsilon)
    check_run_options(oracle, algorithm, epsilon, flags.kind, flags.index)
    if not 0 < flags.beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {flags.beta}")
    options = algorithm.options(flags, oracle)
    return algorithm, Run(oracle, epsilon, flags.beta, flags.kind, options, progress)


def run_algorithm(
    oracle: Oracle,
    flags: RunFlags,
    progress: Progress | None = None,
    on_plan: Callable[[str], None] | None = None,
) -> Summary:
    """Run one algorithm of the registry on an oracle; its JSON-ready summary
    (the algorithm, ε as exact text, then what the algorithm found).

    The whole run is one plan of ε, reserved on both servers before any stream:
    refused at once, nothing spent, if the budget left cannot hold it (MWEM
    reserves its own plan of 2T steps).  On a joint-noise task the plan also
    holds a δ allowance for the streams' sampler δ (`adaptive_groups`); what the
    streams did not use comes back when the plan ends.  `on_plan` is told the
    plan's id once it is reserved (so a caller can end a plan a failure left)."""
    algorithm, run = prepare(oracle, flags, progress)
    total = run.epsilon.value + getattr(run.options, "extra_epsilon", Fraction(0))
    head: Summary = {"algorithm": algorithm.name, "epsilon": str(total)}
    if algorithm.own_plan:
        return {**head, **algorithm.run(run)}
    with planned(oracle, adaptive_groups(oracle, [total])) as plan_oracle:
        if on_plan is not None:
            on_plan(plan_oracle.plan_id)
        return {**head, **algorithm.run(replace(run, oracle=plan_oracle))}
