"""A node dies under a running job: `kill -9` of its slurmd and of everything the job ran on it
(the machine is gone). Slurm marks the node down after SlurmdTimeout and ends the job NODE_FAIL;
no exit record ever comes, so the attempt is lost; orch requeues it uncharged, the next
submission runs on the other node and resumes from the newest checkpoint."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import slurm_id, squeue_state
from daemon_harness import wait_for
from orchestrator.states import JobState

pytestmark = pytest.mark.slow


def job_pids(sid: str) -> list[int]:
    """Every process of Slurm job `sid` on this host: its slurmstepds and what they started."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd.startswith(f"slurmstepd: [{sid}.") or f"SLURM_JOB_ID={sid}".encode() in env:
            pids.append(int(entry))
    return pids


def test_node_failure_requeues_and_the_job_finishes_on_the_other_node(slurm_home):
    h = slurm_home()
    h.start_daemon()
    job = h.submit("survivor", hold="go", ckpt=7, retries=0)
    sid = slurm_id(h, job)
    h.wait_record("survivor", "start", attempt=1, timeout=30)
    node = wait_for(lambda: (h.job(job).executor_ref.get("nodes") or [None])[0], 15, what="the job's node")
    other = "n2" if node == "n1" else "n1"
    t0 = time.monotonic()
    h.slurm.kill9_slurmd(node)
    for pid in job_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        second = h.wait_record("survivor", "start", attempt=2, timeout=90)
        took = time.monotonic() - t0
        assert squeue_state(h.slurm, sid) == "NODE_FAIL"
        assert second["env"]["ORCH_RESUME_FROM"].endswith("step-00000007.ckpt"), second["env"]
        assert h.job(job).executor_ref.get("nodes") == [other]
        h.release("go")
        done = h.wait_state(job, JobState.SUCCEEDED, timeout=30)
        assert done.failures == 0 and done.attempt == 2  # lost, not charged
        kinds = h.event_kinds(job)
        assert "preempted" in kinds, kinds
        assert h.store.attempts(job)[0].outcome.value == "lost"
        print(f"node failure -> next attempt started after {took:.1f}s")
    finally:
        h.slurm.start_slurmd(node)
        h.slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        h.slurm.wait_idle(60)
