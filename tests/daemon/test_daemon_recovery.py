"""The daemon's own life: SIGTERM requeues running jobs, a kill -9 leaves jobs a new daemon
adopts (or requeues when their processes died too), one daemon per home, stop with none."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
from daemon_harness import orch_home, session_members, wait_for  # noqa: F401  (fixture)

from orchestrator.host.procs import is_alive
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def test_daemon_sigterm_requeues_running_jobs_uncharged_and_they_resume_later(orch_home):
    h = orch_home(cpu_slots=2)
    daemon = h.start_daemon()
    saves = h.submit("saves", retries=0, per_attempt={"1": {"hold": "never", "on_term": 75, "notice_ckpt": 7}, "2": {}})
    quits = h.submit("quits", retries=0, per_attempt={"1": {"hold": "never", "on_term": 0}, "2": {}})
    h.wait_record("saves", attempt=1)
    h.wait_record("quits", attempt=1)
    assert h.stop_daemon(daemon) == 0
    for job_id, name in ((saves, "saves"), (quits, "quits")):
        job = h.job(job_id)
        assert job.state is JobState.QUEUED, (name, job.state, job.reason)
        assert job.failures == 0 and job.supervisor_pid is None
        assert (h.tmp / f"term-{name}#1").exists()
        assert h.store.attempts(job_id)[0].outcome == "preempted"
        assert h.event_kinds(job_id)[-1] == "preempted"
    assert "daemon stopped" in h.log_tail()
    # A new daemon (its steps, in this process) runs them again; the one that saved a notice
    # checkpoint resumes from it.
    d = h.local_daemon()
    h.tick_state(d, saves, JobState.SUCCEEDED)
    h.tick_state(d, quits, JobState.SUCCEEDED)
    resumed = h.wait_record("saves", attempt=2)["env"]["ORCH_RESUME_FROM"]
    assert resumed == str(h.run_dir(saves) / "checkpoints" / "notice-step-00000007.ckpt")
    assert h.wait_record("quits", attempt=2)["env"]["ORCH_RESUME_FROM"] == ""
    assert h.job(saves).failures == 0 and h.job(quits).failures == 0


def test_cli_daemon_stop_requeues_and_second_stop_fails(orch_home):
    h = orch_home()
    started = h.cli("daemon", "start")
    assert started.returncode == 0, started.stderr
    job_id = h.submit("long", hold="never", on_term=75)
    h.wait_record("long")
    stopped = h.cli("daemon", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    job = h.job(job_id)
    assert job.state is JobState.QUEUED and job.failures == 0
    again = h.cli("daemon", "stop")
    assert again.returncode == 1 and "no daemon is running" in again.stderr


def test_daemon_stop_with_none_running_exits_1(orch_home):
    h = orch_home()
    result = h.cli("daemon", "stop")
    assert result.returncode == 1
    assert "no daemon is running" in result.stderr and "Traceback" not in result.stderr


def test_a_second_daemon_is_refused_and_names_the_first_pid(orch_home):
    h = orch_home()
    first = h.start_daemon()
    assert (h.root / "daemon.pid").read_text().strip() == str(first.pid)
    for args in (("daemon", "start"), ("daemon", "run")):
        result = h.cli(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert f"pid {first.pid}" in result.stderr and "Traceback" not in result.stderr
    assert first.poll() is None
    assert (h.root / "daemon.pid").read_text().strip() == str(first.pid)
    status = h.cli("daemon", "status")
    assert status.returncode == 0 and f"pid {first.pid}" in status.stdout


def test_the_daemon_never_loads_torch(orch_home):
    h = orch_home()
    daemon = h.start_daemon()
    job_id = h.submit("tiny")
    h.wait_state(job_id, JobState.SUCCEEDED)
    maps = Path(f"/proc/{daemon.pid}/maps").read_text()
    assert "torch" not in maps and "lightning" not in maps


def test_kill9_daemon_then_a_new_daemon_adopts_running_jobs_and_records_their_real_exit(orch_home, caplog):
    h = orch_home(cpu_slots=2)
    daemon = h.start_daemon()
    early = h.submit("early", hold="early", exit=0)  # ends while no daemon runs
    late = h.submit("late", hold="late", exit=3)  # ends under the new daemon
    h.wait_record("early")
    h.wait_record("late")
    pids = {j: h.attempt_pids(j, 1) for j in (early, late)}
    h.kill9(daemon)
    for info in pids.values():  # the supervisors and jobs outlive the daemon
        assert is_alive(info["supervisor_pid"], info["supervisor_start"])
        assert is_alive(info["job_pid"], info["job_start"])
    h.release("early")
    wait_for(lambda: h.exit_record(early, 1), 10, what="the early job's exit record, written with no daemon")
    assert h.state(early) is JobState.RUNNING  # nobody has read it yet
    with caplog.at_level(logging.INFO, logger="orch.daemon"):
        d = h.local_daemon()  # the new daemon: its recovery and steps, in this process
    job = h.tick_state(d, early, JobState.SUCCEEDED)
    assert job.attempt == 1
    assert "adopted its running attempt" in caplog.text
    for _ in range(5):  # the new daemon ticks with the late job still running: it must leave it be
        d.tick()
    assert h.state(late) is JobState.RUNNING and h.job(late).attempt == 1
    assert is_alive(pids[late]["job_pid"], pids[late]["job_start"])
    h.release("late")
    job = h.tick_state(d, late, JobState.FAILED)
    assert "exit code 3" in job.reason
    assert [a.exit_code for a in h.store.attempts(late)] == [3]
    assert len(h.records("late", "start")) == 1 and len(h.records("early", "start")) == 1


def test_kill9_daemon_and_the_job_session_requeues_the_job_and_it_runs_again(orch_home):
    h = orch_home()
    daemon = h.start_daemon()
    job_id = h.submit("doomed", per_attempt={"1": {"hold": "never"}, "2": {}})
    h.wait_record("doomed", attempt=1)
    info = h.attempt_pids(job_id, 1)
    h.kill9(daemon)
    sid = info["supervisor_pid"]
    members = session_members(sid)
    assert info["job_pid"] in members and sid in members
    for pid in members:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not session_members(sid), 5, what="the job's session to die")
    assert h.exit_record(job_id, 1) is None  # the supervisor died before it could write one
    d = h.local_daemon()  # the next daemon, in this process
    job = h.tick_state(d, job_id, JobState.SUCCEEDED)
    assert job.attempt == 2 and job.failures == 0
    first = h.store.attempts(job_id)[0]
    assert first.outcome == "lost"
    kinds = h.event_kinds(job_id)
    assert kinds == ["submitted", "started", "preempted", "started", "succeeded"]
    assert "processes vanished" in h.store.events(job_id)[2].detail
    assert h.wait_record("doomed", attempt=2)["env"]["ORCH_ATTEMPT"] == "2"


def test_a_killed_supervisor_takes_its_orphaned_job_down_before_the_job_runs_again(orch_home):
    h = orch_home()
    d = h.local_daemon()  # the daemon's steps in this process: the supervisor is what is killed
    job_id = h.submit("orphan", per_attempt={"1": {"hold": "never"}, "2": {}})
    h.tick_until(d, lambda: h.records("orphan"), what="the first attempt to start")
    info = h.attempt_pids(job_id, 1)
    os.kill(info["supervisor_pid"], signal.SIGKILL)  # only the supervisor: the job lives on
    job = h.tick_state(d, job_id, JobState.SUCCEEDED)
    assert job.attempt == 2
    assert not is_alive(info["job_pid"], info["job_start"])
    assert h.store.attempts(job_id)[0].outcome == "lost"
    # The first attempt's process was gone before the second one started: never two at once.
    second = h.wait_record("orphan", attempt=2)
    assert not any(r["event"] == "end" and r["attempt"] == 1 for r in h.records("orphan"))
    assert second["t"] > h.store.attempts(job_id)[0].ended_at


def test_a_cancel_requested_while_no_daemon_runs_is_applied_by_the_next_one(orch_home):
    h = orch_home()
    daemon = h.start_daemon()
    job_id = h.submit("later", hold="never", on_term=0)
    h.wait_record("later")
    h.kill9(daemon)
    result = h.cli("cancel", str(job_id))
    assert result.returncode == 0 and "no daemon is running" in result.stderr
    d = h.local_daemon()  # the next daemon (its recovery and ticks, in this process)
    job = h.tick_state(d, job_id, JobState.CANCELLED)
    assert (h.tmp / "term-later#1").exists() and job.attempt == 1


def test_daemon_start_returns_once_the_daemon_listens_for_submits(orch_home):
    from orchestrator.home.wake import poke

    h = orch_home()
    started = h.cli("daemon", "start")
    assert started.returncode == 0, started.stderr
    # `orch submit` right after `orch daemon start` must reach it (and not print "no daemon").
    assert poke(h.home.wake_socket)
    submitted = h.cli("submit", str(h.job_file("right-away")))
    assert submitted.returncode == 0 and "no daemon" not in submitted.stderr


def test_a_daemon_killed_before_it_recorded_the_supervisor_pid_still_gets_the_job_adopted(orch_home):
    h = orch_home()
    daemon = h.start_daemon()
    job_id = h.submit("window", hold="window")
    h.wait_record("window")
    info = h.attempt_pids(job_id, 1)
    h.kill9(daemon)
    # The crash window: the job row says running, but the daemon died between starting the
    # supervisor and writing its pid. attempt-1.pid (written by the supervisor) still names it.
    h.store.update(job_id, time.time(), supervisor_pid=None, supervisor_start=None)
    h.start_daemon()
    h.wait_ticks(3)  # observed ticks: the job must be left running, not killed and started again
    assert h.state(job_id) is JobState.RUNNING and h.job(job_id).supervisor_pid == info["supervisor_pid"]
    assert is_alive(info["job_pid"], info["job_start"])
    h.release("window")
    job = h.wait_state(job_id, JobState.SUCCEEDED)
    assert job.attempt == 1 and len(h.records("window", "start")) == 1
