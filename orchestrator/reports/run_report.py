"""What the runner left in the run folder about one attempt, read once into a RunReport: whether
it wrote result.json, its OOM shrink, a divergence, a full disk, a deterministic job error, and
the step it reached. The outcome table (jobs/outcome.py) decides from this and the exit alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..contract import BATCH, CHECKPOINTS, JOB_ERROR, PROGRESS, RESULT, newest_checkpoint, read_json
from .disk_full import disk_full
from .health import divergence


@dataclass(frozen=True)
class RunReport:
    has_result: bool = False  # result.json written during this attempt
    oom: Optional[dict[str, Any]] = None  # batch.json's entry for this attempt: it ran out of memory
    diverged: Optional[dict[str, Any]] = None  # health.json's divergence record for this attempt
    disk_full: Optional[dict[str, Any]] = None  # disk_full.json for this attempt
    job_error: Optional[dict[str, Any]] = None  # job_error.json for this attempt (with exit 78)
    step_reached: Optional[int] = None  # the last step this attempt reached (progress or checkpoint)


def read_run_report(run_dir: Path, attempt: int, started_at: float) -> RunReport:
    """The run folder as it concerns `attempt`, which started at `started_at` (files older than
    that belong to earlier attempts)."""
    result = run_dir / RESULT
    try:
        has_result = result.stat().st_mtime >= started_at - 1
    except OSError:
        has_result = False
    return RunReport(
        has_result=has_result,
        oom=oom_shrink(run_dir, attempt),
        diverged=divergence(run_dir, attempt),
        disk_full=disk_full(run_dir, attempt),
        job_error=job_error(run_dir, attempt),
        step_reached=step_reached(run_dir, started_at),
    )


def oom_shrink(run_dir: Path, attempt: int) -> Optional[dict[str, Any]]:
    """The runner's batch.json entry for this attempt, if it ran out of memory."""
    sizes = read_json(run_dir / BATCH) or {}
    history = sizes.get("history") or []
    last = history[-1] if history and isinstance(history[-1], dict) else None
    if last and str(last.get("attempt")) == str(attempt) and "from" in last and "to" in last:
        return last
    return None


def job_error(run_dir: Path, attempt: int) -> Optional[dict[str, Any]]:
    """The runner's deterministic error for this attempt: a data or configuration mistake."""
    info = read_json(run_dir / JOB_ERROR)
    if isinstance(info, dict) and str(info.get("attempt")) == str(attempt):
        return info
    return None


def step_reached(run_dir: Path, since: float) -> Optional[int]:
    """The attempt's last step: progress.json, or a checkpoint this attempt wrote at a later step
    (progress is written every few seconds; the notice checkpoint is the step it really ended at)."""
    progress = read_json(run_dir / PROGRESS)
    step = None
    if progress and isinstance(progress.get("step"), int) and (progress.get("updated_at") or 0) >= since - 1:
        step = progress["step"]
    path, ckpt_step = newest_checkpoint(run_dir / CHECKPOINTS)
    try:
        if path is not None and ckpt_step is not None and path.stat().st_mtime >= since - 1:
            step = max(step or 0, ckpt_step)
    except OSError:  # pruned meanwhile
        pass
    return step
