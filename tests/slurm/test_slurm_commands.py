"""Command jobs through a real orch daemon on a real private Slurm: success, what `orch status`
and `orch show` report, and `orch cancel` of a running and of a pending Slurm job."""

from __future__ import annotations

import json
import sys
import time

import pytest

from conftest import orch_cli, slurm_id, squeue_state
from daemon_harness import wait_for
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def test_command_job_runs_to_success_and_status_shows_slurm(slurm_home):
    h = slurm_home()
    d = h.start_daemon()
    job = h.submit("hello", hold="hello", print=["printed by the job"])
    sid = slurm_id(h, job)
    rec = h.wait_record("hello", "start", timeout=30)
    assert rec["env"]["ORCH_ATTEMPT"] == "1" and rec["env"]["ORCH_JOB_ID"] == str(job)
    # while it runs, `orch status` says where: the Slurm id, RUNNING, the node
    wait_for(lambda: "RUNNING on n" in (h.job(job).executor_ref.get("where") or ""), 15, what="the RUNNING state")
    st = orch_cli(h, "status", "--json")
    row = [r for r in json.loads(st.stdout) if r["id"] == job][0]
    assert row["state"] == "running" and row["where"].startswith(f"Slurm {sid}: RUNNING on n"), row
    assert f"Slurm {sid}: RUNNING on n" in orch_cli(h, "status").stdout
    h.release("hello")
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=30)
    assert done.attempt == 1 and done.run_seconds > 0
    # the exit record comes first (orch settles on it); Slurm says COMPLETED once the script has ended
    wait_for(lambda: squeue_state(h.slurm, sid) == "COMPLETED", 30, what=lambda: squeue_state(h.slurm, sid))
    log = (h.run_dir(job) / "attempt-1.log").read_text()
    assert "printed by the job" in log and f"as Slurm job {sid}" in log
    sbatch = (h.run_dir(job) / "attempt-1.sbatch").read_text()
    assert "--no-requeue" in sbatch and "--open-mode=append" in sbatch and "--partition=low" in sbatch
    show = orch_cli(h, "show", str(job), "--json")
    data = json.loads(show.stdout)
    assert data["state"] == "succeeded" and data["attempts"][0]["exit_code"] == 0, data
    assert "hello" in orch_cli(h, "status", "--all").stdout
    assert h.stop_daemon(d) == 0


def test_cancel_running_slurm_job_signals_the_task_and_never_requeues(slurm_home):
    h = slurm_home()
    h.start_daemon()
    job = h.submit("busy", hold="never", on_term=75, notice_ckpt=3, retries=3)
    sid = slurm_id(h, job)
    h.wait_record("busy", "start", timeout=30)
    r = orch_cli(h, "cancel", str(job))
    assert r.returncode == 0, r.stderr
    done = h.wait_state(job, JobState.CANCELLED, timeout=40)
    assert h.records("busy", "sigterm"), "the task itself got SIGTERM (scancel --signal=TERM)"
    assert (h.run_dir(job) / "checkpoints" / "notice-step-00000003.ckpt").exists()
    assert done.attempt == 1
    assert h.exit_record(job, 1)["code"] == 75
    h.wait_ticks(4, exchanges=4)  # observed ticks and looks at Slurm: nothing resubmits it
    assert h.job(job).attempt == 1 and h.job(job).state is JobState.CANCELLED
    name = [
        ln.split("=", 1)[1]
        for ln in (h.run_dir(job) / "attempt-1.sbatch").read_text().splitlines()
        if ln.startswith("#SBATCH --job-name=")
    ][0]
    assert name.endswith(f"-{job}.1")
    r = h.slurm.run("squeue", "-h", "-t", "all", "-n", name[:-1] + "2", "-o", "%i", check=False)
    assert not r.stdout.strip()
    assert squeue_state(h.slurm, sid) in ("COMPLETED", "CANCELLED")


def test_cancel_pending_slurm_job_is_at_once(slurm_home):
    h = slurm_home()
    h.start_daemon()
    # both nodes busy in the high partition: orch's job waits in Slurm's queue
    blocker = h.slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-N2", "--wrap", "sleep 120"
    ).stdout.strip()
    try:
        job = h.submit("waits", hold="never")
        sid = slurm_id(h, job)
        # Slurm gives a reason ("Resources", "Priority") at its scheduler's next pass; until then it
        # reports "None" and orch shows a bare PENDING, so wait for the reason rather than race it
        wait_for(lambda: "PENDING (" in (h.job(job).executor_ref.get("where") or ""), 60, what="PENDING (reason)")
        row = [r for r in json.loads(orch_cli(h, "status", "--json").stdout) if r["id"] == job][0]
        assert row["state"] == "running" and f"Slurm {sid}: PENDING (" in row["where"], row
        h.wait_ticks(4, exchanges=4)  # observed ticks and polls while Slurm holds it PENDING: no runtime, no cost
        assert h.job(job).cost == 0.0 and h.job(job).run_seconds == 0.0
        assert orch_cli(h, "cancel", str(job)).returncode == 0
        h.wait_state(job, JobState.CANCELLED, timeout=60)
        assert squeue_state(h.slurm, sid) == "CANCELLED"
        assert not h.records("waits"), "it never ran"
    finally:
        h.slurm.run("scancel", blocker, check=False)


def test_budget_counts_only_slurm_running_time_and_stops_the_job(slurm_home):
    """max_hours = 0.001 (3.6 s): the job waits PENDING behind a blocker for longer than that and is
    not stopped (pending costs nothing); once Slurm runs it, 3.6 s later it is told to stop."""
    h = slurm_home()
    h.start_daemon()
    blocker = h.slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-N2", "--wrap", "sleep 8"
    ).stdout.strip()
    path = h.job_file("capped", hold="never", on_term=75, notice_ckpt=2)
    path.write_text(path.read_text() + "\n[budget]\nmax_hours = 0.001\n")
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.wake import poke

    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0).id
    poke(h.home.wake_socket)
    try:
        wait_for(lambda: "PENDING" in (h.job(job).executor_ref.get("where") or ""), 20, what="PENDING")
        h.wait_ticks(4, exchanges=4)  # observed ticks and polls while it is PENDING: nothing billed
        assert h.state(job) is JobState.RUNNING and h.job(job).run_seconds == 0.0
        h.wait_record("capped", "start", timeout=30)
        done = h.wait_state(job, JobState.STOPPED, timeout=120)
        assert h.records("capped", "sigterm") and h.exit_record(job, 1)["code"] == 75
        # stopped by its budget (max_hours = 0.001: 3.6 s) once Slurm had run it that long, never
        # before: the recorded running time, not this test's clock, is what the budget counts
        assert done.run_seconds >= 0.001 * 3600, done.run_seconds
        assert done.reason.startswith("budget: ran") and "max_hours" in done.reason, done.reason  # by its budget
    finally:
        h.slurm.run("scancel", blocker, check=False)


def test_daemon_stop_checkpoints_slurm_jobs_and_leaves_them_queued(slurm_home):
    h = slurm_home()
    d = h.start_daemon()
    job = h.submit("stopper", hold="never", on_term=75, notice_ckpt=5)
    sid = slurm_id(h, job)
    h.wait_record("stopper", "start", timeout=30)
    assert h.stop_daemon(d, timeout=60) == 0
    j = h.job(job)
    assert j.state is JobState.QUEUED and h.exit_record(job, 1)["code"] == 75, j
    assert h.records("stopper", "sigterm")
    assert squeue_state(h.slurm, sid) == "COMPLETED"  # the batch step ended by itself: no requeue, no loop


def test_exit_76_takes_the_oom_path_and_another_exit_is_a_charged_retry(slurm_home):
    """The exit record from the node decides as on one machine: 76 -> the OOM path (uncharged),
    3 -> a retry (charged), 0 -> succeeded; each a new submission with ORCH_ATTEMPT counting on."""
    h = slurm_home()
    h.start_daemon()
    job = h.submit("exits", retries=1, per_attempt={"1": {"exit": 76}, "2": {"exit": 3}, "3": {"exit": 0}})
    done = h.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=60)
    assert done.state is JobState.SUCCEEDED and done.attempt == 3 and done.failures == 1, done
    kinds = h.event_kinds(job)
    assert "oom" in kinds and "retrying" in kinds, kinds
    assert [r["env"]["ORCH_ATTEMPT"] for r in h.records("exits", "start")] == ["1", "2", "3"]
    sids = {h.exit_record(job, n)["slurm_job_id"] for n in (1, 2, 3)}
    assert len(sids) == 3


def test_sbatch_refusal_fails_the_job_with_slurms_reason(slurm_home):
    """job.toml [slurm] partition overrides the config's; a partition Slurm does not have makes
    sbatch refuse, and the job fails with Slurm's own words (no retries asked, nothing loops)."""
    h = slurm_home()
    h.start_daemon()
    path = h.job_file("nowhere", retries=0)
    path.write_text(path.read_text() + '\n[slurm]\npartition = "nope"\n')
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.wake import poke

    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0).id
    poke(h.home.wake_socket)
    done = h.wait_state(job, JobState.FAILED, timeout=30)
    assert "--partition=nope" in (h.run_dir(job) / "attempt-1.sbatch").read_text()
    log = (h.run_dir(job) / "attempt-1.log").read_text()
    assert "sbatch refused attempt 1" in log and "partition" in log.lower(), log
    assert "sbatch refused" in [e.detail for e in h.store.events(job)][-1], h.store.events(job)[-1].detail
    assert done.attempt == 1


STACK_JOB = r"""
import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # what the built-in runner does
def waiting_in_a_named_frame():
    open(os.path.join(sys.argv[1], "ready"), "w").close()
    time.sleep(300)
waiting_in_a_named_frame()
"""


def test_doctor_asks_the_slurm_executor_and_dump_stacks_signals_the_steps_tasks(slurm_home):
    """A running Slurm job is healthy to `orch doctor` (its executor says so: no local supervisor
    is expected), and SlurmExecutor.dump_stacks reaches the job's task through Slurm: its stack
    lands in the attempt log, and the job keeps running."""
    from dataclasses import replace

    from orchestrator.executors.slurm.executor import SlurmExecutor

    h = slurm_home()
    h.start_daemon()
    script = h.tmp / "stack_job.py"
    script.write_text(STACK_JOB)
    job_id = h.submit(h.job_file("stacks", command=[sys.executable, str(script), str(h.tmp)]))
    slurm_id(h, job_id)
    wait_for(lambda: (h.tmp / "ready").exists(), 60, what="the Slurm job to start")
    wait_for(lambda: h.job(job_id).state is JobState.RUNNING, 10)

    doctor = orch_cli(h, "doctor", "--json")
    jobs = [f for f in json.loads(doctor.stdout) if f["area"] == "jobs"]
    assert jobs and all(f["level"] == "ok" for f in jobs), jobs
    assert f"job {job_id} (stacks): slurm attempt alive" in jobs[0]["text"], jobs

    executor = SlurmExecutor(h.home, h.config.slurm)
    job = h.job(job_id)
    executor.refresh([job], time.time())
    assert "not sent SIGUSR1" in executor.dump_stacks(job)  # a command job that did not ask: untouched
    said = executor.dump_stacks(replace(job, kind="builtin"))  # as for the built-in runner
    assert "stacks dumped" in said, said
    log = h.run_dir(job_id) / "attempt-1.log"
    wait_for(
        lambda: "waiting_in_a_named_frame" in log.read_text(errors="replace"),
        20,
        what="faulthandler's dump in the attempt log",
    )
    assert h.job(job_id).state is JobState.RUNNING and h.exit_record(job_id, 1) is None
    assert orch_cli(h, "cancel", str(job_id)).returncode == 0
    h.wait_state(job_id, JobState.CANCELLED, timeout=60)
