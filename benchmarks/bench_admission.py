"""What admission and the ingest bounds cost an honest user, through two server
processes: the unary call latency a client sees (GetTask, p50 over many calls)
and the upload rate of Prio3 reports (onehot, d = 1,000: each batch verified by
both servers).  Run it under two checkouts and compare the figures side by
side in one session (the command prints one JSON object):

    python -m svtagg.benchmarks.bench_admission [--reports 3000] [--calls 400]

It uses only what every version of the project offers (`LocalDeployment`,
`Uploader`, the analyst API), so the same file measures the code before a
change and after it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from svtagg.client.upload import Uploader
from svtagg.deploy.launch import LocalDeployment
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import Identity, tls_target
from svtagg.proto.vocab import CHANNEL_OPTIONS


def _stub(dep: LocalDeployment, role: str, service: str, server: str) -> object:
    import grpc

    ident = Identity.load(dep.certs, role)
    creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
    channel = grpc.secure_channel(
        dep.address(server), creds, options=[*CHANNEL_OPTIONS, *tls_target(server)]
    )
    return getattr(pb_grpc, f"{service}Stub")(channel)


def measure(reports: int, calls: int, d: int = 1000) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, LocalDeployment(Path(tmp)) as dep:
        analyst = _stub(dep, "analyst", "Analyst", "leader")
        spec = pb.TaskSpec(
            task_id="bench", d=d, frac_bits=16, n_max=10 * reports, min_batch=1,
            epsilon_total="1", delta_total="0", epsilon_min="1/100", validity="onehot",
        )  # fmt: skip
        analyst.CreateTask(spec, timeout=30)  # type: ignore[attr-defined]
        ingest = _stub(dep, "client", "Ingest", "leader")
        ref = pb.TaskRef(task_id="bench")
        for _ in range(20):  # warm the channel
            ingest.GetTask(ref, timeout=10)  # type: ignore[attr-defined]
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            ingest.GetTask(ref, timeout=10)  # type: ignore[attr-defined]
            lat.append(time.perf_counter() - t)
        rng = np.random.default_rng(1)
        values = np.eye(d)[rng.integers(0, d, reports)]
        c = Identity.load(dep.certs, "client")
        with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
            t = time.perf_counter()
            up.upload("bench", values, batch_size=500)
            upload_s = time.perf_counter() - t
        n = analyst.DescribeTask(ref, timeout=30).n  # type: ignore[attr-defined]
        if n != reports:
            raise RuntimeError(f"the leader holds {n} reports, not {reports}")
    return {
        "get_task_p50_ms": round(1e3 * statistics.median(lat), 3),
        "upload_reports_per_s": round(reports / upload_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=3000)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    print(json.dumps(measure(args.reports, args.calls)))


if __name__ == "__main__":
    main()
