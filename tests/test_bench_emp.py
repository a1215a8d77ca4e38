"""The EMP side-by-side benchmark's argument handling and its reading of the
driver's output (benchmarks/bench_emp.py), without an EMP driver or servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from svtagg.benchmarks import bench_emp as be


def test_without_a_driver_it_says_how_to_build_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        be.main([])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no EMP driver given (--emp)" in err
    assert "emp-sh2pc" in err and "--sizes" in err


def test_a_driver_that_is_not_an_executable_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "driver.txt"
    plain.write_text("not a program")
    for path in (tmp_path / "missing", plain):
        with pytest.raises(SystemExit) as exc:
            be.main(["--emp", str(path)])
        assert exc.value.code == 2
        assert "not an executable file" in capsys.readouterr().err


def _line(k: int, times: list[float]) -> str:
    return json.dumps(
        {
            "event": "chunk",
            "k": k,
            "reps": len(times),
            "bytes_per_cmp": 1920.0,
            "and_per_cmp": 40.0,
            "cpu_s_per_chunk": [0.1, 0.1],
            "times_s": times,
        }
    )


def test_driver_output_is_read_per_chunk_size() -> None:
    text = "\n".join(
        [
            "connected",
            json.dumps({"event": "setup", "setup_s": 0.02, "mode": "batch", "width": 40}),
            _line(1, [20e-6, 30e-6, 40e-6]),
            _line(1000, [0.01, 0.02, 0.005]),
        ]
    )
    run = be.parse_driver_output(text)
    assert run["setup_s"] == 0.02
    assert be.emp_rate(run, 1000) == pytest.approx(1000 / 0.01)
    assert be.emp_latency_ms(run) == pytest.approx(0.03)
    assert be.emp_rate(run, 10_000) is None
    # the same figures once the results went through JSON (string keys)
    again = json.loads(json.dumps(run))
    assert be.emp_rate(again, 1000) == pytest.approx(1000 / 0.01)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "connected\n",
        '{"event": "chunk", "k": 1, "times_s": []',
        '{"event": "chunk", "k": 1, "times_s": [], "bytes_per_cmp": 1}',
    ],
)
def test_driver_output_without_timings_is_an_error(text: str) -> None:
    with pytest.raises(be.DriverError):
        be.parse_driver_output(text)


def _fake_run(emp_s: float, svtagg_rate: int) -> dict[str, object]:
    """One quick run of one round: EMP takes emp_s per chunk at every K."""
    emp = be.parse_driver_output("\n".join(_line(k, [emp_s]) for k in (1, *be.QUICK_SIZES)))
    rows = [
        {"chunk": k, "comparisons_per_s_median": svtagg_rate, "peer_MB_per_chunk": 1.936 * k / 1000}
        for k in be.QUICK_SIZES
    ]
    single = {"p50_ms": 5.0, "p99_ms": 9.0, "peer_bytes_per_query": 1881.0}
    rnd = {
        "emp": {"EMP batch": emp},
        "svtagg": {"single_query": single, "chunks": rows, "chunks_one_stream": rows},
    }
    return {
        "quick": True,
        "emp_variants": ["EMP batch"],
        "load_start": "1.00 1.00 1.00",
        "load_end": "2.00 2.00 2.00",
        "rounds": [rnd],
    }


def test_pooled_table_pairs_each_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # round 1: EMP 10^3 per 0.01 s at K = 1000 (100,000/s), svtagg 50,000/s -> 0.5×;
    # round 2: EMP 200,000/s, svtagg 50,000/s -> 0.25×; median 0.375×
    files = []
    for i, (emp_s, rate) in enumerate([(0.01, 50_000), (0.005, 50_000)]):
        f = tmp_path / f"run{i}.json"
        f.write_text(json.dumps(_fake_run(emp_s, rate)))
        files.append(str(f))
    assert be.main(["--table", *files]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 1,000:"))
    assert "0.38× (0.25–0.50)" in row
    assert "150,000 (100,000–200,000)" in row
    assert "2 runs, 2 rounds pooled" in out


def test_table_prints_the_floor_under_a_single_query(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for i, (rpc, commit) in enumerate([(0.8, 0.3), (1.0, 0.5)]):
        run = _fake_run(0.01, 50_000)
        single = run["rounds"][0]["svtagg"]["single_query"]  # type: ignore[index]
        single.update(grpc_unary_p50_ms=rpc, fsync_commit_p50_ms=commit)
        f = tmp_path / f"run{i}.json"
        f.write_text(json.dumps(run))
        files.append(str(f))
    assert be.main(["--table", *files]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| 1: floor"))
    assert "0.90 (0.80–1.00) ms a bare gRPC call" in row
    assert "0.40 (0.30–0.50) ms an fsync'd commit" in row
    # Results saved before the floor was measured print no such row.
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(_fake_run(0.01, 50_000)))
    assert be.main(["--table", str(plain)]) == 0
    assert "| 1: floor" not in capsys.readouterr().out


def test_floor_is_measured_on_a_running_deployment_round_after_round(tmp_path: Path) -> None:
    """`bench_floor` against real server processes, twice (as bench_emp's rounds
    call it): both figures are positive times, each round on a fresh file."""
    from svtagg.benchmarks.bench_system import bench_floor
    from svtagg.deploy.launch import LocalDeployment

    with LocalDeployment(tmp_path / "dep") as dep:
        for _ in range(2):
            floor = bench_floor(dep, 5)
            assert set(floor) == {"grpc_unary_p50_ms", "fsync_commit_p50_ms"}
            assert all(0 < v < 1000 for v in floor.values()), floor
