"""Budget plans: the composition rules (exact for basic, conservative for
advanced and zCDP), group admission and refunds, reservation on both servers
(one-process drivers), and the MWEM (ε, δ) run of the review through the real
servers, charged by zCDP on both ledgers."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import Deployment, DriverPair, driver_pair, make_task, off_loop

from svtagg.analyst import applications as apps
from svtagg.analyst.local_oracle import LocalOracle
from svtagg.analyst.oracle import planned
from svtagg.dp.accounting import advanced_composition, zcdp_to_dp
from svtagg.dp.errors import BudgetExhausted, InvalidArgument, PeerUnavailable
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import Group, PlanBook, Rule, plan_charge
from svtagg.dp.task import TaskSpec, safe_epsilon_min
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import Role
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange.party import garbled_circuit_party
from svtagg.servers.exchange.values import (
    OpenStream,
    PlanGroup,
    PlanInfo,
    PlanRequest,
    PrepareStream,
)
from svtagg.servers.helper import HelperDriver
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.memory import MemoryHelperPort
from svtagg.servers.store.sqlite import SqliteStore

TINY = Fraction(1, 10**6)


def test_basic_is_exact_and_wins_without_slack() -> None:
    c = plan_charge([Group(Fraction(1, 3))] * 3)
    assert (c.epsilon, c.delta, c.rule) == (1, 0, Rule.BASIC)


def test_zcdp_charges_the_reviewed_mwem_plan_within_its_budget() -> None:
    """MWEM, T = 20, (ε, δ) = (1, 10^-6): 40 steps of ε0 from advanced composition
    cost 40·ε0 ≈ 1.16 under basic composition, but ≤ 1 through zCDP."""
    step = apps.mwem_step_epsilon(1, 20, 1e-6)
    c = plan_charge([Group(step)] * 40, TINY)
    assert 40 * step > 1 and c.rule == Rule.ZCDP and c.epsilon <= 1 and c.delta == TINY
    rho = float(40 * step**2 / 2)
    # Conservative: never below the real-valued bound, and only just above it.
    assert float(c.epsilon) >= zcdp_to_dp(rho, 1e-6)
    assert float(c.epsilon) - zcdp_to_dp(rho, 1e-6) < 1e-8


def test_advanced_composition_when_groups_have_delta() -> None:
    g = Group(Fraction(1, 100), Fraction(1, 10**9))
    c = plan_charge([g] * 1000, TINY)  # zCDP needs pure groups: advanced is used
    eps, dl = advanced_composition(0.01, 1e-9, 1000, 1e-6)
    assert c.rule == Rule.ADVANCED and float(c.epsilon) >= eps and c.delta == 1000 * g.delta + TINY
    assert c.epsilon < 10  # far below the basic 10


def test_groups_admit_only_what_they_hold_and_basic_plans_refund() -> None:
    book = PlanBook.reserve([Group(Fraction(1, 2)), Group(Fraction(1, 2))])
    book.admit(0, Fraction(1, 4), Fraction(0))
    book.admit(0, Fraction(1, 4), Fraction(0))
    with pytest.raises(InvalidArgument, match="plan group 0"):
        book.admit(0, Fraction(1, 100), Fraction(0))
    with pytest.raises(InvalidArgument, match="out of"):
        book.admit(2, Fraction(1, 100), Fraction(0))
    assert book.refund() == (Fraction(1, 2), 0)  # group 1 never spent
    again = PlanBook.from_json(book.to_json())
    assert again == book
    zc = PlanBook.reserve([Group(Fraction(1, 50))] * 40, TINY)
    assert zc.charge.rule == Rule.ZCDP and zc.refund() == (0, 0)  # never refunded


def test_local_oracle_plan_refuses_whole_and_spends_nothing() -> None:
    o = LocalOracle(np.zeros((10, 2)), 1)
    with pytest.raises(BudgetExhausted):
        o.reserve_plan([(Fraction(3, 4), 0), (Fraction(1, 2), 0)])
    assert o.budget().epsilon_spent == 0
    with planned(o, [(Fraction(1, 2), 0)]) as p:
        p.open_stream(Fraction(1, 4))
        assert o.budget().epsilon_spent == Fraction(1, 2)  # the reservation
        with pytest.raises(InvalidArgument):
            p.open_stream(Fraction(1, 2))  # more than its group holds
    assert o.budget().epsilon_spent == Fraction(1, 4)  # the unused quarter came back


def small_task(epsilon_total: str) -> TaskSpec:
    return TaskSpec(
        task_id="t",
        d=2,
        frac_bits=16,
        n_max=1000,
        min_batch=1,
        epsilon_total=epsilon_total,
        delta_total="0",
        epsilon_min="1/8",
    )


async def test_plans_on_both_servers(tmp_path: Path) -> None:
    async with driver_pair(tmp_path) as pair:
        await pair.leader.create_task(small_task("2"))
        pair.upload("t", np.ones((50, 2)))
        await pair.leader.close_collection("t")

        def spent() -> list[Fraction]:
            return [d.core.store.task("t").budget.epsilon_spent for d in (pair.leader, pair.helper)]

        too_big = PlanRequest("t", (PlanGroup("3"),))
        with pytest.raises(BudgetExhausted):
            await pair.leader.reserve_plan(too_big)
        assert spent() == [0, 0]
        ok = PlanRequest("t", (PlanGroup("1"), PlanGroup("1/2")))
        info = await pair.leader.reserve_plan(ok)
        assert (info.epsilon, info.rule) == (Fraction(3, 2), "basic") and spent() == [
            Fraction(3, 2)
        ] * 2
        req = OpenStream("t", StreamKind.LAP24, "1/2", plan=(info.plan_id, 1))
        await pair.leader.open_stream(req)
        assert spent() == [Fraction(3, 2)] * 2  # counted in the plan, not again
        with pytest.raises(InvalidArgument):
            await pair.leader.open_stream(req)  # group 1 is used up
        assert spent() == [Fraction(3, 2)] * 2
        ended = await pair.leader.end_plan(info.plan_id)
        assert ended.refunded_epsilon == 1 and spent() == [Fraction(1, 2)] * 2
        assert (await pair.leader.end_plan(info.plan_id)).refunded_epsilon == 0  # idempotent
        with pytest.raises(Exception, match="ended"):
            await pair.leader.open_stream(
                OpenStream("t", StreamKind.LAP24, "1/4", plan=(info.plan_id, 0))
            )


async def test_mwem_with_delta_runs_on_the_servers(deployment: Deployment) -> None:
    """The review's MWEM run: T = 20, budget (1, 10^-6).  It completes, and both
    ledgers hold the plan's zCDP charge (≤ 1), not the basic 40·ε0 > 1."""
    attributes, n, t = 4, 200, 20
    wl = apps.MarginalWorkload.build(attributes)
    rng = np.random.default_rng(8)
    x = (rng.random((n, attributes)) < [0.9, 0.7, 0.3, 0.1]).astype(int)
    values = apps.marginals_embedding(x)
    n_max, frac_bits = 1000, 16

    def setup() -> None:
        stub = deployment.analyst_stub()
        make_task(
            stub,
            "mw",
            d=values.shape[1],
            n_max=n_max,
            eps_total="1",
            delta_total="1/1000000",
            eps_min=str(safe_epsilon_min(n_max, frac_bits)),
        )
        with deployment.uploader() as up:
            up.upload("mw", values, batch_size=64)
        stub.CloseCollection(pb.TaskRef(task_id="mw"), timeout=30)

    await off_loop(setup)

    def run() -> tuple[apps.MwemResult, object]:
        with deployment.oracle("mw") as oracle:
            res = apps.mwem_svt(oracle, wl, 1, 0.1, rounds=t, delta=1e-6)
            return res, oracle.describe()

    res, info = await off_loop(run)
    assert res.rounds == t and res.synthetic.sum() == pytest.approx(n)
    charge = plan_charge([Group(res.step_epsilon)] * (2 * t), TINY)
    assert charge.rule == Rule.ZCDP and charge.epsilon <= 1
    for b in (info.budget, info.helper_budget):  # type: ignore[attr-defined]
        assert Fraction(b.epsilon_spent) == charge.epsilon
        assert Fraction(b.delta_spent) == TINY
    assert not math.isclose(float(charge.epsilon), float(2 * t * res.step_epsilon))


async def _restart(pair: DriverPair, root: Path) -> None:
    """Both servers stop and start again on their stores (a new leader driver
    reconciles every task before its next stream, as after a process restart)."""
    await pair.leader.pool.close()
    await pair.port.close()
    pair.leader.core.store.close()
    pair.helper.core.store.close()
    pair.helper = HelperDriver(
        ServerCore(Role.HELPER, SqliteStore(root / "h.sqlite")), garbled_circuit_party
    )
    pair.port = MemoryHelperPort(pair.helper)
    pair.leader = LeaderDriver(
        ServerCore(Role.LEADER, SqliteStore(root / "l.sqlite")), pair.port, garbled_circuit_party
    )


def _ledgers(pair: DriverPair, task_id: str) -> list[tuple[Fraction, Fraction]]:
    return [
        (b.epsilon_spent, b.delta_spent)
        for b in (d.core.store.task(task_id).budget for d in (pair.leader, pair.helper))
    ]


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
@pytest.mark.parametrize("total", ["2", "10"])
async def test_a_plan_stream_the_helper_missed_is_replayed_in_its_group(
    tmp_path: Path, total: str, restart: bool
) -> None:
    """The helper is down when a stream of a reserved plan opens (and both
    servers may restart afterwards).  Reconciliation replays the stream's charge
    on the helper in the plan's group (not on the task's ledger): the ledgers
    stay equal, and a plan that holds the rest of the budget (total 2) does not
    make every later call fail with BudgetExhausted."""
    async with driver_pair(tmp_path) as pair:
        await pair.leader.create_task(small_task(total))
        pair.upload("t", np.ones((50, 2)))
        await pair.leader.close_collection("t")
        plan = await pair.leader.reserve_plan(PlanRequest("t", (PlanGroup("1"), PlanGroup("1"))))

        def in_plan(group: int, eps: str) -> OpenStream:
            return OpenStream("t", StreamKind.LAP24, eps, plan=(plan.plan_id, group))

        pair.port.available = False
        with pytest.raises(PeerUnavailable):
            await pair.leader.open_stream(in_plan(0, "1/2"))
        pair.port.available = True
        if restart:
            await _restart(pair, tmp_path)
        info = await pair.leader.describe("t")
        assert Fraction(info.budget.epsilon_spent) == Fraction(info.helper_budget.epsilon_spent)
        assert _ledgers(pair, "t") == [(Fraction(2), Fraction(0))] * 2
        book, _, _ = pair.helper.core.store.plan(plan.plan_id)
        assert book.spent[0] == (Fraction(1, 2), 0)  # the replayed stream, in its group
        await pair.leader.open_stream(in_plan(0, "1/2"))  # what group 0 has left
        with pytest.raises(InvalidArgument):
            await pair.leader.open_stream(in_plan(0, "1/8"))  # group 0 is used up
        ended = await pair.leader.end_plan(plan.plan_id)
        assert ended.refunded_epsilon == 1  # group 1 was never used
        assert _ledgers(pair, "t") == [(Fraction(1), Fraction(0))] * 2


async def test_a_plan_the_leader_died_reserving_is_reserved_on_the_helper(tmp_path: Path) -> None:
    """The leader dies after committing its plan reservation, before the helper
    reserved it (the analyst got no answer and never learns the plan's id).  On
    restart the plan is active on the leader only; reconciliation reserves it on
    the helper as well, so both ledgers hold its charge (never refunded), and
    the task goes on: a fresh plan reserves, admits a stream and ends."""
    async with driver_pair(tmp_path) as pair:
        await pair.leader.create_task(small_task("10"))
        pair.upload("t", np.ones((50, 2)))
        await pair.leader.close_collection("t")
        two = PlanRequest("t", (PlanGroup("1/2"), PlanGroup("1/2")))
        pair.leader.core.reserve_plan("a" * 32, two)  # the leader's half of ReservePlan
        await _restart(pair, tmp_path)
        info = await pair.leader.describe("t")
        assert Fraction(info.budget.epsilon_spent) == Fraction(info.helper_budget.epsilon_spent)
        assert _ledgers(pair, "t") == [(Fraction(1), Fraction(0))] * 2
        assert pair.helper.core.store.plan("a" * 32)[1] == "active"
        plan = await pair.leader.reserve_plan(two)
        await pair.leader.open_stream(
            OpenStream("t", StreamKind.LAP24, "1/2", plan=(plan.plan_id, 0))
        )
        assert (await pair.leader.end_plan(plan.plan_id)).refunded_epsilon == Fraction(1, 2)
        assert _ledgers(pair, "t") == [(Fraction(3, 2), Fraction(0))] * 2


async def test_a_plan_stream_the_leader_died_opening_is_replayed_in_its_group(
    tmp_path: Path,
) -> None:
    """The leader dies after charging a stream of a reserved plan (`opening`),
    before the helper charged it: on restart the stream is failed, and
    reconciliation replays its charge on the helper in the plan's group, so
    that ending the plan refunds the same on both servers."""
    async with driver_pair(tmp_path) as pair:
        await pair.leader.create_task(small_task("10"))
        pair.upload("t", np.ones((50, 2)))
        await pair.leader.close_collection("t")
        plan = await pair.leader.reserve_plan(
            PlanRequest("t", (PlanGroup("1/2"), PlanGroup("1/2")))
        )
        pair.leader.core.open_stream(
            PrepareStream("b" * 32, "t", StreamKind.LAP24, "1/2", "", (plan.plan_id, 1)),
            open_now=False,
        )
        await _restart(pair, tmp_path)
        assert (await pair.leader.end_plan(plan.plan_id)).refunded_epsilon == Fraction(1, 2)
        assert _ledgers(pair, "t") == [(Fraction(1, 2), Fraction(0))] * 2
        assert [d.core.store.stream("b" * 32).state for d in (pair.leader, pair.helper)] == [
            "failed",
            "failed",
        ]


async def test_a_reconciliation_cut_off_by_the_helper_is_done_again(tmp_path: Path) -> None:
    """The helper is lost in the middle of the reconciliation after a restart
    (the plan the leader died reserving not yet reserved there): the next
    reconciliation still owes it, and brings the ledgers together."""
    async with driver_pair(tmp_path) as pair:
        await pair.leader.create_task(small_task("10"))
        pair.upload("t", np.ones((50, 2)))
        await pair.leader.close_collection("t")
        pair.leader.core.reserve_plan("a" * 32, PlanRequest("t", (PlanGroup("1/2"),)))
        await _restart(pair, tmp_path)
        reserve = pair.helper.reserve_plan

        async def lost(request: PlanRequest) -> PlanInfo:
            pair.helper.reserve_plan = reserve  # type: ignore[method-assign]
            raise PeerUnavailable("helper: UNAVAILABLE (lost during the reconciliation)")

        pair.helper.reserve_plan = lost  # type: ignore[method-assign]
        with pytest.raises(PeerUnavailable):
            await pair.leader.ledgers.sync("t")
        assert _ledgers(pair, "t") == [(Fraction(1, 2), 0), (0, 0)]
        await pair.leader.describe("t")
        assert _ledgers(pair, "t") == [(Fraction(1, 2), Fraction(0))] * 2
