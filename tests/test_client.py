"""Client SDK: retries never double-count, file loading and embeddings, the CLI."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import Deployment, make_task, off_loop, store_view

from svtagg.client.upload import UploadError, UploadStats, embed, load_records, make_batch
from svtagg.deploy.cli import main
from svtagg.mpc.ring import encode
from svtagg.mpc.sharing import expand_seed
from svtagg.proto import svtagg_pb2 as pb


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected: answer lost"


class _LostFirstAnswer:
    """Delivers the first call to the server, then pretends the answer was lost."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, 0

    def future(self, msg: Any, timeout: float) -> Any:
        self.calls += 1
        fut = self.real.future(msg, timeout=timeout)
        if self.calls == 1:
            fut.result()

            def fail() -> None:
                raise _Unavailable()

            return SimpleNamespace(result=fail)
        return fut


def test_batch_shares_reconstruct():
    values = np.random.default_rng(3).random((5, 7))
    b = make_batch("t", values, 16)
    for lr, hr, row in zip(b.leader.reports, b.helper.reports, encode(values, 16), strict=True):
        assert lr.report_id == hr.report_id and len(lr.report_id) == 16
        explicit = np.frombuffer(lr.explicit_share, dtype="<u8")
        assert np.array_equal(explicit + expand_seed(hr.seed, 7), row)


async def test_retry_after_lost_answer_counts_once(deployment: Deployment):
    def run() -> tuple[UploadStats, int, int]:
        stub = deployment.analyst_stub()
        make_task(stub, "t", d=3)
        with deployment.uploader(backoff=0.01) as up:
            for i in (0, 1):
                real = up._stubs[i]
                up._stubs[i] = SimpleNamespace(
                    Upload=_LostFirstAnswer(real.Upload), GetTask=real.GetTask
                )
            stats = up.upload("t", np.ones((7, 3)), batch_size=7)
            # A fresh replay of the same batch (not a retry) is an error.
            batch = make_batch("t", np.ones((2, 3)), 16)
            up.send(batch)
            with pytest.raises(UploadError, match="ALREADY_EXISTS"):
                up.send(batch)
        stub.CloseCollection(pb.TaskRef(task_id="t"), timeout=5)
        info = stub.DescribeTask(pb.TaskRef(task_id="t"), timeout=5)
        return stats, info.n, stats.retries

    stats, n, retries = await off_loop(run)
    assert retries == 1 and stats.reports == 7
    assert n == 9  # 7 + 2, each counted once, and both servers agreed at close


def test_load_records_and_embeddings(tmp_path: Path):
    csv = tmp_path / "x.csv"
    csv.write_text("3\n0\n3\n")
    cats = load_records(csv)
    v = embed(cats, "heavy_hitters", fmt="categories", d=5)
    assert v.shape == (3, 5) and v.sum(axis=0).tolist() == [1, 0, 0, 2, 0]
    npy = tmp_path / "x.npy"
    np.save(npy, np.array([[0.2, 0.9]]))
    assert embed(load_records(npy), None).tolist() == [[0.2, 0.9]]
    with pytest.raises(ValueError, match="unknown embedding"):
        embed(cats, "nope")


async def test_cli_upload(deployment: Deployment, tmp_path: Path):
    data = tmp_path / "cats.csv"
    data.write_text("\n".join(str(i % 4) for i in range(30)) + "\n")

    def run() -> tuple[int, int]:
        make_task(deployment.analyst_stub(), "t", d=4)
        rc = main(
            [
                "client",
                "upload",
                "--leader",
                deployment.leader_addr,
                "--helper",
                deployment.helper_addr,
                "--certs",
                str(deployment.certs),
                "--task",
                "t",
                "--input",
                str(data),
                "--embedding",
                "heavy_hitters",
                "--format",
                "categories",
                "--param",
                "d=4",
                "--batch",
                "8",
                "--no-require-validation",  # a task of plain shares
            ]
        )
        info = deployment.analyst_stub().DescribeTask(pb.TaskRef(task_id="t"), timeout=5)
        return rc, info.n

    assert await off_loop(run) == (0, 30)


async def test_cli_upload_proves_by_default_and_refuses_plain_tasks(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`svtagg client upload` to a task with a validity circuit sends proved
    reports without any option; to a task of plain shares it refuses by
    default, saying how to upload anyway."""
    data = tmp_path / "cats.csv"
    data.write_text("\n".join(f"{i % 4},{(i + 1) % 4}" for i in range(30)) + "\n")
    base = ["client", "upload", "--leader", deployment.leader_addr, "--helper",
            deployment.helper_addr, "--certs", str(deployment.certs), "--input", str(data),
            "--embedding", "heavy_hitters", "--format", "categories", "--quiet"]  # fmt: skip

    def run() -> tuple[int, int, int]:
        stub = deployment.analyst_stub()
        spec = pb.TaskSpec(
            task_id="hh", d=4, frac_bits=16, n_max=1000, min_batch=1, epsilon_total="1",
            delta_total="0", epsilon_min="1/100", validity="multihot:2",
        )  # fmt: skip
        stub.CreateTask(spec, timeout=10)
        make_task(stub, "plain", d=4)
        proved = main([*base, "--task", "hh"])
        refused = main([*base, "--task", "plain"])
        info = stub.DescribeTask(pb.TaskRef(task_id="hh"), timeout=5)
        return proved, refused, info.n

    assert await off_loop(run) == (0, 2, 30)
    assert "--no-require-validation" in capsys.readouterr().err


def _cli(dep: Deployment, task: str, path: Path, *extra: str) -> int:
    return main(
        ["client", "upload", "--leader", dep.leader_addr, "--helper", dep.helper_addr,
         "--certs", str(dep.certs), "--task", task, "--input", str(path), "--quiet", *extra]
    )  # fmt: skip


def _proved_task(dep: Deployment, task: str, d: int, validity: str) -> None:
    spec = pb.TaskSpec(
        task_id=task, d=d, frac_bits=16, n_max=1000, min_batch=1, epsilon_total="1",
        delta_total="0", epsilon_min="1/100", validity=validity,
    )  # fmt: skip
    dep.analyst_stub().CreateTask(spec, timeout=10)


async def test_a_crlf_file_uploads_and_its_json_says_what_each_server_holds(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A CRLF file (with a header) to a task with range proofs: every row held
    by both servers, and --json says so per server (leader_rows, helper_rows)
    instead of n from the servers' answers, which for a client is no count of
    anything (the issue's "helper_n": 0)."""
    import json

    rows = 25
    path = tmp_path / "crlf.csv"
    path.write_bytes(b"a,b,c\r\n" + b"0.5,0.25,1\r\n" * rows)

    def run() -> int:
        _proved_task(deployment, "r", 3, "range")
        return _cli(deployment, "r", path, "--header", "--batch", "10", "--json")

    assert await off_loop(run) == 0
    result = json.loads(capsys.readouterr().out)
    assert "leader_n" not in result and "helper_n" not in result, result
    assert (result["rows"], result["reports"], result["batches"]) == (rows, rows, 3), result
    assert (result["leader_rows"], result["helper_rows"]) == (rows, rows), result
    assert (result["leader_stored"], result["helper_stored"]) == (rows, rows), result
    held = [store_view(deployment.root / f"{r}.sqlite", "r").n for r in ("leader", "helper")]
    assert held == [rows, rows]


async def test_a_tsv_file_gets_the_delimiter_hint_and_the_hint_works(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A tab-separated file read with the default ',' is refused with the hint
    --delimiter '\\t' (as a shell passes it: backslash, t), which then reads it."""
    path = tmp_path / "users.tsv"
    path.write_text("0.5\t0.25\t1\n0\t1\t0.75\n")

    def run() -> tuple[int, int]:
        make_task(deployment.analyst_stub(), "t", d=3)
        plain = ("--no-require-validation",)
        return _cli(deployment, "t", path, *plain), _cli(
            deployment, "t", path, *plain, "--delimiter", "\\t"
        )

    assert await off_loop(run) == (2, 0)
    err = capsys.readouterr().err
    assert "--delimiter '\\t'" in err, err
    assert store_view(deployment.root / "helper.sqlite", "t").n == 2
