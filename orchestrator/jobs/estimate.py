"""`orch estimate job.toml` (and `orch submit --estimate`): what a job will take and cost before it
is queued, as one dict (`--json` prints it, views/estimate.py words it). A built-in job is measured
by a short probe of the real job on this machine (probe.py); a command job is estimated from the
finished jobs of the same name. The maths are planning/projection.py; the store's jobs are only
read (the queue ahead)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..contract import mtbf_choice
from ..cost.money import Pricing, format_duration, job_hourly_rates
from ..home.paths import Home
from ..model.states import JobState
from ..planning.forecast import history_of, queue_forecast
from ..planning.projection import builtin_projection, command_projection
from ..planning.rank_memory import rank_holds, rank_memory
from ..spec.jobspec import JobSpec, load_jobspec
from ..store import Store
from .probe import run_probe


@dataclass
class Candidate:
    """The job being estimated, placed in the queue as dispatch would place it (never stored)."""

    spec_json: str
    spec: dict[str, Any]
    gpus: int
    priority: int
    id: int = 2**62
    started_at: Optional[float] = None
    state: JobState = JobState.QUEUED
    after_ids: list[int] = field(default_factory=list)


def hourly_rate(pricing: Pricing, gpus: int, managed_gpus: int) -> float:
    """What the job would pay per hour alone on this machine (SPEC's one formula)."""
    rates, _ = job_hourly_rates([("job", gpus)], max(managed_gpus, gpus), pricing)
    return rates["job"]


def mtbf_of(store: Store, spec: JobSpec) -> tuple[float, str]:
    """The MTBF the estimate plans checkpoints for, and why (contract.mtbf_choice): the job's own,
    else this machine's count of preemptions (planning/mtbf.py), else orch's assumption."""
    from ..planning.mtbf import machine_mtbf

    notices, lost_at, uptime = store.preemption_history()
    machine = machine_mtbf(notices, lost_at, uptime)
    if machine is None:
        return mtbf_choice(spec.checkpoint.mtbf_hours, None)
    why = f"this machine: {machine[1]} preemption(s) in {format_duration(uptime)} of daemon uptime"
    return mtbf_choice(spec.checkpoint.mtbf_hours, machine[0], why)


def estimate_data(
    store: Store,
    home: Home,
    config: Any,
    job_toml: Path,
    now: float,
    *,
    warmup: int = 10,
    steps: int = 30,
    daemon_running: bool = True,
    sweep: Optional[str] = None,
) -> dict[str, Any]:
    """`sweep`: the job is a sweep's base job, and the sweep's name finds its earlier trials. The
    caller has admitted the job (jobs/admission.py: a job that can never start here is not probed)."""
    from ..planning.capacity import gpu_slots

    spec = load_jobspec(job_toml)
    managed = len(gpu_slots(config))
    rate = hourly_rate(Pricing.from_config(config), spec.gpus, managed)
    if spec.is_command:
        history = history_of(store.jobs([JobState.SUCCEEDED]), spec.name or "", sweep=sweep)
        data = command_projection(spec, history, rate, sweep)
    else:
        before = _load_averages()  # read before the probe, so that they do not count it
        probe = run_probe(job_toml, warmup=warmup, steps=steps)
        data = builtin_projection(spec, probe, rate, mtbf_of(store, spec), before)
        data.update(rank_data(spec, probe))
        data["_probe"] = probe  # for a sweep's bound; dropped before printing
    body = spec.model_dump(mode="json", exclude_none=True)
    candidate = Candidate(json.dumps(body), body, spec.gpus, spec.priority)
    forecast = queue_forecast(
        store,
        home,
        managed,
        config.daemon.cpu_slots,
        now,
        extra=candidate,  # type: ignore[arg-type]
        extra_left=data.get("wall_s"),
    )[candidate.id]
    wait = None if math.isinf(forecast.start) else max(0.0, forecast.start - now)
    data.update(
        {
            "job": spec.name,
            "gpus": spec.gpus,
            "currency": config.pricing.currency,
            "hourly_rate": round(rate, 6),
            "queue_wait_s": None if wait is None else round(wait, 1),
            "queue_wait_is_lower_bound": forecast.lower_bound,
            "queue_ahead": len([j for j in store.jobs([JobState.QUEUED, JobState.RUNNING])]),
            "daemon_running": daemon_running,
        }
    )
    if data.get("wall_s") is not None and wait is not None:
        data["projected_finish"] = now + wait + data["wall_s"]
        data["projected_finish_latest"] = now + wait + data["wall_s_high"]
    return data


def rank_data(spec: JobSpec, probe: dict[str, Any]) -> dict[str, Any]:
    """What each rank holds, in words (as `orch show` says it) and in bytes from the probe's count of
    the model's parameters (planning/rank_memory.py); memory None when the probe could not count."""
    body = spec.model_dump(mode="json", exclude_none=True)
    out: dict[str, Any] = {"ranks": rank_holds(body, spec.gpus) or None, "memory": None}
    if probe.get("trainable_params") is not None and probe.get("frozen_bytes") is not None:
        out["memory"] = rank_memory(
            body,
            spec.gpus,
            trainable_params=int(probe["trainable_params"]),
            frozen_bytes=int(probe["frozen_bytes"]),
            peak_gpu_bytes=probe.get("peak_gpu_bytes"),
        )
        out["memory"]["params"] = probe.get("params")
    return out


def _load_averages() -> list[float]:
    try:
        return list(os.getloadavg())
    except OSError:  # not available here
        return []


def public(data: dict[str, Any]) -> dict[str, Any]:
    """The estimate as printed and as --json: without the fields kept for the sweep's bound."""
    return {k: v for k, v in data.items() if not k.startswith("_")}
