"""Statistical privacy audit of SVT streams (in the style of StatDP, Ding et al. 2018).

Pick two neighbouring datasets D, D' (one user's row replaced), run many fresh
streams on each through an oracle, and for every event E of a family fixed in
advance test H0: P[E | D] ≤ e^ε · P[E | D'] (and the reverse).  The test is
StatDP's: thin the D-count c₁ to c₁' ~ Binomial(c₁, e^−ε), which under H0 is a
Binomial(N, p) draw with p ≤ P[E | D'], then a one-sided Fisher exact test of
c₁' against c₂.  Under H0 the p-value is super-uniform, so with a Bonferroni
correction over events and directions the audit of a correct mechanism fails
with probability at most `level`.

When the events cannot be fixed in advance, `pilot_audit` chooses the most
telling few on a pilot sample and tests them on a fresh one.  When the exact
output law of the specified mechanism is known (`first_yes_pmf`), `fit_test`
adds a conformance test of each dataset's outputs against it: it catches a
deployed mechanism that is not the specified one even where the DP inequality
alone needs far more streams to show the difference (two servers' noise hides
most of a broken stream's privacy loss; see docs/privacy.md).

A correct mechanism passes; a broken one (see tests/test_audit.py) must fail.
The audit needs only the `Oracle` interface, so it runs unchanged against the
local oracle and against the real servers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.analyst.oracle import Oracle
from svtagg.dp.jointsvt import joint_stream_noise
from svtagg.dp.kinds import StreamKind, noise_model
from svtagg.dp.noise import laplace_log_pmf, sum_pmf
from svtagg.dp.queries import Outcome, Query, encode_thresholds
from svtagg.mpc.ring import encode

Output = Hashable
Event = tuple[str, Callable[[Output], bool]]


@dataclass(frozen=True)
class Scenario:
    """Neighbouring datasets and the chunk every audited stream answers."""

    name: str
    data: np.ndarray
    neighbour: np.ndarray
    epsilon: Fraction
    kind: StreamKind
    chunk: tuple[tuple[Query, float], ...]

    def __post_init__(self) -> None:
        if self.data.shape != self.neighbour.shape:
            raise ValueError("neighbouring datasets must have the same shape")
        differing = np.flatnonzero((self.data != self.neighbour).any(axis=1))
        if differing.size > 1:
            raise ValueError("neighbouring datasets must differ in at most one user's row")


def first_yes_events(k: int) -> list[Event]:
    """The fixed event family for first-YES outputs in {0..k-1, None}."""

    def equals(j: int) -> Callable[[Output], bool]:
        return lambda o: o == j

    def none_or_at_least(j: int) -> Callable[[Output], bool]:
        return lambda o: o is None or (isinstance(o, int) and o >= j)

    events: list[Event] = [("none", lambda o: o is None)]
    for j in range(k):
        events.append((f"={j}", equals(j)))
        events.append((f"none or >={j}", none_or_at_least(j)))
    return events


@dataclass
class EventResult:
    event: str
    direction: str
    count_first: int
    count_second: int
    p_value: float


@dataclass
class FitResult:
    """Conformance of one dataset's outputs to the specified mechanism's exact law."""

    dataset: str
    trials: int
    statistic: float
    p_value: float


@dataclass
class AuditReport:
    scenario: str
    epsilon: float
    trials: int
    level: float
    results: list[EventResult] = field(default_factory=list)
    fits: list[FitResult] = field(default_factory=list)

    @property
    def threshold(self) -> float:
        """Bonferroni: every event test and every conformance test at level / their number."""
        return self.level / max(1, len(self.results) + len(self.fits))

    @property
    def worst(self) -> EventResult:
        return min(self.results, key=lambda r: r.p_value)

    @property
    def ratio_violated(self) -> bool:
        """True when some event's ratio exceeds e^ε at the Bonferroni-corrected level."""
        return bool(self.results) and self.worst.p_value < self.threshold

    @property
    def fit_violated(self) -> bool:
        """True when some dataset's outputs do not follow the specified mechanism's law."""
        return any(f.p_value < self.threshold for f in self.fits)

    @property
    def violated(self) -> bool:
        return self.ratio_violated or self.fit_violated

    def summary(self) -> str:
        w = self.worst
        text = (
            f"{self.scenario}: {'VIOLATION' if self.violated else 'pass'} "
            f"(ε={self.epsilon:g}, {self.trials} streams per dataset, "
            f"{len(self.results) + len(self.fits)} tests at family level {self.level:g}, "
            f"the false-failure probability of a correct mechanism; worst event "
            f"'{w.event}' {w.direction}: counts {w.count_first} vs {w.count_second}, "
            f"p={w.p_value:.3g}"
        )
        for f in self.fits:
            text += (
                f"; fit on {f.dataset} ({f.trials} streams): G={f.statistic:.1f}, p={f.p_value:.3g}"
            )
        return text + f"; threshold {self.threshold:.3g})"


def fisher_one_sided(a: int, b: int, n: int) -> float:
    """P-value of a one-sided Fisher exact test that success rate 1 > rate 2.

    Two samples of size n with a and b successes; conditional on a + b = m the
    count a is hypergeometric; the p-value is P(X >= a).
    """
    m = a + b
    if m == 0:
        return 1.0
    total = 2 * n

    def log_h(x: int) -> float:
        return _log_comb(n, x) + _log_comb(n, m - x) - _log_comb(total, m)

    lo, hi = max(a, m - n), min(m, n)
    logs = [log_h(x) for x in range(lo, hi + 1)]
    if not logs:
        return 0.0
    mx = max(logs)
    return min(1.0, math.exp(mx) * sum(math.exp(v - mx) for v in logs))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def ratio_test(c1: int, c2: int, trials: int, epsilon: float, rng: np.random.Generator) -> float:
    """P-value for H0: p1 ≤ e^ε p2 given counts c1, c2 out of `trials` each."""
    thinned = int(rng.binomial(c1, math.exp(-epsilon)))
    return fisher_one_sided(thinned, c2, trials)


def collect(
    make_oracle: Callable[[np.ndarray], Oracle],
    data: np.ndarray,
    run: Callable[[Oracle], Output],
    trials: int,
    progress: Callable[[int], None] | None = None,
) -> list[Output]:
    """Outputs of `trials` fresh streams on one dataset (one oracle, large budget)."""
    oracle = make_oracle(data)
    outputs = []
    for i in range(trials):
        outputs.append(run(oracle))
        if progress is not None:
            progress(i)
    return outputs


def audit_outputs(
    name: str,
    epsilon: float,
    outputs_d: Sequence[Output],
    outputs_dp: Sequence[Output],
    events: Sequence[Event],
    level: float = 1e-3,
    seed: int = 0,
) -> AuditReport:
    """Test every event in both directions on already collected outputs."""
    if len(outputs_d) != len(outputs_dp):
        raise ValueError("both datasets need the same number of trials")
    trials = len(outputs_d)
    rng = np.random.default_rng(seed)
    report = AuditReport(name, float(epsilon), trials, level)
    for label, pred in events:
        c_d = sum(1 for o in outputs_d if pred(o))
        c_dp = sum(1 for o in outputs_dp if pred(o))
        for direction, a, b in (("D vs D'", c_d, c_dp), ("D' vs D", c_dp, c_d)):
            p = ratio_test(a, b, trials, float(epsilon), rng)
            report.results.append(EventResult(label, direction, a, b, p))
    return report


def _default_run(scenario: Scenario) -> Callable[[Oracle], Output]:
    """One fresh stream of the scenario's kind and ε answering its chunk."""

    def run(oracle: Oracle) -> Output:
        return oracle.open_stream(scenario.epsilon, scenario.kind).ask(scenario.chunk)

    return run


def audit(
    scenario: Scenario,
    make_oracle: Callable[[np.ndarray], Oracle],
    trials: int,
    events: Sequence[Event] | None = None,
    run: Callable[[Oracle], Output] | None = None,
    level: float = 1e-3,
    seed: int = 0,
) -> AuditReport:
    """Run `trials` streams on each dataset of the scenario and test the events."""
    run = run or _default_run(scenario)
    if events is None:
        events = first_yes_events(len(scenario.chunk))
    out_d = collect(make_oracle, scenario.data, run, trials)
    out_dp = collect(make_oracle, scenario.neighbour, run, trials)
    return audit_outputs(scenario.name, float(scenario.epsilon), out_d, out_dp, events, level, seed)


# --------------------------------------------------------------------------------------
# Events chosen on a pilot sample.

Counts = Callable[[Sequence[Output]], np.ndarray]


def count_events(events: Sequence[Event]) -> Counts:
    """Counts of each event over a sample (each distinct output evaluated once)."""

    def count(outputs: Sequence[Output]) -> np.ndarray:
        seen = Counter(outputs)
        return np.array([sum(n for o, n in seen.items() if pred(o)) for _, pred in events])

    return count


def first_yes_intervals(k: int) -> list[Event]:
    """Every interval of the ordered outcomes 0 < 1 < … < k−1 < none, for a pilot to
    choose from: a broken stream shows in where its first YES tends to fall."""
    order: list[Output] = [*range(k), None]

    def within(a: int, b: int) -> Callable[[Output], bool]:
        inside = frozenset(order[a:b])
        return lambda o: o in inside

    return [
        (f"[{a}, {'none' if b == k + 1 else b - 1}]", within(a, b))
        for a in range(k + 1)
        for b in range(a + 1, k + 2)
    ]


def choose_events(
    pilot_d: np.ndarray, pilot_dp: np.ndarray, epsilon: float, keep: int
) -> list[tuple[int, int]]:
    """The `keep` (event index, direction) pairs the pilot counts point to.

    Each is scored by z = (c₁e^−ε − c₂)/√(c₁e^−ε + c₂), the pilot's estimate of
    how far the thinned test of `ratio_test` will land from H0; direction 0 tests
    P[E | D] ≤ e^ε P[E | D'], direction 1 the reverse.
    """
    shrink = math.exp(-epsilon)
    scored = []
    for i in range(len(pilot_d)):
        for direction, a, b in ((0, pilot_d[i], pilot_dp[i]), (1, pilot_dp[i], pilot_d[i])):
            thinned = a * shrink
            z = (thinned - b) / math.sqrt(thinned + b) if thinned + b > 0 else -math.inf
            scored.append((-z, i, direction))
    return [(i, direction) for _, i, direction in sorted(scored)[:keep]]


@dataclass(frozen=True)
class PilotDesign:
    """How `pilot_audit_outputs` tests: the `keep` (event, direction) pairs the
    pilot points to, at family level `level` (the false-failure probability of a
    correct mechanism), thinning draws from `seed`; `count` counts the events over
    a sample (default `count_events`), and `reference` (the exact output laws on D
    and D', see `first_yes_pmf`) adds the conformance tests."""

    keep: int = 5
    level: float = 1e-3
    seed: int = 0
    count: Counts | None = None
    reference: tuple[np.ndarray, np.ndarray] | None = None


def pilot_audit_outputs(
    name: str,
    epsilon: float,
    pilot: tuple[Sequence[Output], Sequence[Output]],
    final: tuple[Sequence[Output], Sequence[Output]],
    events: Sequence[Event],
    design: PilotDesign | None = None,
) -> AuditReport:
    """Test on `final` the `design.keep` (event, direction) pairs `pilot` points to.

    `pilot` and `final` are (outputs on D, outputs on D'), drawn independently.
    The final sample is independent of the choice, so for a correct mechanism
    each final p-value is super-uniform and the Bonferroni family over the kept
    pairs holds its level whatever the pilot chose.  With `design.reference` (the
    exact output laws of the specified mechanism on D and D', see `first_yes_pmf`)
    each dataset's pilot and final outputs together also get a conformance test
    (`fit_test`), one more member of the same Bonferroni family: it is fixed in
    advance, so using the pilot's outputs too costs nothing.
    """
    if len(final[0]) != len(final[1]) or len(pilot[0]) != len(pilot[1]):
        raise ValueError("both datasets need the same number of trials")
    design = design if design is not None else PilotDesign()
    count = design.count or count_events(events)
    pilot_d, pilot_dp = count(pilot[0]), count(pilot[1])
    chosen = choose_events(pilot_d, pilot_dp, epsilon, design.keep)
    final_d, final_dp = count(final[0]), count(final[1])
    trials = len(final[0])
    rng = np.random.default_rng(design.seed)
    label = f"{name}, {len(chosen)} events from a {len(pilot[0])}-stream pilot"
    report = AuditReport(label, epsilon, trials, design.level)
    for i, direction in chosen:
        a, b = int(final_d[i]), int(final_dp[i])
        if direction == 1:
            a, b = b, a
        report.results.append(
            EventResult(
                events[i][0],
                ("D vs D'", "D' vs D")[direction],
                a,
                b,
                ratio_test(a, b, trials, epsilon, rng),
            )
        )
    if design.reference is not None:
        laws = design.reference
        for dataset, p, first, second in zip(("D", "D'"), laws, pilot, final, strict=True):
            report.fits.append(fit_test(dataset, [*first, *second], p, rng))
    return report


def pilot_audit(
    scenario: Scenario,
    make_oracle: Callable[[np.ndarray], Oracle],
    events: Sequence[Event],
    pilot_trials: int,
    trials: int,
    run: Callable[[Oracle], Output] | None = None,
    design: PilotDesign | None = None,
) -> AuditReport:
    """`pilot_audit_outputs` (with `design`) on streams of the scenario:
    `pilot_trials` per dataset for the pilot, then `trials` fresh ones (from new
    oracles) for the final test."""
    run = run or _default_run(scenario)

    def sample(n: int) -> tuple[list[Output], list[Output]]:
        return (
            collect(make_oracle, scenario.data, run, n),
            collect(make_oracle, scenario.neighbour, run, n),
        )

    pilot = sample(pilot_trials)
    final = sample(trials)
    return pilot_audit_outputs(scenario.name, float(scenario.epsilon), pilot, final, events, design)


# --------------------------------------------------------------------------------------
# Conformance to the exact output law of the specified mechanism.

#: Monte Carlo draws behind a conformance p-value; the smallest p-value it can
#: give is 1/(FIT_SIMS + 1) = 5·10^−5, below a 10^−3 family's share for up to
#: 19 tests.
FIT_SIMS = 20_000


def first_yes_pmf(
    scores: Sequence[int],
    taus: Sequence[int],
    kind: StreamKind | str,
    epsilon: Fraction,
    frac_bits: int,
    parties: int = 2,
) -> npt.NDArray[np.float64]:
    """Exact P(first YES at j) for j < k, and P(no YES) last, of one chunk of a
    fresh AboveThreshold stream on grid scores and thresholds (no ring wrap),
    every noise term being the sum of `parties` independent full draws, as in
    `dp.svt` and the servers: YES iff s − τ + ν − γ ≥ 0."""
    model = noise_model(kind)
    eps = Fraction(epsilon)
    g_lo, p_gamma = sum_pmf(model.threshold_family, model.threshold_scale(eps, frac_bits), parties)
    n_lo, p_nu = sum_pmf(model.query_family, model.query_scale(eps, frac_bits), parties)
    return _first_yes_law(scores, taus, (g_lo, p_gamma), (n_lo, p_nu))


def joint_first_yes_pmf(
    scores: Sequence[int],
    taus: Sequence[int],
    kind: StreamKind | str,
    epsilon: Fraction,
    frac_bits: int,
) -> npt.NDArray[np.float64]:
    """`first_yes_pmf` for a stream of a joint-noise task: γ and every ν are ONE
    draw each of the garbled sampler, 2^F·Z plus the servers' dither, whose
    exact law is `JointStreamNoise.grid_pmf` (`dp.joint.pmf` at the stream's
    digits, spread and convolved with `dp.jointsvt.dither_law`); small
    supports only (`dp.joint.MAX_ENUMERATED_DIGITS`)."""
    noise = joint_stream_noise(StreamKind.parse(kind), Fraction(epsilon), frac_bits)
    return _first_yes_law(scores, taus, noise.grid_pmf("threshold"), noise.grid_pmf("query"))


def joint_ctt_pmf(
    scores: Sequence[int],
    lows: Sequence[int],
    highs: Sequence[int],
    epsilon: Fraction,
    frac_bits: int,
    gamma: tuple[int, npt.NDArray[np.float64]] | None = None,
    nu: tuple[int, npt.NDArray[np.float64]] | None = None,
) -> dict[tuple[Outcome, ...], float]:
    """The exact law of a CompareToThresholds chunk's answer on a joint-noise
    stream (grid scores and thresholds, no ring wrap): every possible output —
    HIGH/LOW answers up to the first CLOSE, which ends it — and its probability,
    γ and each ν ONE draw of the sampler (`JointStreamNoise.grid_pmf`, as in
    `joint_first_yes_pmf`): HIGH iff s + ν > τH − γ, else LOW iff s + ν < τL + γ,
    else CLOSE (`dp.svt.CompareToThresholdsStream`).  `gamma`, `nu` replace
    γ's and ν's laws (lowest value, pmf): the broken controls and small test
    samplers.  At most 2^(k+1) − 1 outputs for k queries; outputs of
    probability 0 are left out (absent means 0)."""
    noise = joint_stream_noise(StreamKind.CTT, Fraction(epsilon), frac_bits)
    g_lo, p_gamma = noise.grid_pmf("threshold") if gamma is None else gamma
    n_lo, p_nu = noise.grid_pmf("query") if nu is None else nu
    below = np.concatenate([[0.0], np.cumsum(p_nu)])  # below[i] = P(ν < n_lo + i)
    g = g_lo + np.arange(p_gamma.size)

    def p_less(x: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """P(ν < x), elementwise."""
        return below[np.clip(x - n_lo, 0, p_nu.size)]

    laws = []
    for s, lo, hi in zip(scores, lows, highs, strict=True):
        high = 1.0 - p_less(int(hi) - int(s) + 1 - g)  # ν > τH − γ − s
        low = p_less(np.minimum(int(lo) - int(s) + g, int(hi) - int(s) + 1 - g))
        laws.append((high, low, np.clip(1.0 - high - low, 0.0, 1.0)))
    out: dict[tuple[Outcome, ...], float] = {}

    def walk(i: int, weight: npt.NDArray[np.float64], prefix: tuple[Outcome, ...]) -> None:
        if i == len(laws):
            out[prefix] = float(weight.sum())
            return
        high, low, close = laws[i]
        out[(*prefix, Outcome.CLOSE)] = float((weight * close).sum())
        for answer, p in ((Outcome.HIGH, high), (Outcome.LOW, low)):
            if np.any(p * weight > 0):  # impossible answers are not walked (nor listed)
                walk(i + 1, weight * p, (*prefix, answer))

    walk(0, p_gamma, ())
    return out


def _first_yes_law(
    scores: Sequence[int],
    taus: Sequence[int],
    gamma: tuple[int, npt.NDArray[np.float64]],
    nu: tuple[int, npt.NDArray[np.float64]],
) -> npt.NDArray[np.float64]:
    """P(first YES at j) for j < k, then P(no YES), for γ and i.i.d. ν with these
    (lowest value, pmf) laws: YES iff s − τ + ν − γ ≥ 0."""
    g_lo, p_gamma = gamma
    n_lo, p_nu = nu
    cdf_nu = np.cumsum(p_nu)
    gammas = g_lo + np.arange(p_gamma.size)

    def p_no(v: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """P(ν ≤ v)."""
        idx = v - n_lo
        inside = cdf_nu[np.clip(idx, 0, cdf_nu.size - 1)]
        return np.where(idx < 0, 0.0, inside)

    k = len(scores)
    out = np.zeros(k + 1)
    alive = p_gamma.copy()
    for j, (s, t) in enumerate(zip(scores, taus, strict=True)):
        no = p_no(int(t) - int(s) - 1 + gammas)
        out[j] = float(np.sum(alive * (1.0 - no)))
        alive = alive * no
    out[k] = float(alive.sum())
    return out / out.sum()


def scenario_pmfs(
    scenario: Scenario, frac_bits: int, parties: int = 2
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """`first_yes_pmf` of the scenario's chunk on D and on D' (coordinate queries)."""
    taus = encode_thresholds([t for _, t in scenario.chunk], frac_bits).tolist()
    laws = []
    for data in (scenario.data, scenario.neighbour):
        sums = encode(data, frac_bits).astype(np.int64).sum(axis=0)
        full = data.shape[0] * (1 << frac_bits)
        scores = [
            full - sums[q.index] if q.complement else sums[q.index] for q, _ in scenario.chunk
        ]
        laws.append(
            first_yes_pmf(scores, taus, scenario.kind, scenario.epsilon, frac_bits, parties)
        )
    return laws[0], laws[1]


def fit_test(
    dataset: str, outputs: Sequence[Output], pmf: npt.ArrayLike, rng: np.random.Generator
) -> FitResult:
    """G-test of first-YES outputs (None = no YES) against their exact law.

    The p-value is a Monte Carlo one, (1 + #{G* ≥ G})/(FIT_SIMS + 1) over
    multinomial samples G* of the same size from `pmf`: exactly super-uniform
    under H0 whatever the cell sizes, where the χ² approximation is not.
    """
    p = np.asarray(pmf, dtype=np.float64)
    k = p.size - 1
    idx = np.array([k if o is None else int(o) for o in outputs], dtype=np.int64)  # type: ignore[call-overload]
    if idx.size and (idx.min() < 0 or idx.max() > k):
        raise ValueError("an output is outside the chunk's outcomes")
    counts = np.bincount(idx, minlength=k + 1)

    def g(c: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        expected = c.sum(axis=-1, keepdims=True) * p
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(c > 0, c * np.log(c / expected), 0.0)
        return 2.0 * terms.sum(axis=-1)

    observed = float(g(counts))
    sims = g(rng.multinomial(int(counts.sum()), p, size=FIT_SIMS))
    p_value = (1 + int(np.count_nonzero(sims >= observed))) / (FIT_SIMS + 1)
    return FitResult(dataset, int(counts.sum()), observed, p_value)


def counterexample_scenario(
    kind: StreamKind | str = StreamKind.LAP24,
    epsilon: Fraction = Fraction(2),
    k: int = 8,
    n: int = 4,
    tau: float = 0.8,
) -> Scenario:
    """The note's counterexample shape, tuned for power.

    D has one user with value 1 on k coordinates (q_i(D) = Δ); D' replaces that
    user with zeros (q_i(D') = 0); all thresholds equal τ.  Without threshold
    noise P[no YES | D'] / P[no YES | D] grows like e^{k ε / 4} and exceeds e^ε
    for k ≥ 5; with correct noise it stays ≤ e^ε.  τ = 0.8 (0.4 query-noise
    scales at ε = 2) with k = 8 maximises the audit's power for a given trial
    count (a small numerical search over τ and k).
    """
    data = np.zeros((n, k))
    data[0, :] = 1.0
    neighbour = np.zeros((n, k))
    chunk = tuple((Query(j), tau) for j in range(k))
    return Scenario(
        f"counterexample[{StreamKind.parse(kind).value}]",
        data,
        neighbour,
        Fraction(epsilon),
        StreamKind.parse(kind),
        chunk,
    )


def split_scenario(
    kind: StreamKind | str = StreamKind.LAP24,
    epsilon: Fraction = Fraction(2),
    half: int = 16,
    n: int = 4,
    tau: float = 0.5,
) -> Scenario:
    """Neighbours that move half the queries up and half down.

    D's first user has value 1 on the first `half` coordinates, D' moves that
    value to the other `half`.  No single shift of the threshold noise maps one
    dataset's outcomes to the other's, which is what exposes a stream that
    keeps answering after its first YES (found by a small search over τ, sizes).
    """
    k = 2 * half
    data = np.zeros((n, k))
    data[0, :half] = 1.0
    neighbour = np.zeros((n, k))
    neighbour[0, half:] = 1.0
    chunk = tuple((Query(j), tau) for j in range(k))
    return Scenario(
        f"split[{StreamKind.parse(kind).value}]",
        data,
        neighbour,
        Fraction(epsilon),
        StreamKind.parse(kind),
        chunk,
    )


# --------------------------------------------------------------------------------------
# Exact outcome distribution of a stream on ring values (the wrap-attack analysis).

_RING = 1 << 64
_HALF = 1 << 63


def _signed(x: int) -> int:
    x %= _RING
    return x - _RING if x >= _HALF else x


def _laplace_cdf(scale: Fraction, x: int) -> float:
    """P(ν ≤ x) for the discrete Laplace law of `svtagg.dp.noise` (q = e^(−1/scale))."""
    q = math.exp(-1.0 / float(scale))
    if x >= 0:
        return 1.0 - q ** (x + 1) / (1.0 + q)
    return q ** (-x) / (1.0 + q)


def honest_party_outcome_probs(
    values: Sequence[int],
    taus: Sequence[int],
    kind: StreamKind | str,
    epsilon: Fraction,
    frac_bits: int,
    window_scales: int = 40,
) -> npt.NDArray[np.float64]:
    """Exact P(first YES at j) for j < k, and P(no YES) last, of one chunk of an
    AboveThreshold stream whose comparisons run on the ring values `values`
    (grid units mod 2^64, e.g. the servers' reconstructed aggregates) against
    thresholds `taus`, when only the honest server's noise is random (the
    corrupt server's γ and ν are known to the adversary and taken as 0).

    The comparison is the circuit's: YES iff (v − τ + ν − γ) mod 2^64 ≥ 0 as
    int64, so a value near ±2^63 wraps exactly as it would in the servers.
    Laplace-noise kinds only; γ is summed over ±window_scales of its scale
    (the mass left out is below e^−window_scales)."""
    model = noise_model(kind)
    if model.threshold_family != "laplace" or model.query_family != "laplace":
        raise ValueError("exact outcome probabilities are implemented for Laplace kinds")
    sg = model.threshold_scale(Fraction(epsilon), frac_bits)
    sv = model.query_scale(Fraction(epsilon), frac_bits)
    span = math.ceil(window_scales * sg)
    gammas = np.arange(-span, span + 1)
    p_gamma = np.exp(laplace_log_pmf(sg, gammas))
    # ν beyond ±nu_cap scales has mass below e^−200: clip the interval ends there.
    nu_cap = math.ceil(200 * sv)

    def p_yes(base: int, gamma: int) -> float:
        w = _signed(base - gamma)
        # YES iff w + ν ∈ [0, 2^63) or w + ν < −2^63 (wraps to a positive value).
        lo, hi = max(-w, -nu_cap), min(_HALF - 1 - w, nu_cap)
        p = _laplace_cdf(sv, hi) - _laplace_cdf(sv, lo - 1) if lo <= hi else 0.0
        below = -_HALF - 1 - w
        if below >= -nu_cap:
            p += _laplace_cdf(sv, min(below, nu_cap))
        return p

    k = len(values)
    bases = [int(v) - int(t) for v, t in zip(values, taus, strict=True)]
    out = np.zeros(k + 1)
    for g, pg in zip(gammas.tolist(), p_gamma.tolist(), strict=True):
        alive = pg
        for j, b in enumerate(bases):
            y = p_yes(b, g)
            out[j] += alive * y
            alive *= 1.0 - y
        out[k] += alive
    return out
