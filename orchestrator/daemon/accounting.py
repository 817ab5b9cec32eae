"""The daemon's bookkeeping of money and lost work: one accounting interval split among the
running jobs (SPEC's one formula, from cost.py) and the steps a resume had to recompute."""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from ..config import Config
from ..cost import Pricing, split_interval
from ..records import Attempt, Job
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


def lost_steps_updates(job: Job, attempts: Sequence[Attempt], resume_step: Optional[int]) -> dict[str, Any]:
    """Steps the previous attempt reached beyond the checkpoint the next one resumes from had to
    be recomputed: that is the preemption waste, in steps, seconds (at the previous attempt's mean
    step time) and money (at the job's own mean rate)."""
    if not attempts:
        return {}
    prev = attempts[-1]
    if prev.step_reached is None or prev.ended_at is None:
        return {}
    lost = max(0, prev.step_reached - (resume_step or 0))
    if not lost:
        return {}
    done = prev.step_reached - (prev.resumed_from_step or 0)
    step_s = (prev.ended_at - prev.started_at) / done if done > 0 else 0.0
    rate = job.cost / job.run_seconds if job.run_seconds > 0 else 0.0
    return {"steps_lost": job.steps_lost + lost, "waste_seconds": job.waste_seconds + lost * step_s,
            "waste_cost": job.waste_cost + lost * step_s * rate}
