"""What ends an attempt, through the daemon's steps with real supervisors and jobs: cancel, retries,
exit 75, signals; the job-process contract (env, attempt-<n>.exit, attempt-<n>.log) and `orch logs
-f`. Most tests tick an in-process daemon; the daemon's own process where stopping it is the point."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


# These tests need the daemon's steps, not its process: an in-process daemon (real supervisors and
# jobs, `orch cancel` a real CLI) that the test ticks. The ones that stop, kill or restart the
# daemon itself start its process.


def test_cancel_a_queued_job_is_immediate(orch_home):
    h = orch_home()
    d = h.local_daemon()
    blocker = h.submit("blocker", hold="blocker")
    h.tick_state(d, blocker, JobState.RUNNING)
    waiting = h.submit("waiting")
    result = h.cli("cancel", str(waiting))
    assert result.returncode == 0 and f"cancelled job {waiting}" in result.stdout
    assert h.state(waiting) is JobState.CANCELLED
    h.release("blocker")
    h.tick_state(d, blocker, JobState.SUCCEEDED)
    assert h.state(waiting) is JobState.CANCELLED and not h.records("waiting")
    again = h.cli("cancel", str(waiting))
    assert again.returncode == 1 and "cannot become cancelled" in again.stderr


def test_cancel_a_running_job_sigterms_it_and_it_ends_cancelled(orch_home):
    h = orch_home()
    d = h.local_daemon()
    job_id = h.submit("victim", hold="never", on_term=0)
    h.tick_until(d, lambda: h.records("victim"), what="the job to start")
    result = h.cli("cancel", str(job_id))
    assert result.returncode == 0 and "SIGTERM" in result.stdout
    job = h.tick_state(d, job_id, JobState.CANCELLED)
    assert (h.tmp / "term-victim#1").exists()  # the job's own SIGTERM handler ran
    assert job.failures == 0 and job.reason.startswith("cancelled by the user")
    assert h.store.attempts(job_id)[0].outcome == "cancelled"
    assert h.exit_record(job_id, 1)["code"] == 0
    assert "cancel_requested" in h.event_kinds(job_id)


def test_cancel_escalates_to_sigkill_after_the_grace(orch_home):
    h = orch_home(grace_seconds=1)
    d = h.local_daemon()
    job_id = h.submit("stubborn", hold="never", on_term=None)  # traps SIGTERM and goes on
    h.tick_until(d, lambda: h.records("stubborn"), what="the job to start")
    assert h.cli("cancel", str(job_id)).returncode == 0
    h.tick_state(d, job_id, JobState.CANCELLED)
    assert (h.tmp / "term-stubborn#1").exists()
    assert h.exit_record(job_id, 1)["signal"] == signal.SIGKILL


def test_retries_then_failure_names_the_exit_code_and_keeps_the_log_tail(orch_home):
    h = orch_home()
    d = h.local_daemon()
    job_id = h.submit("flaky", retries=2, exit=3, print=["the last words of the job"])
    job = h.tick_state(d, job_id, JobState.FAILED)
    attempts = h.store.attempts(job_id)
    assert [a.n for a in attempts] == [1, 2, 3] and [a.exit_code for a in attempts] == [3, 3, 3]
    assert job.failures == 3 and job.attempt == 3
    assert "exit code 3" in job.reason and "2 retries" in job.reason
    assert [r["attempt"] for r in h.records("flaky", "start")] == [1, 2, 3]
    events = h.store.events(job_id)
    assert [e.kind for e in events].count("retrying") == 2
    failed = [e for e in events if e.kind == "failed"][-1]
    assert "exit code 3" in failed.detail and "the last words of the job" in failed.detail
    # Backoff: the third attempt waited at least base * 2 after the second one ended.
    assert attempts[2].started_at - attempts[1].ended_at >= 0.4 - 0.05


def test_exit_75_requeues_uncharged_and_the_next_attempt_resumes_from_the_checkpoint(orch_home):
    h = orch_home()
    d = h.local_daemon()
    job_id = h.submit("ckpt", retries=0, per_attempt={"1": {"ckpt": 10, "exit": 75}, "2": {"exit": 0}})
    job = h.tick_state(d, job_id, JobState.SUCCEEDED)
    assert job.failures == 0 and job.attempt == 2
    first, second = h.records("ckpt", "start")
    assert first["env"]["ORCH_RESUME_FROM"] == ""
    expected = str(h.run_dir(job_id) / "checkpoints" / "step-00000010.ckpt")
    assert second["env"]["ORCH_RESUME_FROM"] == expected
    attempts = h.store.attempts(job_id)
    assert attempts[0].outcome == "checkpointed" and attempts[1].resumed_from_step == 10
    kinds = h.event_kinds(job_id)
    assert kinds == ["submitted", "started", "retrying", "resumed", "succeeded"]


def test_job_env_contract(orch_home):
    h = orch_home()
    d = h.local_daemon()
    job_id = h.submit("envy", env={"MY_SETTING": "42", "HF_ENDPOINT": "https://hf-mirror.com"})
    h.tick_state(d, job_id, JobState.SUCCEEDED)
    rec = h.wait_record("envy")
    run_dir = h.run_dir(job_id)
    assert rec["env"] == {
        "ORCH_JOB_ID": str(job_id),
        "ORCH_ATTEMPT": "1",
        "ORCH_RUN_DIR": str(run_dir),
        "ORCH_CKPT_DIR": str(run_dir / "checkpoints"),
        "ORCH_RESUME_FROM": "",
        "CUDA_VISIBLE_DEVICES": "",
        "MY_SETTING": "42",
        "HF_ENDPOINT": "https://hf-mirror.com",
    }
    assert (run_dir / "checkpoints").is_dir()
    assert rec["cwd"] == str(h.jobs_dir)  # workdir defaults to the job file's folder


def test_attempt_exit_and_log_files(orch_home):
    h = orch_home()
    d = h.local_daemon()
    ok = h.submit("ok", exit=0)
    killed = h.submit("killed", self_signal=int(signal.SIGKILL), retries=0)
    missing = h.submit("missing", command=[str(h.tmp / "no-such-program")], retries=0)
    h.tick_state(d, ok, JobState.SUCCEEDED)
    h.tick_state(d, killed, JobState.FAILED)
    h.tick_state(d, missing, JobState.FAILED)
    assert h.exit_record(missing, 1)["code"] == 127 and "exit code 127" in h.job(missing).reason
    assert "cannot start the job" in (h.run_dir(missing) / "attempt-1.log").read_text()
    exit_ok = h.exit_record(ok, 1)
    assert set(exit_ok) == {"code", "signal", "started_at", "ended_at"}
    assert exit_ok["code"] == 0 and exit_ok["signal"] is None
    assert exit_ok["started_at"] <= h.wait_record("ok")["t"] <= exit_ok["ended_at"]
    log = (h.run_dir(ok) / "attempt-1.log").read_text()
    assert "ok#1 says hello on stdout" in log and "ok#1 says hello on stderr" in log
    assert "[orch] attempt 1 started" in log and "[orch] attempt 1 ended" in log and "exit code 0" in log
    exit_killed = h.exit_record(killed, 1)
    assert exit_killed["code"] is None and exit_killed["signal"] == signal.SIGKILL
    assert "terminated by signal 9 (SIGKILL)" in h.job(killed).reason
    assert h.store.attempts(killed)[0].exit_signal == 9


def test_logs_follow_across_attempts_until_the_job_ends(orch_home):
    h = orch_home()
    h.start_daemon()
    job_id = h.submit(
        "chatty",
        per_attempt={
            "1": {"hold": "first", "exit": 75, "print": ["first attempt bye"]},
            "2": {"hold": "second", "print": ["second attempt bye"]},
        },
    )
    h.wait_record("chatty", attempt=1)
    follower = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "logs", "-f", str(job_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        h.release("first")
        h.wait_record("chatty", attempt=2)
        assert follower.poll() is None  # the job has not ended: still following
        h.release("second")
        out, err = follower.communicate(timeout=20)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert h.state(job_id) is JobState.SUCCEEDED
    for text in (
        "chatty#1 says hello on stdout",
        "first attempt bye",
        "chatty#2 says hello on stdout",
        "second attempt bye",
        "[orch] attempt 2 ended",
    ):
        assert text in out
    assert out.index("first attempt bye") < out.index("chatty#2 says hello")
    last = h.cli("logs", str(job_id), "-n", "1")
    assert last.returncode == 0 and last.stdout.strip().startswith("[orch] attempt 2 ended")


def test_a_job_with_its_own_longer_grace_gets_all_of_it_when_the_daemon_stops(orch_home):
    h = orch_home(grace_seconds=0.2)  # the daemon's backstop and its stop wait: config grace + 5 s
    daemon = h.start_daemon()
    job_id = h.submit("slow-saver", grace_seconds=20, hold="never", on_term=75, term_delay=6)
    h.wait_record("slow-saver")
    assert h.stop_daemon(daemon, timeout=30) == 0
    # The daemon waited for the job's own grace, and never SIGKILLed it mid-checkpoint.
    assert h.exit_record(job_id, 1)["code"] == 75
    job = h.job(job_id)
    assert job.state is JobState.QUEUED and job.failures == 0
    assert h.store.attempts(job_id)[0].outcome == "preempted"


def test_a_lost_mirror_lease_moves_the_job_with_its_own_intent_not_the_budgets(orch_home):
    """Another machine adopted the job: the running attempt is told to checkpoint and stop, the
    intent recorded is `lease_lost` (a budget stop is a different fact), and the job ends `moved`
    with the lease's reason — also when a preemption notice was already stopping it. `orch retry`
    refuses it (it would run on two machines), and its notification says what happened."""
    from orchestrator.daemon.stop_requests import signal_job, stop_for_lost_lease
    from orchestrator.model.states import Intent

    h = orch_home(cpu_slots=2)
    d = h.local_daemon()
    plain = h.submit("plain", hold="never", on_term=75, ckpt=3)
    noticed = h.submit("noticed", hold="never", on_term=75, ckpt=3, term_delay=1.0)
    h.tick_until(d, lambda: len(h.records(event="start")) == 2, what="both jobs to start")
    signal_job(d, h.job(noticed), Intent.PREEMPT, time.time(), "a test notice")  # already stopping
    assert h.job(plain).intent is Intent.NONE
    assert h.job(noticed).intent is Intent.PREEMPT
    reason = "lease lost: host other-machine adopted this job"
    for job_id in (plain, noticed):
        stop_for_lost_lease(d, job_id, reason, time.time())
        assert h.job(job_id).intent is Intent.LEASE_LOST
    for job_id in (plain, noticed):
        job = h.tick_until(
            d,
            lambda: (lambda j: j if j.state is JobState.MOVED else None)(h.job(job_id)),
            what=f"job {job_id} to stop",
        )
        assert job.reason == reason and h.store.attempts(job_id)[-1].outcome == "moved"
        assert [e.kind for e in h.store.events(job_id, kinds=["lease_lost", "stopped"])] == ["lease_lost"]
    queued = h.submit("queued-elsewhere", hold="never")  # never dispatched: no tick before the lease is lost
    stop_for_lost_lease(d, queued, reason, time.time())
    assert h.job(queued).state is JobState.MOVED and h.job(queued).reason == reason
    for job_id in (plain, queued):
        retried = h.cli("retry", str(job_id))
        assert retried.returncode == 1 and "other-machine adopted this job" in retried.stderr, retried
        assert "train it twice" in retried.stderr and "Traceback" not in retried.stderr
        assert h.job(job_id).state is JobState.MOVED
