"""Benchmarks of the Ray executor on a REAL Ray cluster on this host (a head and two 1-GPU workers,
started here like tests/ray_executor):

1. submit -> running on Ray: `orch submit` (the CLI) of a command job through a running daemon vs a
   bare `ray job submit --no-wait` (Ray's CLI) of the same entrypoint, arms alternated, a warm-up
   trial of each first. Both measured from the CLI's start to the moment the job's own first line
   runs on the node (it creates a marker file), so both arms end at the same event.
2. node lost -> training again: a command job that writes a heartbeat file every 0.2 s; the raylet
   of its node `kill -9`ed; from the kill to the first heartbeat of attempt 2 on the other worker
   (Ray noticing the node is gone + orch reading the lost attempt + the submit + the start).

Run: `python -m benchmarks.ray [--trials 5] [--losses 2]` with ray installed (the test extra)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.host.polling import poll
from tests.ray_executor.ray_cluster import RAY, RayCluster, why_unusable


def wait(pred, timeout=180.0, interval=0.02, what=""):
    value = poll(pred, timeout, interval)
    if not value:
        raise TimeoutError(what)
    return value


def make_home(tmp: Path, c: RayCluster):
    from orchestrator.spec.config import load_config
    from tests.daemon_harness import OrchHome

    h = OrchHome(tmp, grace_seconds=10, tick_seconds=0.2)
    text = (h.root / "config.toml").read_text()
    text += f'\n[executor]\nkind = "ray"\n\n[ray]\naddress = "{c.address}"\npoll_seconds = 0.5\n'
    (h.root / "config.toml").write_text(text)
    h.config = load_config(h.root / "config.toml", required=True)
    return h


def marker_command(marker: Path) -> list[str]:
    return [sys.executable, "-c", f"import pathlib; pathlib.Path({str(marker)!r}).touch()"]


def orch_arm(h, n: int) -> float:
    marker = h.tmp / f"orch-{n}.started"
    job = h.jobs_dir / f"b{n}.toml"
    job.write_text(f"name = 'b{n}'\ngpus = 1\ncommand = {json.dumps(marker_command(marker))}\n")
    t0 = time.perf_counter()
    out = h.cli("submit", str(job))
    assert out.returncode == 0, out.stderr
    wait(marker.exists, what=f"orch trial {n}")
    return time.perf_counter() - t0


def bare_arm(h, c: RayCluster, n: int) -> float:
    marker = h.tmp / f"bare-{n}.started"
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(RAY), "job", "submit", "--address", c.address, "--submission-id", f"bare-{n}-{time.time_ns()}"]
        + ["--entrypoint-num-gpus", "1", "--no-wait", "--", *marker_command(marker)],
        capture_output=True,
        text=True,
        env=c.env,
    )
    assert out.returncode == 0, out.stderr
    wait(marker.exists, what=f"bare trial {n}")
    return time.perf_counter() - t0


def submit_ratio(h, c: RayCluster, trials: int) -> dict:
    orch_arm(h, 0), bare_arm(h, c, 0)  # warm-up: the first of each pays for cold caches
    orch, bare = [], []
    for n in range(1, trials + 1):
        arms = [lambda: orch.append(orch_arm(h, n)), lambda: bare.append(bare_arm(h, c, n))]
        for arm in arms if n % 2 else arms[::-1]:
            arm()
    return {
        "orch_s": [round(x, 2) for x in orch],
        "bare_s": [round(x, 2) for x in bare],
        "orch_median_s": round(statistics.median(orch), 2),
        "bare_median_s": round(statistics.median(bare), 2),
        "ratio": round(statistics.median(orch) / statistics.median(bare), 3),
    }


def node_loss(h, c: RayCluster, n: int) -> dict:
    beat = h.tmp / f"beat-{n}"
    code = (  # one line: a job.toml string holds no newline
        "import os, pathlib, time; "
        f"[(pathlib.Path({str(beat)!r} + '-' + os.environ['ORCH_ATTEMPT']).write_text(str(time.time())), "
        "time.sleep(0.2)) for _ in iter(int, 1)]"
    )
    job = h.jobs_dir / f"loss{n}.toml"
    job.write_text(f"name = 'loss{n}'\ngpus = 1\nretries = 0\ncommand = {json.dumps([sys.executable, '-c', code])}\n")
    out = h.cli("submit", str(job), "--json")
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["id"]
    wait(lambda: Path(f"{beat}-1").exists(), what="attempt 1 beating")
    node = wait(lambda: h.job(job_id).executor_ref.get("node_id"), what="its node")
    worker = wait(lambda: c.node_of(node), what="its worker")
    t0 = time.time()
    c.lose_worker(worker)
    wait(lambda: Path(f"{beat}-2").exists(), timeout=300, what="attempt 2 beating")
    again = time.time() - t0
    attempts = h.store.attempts(job_id)
    lost_at = attempts[0].ended_at or t0
    h.cli("cancel", str(job_id))
    c.add_worker(worker)
    return {
        "kill_to_training_again_s": round(again, 1),
        "kill_to_lost_s": round(lost_at - t0, 1),
        "lost_to_training_s": round(again - (lost_at - t0), 1),
        "outcome_1": attempts[0].outcome.value,
        "charged": h.job(job_id).failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--losses", type=int, default=2)
    args = parser.parse_args()
    why = why_unusable()
    if why:
        sys.exit(why)
    c = RayCluster(fast_loss_detection=False)  # Ray's own node health check, as on a user's cluster
    h = None
    tmp = Path(tempfile.mkdtemp(prefix="orch-ray-bench-"))
    try:
        c.start(workers=2)
        h = make_home(tmp, c)
        h.start_daemon()
        report = {"submit_to_running": submit_ratio(h, c, args.trials)}
        print(json.dumps(report), file=sys.stderr, flush=True)
        report["node_loss"] = [node_loss(h, c, n) for n in range(args.losses)]
        print(json.dumps(report, indent=2))
    finally:
        if h is not None:
            h.cleanup()
        c.stop()


if __name__ == "__main__":
    main()
