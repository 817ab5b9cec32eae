"""The Ray head stopped while a job runs: the daemon waits and says so (the log, `orch status`),
nothing ends; when the head is back (restarted at the same address, without its old job table, its
workers new) every attempt is reconciled: the one the new head does not know is lost, requeued and
run again, not charged to `retries`."""

from __future__ import annotations

from conftest import submit
from daemon_harness import wait_for
from orchestrator.model.states import AttemptOutcome, JobState


def test_the_head_stopped_and_restarted_while_a_job_runs_loses_nothing(ray_home):
    h = ray_home()
    h.start_daemon()
    job = submit(h, h.job_file("through", gpus=1, retries=0, hold="go", on_term=75))
    h.wait_record("through", "start", attempt=1, timeout=90)
    h.ray.stop_head()
    try:
        wait_for(lambda: "does not answer" in h.log_text(), 60, what=lambda: h.log_tail(20))
        shown = h.cli("status")
        assert "the head does not answer since" in shown.stdout, shown.stdout
        assert h.state(job) is JobState.RUNNING and h.job(job).attempt == 1
    finally:
        h.ray.start_head()
        h.ray.replace_workers()
    h.wait_record("through", "start", attempt=2, timeout=180)
    h.release("go")
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=120)
    attempts = h.store.attempts(job)
    assert [a.outcome for a in attempts] == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED], attempts
    assert done.failures == 0
    assert "answers again" in h.log_text()
