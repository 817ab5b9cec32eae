"""A full disk as the daemon sees it: RUN_DIR/disk_full.json, written by the runner when a
checkpoint write failed with ENOSPC (training/checkpoints.py). The write failed cleanly: its temp
file is gone and the previous checkpoint is intact. The job fails at once, not retried (a retry
would meet the same full disk), with a reason naming the folder, the bytes free and the bytes the
checkpoint needed, and a `disk_full` event beside the `failed` one. Never imports the training side."""

from __future__ import annotations

from typing import Any, Optional

from ..contract import DISK_FULL, read_json
from ..jobs.outcome import Decision
from ..home.paths import Home
from ..model.records import Job
from ..model.states import AttemptOutcome, EventKind, JobState


def disk_full(home: Home, job: Job) -> Optional[dict[str, Any]]:
    """The runner's disk-full record for the job's current attempt, if its disk filled up."""
    info = read_json(home.run_dir(job.id) / DISK_FULL)
    if isinstance(info, dict) and str(info.get("attempt")) == str(job.attempt):
        return info
    return None


def _mb(n: Any) -> str:
    return f"{n / 1e6:.1f} MB" if isinstance(n, (int, float)) else "?"


def disk_full_text(info: dict[str, Any]) -> str:
    kept = info.get("previous")
    keep = f"the previous checkpoint {kept} is intact" if kept else "no earlier checkpoint exists"
    return (
        f"disk full: saving {info.get('name') or 'a checkpoint'} needed {_mb(info.get('needed_bytes'))} but "
        f"{info.get('folder') or 'the checkpoint folder'} had {_mb(info.get('free_bytes'))} free; "
        f"the write was abandoned cleanly and {keep}"
    )


def disk_full_decision(info: dict[str, Any], job_id: int) -> Decision:
    return Decision(
        JobState.FAILED,
        EventKind.FAILED,
        AttemptOutcome.FAILED,
        disk_full_text(info) + f". Free space there (or lower [checkpoint] keep), then `orch retry {job_id}`",
        charged=True,
    )
