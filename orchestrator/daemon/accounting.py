"""The daemon's bookkeeping of money: one accounting interval split among the running jobs
(the one formula, from cost.py), the rest idle."""

from __future__ import annotations

import logging
from typing import Callable, Optional

from ..spec.config import Config
from ..model.records import Job
from ..cost.money import Pricing, split_interval
from ..model.states import JobState
from ..store import Store

log = logging.getLogger("orch.daemon")


def accrue_interval(
    store: Store,
    config: Config,
    managed_gpus: int,
    seconds: float,
    now: float,
    *,
    billable: Optional[Callable[[Job], bool]] = None,
) -> None:
    """Bill `seconds` of daemon uptime: each running job its share, the rest idle.

    With `billable` (a cluster executor: Slurm), only the jobs it names are charged (a job
    Slurm still holds PENDING costs nothing), each its own GPUs x gpu_hour, and the cluster
    has no idle cost of ours."""
    running = store.jobs([JobState.RUNNING])
    p = config.pricing
    pricing = Pricing(currency=p.currency, gpu_hour=p.gpu_hour, instance_hour=p.instance_hour)
    if billable is not None:
        running = [j for j in running if billable(j)]
        pricing = Pricing(currency=p.currency, gpu_hour=p.gpu_hour, instance_hour=0.0)
        managed_gpus = sum(j.gpus for j in running)
    try:
        costs, idle = split_interval(seconds, [(j.id, j.gpus) for j in running], managed_gpus, pricing)
    except ValueError as exc:
        # Running jobs hold more GPUs than this daemon manages (the config changed under an
        # adopted job): bill each job its own GPUs and the machine nothing idle, and say so.
        log.warning("cost: %s; billing each job its own GPUs until they finish", exc)
        costs, idle = {j.id: j.gpus * p.gpu_hour * seconds / 3600 for j in running}, 0.0
    # A job `orch run` runs in the foreground holds its share of the machine (so it is not idle),
    # but that process charges it: one process accrues a job's time (docs/cost.md).
    charged = [j for j in running if not j.in_foreground]
    store.accrue(now, seconds, {j.id: (costs.get(j.id, 0.0), j.gpus * seconds) for j in charged}, idle)
