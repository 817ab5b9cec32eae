"""What `orch run` charges the one job it runs for an interval: that job's share of the machine
among the jobs running now, by the daemon's formula (money.split_interval). A daemon beside it
charges that job nothing (one process accrues a job's time: docs/cost.md)."""

from __future__ import annotations

from typing import Sequence

from .money import Pricing, split_interval


def own_share(
    seconds: float, job_id: int, gpus: int, running: Sequence[tuple[int, int]], managed_gpus: int, pricing: Pricing
) -> float:
    """The cost of `seconds` for job `job_id` (holding `gpus`), with `running` the (id, gpus) of
    every running job (it is added when missing). More GPUs held than managed (a config changed
    under a running job): its own GPUs only."""
    if seconds <= 0:
        return 0.0
    jobs = list(running)
    if job_id not in {i for i, _ in jobs}:
        jobs.append((job_id, gpus))
    try:
        costs, _ = split_interval(seconds, jobs, managed_gpus, pricing)
    except ValueError:
        return gpus * pricing.gpu_hour * seconds / 3600.0
    return costs.get(job_id, 0.0)
