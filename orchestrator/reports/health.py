"""Training health as the daemon sees it: RUN_DIR/health.json, written by the runner
(training/health.py). A diverged attempt makes its job `failed` at once — resuming from the last
good checkpoint would only diverge again — with a `diverged` event naming the step; a flat loss
becomes one `loss_flat` event while the job goes on. Reads a small JSON file; never imports the
training side."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ..spec.config import Config
from ..contract import HEALTH, read_json
from ..jobs.lifecycle import outgoing_for, payload_for
from ..jobs.outcome import Decision
from ..home.paths import Home
from ..model.records import Job
from ..model.states import AttemptOutcome, EventKind, JobState
from ..store import Store


def read_health(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / HEALTH) or {}


def divergence(home: Home, job: Job) -> Optional[dict[str, Any]]:
    """The runner's divergence record for the job's current attempt, if it diverged."""
    info = read_health(home.run_dir(job.id)).get("diverged")
    if isinstance(info, dict) and str(info.get("attempt")) == str(job.attempt) and isinstance(info.get("step"), int):
        return info
    return None


def diverged_text(info: dict[str, Any]) -> str:
    what = str(info.get("what") or "the training loss became NaN or infinite")
    kept = info.get("checkpoint")
    keep = (
        f"the newest checkpoint from before it, {kept}, is kept" if kept else "no checkpoint had been written before it"
    )
    return f"training diverged: {what} at step {info['step']}; stopped at once, {keep}"


def diverged_decision(info: dict[str, Any]) -> Decision:
    """Failed, not retried: another attempt would resume from the same weights and diverge again."""
    return Decision(
        JobState.FAILED,
        EventKind.FAILED,
        AttemptOutcome.FAILED,
        diverged_text(info) + ". Lower [train] learning_rate (or set gradient_clip_val) and submit again",
        charged=True,
    )


# health.json's (mtime, size) per job when last looked at: a tick reads a file only when it changed.
_SEEN: dict[int, tuple[float, int]] = {}


def flat_text(info: dict[str, Any]) -> str:
    return (
        f"the training loss is flat: {info.get('recent', 0):.4g} over the last {info.get('window')} steps at step "
        f"{info.get('step')}, against {info.get('baseline', 0):.4g} over the first ones "
        f"({info.get('improvement', 0):+.1%}; flat_min_improvement = {info.get('min_improvement')}); "
        "training goes on"
    )


def record_loss_flat(store: Store, config: Config, home: Home, now: float) -> list[Job]:
    """One `loss_flat` event (with its notifications) per running job whose runner reported a
    flat loss; returns the jobs it was recorded for (the daemon runs their hooks)."""
    recorded = []
    for job in store.jobs([JobState.RUNNING]):
        path = home.run_dir(job.id) / HEALTH
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (st.st_mtime, st.st_size)
        if _SEEN.get(job.id) == key:
            continue
        _SEEN[job.id] = key
        info = read_health(home.run_dir(job.id)).get("loss_flat")
        if not isinstance(info, dict) or store.events(job.id, kinds=[EventKind.LOSS_FLAT.value]):
            continue
        detail = flat_text(info)
        payload = payload_for(job, EventKind.LOSS_FLAT, config, home, reason=detail)
        store.record_event(
            job.id, EventKind.LOSS_FLAT, now, detail=detail, outgoing=outgoing_for(config, EventKind.LOSS_FLAT, payload)
        )
        recorded.append(job)
    return recorded
