"""The tick's hang watchdog: a running job whose progress (the step in progress.json) has not
advanced for its `[train] hang_minutes` (built-in jobs) or `watchdog_minutes` (any job that writes
progress.json) is stuck — a collective waiting forever, a deadlocked data loader, a download that
never ends. Its Python stacks go into its log (the executor's dump_stacks), a `hang` event and
notification name the step it stuck at, then SIGTERM, the grace, SIGKILL (the supervisor's and the
escalate step's usual path) and a charged retry from the newest checkpoint (the hang intent).

A hang before the first step counts too: an attempt with no progress of its own is measured from
its start. The clock is the daemon's: it starts again when a daemon starts (never a false alarm
from a stale file), and each attempt is judged once (its intent is set)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

from ..jobs.settling import attempt_started_at
from ..contract import PROGRESS, read_json
from ..jobs.lifecycle import outgoing_for, payload_for
from ..model.records import Job
from ..model.states import EventKind, Intent, JobState
from .step_context import StepContext
from .stop_requests import signal_job

log = logging.getLogger("orch.daemon")


@dataclass
class Seen:
    """When an attempt's step last moved, as this daemon saw it."""

    step: Optional[int]  # None: no progress from this attempt yet
    since: float  # when that step was first seen (or the attempt began)


def limit_minutes(job: Job) -> Optional[float]:
    """The job's watchdog limit: `watchdog_minutes`, else the built-in `[train] hang_minutes`."""
    spec = job.spec or {}
    minutes = spec.get("watchdog_minutes")
    if minutes is None and job.kind != "command":
        minutes = (spec.get("train") or {}).get("hang_minutes")
    return float(minutes) if minutes else None


def attempt_step(d: StepContext, job: Job, began: float) -> tuple[Optional[int], float]:
    """The step this attempt reported (progress.json written since it began) and when; else
    (None, when the attempt began)."""
    progress = read_json(d.home.run_dir(job.id) / PROGRESS) or {}
    step, updated = progress.get("step"), progress.get("updated_at")
    if (
        isinstance(step, int)
        and not isinstance(step, bool)
        and isinstance(updated, (int, float))
        and updated >= began - 1
    ):
        return step, float(updated)
    return None, began


class Watchdog:
    """The tick's hang step. What it must remember across a daemon restart (that a job was stopped
    for a hang, so its retry is charged whatever it exits with) is the job's intent in the store
    (Intent.HANG); what it keeps here is only when each attempt's step last moved, which a new
    daemon measures afresh."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], Seen] = {}

    def check(self, d: StepContext, now: float) -> None:
        running = d.store.jobs([JobState.RUNNING])
        live = {(j.id, j.attempt) for j in running}
        for key in [k for k in self.seen if k not in live]:
            del self.seen[key]
        for job in running:
            minutes = limit_minutes(job)
            if minutes is None or not job.attempt:
                continue
            key = (job.id, job.attempt)
            began = attempt_started_at(d.store, job)
            step, written = attempt_step(d, job, began)
            entry = self.seen.get(key)
            if entry is None:
                # First look (a new attempt, or one a restarted daemon adopted): the step was last
                # written then, or nothing came since the attempt began.
                entry = self.seen[key] = Seen(step, min(now, max(began, written)))
            elif step != entry.step:
                entry.step, entry.since = step, now
            if job.intent is not Intent.NONE or job.signalled_at is not None:
                continue  # already being stopped (for a hang, or for another reason)
            stuck_s = now - entry.since
            if stuck_s >= minutes * 60:
                hang(d, job, entry.step, stuck_s, now)


def hang(d: StepContext, job: Job, step: Optional[int], stuck_s: float, now: float) -> None:
    where = f"at step {step}" if step is not None else "before its first step"
    reason = (
        f"hang: no progress for {stuck_s / 60:.1f} min, stuck {where} (watchdog "
        f"{limit_minutes(job):g} min); stacks dumped into its log, stopping it to retry from its newest checkpoint"
    )
    _log_line(d, job, f"[orch] watchdog: {reason}")
    try:
        dumped = d.executor.dump_stacks(job)
    except Exception as exc:  # never let a dump failure keep a hung job on the bill
        dumped = f"no stack dump ({type(exc).__name__}: {exc})"
    log.warning("job %s (%s): %s; %s", job.id, job.name, reason, dumped)
    payload = payload_for(job, EventKind.HANG, d.config, d.home, reason=reason, state=job.state, with_log=True)
    payload["step"] = step
    d.store.record_event(
        job.id,
        EventKind.HANG,
        now,
        detail=f"{reason} ({dumped})",
        outgoing=outgoing_for(d.config, EventKind.HANG, payload),
    )
    d.on_event(EventKind.HANG.value, job)
    # The hang intent, recorded before the signal: the attempt ends as a charged failure (retried
    # with backoff) whatever it exits with, also after a daemon restart, so a job that hangs every
    # time runs out of retries instead of looping. signalled_at arms the escalate backstop.
    signal_job(d, job, Intent.HANG, now, reason)


def _log_line(d: StepContext, job: Job, text: str) -> None:
    for path in d.executor.log_paths(job)[:1]:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass
