"""The statistical privacy audit: correct streams pass, known-broken ones are caught.

Every correct-mechanism audit is a family of one-sided tests at a Bonferroni-
corrected total level of 1e-3, so each passes a correct mechanism except with
probability ≤ 1e-3.  The default (light) run uses few trials; `pytest -m heavy`
(`scripts/heavy.sh`) runs the large version, including the control that needs
~10^5 trials to be caught (a stream that reveals its noisy value with the YES).
That control's events are chosen on a separate pilot sample
(`svtagg.analyst.audit.pilot_audit`): the pilot only decides which few (event,
direction) pairs the fresh final sample tests, so the final Bonferroni
correction is over those few and the level holds however the pilot chose.
Oracles are seeded, so each run is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from broken_mechanisms import KeepsAnsweringOracle, NoThresholdNoiseOracle, RevealsValueOracle

from svtagg.analyst.audit import (
    AuditReport,
    Event,
    Output,
    PilotDesign,
    Scenario,
    audit,
    collect,
    count_events,
    counterexample_scenario,
    first_yes_events,
    first_yes_pmf,
    fit_test,
    honest_party_outcome_probs,
    pilot_audit,
    scenario_pmfs,
    split_scenario,
)
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import Outcome, Query

FRAC_BITS = 6  # the audit's grid: small, so streams are cheap; the mechanism is the same


def _maker(cls: type[LocalOracle] = LocalOracle, parties: int = 1, seed: int = 0) -> Any:
    counter = iter(range(10**6))

    def make(data: np.ndarray) -> LocalOracle:
        seed_i = seed * 1000 + next(counter)
        return cls(data, 10**9, "0.5", frac_bits=FRAC_BITS, parties=parties, seed=seed_i)

    return make


def keeps_answering_events(half: int) -> list[tuple[str, Any]]:
    """Fixed family for YES-vectors: many YES in the first half, few in the second."""
    return [
        (f"A>={a},B<={a - 2}", lambda o, a=a: sum(o[:half]) >= a and sum(o[half:]) <= a - 2)
        for a in range(2, half + 1)
    ]


# --- the reveals-value control -------------------------------------------------------

REVEAL_PILOT_TRIALS = 50_000
REVEAL_TRIALS = 200_000
REVEAL_KEEP = 5


def reveal_scenario() -> Scenario:
    """The counterexample shape with k = 32 queries at τ = 0.5 (ε = 2, lap24).

    A YES at j that reveals its noisy value v tells that γ ≤ v − τ; given so low
    a γ each of the j earlier NOs is up to e^{ε/4} likelier on D' (scores 0) than
    on D (scores 1), so late YESes with low values are the revealing events.  k
    and τ were chosen with exact output distributions of the broken stream: they
    maximise the power of the best such event (k = 16 at τ = 1.6 needs ~2× the
    streams for the same power; more than 32 queries gains almost nothing).
    """
    sc = counterexample_scenario(StreamKind.LAP24, Fraction(2), k=32, tau=0.5)
    return replace(sc, name="reveals-value")


@dataclass(frozen=True)
class LateLowValue:
    """First YES at some j ≥ j0 with revealed value v ≤ c + s·(j − j0) (grid units)."""

    j0: int
    c: int
    s: int

    @property
    def label(self) -> str:
        return f"YES at j>={self.j0}, v<={self.c}+{self.s}(j-{self.j0})"

    def __call__(self, o: Output) -> bool:
        return o is not None and o[0] >= self.j0 and o[1] <= self.c + self.s * (o[0] - self.j0)  # type: ignore[index]


#: 12 × 17 × 5 = 1,020 candidates: j0 ∈ 0..11, c from −1 to 3 score units in
#: quarters, slope s from 0 to 1/4 unit per index.
REVEAL_FAMILY = [
    LateLowValue(j0, c, s)
    for j0 in range(12)
    for c in range(-64, 193, 16)
    for s in (0, 4, 8, 12, 16)
]


def reveal_events() -> list[Event]:
    return [(e.label, e) for e in REVEAL_FAMILY]


def count_late_low(outputs: Sequence[Output]) -> np.ndarray:
    """`count_events(reveal_events())`, vectorised (1,020 events × 10^5 outputs)."""
    hits = [o for o in outputs if o is not None]
    j = np.fromiter((o[0] for o in hits), dtype=np.int64, count=len(hits))  # type: ignore[index]
    v = np.fromiter((o[1] for o in hits), dtype=np.int64, count=len(hits))  # type: ignore[index]
    return np.array(
        [np.count_nonzero((j >= e.j0) & (v <= e.c + e.s * (j - e.j0))) for e in REVEAL_FAMILY]
    )


# --- correct mechanisms pass ---------------------------------------------------------


@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3])
def test_correct_kinds_pass_counterexample_audit(kind: StreamKind) -> None:
    rep = audit(counterexample_scenario(kind), _maker(seed=1), trials=3000)
    assert not rep.violated, rep.summary()


def test_two_party_noise_passes_audit() -> None:
    rep = audit(counterexample_scenario(StreamKind.LAP24), _maker(parties=2, seed=2), trials=2000)
    assert not rep.violated, rep.summary()


def test_correct_stream_passes_split_audit() -> None:
    rep = audit(split_scenario(StreamKind.LAP24), _maker(seed=3), trials=2000)
    assert not rep.violated, rep.summary()


def _ctt_run(eps: Fraction, delta: Fraction, k: int, lo: float, hi: float) -> Any:
    chunk = [(Query(j), lo, hi) for j in range(k)]

    def run(oracle: Any) -> Any:
        out = oracle.open_stream(eps, "ctt", delta).compare(chunk)
        return tuple(o.value for o in out)

    return run


def test_compare_to_thresholds_passes_audit() -> None:
    from svtagg.analyst.audit import audit_outputs, collect
    from svtagg.dp.kinds import ctt_gap

    eps, delta, k = Fraction(9, 10), Fraction(1, 10**6), 4
    gap = ctt_gap(eps, delta)
    sc = counterexample_scenario(StreamKind.CTT, k=k, n=80)  # 4n must exceed the gap
    run = _ctt_run(eps, delta, k, 0.5 - gap, 0.5)
    trials = 2000
    out_d = collect(_maker(seed=4), sc.data, run, trials)
    out_dp = collect(_maker(seed=5), sc.neighbour, run, trials)
    events = [
        (f"{m} high then close", lambda o, m=m: o == ("high",) * m + ("close",)) for m in range(k)
    ] + [("all high", lambda o: o == ("high",) * k)]
    # δ·trials = 0.002 expected extra events: far below what the test can see.
    rep = audit_outputs("ctt", float(eps), out_d, out_dp, events)
    assert not rep.violated, rep.summary()
    assert Outcome.HIGH.value == "high"


# --- known-broken mechanisms are caught ---------------------------------------------


def test_audit_catches_missing_threshold_noise() -> None:
    # The event is the note's: "no YES at all", declared before any data is seen.
    rep = audit(
        counterexample_scenario(),
        _maker(NoThresholdNoiseOracle, seed=6),
        trials=12_000,
        events=[("none", lambda o: o is None)],
    )
    assert rep.violated, "no-threshold-noise control not detected: " + rep.summary()


def test_audit_catches_stream_that_keeps_answering() -> None:
    sc = split_scenario()
    half = len(sc.chunk) // 2
    rep = audit(
        sc,
        _maker(KeepsAnsweringOracle, seed=7),
        trials=2000,
        events=keeps_answering_events(half),
        run=lambda o: o.run_vector(sc.epsilon, sc.kind, sc.chunk),
    )
    assert rep.violated, "keeps-answering control not detected: " + rep.summary()


# --- the pilot machinery (light) ----------------------------------------------------


def test_vectorised_reveal_counts_match_the_events() -> None:
    rng = np.random.default_rng(0)
    js, vs = rng.integers(0, 32, 2000), rng.integers(-300, 400, 2000)
    outputs: list[Output] = [None] * 50 + [(int(j), int(v)) for j, v in zip(js, vs, strict=True)]
    assert count_late_low(outputs).tolist() == count_events(reveal_events())(outputs).tolist()


def test_pilot_audit_passes_correct_stream() -> None:
    sc = counterexample_scenario()
    events = first_yes_events(len(sc.chunk))
    rep = pilot_audit(sc, _maker(seed=8), events, 1000, 2000, design=PilotDesign(keep=3))
    assert len(rep.results) == 3 and rep.threshold == pytest.approx(1e-3 / 3)
    assert rep.trials == 2000
    assert not rep.violated, rep.summary()


# --- the exact output law and the conformance test (light) ---------------------------


@pytest.mark.parametrize("kind", ["lap24", "lap3"])
def test_first_yes_pmf_one_party_matches_the_ring_computation(kind: str) -> None:
    """Two independent computations of one law: `first_yes_pmf` (noise pmfs
    convolved) and `honest_party_outcome_probs` (the ring comparison, one
    party's noise) agree on small values, where nothing wraps."""
    scores, taus = [64, 0, 64, 30, 64, 5], [51, 20, 0, 40, 100, -10]
    exact = first_yes_pmf(scores, taus, kind, Fraction(2), FRAC_BITS, parties=1)
    ring = honest_party_outcome_probs(scores, taus, kind, Fraction(2), FRAC_BITS)
    assert exact.sum() == pytest.approx(1.0)
    assert np.abs(exact - ring).max() < 1e-9


@pytest.mark.parametrize("kind", [StreamKind.LAP3, StreamKind.EXP3])
def test_conformance_test_passes_correct_and_catches_missing_threshold_noise(
    kind: StreamKind,
) -> None:
    """1,000 two-party streams on the counterexample: the correct stream fits its
    exact law (false failure ≤ 1e-3, the level used), the one without threshold
    noise does not (G ≥ 100 expected, against a critical value near 27)."""
    sc = counterexample_scenario(kind, tau=0.5)
    law, _ = scenario_pmfs(sc, FRAC_BITS)
    rng = np.random.default_rng(20)
    for cls, seed, broken in ((LocalOracle, 21, False), (NoThresholdNoiseOracle, 22, True)):
        outputs = collect(_maker(cls, parties=2, seed=seed), sc.data, _run(sc), 1000)
        fit = fit_test("D", outputs, law, rng)
        assert fit.trials == 1000
        assert (fit.p_value < 1e-3) == broken, f"{cls.__name__} {kind}: {fit}"


def test_fit_test_refuses_outputs_outside_the_chunk() -> None:
    with pytest.raises(ValueError, match="outside"):
        fit_test("D", [0, 9], np.full(9, 1 / 9), np.random.default_rng(0))


def _run(sc: Scenario) -> Any:
    return lambda o: o.open_stream(sc.epsilon, sc.kind).ask(sc.chunk)


# --- heavy versions -----------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("parties", [1, 2])
@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3])
def test_heavy_correct_kinds_pass(kind: StreamKind, parties: int) -> None:
    for sc in (counterexample_scenario(kind), split_scenario(kind)):
        rep = audit(sc, _maker(parties=parties, seed=11), trials=30_000)
        print(rep.summary())
        assert not rep.violated, rep.summary()


def reveal_control_report(seed: int = 12) -> AuditReport:
    """The heavy reveals-value audit: pilot-chosen events, then the final test."""
    sc = reveal_scenario()
    return pilot_audit(
        sc,
        _maker(RevealsValueOracle, seed=seed),
        reveal_events(),
        REVEAL_PILOT_TRIALS,
        REVEAL_TRIALS,
        run=lambda o: o.run_revealing(sc.epsilon, sc.kind, sc.chunk),
        design=PilotDesign(keep=REVEAL_KEEP, seed=seed, count=count_late_low),
    )


@pytest.mark.heavy
def test_heavy_audit_catches_revealed_noisy_value() -> None:
    rep = reveal_control_report()
    print(rep.summary())
    assert len(rep.results) == REVEAL_KEEP
    assert rep.violated, "reveals-value control not detected: " + rep.summary()


@pytest.mark.heavy
def test_heavy_audit_correct_mechanism_on_reveal_scenario() -> None:
    """The same scenario, pilot and sizes on the correct stream: no violation."""
    sc = reveal_scenario()
    rep = pilot_audit(
        sc,
        _maker(seed=13),
        first_yes_events(len(sc.chunk)),
        REVEAL_PILOT_TRIALS,
        REVEAL_TRIALS,
        design=PilotDesign(keep=REVEAL_KEEP, seed=13),
    )
    print(rep.summary())
    assert not rep.violated, rep.summary()
