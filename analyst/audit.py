"""Statistical privacy audit of SVT streams (in the style of StatDP, Ding et al. 2018).

Pick two neighbouring datasets D, D' (one user's row replaced), run many fresh
streams on each through an oracle, and for every event E of a family fixed in
advance test H0: P[E | D] ≤ e^ε · P[E | D'] (and the reverse).  The test is
StatDP's: thin the D-count c₁ to c₁' ~ Binomial(c₁, e^−ε), which under H0 is a
Binomial(N, p) draw with p ≤ P[E | D'], then a one-sided Fisher exact test of
c₁' against c₂.  Under H0 the p-value is super-uniform, so with a Bonferroni
correction over events and directions the audit of a correct mechanism fails
with probability at most `level`.

A correct mechanism passes; a broken one (see tests/test_audit.py) must fail.
The audit needs only the `Oracle` interface, so it runs unchanged against the
local oracle and against the real servers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.analyst.oracle import Oracle
from svtagg.dp.kinds import StreamKind, noise_model
from svtagg.dp.noise import laplace_log_pmf
from svtagg.dp.queries import Query

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
class AuditReport:
    scenario: str
    epsilon: float
    trials: int
    level: float
    results: list[EventResult] = field(default_factory=list)

    @property
    def threshold(self) -> float:
        return self.level / max(1, len(self.results))

    @property
    def worst(self) -> EventResult:
        return min(self.results, key=lambda r: r.p_value)

    @property
    def violated(self) -> bool:
        """True when some event's ratio exceeds e^ε at the Bonferroni-corrected level."""
        return self.worst.p_value < self.threshold

    def summary(self) -> str:
        w = self.worst
        return (
            f"{self.scenario}: {'VIOLATION' if self.violated else 'pass'} "
            f"(ε={self.epsilon:g}, {self.trials} streams per dataset, "
            f"{len(self.results)} tests at level {self.level:g}; worst event "
            f"'{w.event}' {w.direction}: counts {w.count_first} vs {w.count_second}, "
            f"p={w.p_value:.3g} vs threshold {self.threshold:.3g})"
        )


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
    if run is None:

        def run(oracle: Oracle) -> Output:
            return oracle.open_stream(scenario.epsilon, scenario.kind).ask(scenario.chunk)

    if events is None:
        events = first_yes_events(len(scenario.chunk))
    out_d = collect(make_oracle, scenario.data, run, trials)
    out_dp = collect(make_oracle, scenario.neighbour, run, trials)
    return audit_outputs(scenario.name, float(scenario.epsilon), out_d, out_dp, events, level, seed)


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
