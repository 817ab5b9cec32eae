"""THE table "What ends an attempt, and what the job becomes" (the user-facing contract): the daemon's intent, the
attempt's exit (or none: it vanished) and what the runner left in its run folder (a RunReport)
decide the next state. One pure function, used by the daemon's reap, `orch run` and the recovery of
a vanished attempt alike; the callers only apply the decision."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Optional

from ..contract import EX_CHECKPOINTED, EX_CONFIG, EX_OOM
from ..model.states import AttemptOutcome, EventKind, Intent, JobState
from ..reports.disk_full import disk_full_text
from ..reports.health import diverged_text
from ..reports.run_report import RunReport


@dataclass(frozen=True)
class Decision:
    state: JobState
    event: EventKind
    outcome: AttemptOutcome  # the attempt's outcome, shown in `orch show`
    reason: str  # "" keeps the reason recorded with the intent (a budget's, a lease holder's...)
    charged: bool = False  # spends one of the job's retries
    backoff: bool = False  # wait before the next attempt


@dataclass(frozen=True)
class Exit:
    """How the attempt's process ended, from its exit record."""

    code: Optional[int] = None
    signal: Optional[int] = None


@dataclass(frozen=True)
class Retries:
    """The job's retry budget as it stood when the attempt ended."""

    failures: int = 0  # charged failures so far
    retries: int = 0  # how many the job allows


def describe_exit(code: Optional[int], sig: Optional[int]) -> str:
    if sig:
        try:
            name = _signal.Signals(sig).name
        except ValueError:
            name = "unknown signal"
        return f"terminated by signal {sig} ({name})"
    return f"exit code {code}"


VANISHED = "its processes vanished (killed, or the machine restarted)"


def decide(
    intent: Intent,
    ended: Optional[Exit],
    report: RunReport,
    *,
    is_command: bool,
    retries: Retries,
    job_id: int = 0,
) -> Decision:
    """The next state of a job whose attempt ended (`ended` None: no exit record and nothing left
    running). Every row is a case in tests/jobs/test_outcome_table.py."""
    d = _decide(intent, ended, report, is_command=is_command, retries=retries, job_id=job_id)
    if ended is None:  # whatever the row, the attempt itself is recorded as lost
        return Decision(d.state, d.event, AttemptOutcome.LOST, d.reason, d.charged, d.backoff)
    return d


def _decide(
    intent: Intent, ended: Optional[Exit], report: RunReport, *, is_command: bool, retries: Retries, job_id: int
) -> Decision:
    code, sig = (ended.code, ended.signal) if ended else (None, None)
    if ended is not None and intent is Intent.NONE and report.oom is not None:
        # Under DDP an OOM on another rank makes Lightning kill rank 0 (signal 9): the runner's
        # batch.json entry for this attempt is the truth, not the exit code.
        code, sig = EX_OOM, None
    how = describe_exit(code, sig) if ended else VANISHED
    if ended is not None and code == 0 and report.has_result:
        return Decision(JobState.SUCCEEDED, EventKind.SUCCEEDED, AttemptOutcome.SUCCEEDED, "")
    # The daemon's intent decides first: it signalled the attempt for a reason, whatever the code.
    if intent is Intent.CANCEL:
        said = f"cancelled by the user ({how})" if ended else "cancelled by the user"
        return Decision(JobState.CANCELLED, EventKind.CANCELLED, AttemptOutcome.CANCELLED, said)
    if intent is Intent.BUDGET:
        return Decision(JobState.STOPPED, EventKind.STOPPED, AttemptOutcome.STOPPED, "")
    if intent is Intent.LEASE_LOST:  # another machine adopted the job: it runs there now, never again here
        return Decision(JobState.MOVED, EventKind.LEASE_LOST, AttemptOutcome.MOVED, "")
    if intent is Intent.MOVE:  # a planned market move: checkpointed and handed over, it runs elsewhere now
        return Decision(JobState.MOVED, EventKind.MARKET_MOVE, AttemptOutcome.MOVED, "")
    if intent is Intent.PRUNE:
        return Decision(JobState.PRUNED, EventKind.PRUNED, AttemptOutcome.PRUNED, "")
    if intent is Intent.HANG:  # an exit 75 or 76 after the watchdog's SIGTERM still spends a retry
        said = f"({how})" if ended else "; its processes then vanished"
        return _charged_failure(f"hung and stopped by the watchdog{' ' if ended else ''}{said}", retries)
    if ended is None or intent is Intent.PREEMPT:
        return Decision(
            JobState.QUEUED,
            EventKind.PREEMPTED,
            AttemptOutcome.PREEMPTED,
            f"{'preempted (' + how + ')' if ended else how}; queued to resume from its latest checkpoint",
        )
    # No intent: what the runner reported, then the exit code.
    if report.diverged is not None:  # failed at once: resuming would diverge again from the same weights
        return _failed(
            diverged_text(report.diverged) + ". Lower [train] learning_rate (or set gradient_clip_val) and submit again"
        )
    if report.disk_full is not None:  # failed until space is freed: a retry meets the same full disk
        return _failed(
            disk_full_text(report.disk_full)
            + f". Free space there (or lower [checkpoint] keep), then `orch retry {job_id}`"
        )
    if code == EX_CONFIG or report.job_error is not None:  # the same data or config fails the same way
        message = str((report.job_error or {}).get("message") or "").strip()
        return Decision(
            JobState.FAILED,
            EventKind.FAILED,
            AttemptOutcome.FAILED,
            (message or f"a data or configuration error ({how})")
            + "; not retried: the same input would fail again. Fix it and submit again",
        )
    if code == 0:
        if is_command:
            return Decision(JobState.SUCCEEDED, EventKind.SUCCEEDED, AttemptOutcome.SUCCEEDED, "")
        return Decision(
            JobState.FAILED,
            EventKind.FAILED,
            AttemptOutcome.FAILED,
            "the built-in runner exited 0 without writing result.json",
        )
    if code == EX_CHECKPOINTED:
        return Decision(
            JobState.QUEUED,
            EventKind.RETRYING,
            AttemptOutcome.CHECKPOINTED,
            "the job checkpointed and asked to be resumed (exit 75); not charged to retries",
        )
    if code == EX_OOM:
        shrink = report.oom
        reason = "out of GPU memory: running again with half the micro-batch and twice the accumulation"
        if shrink is not None:
            reason = (
                f"out of GPU memory at step {shrink.get('step')}: running again in a fresh process with "
                f"batch {shrink['from']['batch_size']} -> {shrink['to']['batch_size']}, accumulation "
                f"{shrink['from']['accumulate_grad_batches']} -> {shrink['to']['accumulate_grad_batches']}"
            )
        return Decision(JobState.QUEUED, EventKind.OOM, AttemptOutcome.OOM, reason)
    return _charged_failure(how, retries)


def _failed(reason: str) -> Decision:
    """Failed at once, never retried; the attempt counts as a charged failure."""
    return Decision(JobState.FAILED, EventKind.FAILED, AttemptOutcome.FAILED, reason, charged=True)


def _charged_failure(how: str, retries: Retries) -> Decision:
    """A failed attempt: retried (with backoff, from the latest checkpoint) while retries remain."""
    if retries.failures + 1 <= retries.retries:
        return Decision(
            JobState.QUEUED,
            EventKind.RETRYING,
            AttemptOutcome.FAILED,
            f"{how}; retry {retries.failures + 1} of {retries.retries}, resuming from the latest checkpoint",
            charged=True,
            backoff=True,
        )
    n = retries.retries
    tried = f" after {n} retr{'y' if n == 1 else 'ies'}" if n else ""
    return Decision(JobState.FAILED, EventKind.FAILED, AttemptOutcome.FAILED, f"{how}{tried}", charged=True)
