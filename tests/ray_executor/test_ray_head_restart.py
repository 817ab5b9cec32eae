"""The Ray head stopped and started again (same address) while a job runs on a worker: the daemon
keeps the attempt as it is and says it waits for the head (`orch status`, its log); when the head
answers again it reconciles every attempt. A head without GCS fault tolerance comes back with an
empty job table, and on one host its workers die with it (as they do on a real cluster when their
GCS goes away), so the attempt is lost: requeued, not charged to `retries` (0 here: a charged
failure would fail the job), and the next attempt runs to success on a worker that rejoined."""

from __future__ import annotations

from conftest import submit, wait_ray_state
from daemon_harness import wait_for
from orchestrator.model.states import AttemptOutcome, JobState


def test_the_head_stopped_and_restarted_loses_nothing_and_every_attempt_is_reconciled(ray_home):
    h = ray_home(workers=1)
    h.start_daemon()
    # attempt 1 holds until it is stopped; attempt 2 ends at once with exit 0
    job = submit(h, h.job_file("survivor", gpus=1, hold="never", per_attempt={"2": {"hold": ""}}))
    h.wait_record("survivor", "start", timeout=90)
    wait_ray_state(h, job, "RUNNING")
    workers = sorted(h.ray.workers)
    h.ray.stop_head()
    try:
        wait_for(lambda: "does not answer" in h.log_text(), 60, what=lambda: f"the daemon to say so; {h.log_tail(20)}")
        shown = h.cli("status")
        assert "the head does not answer since" in shown.stdout, shown.stdout
        assert h.state(job) is JobState.RUNNING and h.job(job).attempt == 1  # nothing ends while it cannot tell
        for name in workers:  # what the workers' raylets do on their own once their GCS is gone
            h.ray.lose_worker(name)
    finally:
        h.ray.start_head()
        h.ray.add_workers(workers[:1])  # one GPU is enough here; the next test that needs two starts the other
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=180)
    assert "answers again" in h.log_text() and "reconciling every attempt" in h.log_text(), h.log_tail(30)
    attempts = h.store.attempts(job)
    assert [a.outcome for a in attempts] == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED], attempts
    assert done.failures == 0 and done.attempt == 2, done
    assert h.exit_record(job, 1) is None and h.exit_record(job, 2)["code"] == 0  # the lost step wrote none
    assert [r["attempt"] for r in h.records("survivor", "start")] == [1, 2]  # one copy at a time
