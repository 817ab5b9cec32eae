"""Training health as the daemon sees it: RUN_DIR/health.json, written by the runner
(training/heartbeat/health.py). A diverged attempt fails its job at once (the outcome table's row: resuming
from the last good checkpoint would only diverge again); a flat loss becomes one `loss_flat`
event while the job goes on (daemon/health_watch.py). Reads a small JSON file; never imports the
training side."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..contract import HEALTH, read_json


def read_health(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / HEALTH) or {}


def divergence(run_dir: Path, attempt: int) -> Optional[dict[str, Any]]:
    """The runner's divergence record for this attempt, if it diverged."""
    info = read_health(run_dir).get("diverged")
    if isinstance(info, dict) and str(info.get("attempt")) == str(attempt) and isinstance(info.get("step"), int):
        return info
    return None


def diverged_text(info: dict[str, Any]) -> str:
    what = str(info.get("what") or "the training loss became NaN or infinite")
    kept = info.get("checkpoint")
    keep = (
        f"the newest checkpoint from before it, {kept}, is kept" if kept else "no checkpoint had been written before it"
    )
    return f"training diverged: {what} at step {info['step']}; stopped at once, {keep}"


def loss_flat(run_dir: Path) -> Optional[dict[str, Any]]:
    info = read_health(run_dir).get("loss_flat")
    return info if isinstance(info, dict) else None


def flat_text(info: dict[str, Any]) -> str:
    return (
        f"the training loss is flat: {info.get('recent', 0):.4g} over the last {info.get('window')} steps at step "
        f"{info.get('step')}, against {info.get('baseline', 0):.4g} over the first ones "
        f"({info.get('improvement', 0):+.1%}; flat_min_improvement = {info.get('min_improvement')}); "
        "training goes on"
    )
