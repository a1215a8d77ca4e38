"""The statistical privacy audit: correct streams pass, known-broken ones are caught.

Every correct-mechanism audit is a family of one-sided tests at a Bonferroni-
corrected total level of 1e-3, so each passes a correct mechanism except with
probability ≤ 1e-3.  The default (light) run uses few trials; `pytest -m heavy`
(`scripts/heavy.sh`) runs the large version, including the control that needs
~10^5 trials to be caught (a stream that reveals its noisy value with the YES).
Oracles are seeded, so each run is reproducible.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from broken_mechanisms import KeepsAnsweringOracle, NoThresholdNoiseOracle, RevealsValueOracle
from svtagg.analyst.audit import (
    Scenario,
    audit,
    counterexample_scenario,
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


def reveal_scenario(k: int = 16) -> Scenario:
    data = np.zeros((4, k))
    data[0, : k - 1] = 1.0
    chunk = tuple([(Query(j), 1.6) for j in range(k - 1)] + [(Query(k - 1), 0.0)])
    return Scenario("reveals-value", data, np.zeros((4, k)), Fraction(2), StreamKind.LAP24, chunk)


def reveal_events(k: int) -> list[tuple[str, Any]]:
    unit = 2**FRAC_BITS
    return [
        (f"last & v<={c}", lambda o, c=c: o is not None and o[0] == k - 1 and o[1] <= c * unit)
        for c in (0.25, 0.5, 1.0)
    ]


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


# --- heavy versions -----------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("parties", [1, 2])
@pytest.mark.parametrize("kind", [StreamKind.LAP24, StreamKind.LAP3, StreamKind.EXP3])
def test_heavy_correct_kinds_pass(kind: StreamKind, parties: int) -> None:
    for sc in (counterexample_scenario(kind), split_scenario(kind)):
        rep = audit(sc, _maker(parties=parties, seed=11), trials=30_000)
        print(rep.summary())
        assert not rep.violated, rep.summary()


@pytest.mark.heavy
def test_heavy_audit_catches_revealed_noisy_value() -> None:
    sc = reveal_scenario()
    k = len(sc.chunk)
    rep = audit(
        sc,
        _maker(RevealsValueOracle, seed=12),
        trials=150_000,
        events=reveal_events(k),
        run=lambda o: o.run_revealing(sc.epsilon, sc.kind, sc.chunk),
    )
    print(rep.summary())
    assert rep.violated, "reveals-value control not detected: " + rep.summary()


@pytest.mark.heavy
def test_heavy_audit_correct_mechanism_on_reveal_scenario() -> None:
    """The same scenario and sizes on the correct stream: no violation."""
    sc = reveal_scenario()
    rep = audit(sc, _maker(seed=13), trials=150_000)
    print(rep.summary())
    assert not rep.violated, rep.summary()
