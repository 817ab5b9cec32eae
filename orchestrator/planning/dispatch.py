"""Which queued job may start now, and why the others wait. Pure functions over records, so the
daemon's choice and the reason `orch status` prints come from the same code."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ..model.clock import format_clock
from ..model.records import Job
from ..model.states import JobState


@dataclass(frozen=True)
class Hold:
    reason: str
    fail: bool = False  # the job can never run: fail it with this reason


def hold_reason(
    job: Job,
    dep_states: Mapping[int, JobState],
    now: float,
    *,
    budget_reason: Optional[str] = None,
    notice_active: bool = False,
) -> Optional[Hold]:
    """Why `job` (queued) cannot start now, or None when only free slots decide."""
    for dep in job.after_ids:
        state = dep_states.get(dep)
        if state is None:
            return Hold(f"dependency {dep} no longer exists", fail=True)
        if state in (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.PRUNED, JobState.MOVED):
            return Hold(
                f"dependency {dep} {state.value}" if state is not JobState.FAILED else f"dependency {dep} failed",
                fail=True,
            )
        if state is not JobState.SUCCEEDED:
            return Hold(f"waiting for job {dep} to succeed")
    if job.not_before is not None and now < job.not_before:
        return Hold(f"held until {_clock(job.not_before)} (--at)")
    if job.retry_after is not None and now < job.retry_after:
        return Hold(f"retrying in {job.retry_after - now:.0f}s")
    if notice_active:
        return Hold("preemption notice: not starting new work until it clears")
    if budget_reason:
        return Hold(budget_reason)
    return None


def _clock(ts: float) -> str:
    return format_clock(ts)


def edf_order(queue: Sequence[Job]) -> list[Job]:
    """Dispatch order: priority high first; among equal priority the earliest deadline first (jobs
    without one after those with one); then submit order."""
    from ..spec.jobspec import deadline_ts

    def key(job: Job) -> tuple[int, float, int]:
        when = deadline_ts(job.spec.get("deadline")) if '"deadline"' in job.spec_json else None
        return (-job.priority, math.inf if when is None else when, job.id)

    return sorted(queue, key=key)


def fits(job: Job, free_gpus: Sequence[int], free_cpu_slots: int) -> bool:
    return len(free_gpus) >= job.gpus if job.gpus > 0 else free_cpu_slots > 0


def free_slots(running: Sequence[Job], managed: Sequence[int], cpu_slots: int) -> tuple[list[int], int]:
    """The managed GPUs no running job holds, and the CPU slots ([daemon] cpu_slots) no running
    GPU-free job takes: what the daemon's dispatch and `orch run` both start attempts into,
    counting each other's jobs."""
    held = {g for j in running for g in j.gpu_ids}
    return [g for g in managed if g not in held], cpu_slots - sum(1 for j in running if j.gpus == 0)


def choose_slot(job: Job, free_gpus: Sequence[int], free_cpu_slots: int) -> Optional[list[int]]:
    """The GPUs to start `job` on (the lowest free ones; [] for a GPU-free job in a free CPU
    slot), or None while it does not fit."""
    if not fits(job, free_gpus, free_cpu_slots):
        return None
    return sorted(free_gpus)[: job.gpus]
