"""The tick's health step: a running job whose runner reported a flat loss (health.json) gets one
`loss_flat` event with its notifications while training goes on. A divergence is not handled
here: it ends the attempt, and the outcome table fails the job."""

from __future__ import annotations

import os

from ..contract import HEALTH
from ..jobs.lifecycle import outgoing_for, payload_for
from ..model.records import Job
from ..model.states import EventKind, JobState
from ..reports.health import flat_text, loss_flat
from .step_context import StepContext


class LossFlatWatch:
    """One per daemon: health.json's (mtime, size) per running job when last read, so a tick
    reads a file only when it changed; forgotten once the job stops running."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, int]] = {}

    def check(self, d: StepContext, now: float) -> list[Job]:
        """Record the events; returns the jobs they were recorded for (the daemon runs their hooks)."""
        recorded = []
        running = d.store.jobs([JobState.RUNNING])
        for gone in set(self.seen) - {job.id for job in running}:
            del self.seen[gone]
        for job in running:
            run_dir = d.home.run_dir(job.id)
            try:
                st = os.stat(run_dir / HEALTH)
            except OSError:
                continue
            key = (st.st_mtime, st.st_size)
            if self.seen.get(job.id) == key:
                continue
            self.seen[job.id] = key
            info = loss_flat(run_dir)
            if info is None or d.store.events(job.id, kinds=[EventKind.LOSS_FLAT.value]):
                continue
            detail = flat_text(info)
            payload = payload_for(job, EventKind.LOSS_FLAT, d.config, d.home, reason=detail)
            outgoing = outgoing_for(d.config, EventKind.LOSS_FLAT, payload)
            d.store.record_event(job.id, EventKind.LOSS_FLAT, now, detail=detail, outgoing=outgoing)
            recorded.append(job)
        return recorded
