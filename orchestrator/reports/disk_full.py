"""A full disk as the daemon sees it: RUN_DIR/disk_full.json, written by the runner when a
checkpoint write failed with ENOSPC (training/resume/checkpoints.py). The write failed cleanly: its temp
file is gone and the previous checkpoint is intact. The job fails at once (the outcome table's row), not retried (a retry
would meet the same full disk), with a reason naming the folder, the bytes free and the bytes the
checkpoint needed, and a `disk_full` event beside the `failed` one. Never imports the training side."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..contract import DISK_FULL, read_json


def disk_full(run_dir: Path, attempt: int) -> Optional[dict[str, Any]]:
    """The runner's disk-full record for this attempt, if its disk filled up."""
    info = read_json(run_dir / DISK_FULL)
    if isinstance(info, dict) and str(info.get("attempt")) == str(attempt):
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
