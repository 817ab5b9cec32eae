"""Cost on Slurm: the GPUs Slurm allocated x the time Slurm ran the attempt x gpu_hour; nothing
while it is PENDING. The test cluster's "GPUs" are fake gres (/dev/null, /dev/zero): Slurm
allocates and counts them and sets CUDA_VISIBLE_DEVICES, but no CUDA code runs on them."""

from __future__ import annotations

import time

import pytest

from conftest import slurm_id
from daemon_harness import wait_for
from orchestrator.spec.config import load_config
from orchestrator.executors.slurm.query import parse_duration
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow


def test_gpu_job_costs_allocated_gpus_times_slurm_running_time_and_nothing_pending(slurm_home):
    h = slurm_home()
    text = (h.root / "config.toml").read_text() + "\n[pricing]\ngpu_hour = 3600.0\n"  # 1 per GPU-second
    (h.root / "config.toml").write_text(text)
    h.config = load_config(h.root / "config.toml", required=True)
    h.start_daemon()
    # every "GPU" of both nodes taken by a high-partition job: ours waits PENDING
    blocker = h.slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-N2", "--gres=gpu:2", "--wrap", "sleep 6"
    ).stdout.strip()
    path = h.job_file("gpu2", gpus=2, hold="go", env_keys=["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"])
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=64).id
    poke(h.home.wake_socket)
    try:
        sid = slurm_id(h, job)
        wait_for(lambda: "PENDING" in (h.job(job).executor_ref.get("where") or ""), 20, what="PENDING")
        h.wait_ticks(4, exchanges=4)  # observed ticks and polls while it is PENDING
        assert h.job(job).cost == 0.0 and h.job(job).gpu_seconds == 0.0
        start = h.wait_record("gpu2", "start", timeout=40)
        assert start["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and start["env"]["SLURM_JOB_GPUS"] == "0,1", start["env"]
        sbatch = (h.run_dir(job) / "attempt-1.sbatch").read_text()
        assert "--gres=gpu:2" in sbatch
        wait_for(lambda: h.job(job).run_seconds >= 3, 20, what="3 s of running")
        h.release("go")
        done = h.wait_state(job, JobState.SUCCEEDED, timeout=30)
        elapsed = parse_duration(h.slurm.run("squeue", "-h", "-t", "all", "-j", sid, "-o", "%M").stdout.strip())
        assert done.cost == pytest.approx(2 * done.run_seconds, rel=1e-6)
        assert done.gpu_seconds == pytest.approx(2 * done.run_seconds, rel=1e-6)
        # Slurm's own clock saw it run too (the daemon's polls lag Slurm's by a poll or two either
        # way, so the two are not compared closer: on a loaded machine that would be a race)
        assert elapsed > 0 and done.run_seconds >= 3, (done.run_seconds, elapsed)  # 3: waited for above
        ledger = h.store.ledger()
        assert ledger.get("idle_cost", 0.0) == 0.0  # a cluster has no idle cost of ours
    finally:
        h.slurm.run("scancel", blocker, check=False)
