"""The tick's deadline watch: for each active job with a `deadline`, the projected finish (the queue
ahead of it + its own ETA, orchestrator/planning/forecast.py); one `deadline_at_risk` event and notification
when the projection crosses the deadline, and a `deadline_recovered` event when it comes back, so a
second crossing is told again."""

from __future__ import annotations

import math
from typing import Optional

from ..cost.money import format_duration
from ..model.clock import format_clock
from ..planning.forecast import Forecast, queue_forecast
from ..spec.jobspec import deadline_ts
from ..jobs.lifecycle import outgoing_for, payload_for
from ..model.records import Job
from ..model.states import EventKind, JobState
from .step_context import StepContext

# A projection must come back this far inside the deadline to count as recovered: an ETA that
# wobbles around the deadline is one crossing, not one per tick.
RECOVER_MARGIN_S = 60.0


def at_risk_text(job: Job, deadline: float, forecast: Forecast, now: float) -> str:
    finish = forecast.finish if forecast.finish is not None else forecast.start
    late = finish - deadline
    wait = max(0.0, forecast.start - now) if job.state is JobState.QUEUED else 0.0
    own = (forecast.finish - forecast.start) if forecast.finish is not None else None
    parts = [
        f"projected to finish {_clock(finish)}{' or later' if forecast.lower_bound or own is None else ''}, "
        f"{format_duration(late)} after its deadline {_clock(deadline)}"
    ]
    helps = []
    if wait > 0:
        helps.append(
            f"{format_duration(wait)} of it is the queue ahead: a higher priority (now {job.priority}) would "
            f"start it sooner"
        )
    # A cut can only shorten what is still to run (a running job's remaining steps); the queue
    # ahead is not the job's to cut, so a job that would start after its deadline gets no cut.
    left = (forecast.finish - max(forecast.start, now)) if forecast.finish is not None else None
    cut = math.ceil(100 * late / own) if own else 100  # rounded up: the cut printed is enough
    if own is not None and own > 0 and left is not None and late < left and cut < 100:
        helps.append(
            f"its own run takes {format_duration(own)}: fewer epochs (max_epochs) or max_steps cut by "
            f"{cut}% would meet it"
        )
    elif own is not None and own > 0:
        helps.append(
            f"no cut of its own run can meet it: it would start only {_clock(forecast.start)}, "
            f"{format_duration(forecast.start - deadline)} after the deadline"
            if forecast.start >= deadline
            else f"no cut of its own run can meet it: it is {format_duration(late)} late with "
            f"{format_duration(left)} left to run"
        )
    if own is None:
        helps.append("its own run time is not known yet (no finished job of this name)")
    return parts[0] + ("; " + "; ".join(helps) if helps else "")


def watch_deadlines(d: StepContext, now: float) -> list[Job]:
    """Record crossings; returns the jobs a `deadline_at_risk` was recorded for (their hooks run)."""
    jobs = [j for j in d.store.jobs([JobState.QUEUED, JobState.RUNNING]) if '"deadline"' in j.spec_json]
    if not jobs:
        return []
    forecasts = queue_forecast(d.store, d.home, len(d.managed), d.config.daemon.cpu_slots, now)
    warned = []
    for job in jobs:
        deadline = deadline_ts(job.spec.get("deadline"))
        forecast = forecasts.get(job.id)
        if deadline is None or forecast is None:
            continue
        finish = _projected(forecast, deadline)
        at_risk = _is_at_risk(d, job)
        if finish is not None and finish > deadline and not at_risk:
            detail = at_risk_text(job, deadline, forecast, now)
            payload = payload_for(job, EventKind.DEADLINE_AT_RISK, d.config, d.home, reason=detail)
            d.store.record_event(
                job.id,
                EventKind.DEADLINE_AT_RISK,
                now,
                detail=detail,
                outgoing=outgoing_for(d.config, EventKind.DEADLINE_AT_RISK, payload),
            )
            warned.append(job)
        elif at_risk and finish is not None and finish <= deadline - RECOVER_MARGIN_S and forecast.finish is not None:
            detail = f"projected to finish {_clock(finish)}, before its deadline {_clock(deadline)}"
            payload = payload_for(job, EventKind.DEADLINE_RECOVERED, d.config, d.home, reason=detail)
            d.store.record_event(
                job.id,
                EventKind.DEADLINE_RECOVERED,
                now,
                detail=detail,
                outgoing=outgoing_for(d.config, EventKind.DEADLINE_RECOVERED, payload),
            )
    return warned


def _projected(forecast: Forecast, deadline: float) -> Optional[float]:
    """The finish to compare: the projected one, or the start alone when that is already late."""
    if forecast.finish is not None:
        return forecast.finish
    return forecast.start if forecast.start > deadline else None


def _is_at_risk(d: StepContext, job: Job) -> bool:
    events = d.store.events(job.id, kinds=[EventKind.DEADLINE_AT_RISK.value, EventKind.DEADLINE_RECOVERED.value])
    return bool(events) and events[-1].kind == EventKind.DEADLINE_AT_RISK.value


def _clock(ts: float) -> str:
    if ts == float("inf"):
        return "never (it does not fit this machine)"
    return format_clock(ts)
