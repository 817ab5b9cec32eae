"""A poison job never stops the queue: anything that goes wrong while the tick starts, watches or
reaps one job ends that job, with the reason and a notification, and the tick goes on to the
others. The daemon log keeps the traceback; the user sees one line."""

from __future__ import annotations

import logging
from typing import Callable

from ..model.records import AttemptEnd, Job
from ..model.states import AttemptOutcome, EventKind, JobState
from .step_context import StepContext

log = logging.getLogger("orch.daemon")


def reason_for(what: str, exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"orch could not {what} it ({type(exc).__name__}{': ' + text if text else ''}); see the daemon log"


def fail_job(d: StepContext, job: Job, now: float, what: str, exc: BaseException) -> None:
    """End `job` as failed after an unexpected error in one of the tick's steps. Its processes, if
    any, are cleared first so nothing of it runs on unwatched."""
    log.error("job %s (%s): cannot %s it", job.id, job.name, what, exc_info=exc)
    try:
        current = d.store.get(job.id)
        end = None
        if current.state is JobState.RUNNING:
            d.executor.clear_lost(current)
            end = AttemptEnd(ended_at=now, outcome=AttemptOutcome.FAILED)
        if not current.state.is_terminal:
            d.change(current, JobState.FAILED, EventKind.FAILED, now, reason=reason_for(what, exc), end_attempt=end)
    except Exception:  # the store itself is failing: the next tick tries again
        log.exception("job %s: cannot record its failure", job.id)


def step(name: str, run: Callable[[float], object], now: float) -> None:
    """Run one tick step; an error in it is logged and the tick's other steps still run."""
    try:
        run(now)
    except Exception:
        log.exception("tick step %s failed; the other steps go on", name)
