"""A preemption notice holds dispatch in the same critical section that signals the running jobs:
a tick that takes the daemon's lock right after must not start work on a machine about to be
reclaimed (issue 28, defect 5). A real daemon's steps in this process, real supervisors and jobs."""

from __future__ import annotations

import time

from daemon_harness import orch_home  # noqa: F401  (fixture)

from orchestrator.model.states import JobState


def test_after_a_notice_signals_the_jobs_no_tick_starts_new_work(orch_home):
    h = orch_home(cpu_slots=1, grace_seconds=10)
    d = h.local_daemon()
    running = h.submit("spot", per_attempt={"1": {"hold": "never", "on_term": 75, "notice_ckpt": 3}})
    waiting = h.submit("next")
    h.tick_until(d, lambda: h.records("spot", "start"), what="the first job to start")
    assert h.state(waiting) is JobState.QUEUED  # one CPU slot: it waits behind

    assert d.preempt_all(time.time(), "preemption notice (file): preempt") == [running]
    # The next ticks reap the checkpointed job and free its slot: still nothing may start.
    h.tick_until(
        d, lambda: h.store.attempts(running)[0].ended_at is not None, what="the preempted attempt to be reaped"
    )
    for _ in range(5):
        d.tick()
    assert h.records("next", "start") == [] and len(h.records("spot", "start")) == 1
    assert h.state(waiting) is JobState.QUEUED and h.state(running) is JobState.QUEUED

    d.notice_active = False  # the notice clears (the runtime's watcher says so): work resumes
    h.tick_until(d, lambda: h.state(waiting) is JobState.SUCCEEDED, what="the waiting job to run")
