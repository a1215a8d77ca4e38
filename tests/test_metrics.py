"""The Prometheus endpoint of running servers (subprocesses): scraped after an
upload, a close and a few chunks, its counters match what was done."""

from __future__ import annotations

import re
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import svtagg
from svtagg.deploy.launch import LocalDeployment
from svtagg.dp.queries import Query


def metrics_port(log: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", log.read_text())
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no metrics line in {log}")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_scraped_from_running_servers(tmp_path: Path):
    dep = LocalDeployment(tmp_path / "dep", server_args=["--metrics-listen", "127.0.0.1:0"])
    with dep:
        ports = {r: metrics_port(tmp_path / "dep" / f"{r}.log") for r in ("leader", "helper")}
        values = np.zeros((40, 3))
        values[:30, 1] = 1.0
        with svtagg.connect(
            dep.address("leader"), certs=dep.certs, helper=dep.address("helper")
        ) as conn:
            task = conn.create_task("m", d=3, epsilon=2, min_batch=1)
            stats = conn.upload("m", values, batch=16)
            assert stats.reports == 40 and stats.batches == 3
            task.close_collection()
            oracle = task.oracle()
            stream = oracle.open_stream("1/2")
            # τ far above every sum: two chunks of NO (3 queries each).
            assert stream.ask([(Query(j), 1000.0) for j in range(3)]) is None
            assert stream.ask([(Query(j), 1000.0) for j in range(3)]) is None
            peer_bytes = oracle.stats().peer_bytes

        lead, helper = scrape(ports["leader"]), scrape(ports["helper"])
        t = (("task", "m"),)
        for m in (lead, helper):
            assert m[("svtagg_reports_ingested_total", t)] == 40
            assert m[("svtagg_upload_batches_total", t)] == 3
            assert m[("svtagg_streams_opened_total", (("kind", "lap24"), ("task", "m")))] == 1
            assert m[("svtagg_task_epsilon_spent", t)] == float(Fraction(1, 2))
            assert m[("svtagg_task_epsilon_total", t)] == 2.0
        assert lead[("svtagg_queries_total", t)] == 6
        assert lead[("svtagg_chunks_total", t)] == 2
        assert lead[("svtagg_chunk_seconds_count", ())] == 2
        assert lead[("svtagg_peer_bytes_total", ())] == peer_bytes > 0
        assert lead[("svtagg_helper_reachable", ())] == 1
        assert lead[("svtagg_server_info", (("role", "leader"),))] == 1
        assert helper[("svtagg_server_info", (("role", "helper"),))] == 1


def _one_selection(root: Path, values: np.ndarray) -> tuple[int | None, dict, dict]:
    """One task, one stream, one chunk of three queries at τ = 20 on `values`:
    the answer and both servers' scrapes."""
    dep = LocalDeployment(root, server_args=["--metrics-listen", "127.0.0.1:0"])
    with dep:
        ports = {r: metrics_port(root / f"{r}.log") for r in ("leader", "helper")}
        with svtagg.connect(
            dep.address("leader"), certs=dep.certs, helper=dep.address("helper")
        ) as conn:
            task = conn.create_task("m", d=3, epsilon=8, min_batch=1)
            conn.upload("m", values, batch=16)
            task.close_collection()
            stream = task.oracle().open_stream("4")
            answer = stream.ask([(Query(j), 20.0) for j in range(3)])
        return answer, scrape(ports["leader"]), scrape(ports["helper"])


def _untimed(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict:
    """The samples that are not timings: chunk latencies and the creation time
    of each series vary from run to run whatever the data."""
    return {
        k: v
        for k, v in m.items()
        if not k[0].startswith("svtagg_chunk_seconds") and not k[0].endswith("_created")
    }


def test_metrics_do_not_depend_on_answers(tmp_path: Path):
    """Two selections with the same calls (one chunk of three queries) and
    different answers (a YES at the first query, which closes the stream, and
    no YES at all) leave the same metrics on both servers, timings aside: no
    metric encodes a DP output.  (Each wrong answer has probability below
    e^-30: the scores sit 20 users from τ with noise of scale 1/2 and 1.)"""
    yes = np.zeros((40, 3))
    yes[:, 0] = 1.0
    no = np.zeros((40, 3))
    answer_a, lead_a, helper_a = _one_selection(tmp_path / "a", yes)
    answer_b, lead_b, helper_b = _one_selection(tmp_path / "b", no)
    assert (answer_a, answer_b) == (0, None)
    assert lead_a[("svtagg_chunks_total", (("task", "m"),))] == 1
    assert lead_a[("svtagg_queries_total", (("task", "m"),))] == 3
    assert _untimed(lead_a) == _untimed(lead_b)
    assert _untimed(helper_a) == _untimed(helper_b)
