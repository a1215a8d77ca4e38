"""The prefix crawl (dp/crawl.py, analyst/crawl.py): the level mechanism's exact
privacy loss on neighbouring count vectors and its statistical audit, each
with broken mechanisms the tests must catch; the walk on two in-process
servers' verifiable DPF keys against the plaintext counts; hostile reports
dropped at their level; strings in and out; plans and budgets refused with
their reasons."""

from __future__ import annotations

import math
import os
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from svtagg.analyst.audit import ratio_test
from svtagg.analyst.crawl import (
    DpfCrawlOracle,
    LocalCrawlOracle,
    crawl,
    decode_string,
    encode_string,
    false_positive_floor,
    make_reports,
)
from svtagg.dp.crawl import (
    CrawlPlan,
    above,
    above_probability,
    draw_level_noise,
    level_loss,
    level_scale,
)
from svtagg.dp.errors import BudgetExhausted, InvalidArgument
from svtagg.dp.noise import RandomSource, draw
from svtagg.vdaf.crawl import Level, PrefixDpf
from svtagg.vdaf.sparse import NONCE_SIZE, RAND_SIZE, P

# ----------------------------------------------------------------- exact privacy loss


@pytest.mark.parametrize("eps", [Fraction(1, 8), Fraction(1, 2), Fraction(1)])
def test_a_level_is_epsilon_dp_on_every_replace_one_neighbour(eps: Fraction) -> None:
    """One user replaced moves one candidate's count down and another's up (or
    only one, if the other string is no candidate): over counts around τ, the
    exact worst-case loss of the answers with the honest server's noise alone
    stays within ε_ℓ, and reaches it (the bound is tight) somewhere."""
    tau, t = 20, level_scale(eps)
    worst = 0.0
    for a in range(tau - 6, tau + 6):
        for b in range(tau - 6, tau + 6):
            for moved in ([a - 1, b + 1], [a - 1, b], [a, b + 1]):
                loss = level_loss([a, b], moved, tau, t, parties=1)
                assert loss <= float(eps) + 1e-9
                worst = max(worst, loss)
    assert worst == pytest.approx(float(eps), rel=1e-6)


def test_the_analysts_view_with_both_servers_noise_loses_less() -> None:
    eps = Fraction(1, 2)
    one = level_loss([20, 20], [19, 21], 20, level_scale(eps), parties=1)
    two = level_loss([20, 20], [19, 21], 20, level_scale(eps), parties=2)
    assert two < one <= float(eps) + 1e-9


def test_control_noise_scaled_for_sensitivity_one_is_caught() -> None:
    """Broken: scale 1/ε_ℓ (as if one user moved one count): a replace moves
    two, and the loss doubles."""
    eps = Fraction(1, 2)
    loss = level_loss([20, 20], [19, 21], 20, level_scale(eps, sensitivity=1), parties=1)
    assert loss > 1.9 * float(eps)


def test_control_a_report_counted_twice_in_a_level_is_caught() -> None:
    """Broken: without the level's check a report could add 1 to two
    candidates; a replace then moves four counts, and the real scale pays 2ε."""
    eps = Fraction(1, 2)
    loss = level_loss([20, 20, 20, 20], [19, 19, 21, 21], 20, level_scale(eps), parties=1)
    assert loss > 1.9 * float(eps)


def test_control_no_noise_is_caught() -> None:
    """Broken: the exact counts thresholded; the answer flips with one user."""
    rng = RandomSource()
    on = above([20], 20, Fraction(1), rng, parties=0)
    off = above([19], 20, Fraction(1), rng, parties=0)
    assert on[0] and not off[0]  # probability 1 against 0: no finite ε


def test_above_probability_is_the_noise_tail() -> None:
    t = Fraction(4)
    assert above_probability(10, 10, t, 1) == pytest.approx(1 / (1 + math.exp(-1 / 4)), rel=1e-9)
    # P(ν ≥ x) = q^x / (1 + q) for x ≥ 1, the discrete Laplace tail
    q = math.exp(-1 / 4)
    assert above_probability(0, 7, t, 1) == pytest.approx(q**7 / (1 + q), rel=1e-9)


# ----------------------------------------------------------------- statistical audit

TRIALS = 20_000


def _answers(counts: list[int], eps: Fraction, scale: Fraction, rng: RandomSource) -> Counter:
    """How often each answer vector comes out of TRIALS levels on `counts`, with
    one party's noise of `scale` (the view of an analyst and a corrupt server)."""
    noise = draw("laplace", scale, TRIALS * len(counts), rng).reshape(TRIALS, len(counts))
    yes = (np.asarray(counts) + noise) >= 20
    return Counter(tuple(row) for row in yes.tolist())


@pytest.mark.parametrize(
    ("scale_of", "private"),
    [(level_scale, True), (lambda e: level_scale(e, sensitivity=1), False)],
    ids=["real", "control-sensitivity-one"],
)
def test_the_level_mechanism_passes_the_audit_and_the_control_fails(scale_of, private) -> None:  # type: ignore[no-untyped-def]
    """Sampled answers on neighbours D = (20, 19) and D' = (19, 20) (one user
    moved from the second candidate to the first), one party's noise: a
    one-sided test of P_D(o) ≤ e^ε·P_D'(o) on the answer o = (yes, no), the
    likeliest witness, where the real ratio is exactly e^ε.  The real scale
    passes (p ≥ 10^−6); the scale of sensitivity one, charged as ε (ratio
    e^2ε), is rejected far beyond that (p < 10^−30; observed ≈ 10^−280)."""
    eps = Fraction(1)
    rng = RandomSource(os.urandom(32))
    scale = scale_of(eps)
    d, d2 = _answers([20, 19], eps, scale, rng), _answers([19, 20], eps, scale, rng)
    witness = (True, False)
    p = ratio_test(d[witness], d2[witness], TRIALS, float(eps), np.random.default_rng())
    if private:
        assert p >= 1e-6
    else:
        assert p < 1e-30


# ----------------------------------------------------------------- strings


def test_strings_round_trip_and_prefixes_are_string_prefixes() -> None:
    for s in ["the", "über", "日本", "", "abcdefgh"]:
        x = encode_string(s, 64)
        assert decode_string(x, 64) == s
    assert encode_string("ab", 64) >> 48 == encode_string("abc", 64) >> 48


@pytest.mark.parametrize(
    ("s", "bits", "message"),
    [
        ("abcdefghi", 64, "at most 8 bytes"),
        ("a\0b", 64, "NUL"),
        ("ab", 60, "multiple of 8"),
    ],
)
def test_strings_a_task_cannot_hold_are_refused(s: str, bits: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        encode_string(s, bits)


# ----------------------------------------------------------------- plans and budgets


def test_plan_levels_and_refusals() -> None:
    plan = CrawlPlan(20, 8, Fraction(3), 10)
    assert plan.levels == 3
    assert [plan.prefix_bits(i) for i in (1, 2, 3)] == [8, 16, 20]
    assert plan.level_epsilon == 1
    for bad in (
        dict(bits=0, stride=8),
        dict(bits=257, stride=8),
        dict(bits=64, stride=9),
        dict(bits=64, stride=8, max_kept=1 << 9),
    ):
        with pytest.raises(ValueError):
            CrawlPlan(epsilon=Fraction(1), threshold=10, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold"):
        CrawlPlan(64, 8, Fraction(1), 0)


def test_a_walk_beyond_the_budget_is_refused_before_the_level_answers() -> None:
    values = [encode_string(w, 16) for w in ["ab"] * 40]
    oracle = LocalCrawlOracle(values, 16, Fraction(1, 2))
    with pytest.raises(BudgetExhausted):
        crawl(oracle, CrawlPlan(16, 8, Fraction(1), 10))
    assert oracle.ledger.epsilon_spent == Fraction(1, 2)  # the first level ran, the second not


def test_false_positive_floor_bounds_the_expected_false_positives() -> None:
    for eps in (Fraction(1, 8), Fraction(1, 32)):
        tau = false_positive_floor(eps, 4096, expected=0.05)
        exact = 4096 * above_probability(0, tau, level_scale(eps), 2)
        assert exact <= 0.05


# ----------------------------------------------------------------- the walk


def test_the_walk_on_dpf_keys_counts_every_level_as_the_plaintext() -> None:
    """Two in-process servers on the reports' keys: at every level the sum of
    their count shares equals the plaintext prefix counts, and with noise far
    below one count (ε = 200 over two levels) the walk returns exactly the
    strings held by at least τ users."""
    words = ["ab"] * 12 + ["ac"] * 9 + ["b"] * 7 + ["zz"] * 2 + ["q"] * 1
    values = [encode_string(w, 16) for w in words]
    dpf_oracle = DpfCrawlOracle(make_reports(values, 16), 16, 200)
    plain = LocalCrawlOracle(values, 16, 200)
    seen = []
    real = dpf_oracle.above

    def checked(level, candidates, prefix_bits, epsilon, threshold):  # type: ignore[no-untyped-def]
        out = real(level, candidates, prefix_bits, epsilon, threshold)
        assert dpf_oracle.counts == plain.counts(candidates, prefix_bits)
        seen.append(level)
        return out

    dpf_oracle.above = checked  # type: ignore[method-assign]
    result = crawl(dpf_oracle, CrawlPlan(16, 8, Fraction(200), 5))
    assert seen == [1, 2]
    assert sorted(result.strings()) == ["ab", "ac", "b"]
    assert result.epsilon_spent == 200
    assert dpf_oracle.refused_at == {1: 0, 2: 0}


def _tampered(values: list[int], bits: int) -> list:  # type: ignore[type-arg]
    """Honest reports of `values`, then three hostile ones for the string of
    values[0]: a weight of 2, an output correction changed at bit 12, and a
    key changed for one server."""
    dpf = PrefixDpf(bits)
    reports = make_reports(values, bits)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = dpf.gen(values[0], nonce, os.urandom(RAND_SIZE), weight=2)
    reports.append((nonce, public, keys))
    nonce = os.urandom(NONCE_SIZE)
    public, keys = dpf.gen(values[0], nonce, os.urandom(RAND_SIZE))
    levels = dpf.decode(public)
    lv = levels[11]
    levels[11] = Level(lv.seed, lv.ctrl, lv.proof, (lv.output + 1) % P)
    reports.append((nonce, dpf.encode(levels), keys))
    nonce = os.urandom(NONCE_SIZE)
    public, keys = dpf.gen(values[0], nonce, os.urandom(RAND_SIZE))
    reports.append((nonce, public, (keys[0], bytes([keys[1][0] ^ 1]) + keys[1][1:])))
    return reports


def test_hostile_reports_are_dropped_at_their_level_and_never_counted() -> None:
    values = [encode_string(w, 16) for w in ["ab"] * 6 + ["cd"] * 5]
    oracle = DpfCrawlOracle(_tampered(values, 16), 16, 200)
    counts = []
    real = oracle.above

    def record(*args):  # type: ignore[no-untyped-def]
        out = real(*args)
        counts.append(dict(zip(args[1], oracle.counts, strict=True)))
        return out

    oracle.above = record  # type: ignore[method-assign]
    result = crawl(oracle, CrawlPlan(16, 8, Fraction(200), 3))
    # weight 2 and the changed key fail level 1 (bits 1–8); the changed bit-12
    # correction passes level 1 and fails level 2 (bits 9–16)
    assert oracle.refused_at == {1: 2, 2: 1}
    assert counts[0][ord("a")] == 6 + 1  # the level-12 report still counted at level 1
    assert counts[1][encode_string("ab", 16)] == 6  # and not at level 2
    assert sorted(result.strings()) == ["ab", "cd"]


def test_the_walk_stops_when_too_many_prefixes_pass() -> None:
    values = [encode_string(chr(97 + i), 16) for i in range(20) for _ in range(5)]
    oracle = LocalCrawlOracle(values, 16, 400)
    result = crawl(oracle, CrawlPlan(16, 8, Fraction(400), 3, max_kept=8))
    assert result.found == []
    assert "max_kept = 8" in result.stopped
    assert result.epsilon_spent == 200  # the second level was not run


def test_a_walk_with_nothing_above_stops_after_its_first_level() -> None:
    values = [encode_string("x", 16)] * 3
    result = crawl(LocalCrawlOracle(values, 16, 400), CrawlPlan(16, 8, Fraction(400), 10))
    assert result.found == [] and len(result.levels) == 1
    assert "no candidate of level 1" in result.stopped


def test_level_noise_comes_from_the_csprng_and_has_its_scale() -> None:
    rng = RandomSource()
    x = draw_level_noise(Fraction(1, 4), 200_000, rng)
    t = 8.0  # 2/ε
    q = math.exp(-1 / t)
    var = 2 * q / (1 - q) ** 2  # variance of the discrete Laplace law
    assert abs(float(np.var(x)) / var - 1) < 0.03


# ----------------------------------------------------------------- through the DPF path


def _level_answers(values: list[int], reports: list, runs: int) -> Counter:  # type: ignore[type-arg]
    """How often each answer vector of level 1 (two candidates, τ = 20,
    ε = 1) comes out of `runs` walks on two in-process servers' keys."""
    seen: Counter[tuple[bool, ...]] = Counter()
    for _ in range(runs):
        oracle = DpfCrawlOracle(reports, 8, 1)
        answers = oracle.above(1, [0b0, 0b1], 1, Fraction(1), 20)
        seen[tuple(answers)] += 1
    return seen


def _g_test(seen: Counter, law: dict) -> float:  # type: ignore[type-arg]
    """The G statistic of observed answer vectors against their exact law."""
    n = sum(seen.values())
    return 2 * sum(c * math.log(c / (n * law[o])) for o, c in seen.items() if c)


def test_the_dpf_paths_answers_fit_the_exact_law_and_a_skipped_check_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End to end through the reports' keys: 300 level-1 walks over strings
    of 8 bits (20 users start with bit 0, 19 with bit 1) fit the exact law
    of the two candidates' answers (both servers' noise, τ = 20, ε = 1;
    G within the 99.9 % point of χ²(3), 16.27).  Control: one extra report of
    weight 4 on the first prefix, with the level's check skipped (as a
    server that trusted its clients would), moves that count by 4 — the same
    G test against the honest law rejects it (observed G ≈ 120–175).  With
    the check, the forged report is refused and the law holds again."""
    runs, t = 300, level_scale(Fraction(1))
    values = [0b00000001] * 20 + [0b10000001] * 19
    reports = make_reports(values, 8)
    p = [above_probability(c, 20, t, 2) for c in (20, 19)]
    law = {(a, b): (p[0] if a else 1 - p[0]) * (p[1] if b else 1 - p[1])
           for a in (False, True) for b in (False, True)}  # fmt: skip
    assert _g_test(_level_answers(values, reports, runs), law) < 16.27

    dpf = PrefixDpf(8)
    nonce = os.urandom(NONCE_SIZE)
    public, keys = dpf.gen(0b00000001, nonce, os.urandom(RAND_SIZE), weight=4)
    forged = [*reports, (nonce, public, keys)]
    assert _g_test(_level_answers(values, forged, runs), law) < 16.27
    import svtagg.vdaf.crawl as vcrawl

    monkeypatch.setattr(vcrawl, "check_level", lambda a, b, live: np.asarray(live, dtype=bool))
    assert _g_test(_level_answers(values, forged, runs), law) > 16.27


def test_candidates_that_extend_no_kept_prefix_are_refused_before_anything_is_spent() -> None:
    values = [encode_string(w, 16) for w in ["ab"] * 12]
    oracle = DpfCrawlOracle(make_reports(values, 16), 16, 10)
    with pytest.raises(InvalidArgument, match="extend every kept prefix"):
        oracle.above(1, [0, 1, 2], 8, Fraction(1), 5)  # not the 256 one-byte prefixes
    assert oracle.ledger.epsilon_spent == 0
    assert len(oracle.above(1, list(range(256)), 8, Fraction(1), 5)) == 256
    assert oracle.ledger.epsilon_spent == 1
