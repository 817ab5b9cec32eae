"""When each active job will start and finish: running jobs from their progress (the ETA), queued
ones from the queue ahead of them (dispatch order, the machine's GPUs and CPU slots) plus their own
expected run time (progress of an earlier attempt, else the history of finished jobs of the same
name). Shared by `orch status`/`show` (projected finish), the daemon's deadline watch and
`orch estimate` (the wait before a new job starts)."""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from ..contract import PROGRESS, read_json
from .dispatch import edf_order
from ..home.paths import Home
from ..model.records import Attempt, Job
from ..model.states import JobState
from ..store import Store


def step_rate(progress: Optional[Mapping[str, Any]], attempt: Optional[Attempt]) -> Optional[float]:
    """This attempt's steps per second: steps done since it started (or resumed) over the time
    they took. A mean over the whole attempt is the smoothest rate there is without the daemon's
    history; counting the start-up keeps the ETA on the safe (later) side."""
    if not progress or attempt is None:
        return None
    step, total, at = progress.get("step"), progress.get("total_steps"), progress.get("updated_at")
    if not isinstance(step, int) or not isinstance(total, int) or not isinstance(at, (int, float)) or total <= 0:
        return None
    done = step - (attempt.resumed_from_step or 0)
    elapsed = at - attempt.started_at
    if done <= 0 or elapsed <= 0:
        return None
    return done / elapsed


@dataclass(frozen=True)
class History:
    """Finished (succeeded) jobs of one name: what they took, on average, and the least and most."""

    runs: int
    seconds: float
    cost: float
    seconds_min: Optional[float] = None
    seconds_max: Optional[float] = None
    cost_max: Optional[float] = None


def trial_name(sweep: str, number: int) -> str:
    """A sweep trial's job name: the sweep's name and its number (`sweep-t3`)."""
    return f"{sweep}-t{number}"


def history_of(jobs: Iterable[Job], name: str, *, sweep: Optional[str] = None) -> Optional[History]:
    """The finished jobs named `name`; with `sweep`, also the trials of earlier sweeps of that
    name (`<sweep>-tN`): a sweep's trials are the base job's history."""
    trial = re.compile(re.escape(trial_name(sweep, 0))[:-1] + r"\d+$") if sweep else None
    done = [
        j
        for j in jobs
        if (j.name == name or (trial is not None and trial.match(j.name)))
        and j.state is JobState.SUCCEEDED
        and j.run_seconds > 0
    ]
    if not done:
        return None
    seconds = [j.run_seconds for j in done]
    return History(
        len(done),
        sum(seconds) / len(done),
        sum(j.cost for j in done) / len(done),
        min(seconds),
        max(seconds),
        max(j.cost for j in done),
    )


@dataclass(frozen=True)
class Forecast:
    start: float
    finish: Optional[float]  # None: the job's own run time is unknown
    lower_bound: bool  # a job ahead had an unknown run time: it may start (and finish) later


def remaining_s(
    job: Job, progress: Optional[Mapping[str, Any]], attempt: Optional[Attempt], history: Optional[History], now: float
) -> Optional[float]:
    """Seconds of work left: a running job's ETA; a queued one's from an earlier attempt's pace or
    from its name's history."""
    step = progress.get("step") if progress else None
    total = progress.get("total_steps") if progress else None
    if job.state is JobState.RUNNING:
        rate = step_rate(progress, attempt)
        if rate and isinstance(step, int) and isinstance(total, int):
            return max(0.0, total - step) / rate
        if history is not None and attempt is not None:
            return max(0.0, history.seconds - (now - attempt.started_at))
        return None
    if isinstance(step, int) and isinstance(total, int) and step > 0 and job.run_seconds > 0:
        return max(0.0, total - step) * job.run_seconds / step
    return history.seconds if history is not None else None


def simulate(
    running: Sequence[tuple[Job, Optional[float]]],
    queue: Sequence[tuple[Job, Optional[float]]],
    gpus: int,
    cpu_slots: int,
    now: float,
) -> dict[int, Forecast]:
    """List scheduling as the daemon dispatches: queued jobs in order, each starting when enough
    GPUs (or a CPU slot) are free; a GPU job waiting keeps later GPU jobs waiting too (the daemon
    holds freed GPUs for it). Unknown run times count as zero and make later starts lower bounds."""
    gpu_free = [now] * max(0, gpus)
    cpu_free = [now] * max(1, cpu_slots)
    out: dict[int, Forecast] = {}
    unknown = False
    for job, left in running:
        finish = None if left is None else now + left
        unknown = unknown or left is None
        pool = gpu_free if job.gpus > 0 else cpu_free
        for _ in range(job.gpus if job.gpus > 0 else 1):
            if pool:
                heapq.heapreplace(pool, finish if finish is not None else now)
        out[job.id] = Forecast(job.started_at or now, finish, False)
    heapq.heapify(gpu_free)
    heapq.heapify(cpu_free)
    gpu_floor = now
    for job, left in queue:
        need = job.gpus if job.gpus > 0 else 1
        pool = gpu_free if job.gpus > 0 else cpu_free
        if need > len(pool):
            out[job.id] = Forecast(math.inf, None, unknown)
            continue
        taken = [heapq.heappop(pool) for _ in range(need)]
        start = max(taken[-1], gpu_floor if job.gpus > 0 else now)
        if job.gpus > 0:
            gpu_floor = start
        finish = None if left is None else start + left
        for _ in taken:
            heapq.heappush(pool, finish if finish is not None else start)
        out[job.id] = Forecast(start, finish, unknown)
        unknown = unknown or left is None
    return out


def queue_forecast(
    store: Store,
    home: Home,
    gpus: int,
    cpu_slots: int,
    now: float,
    extra: Optional[Job] = None,
    extra_left: Optional[float] = None,
) -> dict[int, Forecast]:
    """Every active job's forecast (and `extra`'s, a job not yet submitted, placed where dispatch
    would put it)."""
    active = store.jobs([JobState.QUEUED, JobState.RUNNING])
    finished = store.jobs([JobState.SUCCEEDED])
    running: list[tuple[Job, Optional[float]]] = []
    queued: list[tuple[Job, Optional[float]]] = []
    for job in active:
        progress = read_json(home.run_dir(job.id) / PROGRESS) if job.attempt else None
        attempts = store.attempts(job.id) if job.attempt else []
        left = remaining_s(job, progress, attempts[-1] if attempts else None, history_of(finished, job.name), now)
        (running if job.state is JobState.RUNNING else queued).append((job, left))
    lefts = {job.id: left for job, left in queued}
    order = [j for j, _ in queued] + ([extra] if extra is not None else [])
    if extra is not None:
        lefts[extra.id] = extra_left
    return simulate(running, [(j, lefts[j.id]) for j in edf_order(order)], gpus, cpu_slots, now)
