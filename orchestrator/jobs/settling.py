"""Settling an ended attempt, shared by the daemon and `orch run`: read its run folder once into a
RunReport, decide with the intent and the exit through outcome.decide, record the outcome (or, with
no exit record and nothing left running, lose it). Beginning one is attempts.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .backoff import retry_backoff_s
from ..spec.config import Config
from ..contract import CHECKPOINTS, EX_OOM, newest_checkpoint
from ..model.errors import InvalidTransition
from ..reports.disk_full import disk_full_text
from ..reports.health import diverged_text
from ..reports.run_report import RunReport, read_run_report
from .lifecycle import change_state, log_tail
from .outcome import Decision, Exit, Retries, decide, describe_exit
from ..home.paths import Home
from ..model.records import AttemptEnd, Job
from ..model.states import AttemptOutcome, EventKind, Intent, JobState
from ..store import Store


@dataclass(frozen=True)
class Settled:
    job: Job  # the job after the transition
    decision: Decision
    also: tuple[EventKind, ...] = ()  # events recorded beside the decision's (their hooks run too)


def attempt_started_at(store: Store, job: Job) -> float:
    attempts = store.attempts(job.id)
    return attempts[-1].started_at if attempts else (job.started_at or 0.0)


def stalled_resumes(home: Home, store: Store, job: Job) -> int:
    """How many attempts in a row (this one included) exited 75 with no checkpoint newer than
    the one they resumed from."""
    _, newest = newest_checkpoint(home.run_dir(job.id) / CHECKPOINTS)
    attempts = store.attempts(job.id)
    if not attempts or (newest or -1) > (attempts[-1].resumed_from_step or -1):
        return 0
    stalls = 1
    for prev in reversed(attempts[:-1]):
        if prev.outcome != AttemptOutcome.CHECKPOINTED or prev.resumed_from_step != attempts[-1].resumed_from_step:
            break
        stalls += 1
    return stalls


def decide_for(job: Job, ended: Optional[Exit], report: RunReport) -> Decision:
    """The outcome table for this job's ended attempt."""
    return decide(
        job.intent,
        ended,
        report,
        is_command=job.kind == "command",
        retries=Retries(job.failures, job.retries),
        job_id=job.id,
    )


def settle_attempt(
    store: Store, config: Config, home: Home, job: Job, exit_info: Mapping[str, Any], now: float
) -> Optional[Settled]:
    """Decide what an ended attempt makes of its job (the table in outcome.py) and record it.
    None when the job was no longer running (someone else settled it)."""
    run_dir = home.run_dir(job.id)
    started = attempt_started_at(store, job)
    report = read_run_report(run_dir, job.attempt, started)
    code, sig = exit_info.get("code"), exit_info.get("signal")
    d = decide_for(job, Exit(code, sig), report)
    if d.outcome is AttemptOutcome.OOM:
        code = EX_OOM  # the runner's batch.json is the truth under DDP (see outcome.py)
    updates: dict[str, Any] = {"failures": job.failures + int(d.charged)}
    if d.state is JobState.QUEUED:
        stalls = stalled_resumes(home, store, job) if d.outcome is AttemptOutcome.CHECKPOINTED else 0
        if d.backoff or stalls:
            # A job that keeps exiting 75 without a newer checkpoint would otherwise restart
            # several times a second, uncharged: back off as if it were failing.
            tries = job.failures + stalls - 1 if stalls else job.failures
            updates["retry_after"] = now + retry_backoff_s(config, tries)
    end = AttemptEnd(
        ended_at=exit_info.get("ended_at") or now,
        outcome=d.outcome,
        exit_code=code,
        exit_signal=sig,
        step_reached=report.step_reached,
    )
    reason = d.reason or job.reason
    if job.intent is Intent.PREEMPT and job.reason and d.state is JobState.QUEUED:
        reason = f"{job.reason}; {d.reason}"  # which notice (AWS, GCP, daemon stop...) and how it ended
    detail = reason if d.state is not JobState.SUCCEEDED else f"attempt {job.attempt}: {describe_exit(code, sig)}"
    if d.state is JobState.FAILED or d.charged:
        tail = log_tail(run_dir, job.attempt, 10)
        if tail:
            detail += "\nlast log lines:\n" + tail
    return _record(
        store,
        config,
        home,
        job,
        d,
        now,
        end,
        detail=detail,
        reason=reason,
        updates=updates,
        with_log=d.state is JobState.FAILED,
        also=_also(job, d, report),
    )


def _record(
    store: Store,
    config: Config,
    home: Home,
    job: Job,
    d: Decision,
    now: float,
    end: AttemptEnd,
    *,
    detail: str,
    reason: Optional[str],
    updates: dict[str, Any],
    with_log: bool = False,
    also: Sequence[tuple[EventKind, str]] = (),
) -> Optional[Settled]:
    """The decision as the job's transition from running, with the attempt's end; None when the
    job was no longer running (someone else settled it)."""
    try:
        new = change_state(
            store,
            config,
            home,
            job,
            d.state,
            d.event,
            now,
            detail=detail,
            reason=reason,
            expect=[JobState.RUNNING],
            updates=updates,
            end_attempt=end,
            with_log=with_log,
            also=also,
        )
    except InvalidTransition:
        return None
    return Settled(new, d, tuple(kind for kind, _ in also))


def _also(job: Job, d: Decision, report: RunReport) -> list[tuple[EventKind, str]]:
    """Events recorded beside the transition's: what the runner reported that decided it."""
    if job.intent is not Intent.NONE or d.state is not JobState.FAILED:
        return []
    if report.diverged is not None:
        return [(EventKind.DIVERGED, diverged_text(report.diverged))]
    if report.disk_full is not None:
        return [(EventKind.DISK_FULL, disk_full_text(report.disk_full))]
    return []


def lose_attempt(store: Store, config: Config, home: Home, job: Job, now: float) -> Optional[Settled]:
    """No exit record and nothing left running: the machine restarted or someone killed the
    attempt's whole session. The same table decides (a cancel or budget stop still ends the job;
    otherwise it resumes)."""
    started = attempt_started_at(store, job)
    report = read_run_report(home.run_dir(job.id), job.attempt, started)
    d = decide_for(job, None, report)
    updates: dict[str, Any] = {}
    if d.charged:
        updates["failures"] = job.failures + 1
        if d.state is JobState.QUEUED:
            updates["retry_after"] = now + retry_backoff_s(config, job.failures)
    reason = d.reason or job.reason
    end = AttemptEnd(ended_at=now, outcome=d.outcome, step_reached=report.step_reached)
    return _record(store, config, home, job, d, now, end, detail=reason, reason=reason, updates=updates)
