"""The daemon's bookkeeping of money: one accounting interval split among the running jobs
(SPEC's one formula, from cost.py), the rest idle."""

from __future__ import annotations

import logging

from ..config import Config
from ..cost import Pricing, split_interval
from ..states import JobState
from ..store import Store

log = logging.getLogger("orch.daemon")


def accrue_interval(store: Store, config: Config, managed_gpus: int, seconds: float, now: float) -> None:
    """Bill `seconds` of daemon uptime: each running job its share, the rest idle."""
    running = store.jobs([JobState.RUNNING])
    p = config.pricing
    pricing = Pricing(currency=p.currency, gpu_hour=p.gpu_hour, instance_hour=p.instance_hour)
    try:
        costs, idle = split_interval(seconds, [(j.id, j.gpus) for j in running], managed_gpus, pricing)
    except ValueError as exc:
        # Running jobs hold more GPUs than this daemon manages (the config changed under an
        # adopted job): bill each job its own GPUs and the machine nothing idle, and say so.
        log.warning("cost: %s; billing each job its own GPUs until they finish", exc)
        costs, idle = {j.id: j.gpus * p.gpu_hour * seconds / 3600 for j in running}, 0.0
    store.accrue(now, seconds, {j.id: (costs.get(j.id, 0.0), j.gpus * seconds) for j in running}, idle)
