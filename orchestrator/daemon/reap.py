"""The tick's first step: find attempts that ended (their exit record) or vanished (no exit and
nothing left running), and settle each through the same function `orch run` uses."""

from __future__ import annotations

import logging
import sqlite3

from ..jobs.settling import lose_attempt, settle_attempt
from ..model.records import Job
from ..model.states import JobState
from .guard import fail_job
from .step_context import StepContext

log = logging.getLogger("orch.daemon")

# A job another process has just recorded running (`orch run`) has no handle for the moment it
# takes that process to record one: it is not lost until this long after its start was recorded.
HANDLE_GRACE_S = 10.0


def reap(d: StepContext, now: float) -> None:
    for job in d.store.jobs([JobState.RUNNING]):
        try:
            reap_one(d, job, now)
        except sqlite3.Error:
            raise  # the store, not this job: the tick step is retried next tick
        except Exception as exc:  # one job that cannot be watched ends; the others are still reaped
            fail_job(d, job, now, "watch", exc)


def reap_one(d: StepContext, job: Job, now: float) -> None:
    exit_info = d.executor.exit(job)
    if exit_info is None:
        if not job.supervisor_pid and not job.executor_ref:
            job = adopt_unrecorded(d, job, now)
            if not job.supervisor_pid and not job.executor_ref and now - job.updated_at < HANDLE_GRACE_S:
                return  # its starter is recording the handle (`orch run` between begin and record)
        if d.executor.alive(job):
            return
        exit_info = d.executor.exit(job)  # it may have been written just now
    if exit_info is None:
        # Its own processes must not survive the requeue, nor overlap the next attempt.
        d.executor.clear_lost(job)
        settled = lose_attempt(d.store, d.config, d.home, job, now)
    else:
        settled = settle_attempt(d.store, d.config, d.home, job, exit_info, now)
    if settled is not None:
        d.announce(job, settled.job, settled.decision.event, settled.job.reason)
        for kind in settled.also:
            d.on_event(kind.value, settled.job)


def adopt_unrecorded(d: StepContext, job: Job, now: float) -> Job:
    """A daemon that died between starting an attempt and recording its handle left a running job
    with none; the executor may still find the attempt, so it is adopted, not run twice."""
    handle = d.executor.adopt(job) if job.attempt else None
    if not handle:
        return job
    d.store.update(job.id, now, only_if_state=[JobState.RUNNING], **handle)
    log.info("job %s: adopted attempt %s from its pid file (%s)", job.id, job.attempt, handle)
    return d.store.get(job.id)
