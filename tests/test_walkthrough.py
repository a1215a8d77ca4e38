"""docs/walkthrough.md runs as written: its ```python blocks, in order, in one
namespace, against a fresh two-server deployment named by SVTAGG_* settings.
Also the front door's own checks: certificates, settings, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import svtagg
from svtagg.client.records import InputError
from svtagg.deploy.launch import LocalDeployment
from svtagg.dp.errors import NotFound
from svtagg.proto.tls import CertificateError

DOC = Path(__file__).resolve().parents[1] / "docs" / "walkthrough.md"


def blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_walkthrough_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    code = blocks(DOC.read_text())
    assert len(code) >= 6, "the walkthrough lost its code blocks"
    with LocalDeployment(tmp_path / "dep") as dep:
        monkeypatch.setenv("SVTAGG_CONFIG", "")
        monkeypatch.setenv("SVTAGG_LEADER", dep.address("leader"))
        monkeypatch.setenv("SVTAGG_HELPER", dep.address("helper"))
        monkeypatch.setenv("SVTAGG_CERTS", str(dep.certs))
        namespace: dict[str, object] = {"__name__": "walkthrough"}
        for i, block in enumerate(code):
            try:
                exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"walkthrough block {i} failed: {exc!r}\n{block}") from exc


def test_front_door_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SVTAGG_CONFIG", "")
    for var in ("SVTAGG_LEADER", "SVTAGG_HELPER", "SVTAGG_CERTS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="no leader address"):
        svtagg.connect()
    with pytest.raises(CertificateError, match="no such certificate directory"):
        svtagg.connect("127.0.0.1:1", certs=tmp_path / "none")
    assert isinstance(svtagg.__version__, str) and svtagg.__version__[0].isdigit()
    with LocalDeployment(tmp_path / "dep") as dep:
        with svtagg.connect(
            dep.address("leader"), certs=dep.certs, helper=dep.address("helper")
        ) as conn:
            conn.create_task("t", d=3, epsilon=1, min_batch=1)
            bad = np.array([[0.0, 0.5, 1.0], [0.0, 1.5, 0.0]])
            with pytest.raises(InputError, match="row 2, column 2"):
                conn.upload("t", bad)
            with pytest.raises(InputError, match="not a finite"):
                conn.upload("t", [[0.0, float("nan"), 0.0]])
            stats = conn.upload("t", [[0.0, 0.5, 1.0]])
            assert stats.reports == 1
            with pytest.raises(InputError, match="row 2, column 2: category 3 is outside"):
                conn.upload("t", [[0], [1, 3]], embedding="heavy_hitters", fmt="categories")
            with pytest.raises(InputError, match="row 1: a category repeats"):
                conn.upload("t", [[1, 1]], embedding="heavy_hitters", fmt="categories")
            stats = conn.upload("t", [[0, 2], [1]], embedding="heavy_hitters", fmt="categories")
            assert stats.reports == 2
            assert conn.task("t").state().n == 3
            with pytest.raises(NotFound, match="nosuch"):
                conn.task("nosuch")
