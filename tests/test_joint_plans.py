"""Budget plans on a joint-noise task (docs/privacy.md, "Jointly generated
noise", composition over a plan): the scan selection runs end to end through
the one-process reference pair inside a plan whose group carries the joint δ of
every stream it may open, both ledgers show the same (ε, δ), and a plan that
under-declares δ is refused before any stream opens — by the SDK before it
reserves, and by each server at admission when the SDK's check is bypassed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from svtagg.analyst.oracle import OracleStats, plan_groups, planned
from svtagg.analyst.selection import ScanOptions, scan_selection
from svtagg.analyst.selection.scan import scan_plan
from svtagg.dp import accuracy
from svtagg.dp.errors import InvalidArgument
from svtagg.dp.jointsvt import JOINT_SVT_KINDS, joint_group_delta, joint_stream_noise
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanCharge, Rule
from svtagg.dp.queries import Budget, Number, Query, encode_thresholds
from svtagg.dp.task import TaskSpec
from svtagg.servers.exchange.values import (
    Ask,
    OpenStream,
    PlanGroup,
    PlanRequest,
    PrepareStream,
    Queries,
)
from svtagg.servers.reference import ReferencePair, reference_pair

F = 6
N = 40
SCORES = [0.1, 0.2, 0.0, 0.3, 0.1, 1.0, 0.2, 0.0]  # coordinate 5 is the max (N units)


def spec(task_id: str, noise: str = "joint") -> TaskSpec:
    return TaskSpec(
        task_id=task_id,
        d=len(SCORES),
        frac_bits=F,
        n_max=10 * N,
        min_batch=1,
        epsilon_total="40",
        delta_total="1/1000000",
        epsilon_min="1/256",
        noise=noise,
    )


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[ReferencePair]:
    async with reference_pair(tmp_path, frac_bits=F) as p:
        await p.leader.create_task(spec("t"))
        p.upload("t", np.tile(SCORES, (N, 1)))
        await p.leader.close_collection("t")
        yield p


class _PairStream:
    def __init__(self, oracle: PairOracle, stream_id: str, kind: StreamKind, eps: Fraction):
        self.oracle, self.stream_id = oracle, stream_id
        self.kind, self.epsilon, self.delta = kind, eps, Fraction(0)
        self._closed = False
        self._answered = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queries_answered(self) -> int:
        return self._answered

    def ask(self, chunk: Sequence[tuple[Query, Number]]) -> int | None:
        queries = Queries(tuple(q.index for q, _ in chunk), tuple(q.complement for q, _ in chunk))
        taus = tuple(int(t) for t in encode_thresholds([t for _, t in chunk], F))
        answer = self.oracle.run(self.oracle.pair.leader.ask(Ask(self.stream_id, queries, taus)))
        self._closed = answer.closed
        self._answered += len(chunk) if answer.index is None else answer.index + 1
        return answer.index

    def compare(self, chunk: Any) -> Any:
        raise NotImplementedError("the scan selection asks AboveThreshold chunks only")

    def alpha(self, k: int, beta: float) -> float:
        return self.oracle.accuracy(self.kind, self.epsilon, k, beta)


class PairOracle:
    """The analyst SDK's view of a joint-noise task on the reference pair: the
    algorithms run in a worker thread, each call runs on the pair's event loop."""

    noise = "joint"
    frac_bits = F

    def __init__(self, pair: ReferencePair, loop: asyncio.AbstractEventLoop) -> None:
        self.pair, self.loop = pair, loop
        self._stats = OracleStats()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @property
    def n(self) -> int:
        return N

    @property
    def d(self) -> int:
        return len(SCORES)

    @property
    def parties(self) -> int:
        return 2

    def open_stream(
        self,
        epsilon: Number | str,
        kind: StreamKind | str = StreamKind.LAP24,
        delta: Number | str = 0,
        plan: tuple[str, int] | None = None,
    ) -> _PairStream:
        k, eps = StreamKind.parse(kind), Fraction(str(epsilon))
        info = self.run(self.pair.leader.open_stream(OpenStream("t", k, str(eps), "", plan)))
        self._stats.streams += 1
        return _PairStream(self, info.stream_id, k, eps)

    def noisy_max(self, *args: Any, **kw: Any) -> int:
        raise NotImplementedError("not used by the scan selection")

    def reserve_plan(
        self, groups: Sequence[tuple[Number | str, Number | str]], delta_slack: Number | str = 0
    ) -> tuple[str, PlanCharge]:
        request = PlanRequest(
            "t", tuple(PlanGroup(str(e), str(d)) for e, d in groups), str(delta_slack)
        )
        info = self.run(self.pair.leader.reserve_plan(request))
        return info.plan_id, PlanCharge(info.epsilon, info.delta, Rule(info.rule))

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        info = self.run(self.pair.leader.end_plan(plan_id))
        return info.refunded_epsilon, info.refunded_delta

    def accuracy(self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float) -> float:
        # As the remote SDK on a joint task: the α of one draw of the sampler.
        return accuracy.joint_alpha(kind, epsilon, k, beta, F)

    def budget(self) -> Budget:
        return self.pair.leader.core.task("t").budget

    def stats(self) -> OracleStats:
        return self._stats


def _ledgers(p: ReferencePair) -> list[tuple[Fraction, Fraction]]:
    out = []
    for core in (p.leader.core, p.helper.core):
        b = core.task("t").budget
        out.append((b.epsilon_spent, b.delta_spent))
    return out


OPTIONS = ScanOptions(kind=StreamKind.LAP24)


async def test_scan_selection_runs_on_a_joint_noise_task(pair: ReferencePair) -> None:
    oracle = PairOracle(pair, asyncio.get_running_loop())
    eps = Fraction(4)

    def run() -> tuple[Any, list[tuple[StreamKind, Fraction]], int]:
        plan = scan_plan(oracle, eps, 0.1, options=OPTIONS)
        streams = plan.stream_budgets()
        groups = plan_groups(oracle, [streams])
        with planned(oracle, groups, streams=[streams]) as view:
            result = scan_selection(view, eps, 0.1, plan=plan)
            return result, streams, view.opened

    result, streams, opened = await asyncio.to_thread(run)
    assert result.index == 5
    assert 2 <= opened <= len(streams)
    # The plan held exactly the joint δ of every stream it could open; it ended
    # and refunded what the unopened streams did not spend, so both ledgers show
    # the opened streams' (ε, joint δ) — exactly, and the same on both servers.
    per_stream = [joint_stream_noise(k, e, F).delta_charge for k, e in streams]
    assert joint_group_delta(streams, F) == sum(per_stream) > 0
    spent = (sum(e for _, e in streams[:opened]), sum(per_stream[:opened]))
    assert _ledgers(pair) == [spent, spent]


async def test_the_kind_auto_picks_a_joint_kind(pair: ReferencePair) -> None:
    oracle = PairOracle(pair, asyncio.get_running_loop())
    plan = scan_plan(oracle, Fraction(4), 0.1)
    # exp3's one-sided noise has the smallest α here, as with independent noise
    assert plan.kind == StreamKind.EXP3
    assert plan.kind in JOINT_SVT_KINDS


async def test_an_under_declared_plan_is_refused_before_any_stream(pair: ReferencePair) -> None:
    """The SDK refuses a plan whose group lacks its streams' joint δ before it
    reserves anything; the control (the δ = 0 plan the run algorithms used to
    reserve) is what it refuses."""
    oracle = PairOracle(pair, asyncio.get_running_loop())
    eps = Fraction(4)
    plan = scan_plan(oracle, eps, 0.1, options=OPTIONS)
    streams = plan.stream_budgets()
    need = plan_groups(oracle, [streams])[0]
    short = need[1] - joint_stream_noise(streams[-1][0], streams[-1][1], F).delta_charge
    for delta in (Fraction(0), short):

        def run(d: Fraction = delta) -> None:
            with planned(oracle, [(need[0], d)], streams=[streams]) as view:
                scan_selection(view, eps, 0.1, plan=plan)

        with pytest.raises(ValueError, match="under-declares"):
            await asyncio.to_thread(run)
    assert _ledgers(pair) == [(0, 0), (0, 0)]
    assert pair.leader.core.task("t").streams == 0


async def test_both_servers_refuse_a_stream_past_its_groups_delta(pair: ReferencePair) -> None:
    """The servers enforce it, each on its own book: a plan reserved directly
    with δ below one joint stream's charge admits no stream on the leader, and
    the helper refuses the same stream when asked to prepare it."""
    kind, eps = StreamKind.LAP24, Fraction(1)
    charge = joint_stream_noise(kind, eps, F).delta_charge
    request = PlanRequest("t", (PlanGroup("1", str(charge / 2)),))
    plan = await pair.leader.reserve_plan(request)
    reserved = _ledgers(pair)
    assert reserved == [(1, charge / 2)] * 2
    with pytest.raises(InvalidArgument, match="plan group 0"):
        await pair.leader.open_stream(OpenStream("t", kind, "1", "", (plan.plan_id, 0)))
    prepare = PrepareStream("s" * 32, "t", kind, "1", "", (plan.plan_id, 0))
    with pytest.raises(InvalidArgument, match="plan group 0"):
        pair.helper.core.open_stream(prepare)
    assert _ledgers(pair) == reserved
    # With the charge declared, the same stream opens on both.
    await pair.leader.end_plan(plan.plan_id)
    ok = await pair.leader.reserve_plan(PlanRequest("t", (PlanGroup("1", str(charge)),)))
    await pair.leader.open_stream(OpenStream("t", kind, "1", "", (ok.plan_id, 0)))
    assert _ledgers(pair) == [(1, charge)] * 2
