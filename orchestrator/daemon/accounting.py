"""The daemon's bookkeeping of money: the uptime split among the attempts that ran in it (the one
formula, from cost.py), the rest idle — each attempt billed from its own start to its own end, and
the time a dead daemon missed billed on restart from the supervisors' attempt records."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional, cast

from ..model.executor_kinds import executor_kind
from ..spec.config import Config
from ..contract import PROGRESS, attempt_log, attempt_pid, read_json
from ..cost.money import Pricing, Span, split_spans
from ..executors.base import Executor
from ..home.paths import Home
from ..model.errors import JobNotFound
from ..model.records import FOREGROUND, Job
from ..model.states import JobState
from ..store import Store

log = logging.getLogger("orch.daemon")


def _in_foreground(store: Store, job_id: int) -> bool:
    try:
        job = store.get(job_id)
    except JobNotFound:  # gone from the store meanwhile: the daemon's own to bill, as before
        return False
    return job.executor == FOREGROUND or job.in_foreground


def _write(store: Store, config: Config, lo: float, hi: float, spans: list[Span], managed: int, cluster: bool) -> None:
    bill = split_spans(lo, hi, spans, managed, Pricing.from_config(config), jobs_are_machine=cluster)
    # A job `orch run` runs in the foreground holds its share of the machine (so that share is not
    # idle), but that process charges it: exactly one process accrues a job's time (docs/cost.md).
    # Told by the executor recorded with the attempt (same transaction as RUNNING), whatever the
    # job's state now: a job `orch run` started or finished inside this span is never billed here.
    foreground = {j for j in bill.costs if _in_foreground(store, cast(int, j))}
    if bill.over_held:
        # Running jobs hold more GPUs than this daemon manages (the config changed under an
        # adopted job): each job is billed its own GPUs and the machine nothing idle.
        log.warning("cost: %s; billing each job its own GPUs until they finish", bill.over_held)
    # the spans were built from job ids (cost.py's formula takes any hashable id)
    per_job = {
        cast(int, j): (bill.costs[j], bill.gpu_seconds[j], bill.run_seconds[j])
        for j in bill.costs
        if j not in foreground
    }
    store.accrue(hi, hi - lo, per_job, bill.idle)


def accrue_interval(
    store: Store,
    config: Config,
    managed_gpus: int,
    since: float,
    now: float,
    *,
    billable: Optional[Callable[[Job], bool]] = None,
) -> None:
    """Bill the uptime (since, now]: each attempt its share while it ran (from its attempt row's
    start; to its supervisor's end when it ended in between), the rest idle.

    With `billable` (a cluster executor: Slurm), only the jobs it names are charged (a job
    Slurm still holds PENDING costs nothing), each its own GPUs x gpu_hour, for the whole
    interval, and the cluster has no idle cost of ours."""
    if billable is not None:
        running = [j for j in store.jobs([JobState.RUNNING]) if billable(j)]
        spans = [Span(j.id, j.gpus, since) for j in running]
    else:
        spans = [Span(job_id, gpus, start, end) for job_id, gpus, start, end in store.billing_spans(since)]
    _write(store, config, since, now, spans, managed_gpus, billable is not None)


def bill_missed(store: Store, config: Config, home: Home, executor: Executor, managed_gpus: int, now: float) -> float:
    """At start-up, before the reap: bill the time since the last accrual that a dead daemon
    missed, from the attempts it left running — each from its supervisor's start to its end
    (attempt-<n>.exit), to now if it still runs, or to the last thing it wrote if it vanished.
    The machine's idle share of that time is billed too, up to the last of those ends: after it,
    nothing shows that the machine was up. Returns the seconds billed."""
    since = store.ledger().get("accrued_until")
    if since is None or executor_kind(executor.name).bills_by_allocation:
        return 0.0
    spans = []
    for job in store.jobs([JobState.RUNNING]):
        if not job.attempt:
            continue
        run_dir = home.run_dir(job.id)
        ended = executor.exit(job)
        started = (ended or {}).get("started_at") or (read_json(run_dir / attempt_pid(job.attempt)) or {}).get(
            "started_at"
        )
        if not isinstance(started, (int, float)):
            continue
        if ended is not None:
            end = ended.get("ended_at")
        elif executor.alive(job):
            end = now
        else:
            end = _last_sign_of_life(run_dir, job.attempt)
        if isinstance(end, (int, float)) and end > since:
            spans.append(Span(job.id, job.gpus, float(started), min(float(end), now)))
    hi = max((s.end for s in spans if s.end is not None), default=since)
    if hi <= since:
        return 0.0
    _write(store, config, since, hi, spans, managed_gpus, False)
    log.info(
        "cost: billed %.1f s that no daemon counted (%s), from the attempts' own records",
        hi - since,
        ", ".join(f"job {s.job_id}" for s in spans),
    )
    return hi - since


def _last_sign_of_life(run_dir: Path, attempt: int) -> Optional[float]:
    """When a vanished attempt was last seen alive: the newest of its log's and progress.json's
    modification times."""
    times = []
    for path in (run_dir / attempt_log(attempt), run_dir / PROGRESS):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            pass
    return max(times, default=None)
