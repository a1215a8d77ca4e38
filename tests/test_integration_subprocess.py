"""Leader and helper as separate processes, driven through the CLI: create,
upload, restart both servers (SIGTERM, graceful), close, run a selection."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
from svtagg.analyst.cli import main
from svtagg.client.upload import Uploader
from svtagg.servers.launch import LocalDeployment
from svtagg.servers.tls import Identity


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


def test_processes_end_to_end_with_restart(tmp_path: Path):
    dep = LocalDeployment(tmp_path)
    dep.start()
    try:
        common = ["--certs", str(dep.certs), "--task", "hh"]
        rc, out = _cli("analyst", "create-task", "--leader", dep.address("leader"), *common,
                       "--d", "50", "--min-batch", "10", "--epsilon", "3")
        assert rc == 0, out
        values = np.zeros((3000, 50))
        values[:, 7] = 1.0
        values[:1000, 11] = 1.0
        c = Identity.load(dep.certs, "client")
        with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
            assert up.upload("hh", values, batch_size=500).reports == 3000
        for role in ("leader", "helper"):
            assert dep.stop_role(role) == 0  # graceful SIGTERM shutdown
        dep.start()  # same stores, new ports
        leader = ["--leader", dep.address("leader"), *common]
        rc, out = _cli("analyst", "close", *leader)
        assert rc == 0 and "n=3000" in out and "closed" in out, out
        rc, out = _cli("analyst", "run", *leader, "--algorithm", "top-k", "--k", "2",
                       "--epsilon", "2", "--seed", "1")
        assert rc == 0, out
        result = json.loads(out)
        assert result["selected"] == [7, 11]
        assert result["epsilon_spent"] == "2" and result["queries"] > 0
        # The helper alone restarts: the leader drops its dead sessions and goes on.
        assert dep.stop_role("helper") == 0
        dep.start_role("helper")
        rc, out = _cli("analyst", "run", *leader, "--algorithm", "sum", "--index", "11",
                       "--epsilon", "1/2")
        assert rc == 0, out
        assert abs(json.loads(out)["estimate"] - 1000) < 600  # Cor 6.8 at ε = 1/2: coarse
        rc, out = _cli("analyst", "describe", *leader)
        assert "leader ledger: ε 5/2/3" in out and "helper ledger: ε 5/2/3" in out, out
    finally:
        dep.stop()
