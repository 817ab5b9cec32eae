"""The tick's stop requests: a user's cancel, a spent budget, a lost mirror lease, and the
backstop for a job that outlived its grace. The daemon records why it signals (the intent)
before it signals, so the reap step can decide with outcome.py's table whatever the exit code."""

from __future__ import annotations

import logging
from typing import Optional

from ..jobs.attempts import grace_for
from ..jobs.lifecycle import outgoing_for, payload_for
from ..cost.money import format_money
from ..jobs import budget_stop
from ..jobs.budget_stop import budget_reason, record_stop
from ..model.records import Job
from ..model.states import EventKind, Intent, JobState
from .step_context import StepContext

log = logging.getLogger("orch.daemon")


def signal_job(d: StepContext, job: Job, intent: Intent, now: float, reason: str) -> None:
    if record_stop(d.store, job, intent, now, reason):
        log.info("job %s: SIGTERM (%s): %s", job.id, intent.value, reason)
        d.executor.terminate(job)


def stop_for_lost_lease(d: StepContext, job_id: int, reason: str, now: float) -> None:
    """Another machine adopted the job (the mirror's owner lease is gone): a running attempt stops
    here with a checkpoint and the job ends `moved` (the outcome table's lease_lost row); a queued
    one becomes `moved` at once. Either way one `lease_lost` event, delivered like any other."""
    job = d.store.get(job_id)
    if job.state is JobState.RUNNING:
        if job.intent is Intent.NONE:
            signal_job(d, job, Intent.LEASE_LOST, now, reason)
        else:  # already stopping (a notice): it must not be queued again here
            d.store.update(job.id, now, only_if_state=[JobState.RUNNING], intent=Intent.LEASE_LOST.value, reason=reason)
    elif job.state is JobState.QUEUED:
        d.change(job, JobState.MOVED, EventKind.LEASE_LOST, now, reason=reason)
    elif not d.store.events(job.id, kinds=[EventKind.LEASE_LOST.value]):  # finished here already: told once
        payload = payload_for(job, EventKind.LEASE_LOST, d.config, d.home, reason=reason)
        outgoing = outgoing_for(d.config, EventKind.LEASE_LOST, payload)
        d.store.record_event(job.id, EventKind.LEASE_LOST, now, detail=reason, outgoing=outgoing)


def stop_for_move(d: StepContext, job_id: int, reason: str, now: float) -> None:
    """`orch watch` asked that the job move market (objectstore/moves.py): a running attempt stops
    here with a checkpoint, like a preemption notice for that job alone, and the job ends `moved`
    with its lease released (its last manifest hands it over); a queued one is handed over at once.
    A job already stopping for another reason (a notice, a cancel) is left to that."""
    job = d.store.get(job_id)
    if job.state is JobState.RUNNING and job.intent is Intent.NONE:
        signal_job(d, job, Intent.MOVE, now, reason)
    elif job.state is JobState.QUEUED:
        d.store.update(job.id, now, only_if_state=[JobState.QUEUED], intent=Intent.MOVE.value)
        d.change(job, JobState.MOVED, EventKind.MARKET_MOVE, now, reason=reason)


def apply_cancels(d: StepContext, now: float) -> None:
    for job in d.store.jobs([JobState.RUNNING]):
        if job.cancel_requested_at is not None and job.intent is not Intent.CANCEL:
            if job.intent is Intent.NONE:
                signal_job(d, job, Intent.CANCEL, now, "cancelled by the user")
            else:  # already being stopped for another reason: the user's word wins the outcome
                d.store.update(job.id, now, only_if_state=[JobState.RUNNING], intent=Intent.CANCEL.value)


def apply_node_notices(d: StepContext, now: float) -> None:
    """A notice the executor heard for one attempt's machine (a Ray node draining): that attempt
    is stopped as for a preemption notice (SIGTERM, its checkpoint, requeued, not charged)."""
    for job in d.store.jobs([JobState.RUNNING]):
        if job.intent is Intent.NONE:
            why = d.executor.notice(job)
            if why:
                signal_job(d, job, Intent.PREEMPT, now, why)


def check_budgets(d: StepContext, now: float) -> None:
    total_reason = total_budget_reason(d)
    for job in d.store.jobs([JobState.RUNNING]):
        reason = budget_reason(job, d.config, total_reason)  # the one rule, `orch run`'s too
        if reason:
            signal_job(d, job, Intent.BUDGET, now, reason)


def total_budget_reason(d: StepContext) -> Optional[str]:
    return budget_stop.total_budget_reason(d.store, d.config)


def total_budget_hold(d: StepContext) -> Optional[str]:
    """Why queued jobs wait while the total budget is spent. Worded without the running figure,
    so it is written once and not rewritten every tick."""
    if total_budget_reason(d) is None:
        return None
    total = format_money(d.config.budget.total or 0.0, d.config.pricing.currency)
    return f"held: the total budget of {total} is spent; raise [budget] total in config.toml to go on"


def escalate(d: StepContext, now: float) -> None:
    """The supervisor SIGKILLs after the grace by itself; this is the daemon's backstop."""
    for job in d.store.jobs([JobState.RUNNING]):
        if job.signalled_at is not None and now - job.signalled_at > grace_for(job, d.config) + 5:
            d.executor.kill(job)
