"""Server refusals, authorization by certificate role, replays and fail-closed
recovery: every bad input gets one meaningful status and changes nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import Deployment, make_task, off_loop

from svtagg.client.upload import make_batch
from svtagg.dp.kinds import StreamKind
from svtagg.dp.queries import MAX_CHUNK
from svtagg.proto import health_pb2, health_pb2_grpc
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import Identity, tls_target, write_deployment
from svtagg.servers.store.rules import FAILED
from svtagg.servers.store.sqlite import SqliteStore

Code = grpc.StatusCode


def code_of(fn: Callable[[], Any]) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[attr-defined,no-any-return]
    return Code.OK


def channel(
    addr: str, ident: Identity | None, ca: bytes | None = None, server: str = "leader"
) -> grpc.Channel:
    if ident is None:
        return grpc.insecure_channel(addr)
    creds = grpc.ssl_channel_credentials(ca or ident.ca, ident.key, ident.cert)
    return grpc.secure_channel(addr, creds, options=tls_target(server))


def ingest(dep: Deployment, role: str = "leader", as_role: str = "client") -> Any:
    addr = dep.leader_addr if role == "leader" else dep.helper_addr
    return pb_grpc.IngestStub(channel(addr, dep.identity(as_role), server=role))


def _closed_task(dep: Deployment, n: int = 20, d: int = 4, **kw: Any) -> Any:
    stub = dep.analyst_stub()
    make_task(stub, "t", d=d, **kw)
    with dep.uploader() as up:
        up.upload("t", np.random.default_rng(1).random((n, d)), batch_size=10)
    stub.CloseCollection(pb.TaskRef(task_id="t"), timeout=10)
    return stub


async def test_roles_are_enforced(deployment: Deployment, tmp_path: Path):
    dep = deployment

    def peer_as(role: str) -> Any:
        return pb_grpc.PeerStub(channel(dep.helper_addr, dep.identity(role), server="helper"))

    def run() -> dict[str, grpc.StatusCode]:
        make_task(dep.analyst_stub(), "t")
        ref = pb.TaskRef(task_id="t")
        other = write_deployment(tmp_path / "other-ca")
        out = {
            "client->analyst": code_of(
                lambda: dep.analyst_stub("client").DescribeTask(ref, timeout=5)
            ),
            "helper-cert->analyst": code_of(
                lambda: dep.analyst_stub("helper").DescribeTask(ref, timeout=5)
            ),
            "analyst->peer": code_of(lambda: peer_as("analyst").Budget(ref, timeout=5)),
            "client->peer": code_of(lambda: peer_as("client").Budget(ref, timeout=5)),
            "analyst->upload": code_of(
                lambda: ingest(dep, as_role="analyst").Upload(
                    pb.UploadBatch(task_id="t"), timeout=5
                )
            ),
            "other-ca": code_of(
                lambda: pb_grpc.AnalystStub(
                    channel(
                        dep.leader_addr, Identity.load(other, "analyst"), dep.identity("analyst").ca
                    )
                ).DescribeTask(ref, timeout=5)
            ),
            "plaintext": code_of(
                lambda: pb_grpc.AnalystStub(channel(dep.leader_addr, None)).DescribeTask(
                    ref, timeout=5
                )
            ),
            "analyst ok": code_of(lambda: dep.analyst_stub().DescribeTask(ref, timeout=5)),
        }
        return out

    out = await off_loop(run)
    assert out.pop("analyst ok") == Code.OK
    assert out.pop("other-ca") == Code.UNAVAILABLE  # handshake refused
    assert out.pop("plaintext") == Code.UNAVAILABLE
    assert set(out.values()) == {Code.UNAUTHENTICATED}, out


async def test_health_serving(deployment: Deployment):
    def run() -> int:
        stub = health_pb2_grpc.HealthStub(
            channel(deployment.leader_addr, deployment.identity("analyst"))
        )
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status  # type: ignore[no-any-return]

    assert await off_loop(run) == health_pb2.HealthCheckResponse.SERVING


async def test_task_refusals(deployment: Deployment):
    def run() -> dict[str, grpc.StatusCode]:
        stub = deployment.analyst_stub()
        make_task(stub, "t")
        return {
            "dup": code_of(lambda: make_task(stub, "t")),
            "bad id": code_of(lambda: make_task(stub, "bad id!")),
            "d=0": code_of(lambda: make_task(stub, "a", d=0)),
            "overflow": code_of(lambda: make_task(stub, "b", n_max=2**40, frac_bits=30)),
            "eps nan": code_of(lambda: make_task(stub, "c", eps_total="nan")),
            "eps<=0": code_of(lambda: make_task(stub, "c", eps_total="-1")),
            "eps_min tiny": code_of(lambda: make_task(stub, "e", eps_min="1/10**30")),
            "min_batch>n_max": code_of(lambda: make_task(stub, "f", n_max=5, min_batch=6)),
        }

    out = await off_loop(run)
    assert out.pop("dup") == Code.ALREADY_EXISTS
    assert set(out.values()) == {Code.INVALID_ARGUMENT}, out


async def test_upload_refusals_and_replays(deployment: Deployment):
    dep = deployment

    def run() -> tuple[dict[str, grpc.StatusCode], Any, Any]:
        make_task(dep.analyst_stub(), "t", d=3, n_max=25)
        lead, helper = ingest(dep), ingest(dep, "helper")
        batch = make_batch("t", np.full((10, 3), 0.5), 16)
        good = lead.Upload(batch.leader, timeout=5), helper.Upload(batch.helper, timeout=5)
        short = pb.UploadBatch(task_id="t")
        short.reports.add(report_id=os.urandom(16), explicit_share=b"\0" * 16)
        dup_in_batch = pb.UploadBatch(task_id="t")
        rid = os.urandom(16)
        for _ in range(2):
            dup_in_batch.reports.add(report_id=rid, explicit_share=b"\0" * 24)
        bad_id = pb.UploadBatch(task_id="t")
        bad_id.reports.add(report_id=b"x", explicit_share=b"\0" * 24)
        big = make_batch("t", np.zeros((16, 3)), 16)
        out = {
            "replay leader": code_of(lambda: lead.Upload(batch.leader, timeout=5)),
            "replay helper": code_of(lambda: helper.Upload(batch.helper, timeout=5)),
            "unknown task": code_of(
                lambda: lead.Upload(
                    pb.UploadBatch(task_id="nope", reports=batch.leader.reports), timeout=5
                )
            ),
            "short share": code_of(lambda: lead.Upload(short, timeout=5)),
            "seed to leader": code_of(lambda: lead.Upload(batch.helper, timeout=5)),
            "share to helper": code_of(lambda: helper.Upload(batch.leader, timeout=5)),
            "dup in batch": code_of(lambda: lead.Upload(dup_in_batch, timeout=5)),
            "bad report id": code_of(lambda: lead.Upload(bad_id, timeout=5)),
            "empty": code_of(lambda: lead.Upload(pb.UploadBatch(task_id="t"), timeout=5)),
            "over n_max": code_of(lambda: lead.Upload(big.leader, timeout=5)),
            "query while open": code_of(
                lambda: dep.analyst_stub().OpenStream(
                    pb.OpenStreamRequest(task_id="t", kind=pb.LAP24, epsilon="1"), timeout=5
                )
            ),
        }
        after = dep.analyst_stub().DescribeTask(pb.TaskRef(task_id="t"), timeout=5)
        dep.analyst_stub().CloseCollection(pb.TaskRef(task_id="t"), timeout=5)
        out["after close"] = code_of(
            lambda: lead.Upload(make_batch("t", np.zeros((1, 3)), 16).leader, timeout=5)
        )
        return out, good, after

    out, good, after = await off_loop(run)
    # The uploader is not told n (GetTask withholds it from clients too).
    assert good[0].n == good[1].n == 0
    assert after.n == 10  # nothing refused was counted
    assert out.pop("replay leader") == out.pop("replay helper") == Code.ALREADY_EXISTS
    assert out.pop("unknown task") == Code.NOT_FOUND
    assert out.pop("over n_max") == Code.RESOURCE_EXHAUSTED
    assert out.pop("query while open") == out.pop("after close") == Code.FAILED_PRECONDITION
    assert set(out.values()) == {Code.INVALID_ARGUMENT}, out


async def test_close_reconciles_reports_only_one_server_has(deployment: Deployment):
    """Clients that gave up between the two uploads: the close takes such reports
    out on the one server that has them; n and S_L + S_H then cover exactly the
    reports both servers stored."""
    dep = deployment

    def run() -> tuple[Any, grpc.StatusCode, Any]:
        stub = dep.analyst_stub()
        make_task(stub, "t", d=2)
        lead, helper = ingest(dep), ingest(dep, "helper")
        both = make_batch("t", np.array([[1.0, 0.25]] * 4), 16)
        lead_only = make_batch("t", np.ones((3, 2)), 16)
        helper_only = make_batch("t", np.ones((2, 2)), 16)
        lead.Upload(both.leader, timeout=5)
        helper.Upload(both.helper, timeout=5)
        lead.Upload(lead_only.leader, timeout=5)
        helper.Upload(helper_only.helper, timeout=5)
        before = code_of(
            lambda: stub.OpenStream(
                pb.OpenStreamRequest(task_id="t", kind=pb.LAP24, epsilon="1"), timeout=5
            )
        )
        info = stub.CloseCollection(pb.TaskRef(task_id="t"), timeout=10)
        again = stub.CloseCollection(pb.TaskRef(task_id="t"), timeout=10)
        return info, before, again

    info, before, again = await off_loop(run)
    assert before == Code.FAILED_PRECONDITION
    assert (info.n, info.dropped_reports, info.agreed) == (4, 5, True)
    assert (again.n, again.agreed) == (4, True)
    assert dep.leader is not None and dep.helper is not None
    total = dep.leader.store.sums("t") + dep.helper.store.sums("t")
    assert total.tolist() == [4 * 2**16, 2**16]
    assert dep.helper.store.task("t").agreed


async def test_stream_and_chunk_refusals(deployment: Deployment):
    dep = deployment

    def run() -> dict[str, grpc.StatusCode]:
        stub = _closed_task(dep, n=20, d=4, eps_total="5", eps_min="1/10")

        def open_(kind: int = pb.LAP24, eps: str = "1/2", delta: str = "") -> Any:
            return stub.OpenStream(
                pb.OpenStreamRequest(task_id="t", kind=kind, epsilon=eps, delta=delta), timeout=5
            )

        s = open_()
        ctt = open_(pb.CTT, "1/2", "1/10000")

        def ask(idx: list[int], tau: list[int], sid: str = s.stream_id) -> Any:
            return stub.Ask(
                pb.AskRequest(stream_id=sid, queries=pb.Queries(index=idx), tau=tau), timeout=30
            )

        big = 4 * 100_000 * 2**16 + 1
        out = {
            "eps < eps_min": code_of(lambda: open_(eps="1/100")),
            "eps 0": code_of(lambda: open_(eps="0")),
            "eps nan": code_of(lambda: open_(eps="nan")),
            "eps 1e-10000000": code_of(lambda: open_(eps="1e-10000000")),
            "eps 65": code_of(lambda: open_(eps="65")),
            "kind unset": code_of(lambda: open_(pb.STREAM_KIND_UNSPECIFIED)),
            "lap24 with delta": code_of(lambda: open_(delta="1/100")),
            "ctt without delta": code_of(lambda: open_(pb.CTT)),
            "empty chunk": code_of(lambda: ask([], [])),
            "oversized chunk": code_of(lambda: ask([0] * (MAX_CHUNK + 1), [0] * (MAX_CHUNK + 1))),
            "index >= d": code_of(lambda: ask([4], [0])),
            "tau count": code_of(lambda: ask([0, 1, 2], [0, 0])),  # one per query, or one
            "tau too big": code_of(lambda: ask([0], [big])),
            # |−2^63| does not fit int64: it must not slip past the bound (it
            # would flip the comparison), nor wrap the CTT gap check
            "tau -2^63": code_of(lambda: ask([0], [-(2**63)])),
            "ctt tau_low -2^63": code_of(
                lambda: stub.Compare(
                    pb.CompareRequest(
                        stream_id=ctt.stream_id,
                        queries=pb.Queries(index=[0]),
                        tau_low=[-(2**63)],
                        tau_high=[-1],
                    ),
                    timeout=5,
                )
            ),
            "ask on ctt": code_of(lambda: ask([0], [0], ctt.stream_id)),
            "compare on lap24": code_of(
                lambda: stub.Compare(
                    pb.CompareRequest(
                        stream_id=s.stream_id,
                        queries=pb.Queries(index=[0]),
                        tau_low=[0],
                        tau_high=[10**9],
                    ),
                    timeout=5,
                )
            ),
            "gap too small": code_of(
                lambda: stub.Compare(
                    pb.CompareRequest(
                        stream_id=ctt.stream_id,
                        queries=pb.Queries(index=[0]),
                        tau_low=[0],
                        tau_high=[2**16],
                    ),
                    timeout=5,
                )
            ),
        }
        # Still usable after all that: one τ for all of a chunk's queries
        # answers as that τ given for each; a YES closes it, then it refuses.
        one = ask([0, 1, 2, 3], [1000 * 2**16])
        each = ask([0, 1, 2, 3], [1000 * 2**16] * 4)
        assert not one.yes and not each.yes
        yes = ask([3, 0], [-1000 * 2**16])
        out["after yes"] = code_of(lambda: ask([0], [0]))
        out["unknown stream"] = code_of(lambda: ask([0], [0], "f" * 32))
        assert yes.yes and yes.index == 0 and yes.closed  # the one τ held for the first query
        return out

    out = await off_loop(run)
    assert out.pop("after yes") == Code.FAILED_PRECONDITION
    assert out.pop("unknown stream") == Code.NOT_FOUND
    assert out.pop("oversized chunk") == Code.RESOURCE_EXHAUSTED
    assert set(out.values()) == {Code.INVALID_ARGUMENT}, out


def test_mid_chunk_stream_fails_closed_on_restart(tmp_path: Path):
    """A crash between 'chunk in progress' and its result never lets the stream answer."""
    from fractions import Fraction

    from svtagg.dp.task import TaskParams

    store = SqliteStore(tmp_path / "s.sqlite")
    store.create_task(TaskParams("t", 2, 16, 100, 1, Fraction(1), Fraction(0), Fraction(1, 10)))
    store.close_collection("t")
    store.mark_agreed("t", None)
    store.open_stream("s", "t", StreamKind.LAP24, Fraction(1, 2), Fraction(0), Fraction(0))
    store.set_threshold_noise("s", 5)
    store.open_stream("o", "t", StreamKind.LAP24, Fraction(1, 4), Fraction(0), Fraction(0))
    store.begin_chunk("s")
    store.close()  # as if killed mid-chunk (the in_chunk mark is committed)
    again = SqliteStore(tmp_path / "s.sqlite")
    assert again.failed_on_recovery == 2  # the mid-chunk one and the half-opened one
    assert again.stream("s").state == FAILED and again.stream("o").state == FAILED
    assert again.task("t").budget.epsilon_spent == Fraction(3, 4)  # never refunded
    with pytest.raises(Exception, match="failed"):
        again.begin_chunk("s")


async def test_ingest_port_without_client_certificates(certs: Path, tmp_path: Path):
    """--ingest-listen: server-only TLS for clients with no certificate; there
    only Ingest answers, every other service refuses (UNAUTHENTICATED)."""
    from conftest import ingest_port_pair

    from svtagg.client.upload import Uploader

    ca = Identity.load(certs, "leader").ca

    def run() -> tuple[int, grpc.StatusCode, grpc.StatusCode]:
        dep = Deployment(certs, tmp_path, leader_port=leader.port)
        make_task(dep.analyst_stub(), "t", d=2)
        with Uploader(
            f"localhost:{leader.ingest_port}", f"localhost:{helper.ingest_port}", ca
        ) as up:
            n = up.upload("t", np.ones((5, 2))).held[0]
        anon = grpc.secure_channel(
            f"localhost:{leader.ingest_port}",
            grpc.ssl_channel_credentials(ca),
            tls_target("leader"),
        )
        analyst = code_of(
            lambda: pb_grpc.AnalystStub(anon).DescribeTask(pb.TaskRef(task_id="t"), timeout=5)
        )
        anon_h = grpc.secure_channel(
            f"localhost:{helper.ingest_port}",
            grpc.ssl_channel_credentials(ca),
            tls_target("helper"),
        )
        peer = code_of(lambda: pb_grpc.PeerStub(anon_h).Budget(pb.TaskRef(task_id="t"), timeout=5))
        return n, analyst, peer

    async with ingest_port_pair(certs, tmp_path) as (leader, helper):
        n, analyst, peer = await off_loop(run)
    assert n == 5
    assert analyst == peer == Code.UNAUTHENTICATED


def test_certs_command(tmp_path: Path):
    from svtagg.deploy.cli import main
    from svtagg.proto.tls import ROLES, role_of_pem

    assert main(["certs", "--out", str(tmp_path), "--hosts", "localhost,10.0.0.7"]) == 0
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
    for role in ROLES:
        assert role_of_pem((tmp_path / f"{role}.pem").read_bytes()) == role
        assert (tmp_path / f"{role}.key").stat().st_mode & 0o077 == 0


async def test_queries_wait_for_min_batch(deployment: Deployment):
    """Below min_batch the close is refused (a task closed there could never be
    queried), saying how many reports are missing; queries wait meanwhile."""

    def run() -> tuple[grpc.StatusCode, grpc.StatusCode, str]:
        stub = deployment.analyst_stub()
        make_task(stub, "t", d=2, min_batch=10)
        with deployment.uploader() as up:
            up.upload("t", np.ones((5, 2)))
        try:
            stub.CloseCollection(pb.TaskRef(task_id="t"), timeout=5)
            close, detail = Code.OK, ""
        except grpc.RpcError as exc:
            close, detail = exc.code(), exc.details()  # type: ignore[attr-defined]
        ask = code_of(
            lambda: stub.OpenStream(
                pb.OpenStreamRequest(task_id="t", kind=pb.LAP24, epsilon="1"), timeout=5
            )
        )
        return close, ask, detail

    close, ask, detail = await off_loop(run)
    assert close == ask == Code.FAILED_PRECONDITION
    assert "upload 5 more before closing" in detail


async def test_impostor_helper_is_refused(certs: Path, tmp_path: Path):
    """A server holding another role's certificate (here the analyst's, same CA)
    cannot pose as the helper: the leader verifies the name only the helper's
    certificate carries, and refuses to start (one line naming the helper's
    certificate) instead of serving with a helper it can never reach."""
    from svtagg.proto.tls import CertificateError
    from svtagg.proto.vocab import Role
    from svtagg.servers.service import ServerConfig, SvtaggServer

    impostor = SvtaggServer(
        ServerConfig(Role.HELPER, str(tmp_path / "x.sqlite"), Identity.load(certs, "analyst"))
    )
    await impostor.start()
    try:
        leader = SvtaggServer(
            ServerConfig(
                Role.LEADER,
                str(tmp_path / "l.sqlite"),
                Identity.load(certs, "leader"),
                helper_address=f"127.0.0.1:{impostor.port}",
            )
        )
        with pytest.raises(CertificateError) as refused:
            await leader.start(warm=False)
        created = impostor.store.task_ids()
    finally:
        await impostor.stop(0.5)
    assert "is not a helper certificate" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert created == []


def test_budget_policy_caps_the_analysts_proposal(tmp_path: Path):
    """Each server refuses a task whose total budget exceeds its own cap."""
    from fractions import Fraction

    from svtagg.dp.errors import InvalidArgument
    from svtagg.dp.task import TaskSpec, parse_task_params
    from svtagg.servers.core import ServerCore

    core = ServerCore(
        "helper",
        SqliteStore(tmp_path / "h.sqlite"),
        max_epsilon_total=Fraction(8),
        max_delta_total=Fraction(1, 10**6),
    )
    ok = parse_task_params(TaskSpec("ok", 4, 16, 1000, 1, "8", "1/1000000", "1/100"))
    core.check_budget_policy(ok)
    for eps, delta in (("9", "0"), ("1", "1/1000")):
        over = parse_task_params(TaskSpec("over", 4, 16, 1000, 1, eps, delta, "1/100"))
        with pytest.raises(InvalidArgument, match="cap"):
            core.check_budget_policy(over)
    uncapped = ServerCore("leader", SqliteStore(tmp_path / "l.sqlite"))
    uncapped.check_budget_policy(
        parse_task_params(TaskSpec("big", 4, 16, 1000, 1, "1000", "0", "1"))
    )


def test_batch_values_are_bounded(tmp_path: Path):
    """reports × d per batch is capped (the helper expands 8 bytes per value)."""
    from fractions import Fraction

    from svtagg.dp.errors import ResourceExhausted
    from svtagg.dp.task import TaskParams
    from svtagg.proto.vocab import MAX_BATCH_VALUES
    from svtagg.servers.core import ServerCore

    store = SqliteStore(tmp_path / "h.sqlite")
    d = 1 << 20
    store.create_task(TaskParams("wide", d, 16, 100, 1, Fraction(1), Fraction(0), Fraction(1)))
    core = ServerCore("helper", store)
    reports = [(i.to_bytes(16, "big"), bytes(16)) for i in range(MAX_BATCH_VALUES // d + 1)]
    with pytest.raises(ResourceExhausted, match="reports per batch"):
        core.upload("wide", reports)
    assert store.task("wide").n == 0


def test_server_cli_caps_the_budget_by_default() -> None:
    """Without a cap from the operator a server still refuses tasks above
    ε_total = 10 and δ_total = 10^-5; 'none' lifts a cap explicitly."""
    import argparse
    from fractions import Fraction

    from svtagg.servers import cli

    ap = argparse.ArgumentParser()
    cli.register(ap.add_subparsers())
    base = ["server", "--role", "helper", "--db", "x", "--certs", "y"]
    args = ap.parse_args(base)
    assert cli._cap(args.max_epsilon_total, "--max-epsilon-total") == 10
    assert cli._cap(args.max_delta_total, "--max-delta-total") == Fraction(1, 10**5)
    args = ap.parse_args([*base, "--max-epsilon-total", "none", "--max-delta-total", "None"])
    assert cli._cap(args.max_epsilon_total, "--max-epsilon-total") is None
    assert cli._cap(args.max_delta_total, "--max-delta-total") is None


def test_server_flags_name_one_process_kind() -> None:
    """--ingest-only, --worker and --lease-work each name one kind of process;
    only the main process (leased or not) owns the store, and a flag that
    needs the shared PostgreSQL store or the leader is refused in one line."""
    from svtagg.proto.vocab import Role
    from svtagg.servers.service import ProcessKind

    pg, sqlite = "postgresql://x@127.0.0.1:1/x", "x.sqlite"

    def kind(role: Role = Role.LEADER, db: str = pg, **flags: bool) -> ProcessKind:
        named = {"ingest_only": False, "worker": False, "lease_work": False, **flags}
        return ProcessKind.from_flags(role, db, **named)

    assert kind(db=sqlite) is ProcessKind.MAIN
    assert kind(ingest_only=True) is ProcessKind.INGEST_REPLICA
    assert kind(Role.HELPER, worker=True) is ProcessKind.WORKER
    assert kind(lease_work=True) is ProcessKind.LEASED_FRONT_END
    # a replica runs no chunks, so leasing them changes nothing
    assert kind(ingest_only=True, lease_work=True) is ProcessKind.INGEST_REPLICA
    owners = {k for k in ProcessKind if k.owns_store}
    assert owners == {ProcessKind.MAIN, ProcessKind.LEASED_FRONT_END}
    for flags, message in (
        ({"ingest_only": True}, "--ingest-only replicas share a PostgreSQL store"),
        ({"worker": True}, "--worker needs the PostgreSQL store"),
        ({"lease_work": True}, "--lease-work needs the PostgreSQL store"),
        ({"worker": True, "lease_work": True}, "--worker needs the PostgreSQL store"),
    ):
        with pytest.raises(ValueError, match=message):
            kind(db=sqlite, **flags)
    with pytest.raises(ValueError, match="cannot be combined"):
        kind(Role.HELPER, worker=True, lease_work=True)
    with pytest.raises(ValueError, match="--lease-work is for the leader only"):
        kind(Role.HELPER, lease_work=True)


def test_comparison_width_comes_from_public_parameters() -> None:
    """w is the smallest width with wrap_bound < 2^(w−1); a task or
    stream whose values can range wider (larger n_max, smaller ε) gets a wider w,
    and the bound really is below 2^(w−1)."""
    from fractions import Fraction

    from svtagg.dp.kinds import StreamKind, default_tau_bound, noise_model
    from svtagg.dp.queries import Budget
    from svtagg.dp.task import TaskSpec, parse_task_params
    from svtagg.mpc.ring import wrap_bound
    from svtagg.servers.core import ServerCore
    from svtagg.servers.store.rules import OPEN, StreamState, TaskState

    core = ServerCore.__new__(ServerCore)
    core.robust_aggregates = True

    def width(n_max: int, frac_bits: int, eps: Fraction, kind: StreamKind) -> tuple[int, int]:
        p = parse_task_params(
            TaskSpec("t", 4, frac_bits, n_max, 1, "10", "0", str(min(eps, Fraction(1))))
        )
        task = TaskState(p, 0, False, Budget(Fraction(10), Fraction(0)), b"", 0, True)
        stream = StreamState("s", "t", kind, eps, Fraction(0), 0, OPEN, 0, 0)
        noise = noise_model(kind).noise_bound_per_party(eps, frac_bits)
        bound = wrap_bound(n_max, frac_bits, default_tau_bound(n_max, frac_bits), noise)
        return core.comparison_width(task, stream), bound

    small, b_small = width(1000, 8, Fraction(1), StreamKind.LAP24)
    wide, b_wide = width(10**6, 16, Fraction(1, 1000), StreamKind.LAP24)
    assert small < wide <= 64
    for w, b in ((small, b_small), (wide, b_wide)):
        assert b < 1 << (w - 1)  # correct at this width ...
        assert b >= 1 << (w - 2)  # ... and one bit less would not be
    core.robust_aggregates = False  # raw sums can be anything: full width
    assert width(1000, 8, Fraction(1), StreamKind.LAP24)[0] == 64
