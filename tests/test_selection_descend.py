"""A descending scan's levels batched into chunks (`Session.descend`): the stream
sees the same (query, threshold) pairs in the same order as level by level, the
released (position, level) has the same law, and a batching that reorders the
pairs inside a chunk is caught by the same statistical test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chi2_contingency
from test_selection import GRID

from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.selection.records import Candidates
from svtagg.analyst.selection.session import DESCEND_CHUNK, Session
from svtagg.dp.queries import Number, Query

SCORES = (10, 25, 31, 28)
LEVELS = [float(v) for v in range(60, -1, -2)]  # 31 levels, the YES near 30


class _Exact:
    """A noise-free stream: the first pair whose score is strictly above τ."""

    def __init__(self, log: list[list[tuple[Query, Number]]]) -> None:
        self.log = log

    def ask(self, chunk: Sequence[tuple[Query, Number]]) -> int | None:
        self.log.append(list(chunk))
        for i, (q, tau) in enumerate(chunk):
            if SCORES[q.index] > tau:
                return i
        return None


class _ExactOracle:
    n = 100

    def __init__(self) -> None:
        self.log: list[list[tuple[Query, Number]]] = []

    def open_stream(self, epsilon: Number | str, kind: object = "lap24") -> _Exact:
        return _Exact(self.log)


def _descend(per_chunk: int) -> tuple[tuple[int, int] | None, list[list[tuple[Query, Number]]]]:
    oracle = _ExactOracle()
    session = Session(oracle, "lap24", descend_chunk=per_chunk)  # type: ignore[arg-type]
    found = session.descend(Candidates.coordinates(len(SCORES)), range(4), LEVELS, Fraction(1))
    assert session.spend.chunks == len(oracle.log)
    assert found is not None
    assert session.spend.queries == found[1] * 4 + found[0] + 1  # answered up to the YES
    assert session.spend.queries_sent == sum(map(len, oracle.log))
    return found, oracle.log


@pytest.mark.parametrize("per_chunk", [4, 8, 20, 4 * 31, DESCEND_CHUNK])
def test_batched_levels_ask_the_same_pairs_in_order(per_chunk: int) -> None:
    one, log_one = _descend(1)  # one level per chunk: the unbatched scan
    many, log_many = _descend(per_chunk)
    assert one == many == (2, 15)  # score 31 > 30 at level 15, candidate 2
    flat_one = [p for c in log_one for p in c]
    flat_many = [p for c in log_many for p in c]
    answered = 15 * 4 + 3
    assert len(flat_one) == 16 * 4  # level by level: every pair up to the YES's level
    assert flat_many[:answered] == flat_one[:answered]
    levels = max(1, per_chunk // 4)
    assert len(log_many) == -(-16 // levels)  # chunks up to the level of the YES
    assert len(flat_many) - answered < levels * 4  # at most one chunk's worth more


def test_no_yes_asks_every_level_once() -> None:
    oracle = _ExactOracle()
    session = Session(oracle, "lap24", descend_chunk=12)  # type: ignore[arg-type]
    high = [float(v) for v in range(100, 40, -3)]  # 20 levels, every score below
    assert session.descend(Candidates.coordinates(4), range(4), high, Fraction(1)) is None
    assert [tau for c in oracle.log for _, tau in c] == [int(m) for m in high for _ in range(4)]
    assert len(oracle.log) == 7 and session.spend.queries == session.spend.queries_sent == 80


def test_descend_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="descend_chunk"):
        Session(_ExactOracle(), "lap24", descend_chunk=0)  # type: ignore[arg-type]


def _reordering_descend(
    session: Session, cands: Candidates, positions: Sequence[int], levels: Sequence[float]
) -> tuple[int, int] | None:
    """A broken batching (negative control): the levels of a chunk asked lowest
    first, so a low threshold's YES can pre-empt a higher level's."""
    stream = session.open(Fraction(1, 2))
    per = 5
    for first in range(0, len(levels), per):
        block = list(levels[first : first + per])[::-1]
        hit = session._ask_levels(stream, cands, positions, block)
        if hit is not None:
            return hit % len(positions), first + len(block) - 1 - hit // len(positions)
    return None


def _law(runs: int, per_chunk: int | None, seed: int) -> Counter[tuple[int, int] | None]:
    sums = np.asarray(SCORES, dtype=np.int64) * GRID
    oracle = LocalOracle.from_sums(sums, 100, 2 * runs, seed=seed)
    cands = Candidates.coordinates(len(SCORES))
    law: Counter[tuple[int, int] | None] = Counter()
    for _ in range(runs):
        if per_chunk is None:
            session = Session(oracle, "lap24")
            law[_reordering_descend(session, cands, range(4), LEVELS)] += 1
        else:
            session = Session(oracle, "lap24", descend_chunk=per_chunk)
            law[session.descend(cands, range(4), LEVELS, Fraction(1, 2))] += 1
    return law


def _p_same(a: Counter[tuple[int, int] | None], b: Counter[tuple[int, int] | None]) -> float:
    """Two-sample chi-square on the level of the YES, cells with < 10 expected
    merged into their neighbour."""
    levels = sorted({-1 if k is None else k[1] for k in (*a, *b)})
    rows = [
        [sum(c for k, c in x.items() if (-1 if k is None else k[1]) == v) for v in levels]
        for x in (a, b)
    ]
    table: list[list[int]] = [[], []]
    acc = [0, 0]
    for j in range(len(levels)):
        acc = [acc[0] + rows[0][j], acc[1] + rows[1][j]]
        if min(acc) >= 10:
            table[0].append(acc[0])
            table[1].append(acc[1])
            acc = [0, 0]
    table[0][-1] += acc[0]
    table[1][-1] += acc[1]
    return float(chi2_contingency(table)[1])


def test_batched_levels_release_the_same_law() -> None:
    runs = 1500
    one = _law(runs, 1, seed=7)
    batched = _law(runs, 4 * 5, seed=8)
    # false-failure probability 10^-3 (the two laws are equal)
    assert _p_same(one, batched) > 1e-3, (one, batched)
    broken = _law(runs, None, seed=9)
    # the reordered batching moves the YES to lower levels: caught
    assert _p_same(one, broken) < 1e-6, (one, broken)
