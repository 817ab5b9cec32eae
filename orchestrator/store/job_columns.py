"""The jobs table's writable columns: which a caller may set, how they are stored (JSON for the
lists), and the columns a transition resets, written here once instead of at every call site."""

from __future__ import annotations

import json
from typing import Any, Optional

from ..model.records import AttemptStart
from ..model.states import JobState

# Columns callers may set besides the state; anything else is a programming error.
_UPDATABLE = frozenset(
    """priority after_ids not_before retries failures attempt intent cancel_requested_at reason
    started_at finished_at supervisor_pid supervisor_start gpu_ids signalled_at retry_after
    cost run_seconds gpu_seconds waste_seconds waste_cost steps_lost max_cost max_hours executor executor_ref
    gpus spec_json""".split()
)
_JSON_COLUMNS = frozenset({"after_ids", "gpu_ids", "executor_ref", "spec_json"})


def implied_columns(
    src: JobState, dst: JobState, now: float, job_attempt: int, begin: Optional[AttemptStart]
) -> dict[str, Any]:
    """The columns a transition resets, written here once instead of at every call site:
    starting an attempt clears the last one's request and reason; leaving `running` forgets the
    attempt's processes and GPUs; the queue holds no intent; a finished job has its end time."""
    cols: dict[str, Any] = {}
    if dst is JobState.RUNNING:
        cols.update(
            attempt=begin.n if begin else job_attempt + 1,
            gpu_ids=list(begin.gpu_ids) if begin else [],
            intent="",
            cancel_requested_at=None,
            signalled_at=None,
            retry_after=None,
            reason="",
            finished_at=None,
            supervisor_pid=None,
            supervisor_start=None,
            executor_ref={},
        )
    if src is JobState.RUNNING and dst is not JobState.RUNNING:
        cols.update(supervisor_pid=None, supervisor_start=None, executor_ref={}, gpu_ids=[], signalled_at=None)
    if dst is JobState.QUEUED:
        cols.update(intent="", cancel_requested_at=None, signalled_at=None, finished_at=None, retry_after=None)
    if dst.is_terminal:
        cols.update(finished_at=now, retry_after=None)
    return cols


def column_values(updates: dict[str, Any]) -> dict[str, Any]:
    """`updates` as the jobs table stores them; a column callers may not set is a programming error."""
    unknown = set(updates) - _UPDATABLE
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")
    return {
        k: (json.dumps(v) if k in _JSON_COLUMNS else (v.value if hasattr(v, "value") else v))
        for k, v in updates.items()
    }
