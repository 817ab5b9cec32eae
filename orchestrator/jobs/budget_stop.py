"""The one budget stop, for the daemon's tick and a lone `orch run` alike: which running jobs must
stop for a budget (their own [budget] or config.toml's total), and the stop recorded before the
job is signalled (the intent the outcome table decides with). The caller signals the job: the
daemon through its executor, `orch run` to the process group it started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..cost.money import running_job_budget_exceeded, total_budget_exceeded
from ..model.records import Job
from ..model.states import Intent, JobState
from ..store import Store

if TYPE_CHECKING:
    from ..spec.config import Config


def total_budget_reason(store: Store, config: "Config") -> Optional[str]:
    """Why nothing more may run under config.toml's [budget] total, or None."""
    if config.budget.total is None:
        return None
    return total_budget_exceeded(store.total_cost(), config.budget.total, currency=config.pricing.currency)


def budget_reason(job: Job, config: "Config", total_reason: Optional[str]) -> Optional[str]:
    """Why this running job must stop for a budget now, or None (also None once another intent,
    a cancel or a notice, is stopping it)."""
    if job.state is not JobState.RUNNING or job.intent is not Intent.NONE:
        return None
    return running_job_budget_exceeded(
        job.cost, job.run_seconds / 3600, job.max_cost, job.max_hours, total_reason, config.pricing.currency
    )


def record_stop(store: Store, job: Job, intent: Intent, now: float, reason: str) -> bool:
    """Record why the job is about to be signalled, unless an intent is already set; True: the
    caller signals it now (SIGTERM: checkpoint and stop)."""
    if not store.set_intent_once(job.id, intent.value, now):
        return False
    store.update(job.id, now, only_if_state=[JobState.RUNNING], signalled_at=now, reason=reason)
    return True
