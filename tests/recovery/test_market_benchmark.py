"""benchmarks/market.py (`python -m benchmarks.market`) on a short synthetic trace: the real controller replays a handful of jobs
for each policy; the JSON has the documented shape, on-demand only costs exactly 1.0, no policy misses a
deadline or gives a job up on a market with long spot runs and short outages, and none costs less
than the oracle (--oracle) that knows the trace's future."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_market_benchmark_json_on_a_synthetic_trace(tmp_path):
    # 10-minute ticks: 3 h of spot, 1 h without, for 5 days.
    values = ([1] * 18 + [0] * 6) * 5 * 6
    (tmp_path / "zone-a.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": values}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.market",
            str(tmp_path),
            "--starts",
            "3",
            "--job-hours",
            "8",
            "--deadline-hours",
            "12",
            "--workers",
            "1",
            "--oracle",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"orch", "greedy", "uniform_progress", "on_demand", "oracle"}
    oracle = result.pop("oracle")
    assert oracle["runs"] == 3
    for name, row in result.items():
        # Knowing the future, no schedule costs more than the oracle's, in either accounting.
        assert oracle["cost_vs_on_demand"] <= row["cost_vs_on_demand"], name
        assert oracle["paper"]["cost_vs_on_demand"] <= row["paper"]["cost_vs_on_demand"], name
        assert {"od_h", "spot_h", "cost_vs_on_demand", "missed", "given_up", "runs"} <= set(row), name
        assert row["runs"] == 3 and row["missed"] == 0 and row["given_up"] == 0, (name, row)
    assert result["on_demand"]["cost_vs_on_demand"] == 1.0
    assert result["on_demand"]["spot_h"] == 0.0
    # With spot most of the time, orch buys spot hours and pays less than on-demand only.
    assert result["orch"]["spot_h"] > 0 and result["orch"]["cost_vs_on_demand"] < 1.0


def test_market_benchmark_refuses_a_folder_without_traces(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.market", str(tmp_path), "--starts", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2 and "no *.json traces" in done.stderr and "Traceback" not in done.stderr


def test_market_benchmark_zones_on_two_synthetic_zones(tmp_path):
    # Two zones whose spot comes and goes out of step: 2 h up, 2 h down, for 5 days, one shifted
    # by an hour -- together, spot is almost always somewhere.
    a = ([1] * 12 + [0] * 12) * 5 * 3
    b = a[6:] + a[:6]
    for name, values in (("zone-a", a), ("zone-b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": values}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.market",
            str(tmp_path),
            "--zones",
            "--starts",
            "2",
            "--job-hours",
            "8",
            "--deadline-hours",
            "12",
            "--workers",
            "1",
            "--oracle",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"orch", "uniform_progress", "on_demand", "uniform_progress@zone-a", "uniform_progress@zone-b"} <= set(
        result
    )
    single = result["uniform_progress single zone"]
    assert single["best_zone"] in ("zone-a", "zone-b")
    for name in ("orch", "uniform_progress"):
        row = result[name]
        assert row["missed"] == 0 and row["given_up"] == 0 and row["runs"] == 2, (name, row)
        # Spot in either zone: cheaper than in either zone alone, and never under the oracle.
        assert row["cost_vs_on_demand"] <= single["best"], (name, row, single)
        assert result["oracle"]["cost_vs_on_demand"] <= row["cost_vs_on_demand"], name
    assert result["on_demand"]["cost_vs_on_demand"] == 1.0


def test_market_benchmark_packs_jobs_with_different_deadlines_on_one_machine(tmp_path):
    # --jobs-per-machine 3: each start is three jobs that begin on one machine, their deadlines
    # 8 + 4/3, 8 + 8/3 and 12 h; every job is a row of its own, the machines' hours shared.
    values = ([1] * 18 + [0] * 6) * 5 * 6
    (tmp_path / "zone-a.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": values}))
    args = ["--starts", "2", "--job-hours", "8", "--deadline-hours", "12", "--workers", "1", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.market", str(tmp_path), *args, "--jobs-per-machine", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for name, row in result.items():
        assert row["runs"] == 6 and row["missed"] == 0 and row["given_up"] == 0, (name, row)
    # On-demand only: one 3-GPU machine for the three jobs, one boot and one hand-over shared.
    assert result["on_demand"]["cost_vs_on_demand"] == 1.0
    assert result["on_demand"]["machines"] == round(1 / 3, 2)
    assert result["orch"]["spot_h"] > 0 and result["orch"]["cost_vs_on_demand"] < 1.0


def test_market_benchmark_refuses_packing_with_the_oracle(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 2000}))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.market", str(tmp_path), "--jobs-per-machine", "2", "--oracle"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2 and "--jobs-per-machine" in done.stderr and "Traceback" not in done.stderr
