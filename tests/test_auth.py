"""Who may call what, on server processes (issue 6): every Analyst RPC refuses a
client (and a helper) certificate, every Peer RPC refuses an analyst (and a
client) certificate, Upload refuses an analyst certificate, a certificate of
another CA and a plaintext connection fail the handshake.  And the logs: the
servers run with Python DEBUG logging and gRPC's debug verbosity through a whole
session (upload, close, every stream kind, refusals), then the test greps both
logs for the actual secret values: every explicit share (hex, raw bytes, each
uint64 in decimal), every seed (hex, raw bytes), both servers' share sums and
threshold noise γ (read from their stores afterwards) and the thresholds sent.
Fresh per-query noise ν is never stored, so it cannot be grepped for; it only
ever exists inside `ServerCore.ask_inputs`, which logs nothing.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import ProcessDeployment

from svtagg.client.upload import make_batch
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import Identity, tls_target, write_deployment

Code = grpc.StatusCode
D, F = 5, 20

ANALYST_RPCS = {
    "CreateTask": pb.TaskSpec(task_id="x"),
    "DescribeTask": pb.TaskRef(task_id="t"),
    "ListTasks": pb.Empty(),
    "CloseCollection": pb.TaskRef(task_id="t"),
    "OpenStream": pb.OpenStreamRequest(task_id="t"),
    "Ask": pb.AskRequest(stream_id="s"),
    "Compare": pb.CompareRequest(stream_id="s"),
    "NoisyMax": pb.NoisyMaxRequest(stream_id="s"),
    "Budget": pb.TaskRef(task_id="t"),
}
PEER_RPCS = {
    "CreateTask": pb.TaskSpec(task_id="x"),
    "Digest": pb.TaskRef(task_id="t"),
    "CloseCollection": pb.TaskRef(task_id="t"),
    "ListReports": pb.ReportPage(task_id="t"),
    "DropReports": pb.ReportIds(task_id="t"),
    "MarkAgreed": pb.CollectionDigest(task_id="t"),
    "PrepareStream": pb.PrepareStreamRequest(stream_id="s"),
    "FailStream": pb.StreamRef(stream_id="s"),
    "Budget": pb.TaskRef(task_id="t"),
}


def code_of(call: Any) -> Code:
    try:
        r = call()
        if hasattr(r, "__iter__") and not hasattr(r, "ListFields"):
            list(r)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[attr-defined,no-any-return]
    return Code.OK


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pd = ProcessDeployment(
        tmp_path_factory.mktemp("auth"), ["--log-level", "DEBUG"], env={"GRPC_VERBOSITY": "DEBUG"}
    ).start()
    try:
        yield pd
    finally:
        pd.stop()


def test_who_may_call_what(procs: ProcessDeployment, tmp_path: Path):
    pd = procs
    out: dict[str, Code] = {}
    for cert in ("client", "helper"):
        stub = pd.stub(cert, "Analyst", "leader")
        for name, req in ANALYST_RPCS.items():
            out[f"{cert}->Analyst.{name}"] = code_of(
                lambda s=stub, n=name, r=req: getattr(s, n)(r, timeout=10)
            )
    for cert in ("analyst", "client"):
        stub = pd.stub(cert, "Peer", "helper")
        for name, req in PEER_RPCS.items():
            out[f"{cert}->Peer.{name}"] = code_of(
                lambda s=stub, n=name, r=req: getattr(s, n)(r, timeout=10)
            )
        out[f"{cert}->Peer.Session"] = code_of(
            lambda s=stub: s.Session(
                iter([pb.PeerFrame(open=pb.SessionOpen(session_id=b"\0" * 16))]), timeout=10
            )
        )
    for role in ("leader", "helper"):
        out[f"analyst->Ingest.Upload@{role}"] = code_of(
            lambda r=role: pd.stub("analyst", "Ingest", r).Upload(
                pb.UploadBatch(task_id="t"), timeout=10
            )
        )
    assert set(out.values()) == {Code.UNAUTHENTICATED}, {
        k: v for k, v in out.items() if v != Code.UNAUTHENTICATED
    }

    other = Identity.load(write_deployment(tmp_path / "other-ca"), "analyst")
    refused = {}
    for role in ("leader", "helper"):
        ca = pd.identity("analyst").ca
        # Another CA's certificate (the caller trusts the real CA, the server does not).
        creds = grpc.ssl_channel_credentials(ca, other.key, other.cert)
        with grpc.secure_channel(pd.address(role), creds, options=tls_target(role)) as ch:
            refused[f"other-ca@{role}"] = code_of(
                lambda ch=ch: pb_grpc.IngestStub(ch).GetTask(pb.TaskRef(task_id="t"), timeout=10)
            )
        with grpc.insecure_channel(pd.address(role)) as ch:
            refused[f"plaintext@{role}"] = code_of(
                lambda ch=ch: pb_grpc.IngestStub(ch).GetTask(pb.TaskRef(task_id="t"), timeout=10)
            )
    assert set(refused.values()) == {Code.UNAVAILABLE}, refused  # the handshake fails
    for role in ("leader", "helper"):
        assert pd.dep.procs[role].poll() is None


def _numbers(values: Any) -> set[str]:
    """Decimal spellings of secret integers long enough not to appear by chance."""
    out = set()
    for v in values:
        v = int(v)
        for x in {v, v - (1 << 64) if v >= 1 << 63 else v}:
            if abs(x) >= 10**5:
                out.add(str(x))
    return out


def test_logs_hold_no_secrets(procs: ProcessDeployment):
    pd = procs
    stub = pd.stub()
    stub.CreateTask(
        pb.TaskSpec(
            task_id="sec",
            d=D,
            frac_bits=F,
            n_max=1000,
            min_batch=1,
            epsilon_total="100",
            delta_total="1/1000",
            epsilon_min="1/100",
        ),
        timeout=30,
    )
    values = np.random.default_rng(11).random((12, D))
    batch = make_batch("sec", values, F)
    ingest = {r: pd.stub("client", "Ingest", r) for r in ("leader", "helper")}
    ingest["leader"].Upload(batch.leader, timeout=30)
    ingest["helper"].Upload(batch.helper, timeout=30)
    # A replay and a malformed batch too: refusals are logged.
    for role, msg in (("leader", batch.leader), ("helper", batch.helper)):
        with pytest.raises(grpc.RpcError):
            ingest[role].Upload(msg, timeout=30)
    stub.CloseCollection(pb.TaskRef(task_id="sec"), timeout=30)
    taus = [0.3141592, 0.2718281, 0.1414213]
    with pd.oracle("sec") as o:
        for kind in ("lap24", "lap3", "exp3"):
            s = o.open_stream("1/2", kind)
            s.ask([(Query(j), taus[j % 3] * 12) for j in range(D)])
        c = o.open_stream("1/2", "ctt", delta="1/10000")
        c.compare([(Query(0), -200.0, 200.0)])
        encoded_taus = [int(x) for x in o.encode_taus([t * 12 for t in taus])]
    for role in ("leader", "helper"):
        pd.dep.stop_role(role)  # graceful: logs flushed
    secrets_text: set[str] = set()
    secrets_bytes: set[bytes] = set()
    for r_l, r_h in zip(batch.leader.reports, batch.helper.reports, strict=True):
        secrets_bytes |= {r_l.explicit_share, r_h.seed}
        secrets_text |= {r_l.explicit_share.hex(), r_h.seed.hex(), repr(r_h.seed)[2:-1]}
        secrets_text |= _numbers(np.frombuffer(r_l.explicit_share, dtype="<u8"))
    for role in ("leader", "helper"):
        db = sqlite3.connect(pd.root / f"{role}.sqlite")
        gammas = [int(g) for (g,) in db.execute("SELECT gamma FROM streams") if g is not None]
        (sums,) = db.execute("SELECT sums FROM tasks WHERE task_id='sec'").fetchone()
        db.close()
        assert len(gammas) == 4
        secrets_text |= _numbers(gammas) | _numbers(np.frombuffer(sums, dtype=np.uint64))
    secrets_text |= _numbers(encoded_taus)
    assert len(secrets_text) > 12 * (D + 2)
    for role in ("leader", "helper"):
        log = (pd.root / f"{role}.log").read_bytes()
        assert b"DEBUG" in log  # debug logging really was on
        text = log.decode("utf-8", "replace")
        found = [
            s for s in secrets_text if re.search(rf"(?<![0-9a-f]){re.escape(s)}(?![0-9a-f])", text)
        ]
        assert not found, f"{role} log holds secrets: {found[:5]}"
        assert not [b for b in secrets_bytes if b in log], f"{role} log holds raw secret bytes"
    pd.start()  # leave the module fixture running


async def test_get_task_shows_n_and_the_ledger_only_to_the_analyst(certs: Path, tmp_path: Path):
    """Ingest.GetTask gives anyone who may upload (a client certificate, or none
    on --ingest-listen) the task's public parameters, which an upload needs, and
    nothing else: no n, no ledger, no stream count.  The analyst (and the
    leader) see all of it; another role is refused."""
    from conftest import Deployment, ingest_port_pair, make_task, off_loop

    ca = Identity.load(certs, "leader").ca
    ref = pb.TaskRef(task_id="t")

    def get(address: str, server: str, role: str | None) -> Any:
        if role is None:
            creds = grpc.ssl_channel_credentials(ca)
        else:
            who = Identity.load(certs, role)
            creds = grpc.ssl_channel_credentials(who.ca, who.key, who.cert)
        with grpc.secure_channel(address, creds, options=tls_target(server)) as ch:
            return pb_grpc.IngestStub(ch).GetTask(ref, timeout=10)

    def run() -> dict[str, Any]:
        stub = dep.analyst_stub()
        make_task(stub, "t", d=2)
        with dep.uploader() as up:
            up.upload("t", np.ones((5, 2)))
        stub.CloseCollection(ref, timeout=10)
        stub.OpenStream(pb.OpenStreamRequest(task_id="t", kind=pb.LAP24, epsilon="1"), timeout=10)
        out: dict[str, Any] = {}
        for server, s in (("leader", leader), ("helper", helper)):
            out[f"anonymous@{server}"] = get(f"127.0.0.1:{s.ingest_port}", server, None)
            out[f"client@{server}"] = get(f"127.0.0.1:{s.port}", server, "client")
            out[f"analyst@{server}"] = get(f"127.0.0.1:{s.port}", server, "analyst")
        out["helper@leader"] = code_of(lambda: get(dep.leader_addr, "leader", "helper"))
        return out

    async with ingest_port_pair(certs, tmp_path) as (leader, helper):
        dep = Deployment(certs, tmp_path, leader_port=leader.port, helper_port=helper.port)
        out = await off_loop(run)
    assert out.pop("helper@leader") == Code.UNAUTHENTICATED
    for name, info in out.items():
        assert (info.spec.task_id, info.spec.d, info.spec.frac_bits) == ("t", 2, 16), name
        assert not info.collection_open, name
        if name.startswith("analyst@"):
            assert (info.n, info.budget.epsilon_spent, info.streams) == (5, "1", 1), name
        else:
            assert info.n == 0 and not info.HasField("budget") and info.streams == 0, (name, info)
