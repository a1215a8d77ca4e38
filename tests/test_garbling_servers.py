"""The servers' garbling scheme (`--garbling`, servers/exchange/garbling.py): a stream
answered under three-halves through the reference pair, the leader naming its
scheme in SessionOpen, a helper on another scheme refusing the session before
any OT runs (its party is never made), the option, and two server processes
under three-halves end to end (and refusing a leader on half-gates)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import driver_pair

from svtagg.deploy.cli import main
from svtagg.deploy.launch import LocalDeployment
from svtagg.dp.errors import InvalidArgument
from svtagg.dp.task import TaskSpec
from svtagg.mpc.threehalves import SCHEMES
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.tls import Identity
from svtagg.proto.vocab import Role
from svtagg.servers.exchange.garbling import (
    DEFAULT_GARBLING,
    GARBLING_SCHEMES,
    GarbledCircuitParties,
    check_garbling,
    garbling_of,
    ot_of,
)
from svtagg.servers.exchange.values import Ask, Queries

F = 16
N = 200
UNIT = 1 << F
HIGH, LOW = 10 * N * UNIT, -(N * UNIT)


class Spy(GarbledCircuitParties):
    """The real engine under one scheme (and OT extension), remembering the
    parties it made."""

    def __init__(self, garbling: str, ot: str | None = None) -> None:
        super().__init__(garbling, ot)
        self.made: list[tuple[Role, Any]] = []

    def __call__(self, role: Role, channel: Any, session_id: bytes) -> Any:
        party = super().__call__(role, channel, session_id)
        self.made.append((role, party))
        return party


class Opens:
    def __init__(self) -> None:
        self.seen: list[pb.SessionOpen] = []

    def tap(self, what: str, name: str, data: bytes) -> None:
        if name == "frame":
            frame = pb.PeerFrame.FromString(data)
            if frame.WhichOneof("body") == "open":
                self.seen.append(frame.open)


async def _ready(pair: Any) -> str:
    await pair.leader.create_task(TaskSpec("t", 3, F, 10 * N, 1, "20", "0", "1/4", False))
    pair.upload("t", np.ones((N, 3)))
    await pair.leader.close_collection("t")
    return str(await pair.open("t"))


def test_the_schemes_are_the_engines() -> None:
    assert GARBLING_SCHEMES == SCHEMES and DEFAULT_GARBLING in SCHEMES
    assert garbling_of(GarbledCircuitParties("threehalves")) == "threehalves"
    assert garbling_of(lambda role, channel, sid: None) == DEFAULT_GARBLING  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="unknown garbling scheme"):
        GarbledCircuitParties("fourquarters")
    check_garbling("", DEFAULT_GARBLING)  # a leader naming none: the default
    with pytest.raises(InvalidArgument, match="'threehalves' is not this helper's 'halfgates'"):
        check_garbling("threehalves", "halfgates")


@pytest.mark.parametrize("scheme", GARBLING_SCHEMES)
async def test_a_stream_under_each_scheme(tmp_path: Path, scheme: str) -> None:
    opens = Opens()
    spy = Spy(scheme)
    async with driver_pair(tmp_path, spy, tap=opens.tap) as pair:
        sid = await _ready(pair)
        assert not (await pair.leader.ask(Ask(sid, Queries((0, 1)), (HIGH, HIGH)))).yes
        answer = await pair.leader.ask(Ask(sid, Queries((2, 0)), (LOW, LOW)))
        assert answer.yes and answer.index == 0
    assert [o.garbling for o in opens.seen] == [scheme]
    roles = sorted(str(role) for role, _ in spy.made)
    assert roles == sorted([str(Role.LEADER), str(Role.HELPER)])
    assert {party.scheme for _, party in spy.made} == {scheme}


@pytest.mark.parametrize(
    ("leader", "helper"), [("threehalves", "halfgates"), ("halfgates", "threehalves")]
)
async def test_the_helper_refuses_another_scheme_before_any_ot(
    tmp_path: Path, leader: str, helper: str
) -> None:
    lead, help_ = Spy(leader), Spy(helper)
    async with driver_pair(tmp_path, lead, helper_party=help_) as pair:
        await pair.leader.create_task(TaskSpec("t", 3, F, 10 * N, 1, "20", "0", "1/4", False))
        pair.upload("t", np.ones((N, 3)))
        # The close's robust-aggregate pass is the first session.
        with pytest.raises(Exception, match=f"garbling scheme '{leader}' is not this helper's"):
            await pair.leader.close_collection("t")
    assert help_.made == []  # refused at SessionOpen: no party, no base OT
    assert all(not getattr(p, "_ready", False) for _, p in lead.made)


@pytest.mark.parametrize("ot", ["iknp", "softspoken:2", "ferret:tiny"])
async def test_a_stream_under_each_ot_extension(
    tmp_path: Path, ot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The servers' `ot` (`--ot`) is what both parties run and what the leader
    names in SessionOpen, whatever SVTAGG_OT says."""
    from svtagg.mpc.softspoken import parse_ot

    monkeypatch.setenv("SVTAGG_OT", "softspoken:8")
    opens = Opens()
    spy = Spy(DEFAULT_GARBLING, ot)
    assert ot_of(spy) == ot
    async with driver_pair(tmp_path, spy, tap=opens.tap) as pair:
        sid = await _ready(pair)
        answer = await pair.leader.ask(Ask(sid, Queries((2, 0)), (LOW, LOW)))
        assert answer.yes and answer.index == 0
    assert {o.ot_extension for o in opens.seen} == {ot}
    assert {party.ot for _, party in spy.made} == {parse_ot(ot)}


async def test_the_helper_refuses_another_ot_extension(tmp_path: Path) -> None:
    lead, help_ = Spy(DEFAULT_GARBLING, "iknp"), Spy(DEFAULT_GARBLING, "softspoken:4")
    async with driver_pair(tmp_path, lead, helper_party=help_) as pair:
        await pair.leader.create_task(TaskSpec("t", 3, F, 10 * N, 1, "20", "0", "1/4", False))
        pair.upload("t", np.ones((N, 3)))
        with pytest.raises(Exception, match="OT extension 'iknp' is not this helper's"):
            await pair.leader.close_collection("t")
    assert help_.made == []


def test_an_unknown_ot_extension_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    rc, out = _cli(
        "server", "--role", "helper", "--db", str(tmp_path / "h.sqlite"),
        "--certs", str(tmp_path / "certs"), "--ot", "softspoken:3",
    )  # fmt: skip
    assert rc != 0 and "unknown OT extension 'softspoken:3'" in out, out
    assert not (tmp_path / "h.sqlite").exists()
    with pytest.raises(ValueError, match="unknown OT extension"):
        GarbledCircuitParties(DEFAULT_GARBLING, "ferret:b99")


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue() + err.getvalue()


def test_server_processes_under_three_halves(tmp_path: Path) -> None:
    dep = LocalDeployment(tmp_path, server_args=["--garbling", "threehalves"])
    dep.start()
    try:
        common = ["--certs", str(dep.certs), "--task", "g"]
        leader = ["--leader", dep.address("leader"), *common]
        rc, out = _cli("analyst", "create-task", *leader, "--d", "20", "--min-batch", "10")
        assert rc == 0, out
        values = np.zeros((500, 20))
        values[:, 3] = 1.0
        c = Identity.load(dep.certs, "client")
        from svtagg.client.upload import Uploader

        with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
            assert up.upload("g", values, batch_size=250).reports == 500
        rc, out = _cli("analyst", "close", *leader)
        assert rc == 0, out
        run = ["analyst", "run", *leader, "--algorithm", "top-k", "--k", "1", "--epsilon", "2"]
        rc, out = _cli(*run, "--seed", "1")
        assert rc == 0, out
        assert json.loads(out)["selected"] == [3]
        # The leader restarted on half-gates: the helper refuses its sessions.
        assert dep.stop_role("leader") == 0
        dep.role_args["leader"] = ["--garbling", "halfgates"]
        dep.start_role("leader")
        leader = ["--leader", dep.address("leader"), *common]
        rc, out = _cli(
            "analyst",
            "run",
            *leader,
            "--algorithm",
            "top-k",
            "--k",
            "1",
            "--epsilon",
            "1",
            "--seed",
            "2",
        )
        assert rc != 0 and "garbling scheme 'halfgates' is not this helper's" in out, out
    finally:
        dep.stop()
