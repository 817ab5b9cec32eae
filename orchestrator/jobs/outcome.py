"""The table "What ends an attempt, and what the job becomes": the daemon's intent plus the
exit read from attempt-<n>.exit decide the next state. Pure: the daemon applies the decision."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Optional

from ..contract import EX_CHECKPOINTED, EX_OOM
from ..model.states import AttemptOutcome, EventKind, Intent, JobState


@dataclass(frozen=True)
class Decision:
    state: JobState
    event: EventKind
    outcome: AttemptOutcome  # the attempt's outcome, shown in `orch show`
    reason: str
    charged: bool = False  # spends one of the job's retries
    backoff: bool = False  # wait before the next attempt


def describe_exit(code: Optional[int], sig: Optional[int]) -> str:
    if sig:
        try:
            name = _signal.Signals(sig).name
        except ValueError:
            name = "unknown signal"
        return f"terminated by signal {sig} ({name})"
    return f"exit code {code}"


def decide(
    intent: Intent,
    code: Optional[int],
    sig: Optional[int],
    *,
    has_result: bool,
    is_command: bool,
    failures: int,
    retries: int,
) -> Decision:
    how = describe_exit(code, sig)
    if code == 0 and has_result:
        return Decision(JobState.SUCCEEDED, EventKind.SUCCEEDED, AttemptOutcome.SUCCEEDED, "")
    if intent is Intent.CANCEL:
        return Decision(
            JobState.CANCELLED, EventKind.CANCELLED, AttemptOutcome.CANCELLED, f"cancelled by the user ({how})"
        )
    if intent in (Intent.BUDGET, Intent.LEASE_LOST):  # the reason recorded with the intent stays
        return Decision(JobState.STOPPED, EventKind.STOPPED, AttemptOutcome.STOPPED, "")
    if intent is Intent.PRUNE:
        return Decision(JobState.PRUNED, EventKind.PRUNED, AttemptOutcome.PRUNED, "")
    if intent is Intent.PREEMPT:
        return Decision(
            JobState.QUEUED,
            EventKind.PREEMPTED,
            AttemptOutcome.PREEMPTED,
            f"preempted ({how}); queued to resume from its latest checkpoint",
        )
    if intent is Intent.HANG:  # an exit 75 or 76 after the watchdog's SIGTERM still spends a retry
        return charged_failure(f"hung and stopped by the watchdog ({how})", failures, retries)
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
        return Decision(
            JobState.QUEUED,
            EventKind.OOM,
            AttemptOutcome.OOM,
            "out of GPU memory: running again with half the micro-batch and twice the accumulation",
        )
    return charged_failure(how, failures, retries)


def charged_failure(how: str, failures: int, retries: int) -> Decision:
    """A failed attempt: retried (with backoff, from the latest checkpoint) while retries remain."""
    if failures + 1 <= retries:
        return Decision(
            JobState.QUEUED,
            EventKind.RETRYING,
            AttemptOutcome.FAILED,
            f"{how}; retry {failures + 1} of {retries}, resuming from the latest checkpoint",
            charged=True,
            backoff=True,
        )
    tried = f" after {retries} retr{'y' if retries == 1 else 'ies'}" if retries else ""
    return Decision(JobState.FAILED, EventKind.FAILED, AttemptOutcome.FAILED, f"{how}{tried}", charged=True)
