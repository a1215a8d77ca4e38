"""The wrap attack of one malicious client plus the analyst, end to end through
the leader and helper drivers, with the exact privacy loss of its outcome.

A client uploads a share that puts coordinate 0's sum just below 2^63.  Without
robust aggregates the comparison on that coordinate wraps around the ring's
sign bit, so its answers are reversed: raising coordinate 0 makes its YES less
likely, and an honest user who moves weight between a reversed and a normal
coordinate changes both in the same direction — here the honest
user moves one unit from coordinate 1 to coordinate 0, which widens the
γ-window of "no YES" at both ends.  A stream that
alternates the two coordinates then leaks more than ε about the honest user.
With robust aggregates (the default) the servers compare g(S) = min(tri(S), n·2^F)
instead, which moves by at most 2^F when one honest user changes, and the SVT
proof holds again.  The loss is computed exactly (`honest_party_outcome_probs`)
on the aggregates the two servers actually hold after the close, under the
honest server's noise alone (the other server colludes with the analyst).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import DriverPair, driver_pair

from svtagg.analyst.audit import honest_party_outcome_probs
from svtagg.client.upload import make_batch
from svtagg.dp.kinds import StreamKind
from svtagg.dp.task import TaskSpec
from svtagg.mpc.circuits import plain_clamp
from svtagg.servers.exchange.values import Ask, OpenStream, Queries

F = 4
UNIT = 1 << F
N_HONEST = 40
EPS = Fraction(1)
K = 8  # queries in the stream: coordinates 0, 1, 0, 1, ...


def honest_rows(changed: bool) -> np.ndarray:
    """40 users; user 0 holds (0, 1) in D and (1, 0) in D' (a neighbouring dataset);
    10 others hold 1 on coordinate 1."""
    rows = np.zeros((N_HONEST, 2))
    rows[1:11, 1] = 1.0
    rows[0] = (1.0, 0.0) if changed else (0.0, 1.0)
    return rows


def upload_malicious(pair: DriverPair, task_id: str, honest_sum_0: int) -> None:
    """A client that adds 2^63 − 1 − honest_sum_0 − 12·2^F to its leader share of
    coordinate 0, so that S_0 sits twelve units below the sign boundary in D."""
    batch = make_batch(task_id, np.zeros((1, 2)), F)
    rep = batch.leader.reports[0]
    share = np.frombuffer(rep.explicit_share, dtype="<u8").copy()
    share[0] = np.uint64((int(share[0]) + (1 << 63) - 1 - honest_sum_0 - 12 * UNIT) % (1 << 64))
    rep.explicit_share = share.astype("<u8").tobytes()
    pair.leader.core.upload(task_id, [(rep.report_id, rep.explicit_share)])
    pair.helper.core.upload(task_id, [(r.report_id, r.seed) for r in batch.helper.reports])


async def compared_values(tmp_path: Path, changed: bool, robust: bool) -> tuple[np.ndarray, int]:
    """Run the close on D or D' and return what the servers' queries read (the sum
    of both servers' shares, mod 2^64), and the clamp bound n·2^F."""
    tmp_path.mkdir(parents=True)
    async with driver_pair(tmp_path, frac_bits=F, robust=robust) as pair:
        await pair.leader.create_task(
            TaskSpec(
                task_id="w",
                d=2,
                frac_bits=F,
                n_max=1000,
                min_batch=1,
                epsilon_total="10",
                delta_total="0",
                epsilon_min="1/4",
            )
        )
        pair.upload("w", honest_rows(changed))
        upload_malicious(pair, "w", int(honest_rows(False)[:, 0].sum()) * UNIT)
        info = await pair.leader.close_collection("w")
        assert info.agreed
        lt = pair.leader.core.store.task("w")
        ht = pair.helper.core.store.task("w")
        values = pair.leader.core.query_sums(lt) + pair.helper.core.query_sums(ht)
        raw = pair.leader.core.store.sums("w") + pair.helper.core.store.sums("w")
        bound = pair.leader.core.clamp_bound(lt)
        if robust:
            np.testing.assert_array_equal(values, plain_clamp(raw, bound))
        else:
            np.testing.assert_array_equal(values, raw)
        # A stream still runs on these aggregates through the garbled circuit.
        sid = (await pair.leader.open_stream(OpenStream("w", StreamKind.LAP24, "1"))).stream_id
        ans = await pair.leader.ask(Ask(sid, Queries((0, 1) * (K // 2)), (0, 7 * UNIT) * (K // 2)))
        assert ans.index is None or 0 <= ans.index < K
        return values, bound


def privacy_loss(v_d: np.ndarray, v_d2: np.ndarray) -> float:
    """max over outcomes of |ln P[o | D] − ln P[o | D']| for the alternating stream."""
    taus = [0, 7 * UNIT] * (K // 2)
    p = honest_party_outcome_probs([int(v_d[j % 2]) for j in range(K)], taus, "lap24", EPS, F)
    q = honest_party_outcome_probs([int(v_d2[j % 2]) for j in range(K)], taus, "lap24", EPS, F)
    return float(np.max(np.abs(np.log(p) - np.log(q))))


@pytest.mark.parametrize("robust", [True, False], ids=["robust", "control-without-robust"])
async def test_wrap_attack(tmp_path: Path, robust: bool) -> None:
    v_d, bound = await compared_values(tmp_path / "d", False, robust)
    v_d2, _ = await compared_values(tmp_path / "d2", True, robust)
    loss = privacy_loss(v_d, v_d2)
    if robust:
        assert int(v_d[0]) <= bound and int(v_d2[0]) <= bound  # every compared value in [0, N]
        assert loss <= float(EPS) + 1e-9, f"robust aggregates: loss {loss:.4f} > ε"
    else:
        assert int(v_d[0]) > 1 << 62  # the wrapped coordinate really is near the sign bit
        assert loss > float(EPS), f"the control must leak more than ε; loss {loss:.4f}"


def test_exact_probabilities_match_plain_svt() -> None:
    """Far from the sign bit the exact distribution is ordinary SVT: it sums to 1
    and its loss between neighbours is within ε."""
    p = honest_party_outcome_probs([10 * UNIT] * 4, [10 * UNIT] * 4, "lap24", EPS, F)
    q = honest_party_outcome_probs([11 * UNIT] * 4, [10 * UNIT] * 4, "lap24", EPS, F)
    assert math.isclose(p.sum(), 1.0, abs_tol=1e-9) and math.isclose(q.sum(), 1.0, abs_tol=1e-9)
    assert np.max(np.abs(np.log(p) - np.log(q))) <= float(EPS)
