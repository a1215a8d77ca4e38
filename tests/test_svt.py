"""SVT mechanisms, the ledger and the local oracle's contract."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.oracle import Oracle, Stream
from svtagg.dp.errors import BudgetExhausted, Refusal, StreamClosed
from svtagg.dp.kinds import StreamKind, ctt_delta_charge, ctt_gap
from svtagg.dp.ledger import Ledger
from svtagg.dp.noise import RandomSource
from svtagg.dp.queries import Outcome, Query
from svtagg.dp.svt import AboveThresholdStream, batch_above_threshold


def test_ledger_charges_exactly_and_refuses_overdraft() -> None:
    led = Ledger(1, "1e-6")
    for _ in range(3):
        led.charge(Fraction(1, 3))
    assert led.budget().epsilon_left == 0
    with pytest.raises(BudgetExhausted, match="left"):
        led.charge("0.0001")
    assert led.epsilon_spent == 1  # a refused charge changes nothing
    with pytest.raises(ValueError):
        led.charge(0)
    with pytest.raises(ValueError):
        Ledger(-1)
    with pytest.raises(ValueError):
        Ledger(1, 1)


def test_stream_closes_after_first_yes() -> None:
    rng = RandomSource(b"close")
    s = AboveThresholdStream(StreamKind.LAP24, Fraction(10), 4, rng)
    big = 1000 * 16
    assert s.ask(np.array([0, 0, big, big]), np.array([big, big, 0, 0])) == 2
    assert s.closed and s.queries_answered == 3
    with pytest.raises(StreamClosed):
        s.ask(np.array([0]), np.array([0]))


def test_far_scores_answer_deterministically_within_alpha() -> None:
    # 100 users: scores 0, 100, 50; every query is ≥ α from its threshold, so
    # with β = 1e-6 per stream the 21 streams below all answer as stated
    # (false-failure probability ≤ 2.1e-5).
    o = LocalOracle(np.ones((100, 3)) * [0, 1, 0.5], 200, seed=3)
    alpha = o.accuracy("lap24", 5, 3, 1e-6)
    assert alpha < 50
    for _ in range(20):
        st = o.open_stream(5)
        assert st.ask([(Query(0), 50), (Query(1), 50), (Query(2), 50 + 100)]) == 1
    # complement of index 1 is 0, of index 0 is 50
    st = o.open_stream(5)
    assert st.ask([(Query(1, complement=True), 50), (Query(0, complement=True), 50)]) == 1


def test_local_oracle_is_an_oracle_and_counts_everything() -> None:
    o = LocalOracle(np.zeros((10, 4)), 3, seed=1)
    assert isinstance(o, Oracle)
    st = o.open_stream(1, "lap3")
    assert isinstance(st, Stream)
    assert st.ask([(Query(j), 40) for j in range(4)]) is None
    assert st.ask([(Query(0), 40)]) is None
    stats = o.stats()
    assert (stats.streams, stats.queries, stats.chunks) == (1, 5, 2)
    assert o.budget().epsilon_left == 2
    o.open_stream(2, "exp3")
    with pytest.raises(BudgetExhausted):
        o.open_stream("0.001")
    assert o.stats().streams == 2


def test_local_oracle_refuses_bad_input() -> None:
    o = LocalOracle(np.zeros((10, 4)), 3, seed=1)
    with pytest.raises(ValueError):
        o.open_stream(0)
    with pytest.raises(ValueError):
        o.open_stream(float("nan"))
    with pytest.raises(ValueError):
        o.open_stream(1, "bogus")
    with pytest.raises(ValueError):
        o.open_stream(1, "lap24", delta="0.1")
    st = o.open_stream(1)
    with pytest.raises(ValueError):
        st.ask([])
    with pytest.raises(Refusal):
        st.ask([(Query(4), 1)])
    with pytest.raises(ValueError, match="threshold"):
        st.ask([(Query(0), 41)])  # beyond ±4n, as the servers refuse
    with pytest.raises(ValueError, match="threshold"):
        st.ask([(Query(0), "-40.5")])
    with pytest.raises(ValueError):
        st.compare([(Query(0), 0, 100)])
    with pytest.raises(ValueError):
        LocalOracle(np.zeros(3), 1)


def test_batch_svt_matches_stream_semantics() -> None:
    rng = RandomSource(b"batch")
    out = batch_above_threshold(
        np.array([0, 5000]), np.array([5000, 0]), Fraction(50), frac_bits=4, rng=rng
    )
    assert out == 1


def test_compare_to_thresholds_semantics_and_gap() -> None:
    n = 1000
    data = np.zeros((n, 3))
    data[:, 1] = 1.0
    data[: n // 2, 2] = 1.0
    o = LocalOracle(data, 100, delta_total="1e-3", seed=5)
    eps, delta = Fraction(9, 10), Fraction(1, 10**6)
    gap = ctt_gap(eps, delta)
    st = o.open_stream(eps, "ctt", delta)
    assert o.budget().delta_spent == ctt_delta_charge(delta, 1)
    # score 0 far below τL → LOW; score 1000 far above τH → HIGH; 500 between → CLOSE
    lo, hi = 500 - gap / 2 - 1, 500 + gap / 2 + 1
    chunk = [(Query(j), lo, hi) for j in (0, 1, 2, 1)]
    # every score is ≥ 100 score units from the nearer threshold, noise scales are
    # 2.2 and 6.7: a wrong outcome has probability < 1e-6
    assert st.compare(chunk) == [Outcome.LOW, Outcome.HIGH, Outcome.CLOSE]
    assert st.closed
    with pytest.raises(StreamClosed):
        st.compare(chunk)
    with pytest.raises(ValueError, match="requires"):
        o.open_stream(eps, "ctt", delta).compare([(Query(0), 0, gap / 2)])


def test_two_party_ctt_charges_double_delta_and_wider_gap() -> None:
    o = LocalOracle(np.zeros((5, 1)), 10, delta_total="1e-3", parties=2, seed=2)
    o.open_stream("1/2", "ctt", "1e-6")
    assert o.budget().delta_spent == Fraction(2, 10**6)
    half, tiny = Fraction(1, 2), Fraction(1, 10**6)
    assert ctt_gap(half, tiny, 2) > ctt_gap(half, tiny, 1)


@pytest.mark.parametrize("eps, delta", [("1", "1e-6"), ("64", "1e-6"), ("1/2", "0"), ("1/2", "1")])
def test_ctt_refuses_parameters_outside_the_unit_interval(eps: str, delta: str) -> None:
    """Algorithms 4–5 are stated for ε, δ ∈ (0, 1); nothing is charged on refusal."""
    o = LocalOracle(np.zeros((5, 1)), 100, delta_total="1/2", seed=1)
    with pytest.raises(ValueError, match="CompareToThresholds needs"):
        o.open_stream(eps, "ctt", delta)
    assert o.budget().epsilon_spent == 0
