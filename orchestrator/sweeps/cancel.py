"""`orch sweep cancel`: no new trials, every queued trial cancelled at once, every running one asked
to checkpoint and stop. A trial that ends while the walk runs (the daemon reaps it between our read
and our write) is simply done: it never stops the walk half-way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..home.paths import Home
from ..jobs.lifecycle import cancel_job
from ..model.errors import InvalidTransition, OrchError
from ..store import Store


@dataclass(frozen=True)
class SweepCancel:
    name: str
    cancelled: int  # queued trials cancelled at once
    stopping: int  # running trials asked to checkpoint and stop
    finished: int  # trials that ended by themselves while the walk ran


def cancel_sweep(store: Store, config: Any, home: Home, sweep_id: int, now: float) -> SweepCancel:
    sweep = store.sweep(sweep_id)
    if not store.request_sweep_cancel(sweep_id, now):
        raise OrchError(f"sweep {sweep_id} ({sweep.name}) already {sweep.state.value}; nothing to cancel")
    cancelled = stopping = finished = 0
    for trial in store.trials(sweep_id):
        if not store.get(trial.job_id).state.is_active:
            continue
        try:
            _, done = cancel_job(store, config, home, trial.job_id, now)
        except InvalidTransition:  # it finished between our read and our write
            finished += 1
            continue
        cancelled += done
        stopping += not done
    return SweepCancel(sweep.name, cancelled, stopping, finished)
