"""A node dies under a running job: `kill -9` of its slurmd and of everything the job ran on it
(the machine is gone). Slurm marks the node down after SlurmdTimeout and ends the job NODE_FAIL;
no exit record ever comes, so the attempt is lost; orch requeues it uncharged, the next
submission runs on the other node and resumes from the newest checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import slurm_id, squeue_state
from daemon_harness import wait_for
from orchestrator.host import procs
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def job_pids(sid: str) -> list[int]:
    """Every process of Slurm job `sid` on this host: its slurmstepds and what they started."""
    return [
        pid
        for pid in procs.pids()
        if procs.cmdline(pid).startswith(f"slurmstepd: [{sid}.")
        or procs.environ(pid).get(b"SLURM_JOB_ID") == sid.encode()
    ]


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
        wait_for(lambda: h.job(job).executor_ref.get("nodes") == [other], 10, what=f"attempt 2 on {other}")
        h.release("go")
        done = h.wait_state(job, JobState.SUCCEEDED, timeout=30)
        assert done.failures == 0 and done.attempt == 2  # lost, not charged
        kinds = h.event_kinds(job)
        assert "preempted" in kinds, kinds
        assert h.store.attempts(job)[0].outcome.value == "lost"
        print(f"node failure -> next attempt started after {took:.1f}s")
    finally:
        h.release("go")
        h.slurm.start_slurmd(node)
        h.slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        h.slurm.cancel_all()
        h.slurm.wait_idle(60)


def test_attempt_submitted_but_never_recorded_is_adopted_not_submitted_twice(slurm_home):
    """The daemon died between sbatch and recording the Slurm id: the next daemon finds the
    attempt (the file the exchange wrote beside the script) and follows it instead of running it again."""
    from orchestrator.jobs.attempts import begin_attempt
    from orchestrator.executors import build_executor

    h = slurm_home()
    job = h.submit("orphan", hold="go")  # no daemon runs yet: it stays queued
    begun = begin_attempt(
        h.store, h.config, h.home, h.job(job), [], time.time(), environ=dict(os.environ), executor="slurm"
    )
    executor = build_executor(h.config, h.home)
    executor.start(begun.launch)  # queues the sbatch, which the exchange sends off the tick's lock
    executor.exchange([h.job(job)], time.time())  # ...and the daemon "dies" here, before recording it
    ref = json.loads((h.run_dir(job) / "attempt-1.submitted.json").read_text())
    assert h.job(job).state is JobState.RUNNING and not h.job(job).executor_ref
    h.start_daemon()
    wait_for(lambda: h.job(job).executor_ref.get("slurm_job_id") == ref["slurm_job_id"], 20, what="adoption")
    h.wait_record("orphan", "start", attempt=1, timeout=30)
    h.release("go")
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=30)
    assert done.attempt == 1
    name = [
        ln.split("=", 1)[1]
        for ln in (h.run_dir(job) / "attempt-1.sbatch").read_text().splitlines()
        if ln.startswith("#SBATCH --job-name=")
    ][0]
    out = h.slurm.run("squeue", "-h", "-t", "all", "-u", "root", "-o", "%j", check=False).stdout.split()
    assert out.count(name) == 1 and not any(n.startswith(name[:-1]) and n != name for n in out), out
    assert len(h.records("orphan", "start")) == 1
