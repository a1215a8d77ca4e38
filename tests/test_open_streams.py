"""Streams opened together (`RemoteOracle.open_streams`, `Session.open_ahead`):
concurrent OpenStream calls against two server processes, each charged on both
ledgers as a single open is; a refusal leaves the others charged and open, and
the selection that opens its certain streams ahead spends exactly its plan."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from svtagg.analyst.oracle import PlannedOracle
from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.analyst.selection import scan_selection
from svtagg.analyst.selection.records import Candidates
from svtagg.analyst.selection.session import Session
from svtagg.benchmarks.storeview import store_view
from svtagg.client.upload import Uploader
from svtagg.deploy.jobs import analyst_stub, task_spec
from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment
from svtagg.dp.errors import BudgetExhausted
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.tls import Identity


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("open")
    d = LocalDeployment(root, server_args=UNCAPPED_SERVER_ARGS)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def _task(dep: LocalDeployment, task_id: str, eps_total: str) -> np.ndarray:
    stub = analyst_stub(dep.address("leader"), dep.certs)
    stub.CreateTask(task_spec(task_id, 6, 1000, eps_total), timeout=30)
    values = np.zeros((400, 6))
    values[:, 4] = 1.0
    values[:150, 2] = 1.0
    c = Identity.load(dep.certs, "client")
    with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
        up.upload(task_id, values, batch_size=200)
    stub.CloseCollection(pb.TaskRef(task_id=task_id), timeout=60)
    return values.sum(axis=0)


def _spent(dep: LocalDeployment, task_id: str) -> list[Fraction]:
    return [
        store_view(dep.root / f"{r}.sqlite", task_id).epsilon_spent for r in ("leader", "helper")
    ]


def test_open_streams_charges_each_and_keeps_what_opened(dep: LocalDeployment) -> None:
    _task(dep, "many", "3")
    with RemoteOracle.from_certs(dep.address("leader"), "many", dep.certs) as o:
        streams = o.open_streams(["1/2"] * 4)
        assert len({s.stream_id for s in streams}) == 4
        assert _spent(dep, "many") == [Fraction(2)] * 2
        # each answers on its own: a NO far above every score, a YES below
        assert streams[0].ask([(Query(4), 900)]) is None
        assert streams[1].ask([(Query(0), 900), (Query(4), 200)]) == 1
        # 1 left: two of three fit, the third is refused, the two stay charged
        with pytest.raises(BudgetExhausted):
            o.open_streams(["1/2"] * 3)
        assert _spent(dep, "many") == [Fraction(3)] * 2
        assert o.stats().streams == 6
        assert o.budget().epsilon_spent == 3


def test_open_ahead_hands_out_in_order_and_a_plan_spends_exactly(dep: LocalDeployment) -> None:
    _task(dep, "ahead", "10")
    with RemoteOracle.from_certs(dep.address("leader"), "ahead", dep.certs) as o:
        session = Session(o, "lap24")
        session.open_ahead([Fraction(1), Fraction(1, 2)])
        assert _spent(dep, "ahead") == [Fraction(3, 2)] * 2
        assert session.spend.streams == 2 and session.spend.epsilon == Fraction(3, 2)
        with pytest.raises(ValueError, match="opened ahead has ε = 1, not 1/2"):
            session.open(Fraction(1, 2))
        cands = Candidates.coordinates(6)
        # refused without taking it: they come out in order, the spend unchanged
        assert session.ask(session.open(Fraction(1)), cands, range(6), 900.0) is None
        assert session.ask(session.open(Fraction(1, 2)), cands, range(6), 900.0) is None
        assert session.spend.streams == 2
        plan_id, charge = o.reserve_plan([(2, 0)])
        planned = PlannedOracle(o, plan_id, charge)
        res = scan_selection(planned, 2, 0.1)
        o.end_plan(plan_id)
        assert res.index == 4
        assert res.spend.epsilon == 2 and planned.opened == res.spend.streams
        assert _spent(dep, "ahead") == [Fraction(3, 2) + 2] * 2
