"""`orch sweep cancel` and `orch cancel` (issue 28, defect 8): a trial that ends while the sweep's
trials are walked does not stop the walk half-way; `orch cancel` prints the job's own grace."""

from __future__ import annotations

import re
import time

from daemon_harness import orch_home  # noqa: F401  (fixture)

from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.store import Store
from orchestrator.sweeps.cancel import cancel_sweep


def _running_trials(h, count: int) -> int:
    now = time.time()
    sweep = h.store.create_sweep(name="lr", spec={"job_path": "job.toml"}, spec_path="sweep.toml", now=now)
    for n in range(count):
        job = h.store.submit_trial(
            sweep.id, n, {}, now, name=f"lr-t{n}", kind="command", gpus=0, priority=0, retries=0,
            spec={"name": f"lr-t{n}", "command": ["true"]}, spec_path="job.toml",
        )  # fmt: skip
        h.store.transition(job.id, JobState.RUNNING, EventKind.STARTED, now, begin_attempt=AttemptStart(1))
    return sweep.id


def test_a_trial_that_ends_during_sweep_cancel_does_not_stop_it_half_way(orch_home):
    h = orch_home()
    sweep_id = _running_trials(h, 3)
    daemon_store = Store(h.home.db)  # the daemon's own connection, reaping trial 2
    seen = []

    def daemon_reaps_trial_2_between_our_read_and_our_write(sql: str) -> None:
        if re.search(r"\bid=2\b", sql):
            seen.append(sql)
            if len(seen) == 2:  # `orch sweep cancel` has read trial 2 as running, and acts on it now
                daemon_store.transition(
                    2,
                    JobState.SUCCEEDED,
                    EventKind.SUCCEEDED,
                    time.time(),
                    end_attempt=AttemptEnd(ended_at=time.time(), outcome=AttemptOutcome.SUCCEEDED, exit_code=0),
                )

    h.store.db.set_trace_callback(daemon_reaps_trial_2_between_our_read_and_our_write)
    try:
        result = cancel_sweep(h.store, h.config, h.home, sweep_id, time.time())
    finally:
        h.store.db.set_trace_callback(None)
        daemon_store.close()
    assert len(seen) >= 2, seen  # the race happened
    assert (result.stopping, result.finished) == (2, 1)
    assert h.job(2).state is JobState.SUCCEEDED
    assert h.job(3).cancel_requested_at is not None  # the trial after it is still stopped
    assert h.store.sweep(sweep_id).cancel_requested_at is not None


def test_orch_cancel_prints_the_jobs_own_grace(orch_home):
    h = orch_home(grace_seconds=3)
    job_id = h.submit(h.job_file("slow-save", grace_seconds=45))
    h.store.transition(job_id, JobState.RUNNING, EventKind.STARTED, time.time(), begin_attempt=AttemptStart(1))
    out = h.cli("cancel", str(job_id))
    assert out.returncode == 0, out.stderr
    assert "SIGKILL after 45s" in out.stdout, out.stdout
