"""`orch estimate job.toml` (and `orch submit --estimate`): what a job will take and cost before it
is queued. A built-in job is measured by a short probe of the real job on this machine
(`python -m training.probe`, a subprocess: the CLI never imports torch); a command job is estimated
from the finished jobs of the same name. The store's jobs are only read (the queue ahead)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..contract import mtbf_choice
from ..views.estimate import estimate_text, sweep_text  # noqa: F401 (re-exported: the CLI prints them)
from ..cost.money import Pricing, format_duration, job_hourly_rates
from ..model.errors import OrchError
from ..planning.forecast import history_of, queue_forecast
from ..spec.jobspec import JobSpec, load_jobspec
from ..planning.speed_range import sweep_bound  # noqa: F401 (sweep_bound: the CLI's)
from ..planning.projection import builtin_projection, command_projection
from ..home.paths import Home
from ..model.states import JobState
from ..store import Store

PROBE_TIMEOUT_S = 1800.0


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
    from ..planning.mtbf import machine_mtbf

    notices, lost_at, uptime = store.preemption_history()
    machine = machine_mtbf(notices, lost_at, uptime)
    if machine is None:
        return mtbf_choice(spec.checkpoint.mtbf_hours, None)
    why = f"this machine: {machine[1]} preemption(s) in {format_duration(uptime)} of daemon uptime"
    return mtbf_choice(spec.checkpoint.mtbf_hours, machine[0], why)


def run_probe(job_toml: Path, *, warmup: int, steps: int, env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    # absolute: the probe runs in the repository's folder, not the user's
    cmd = [
        sys.executable,
        "-m",
        "training.probe",
        str(job_toml.absolute()),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
    ]
    spawned = time.time()
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=env or dict(os.environ),
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        exited = time.time()
    except subprocess.TimeoutExpired:
        raise OrchError(f"the probe of {job_toml} took over {PROBE_TIMEOUT_S:.0f} s; nothing was estimated") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise OrchError(f"the probe of {job_toml} failed (exit {done.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    # Seen from here, the probe's start-up includes the interpreter's own start, and its end the
    # interpreter's shutdown after the export (threads joined, files closed): a real attempt pays both.
    if result.get("first_step_at"):
        result["startup_s"] = max(0.0, result["first_step_at"] - spawned - float(result.get("counting_s") or 0.0))
    if result.get("last_step_at"):
        result["end_s"] = max(0.0, exited - result["last_step_at"] - float(result.get("after_last_step_s") or 0.0))
    result["probe_s"] = exited - spawned
    result["launch_s"] = launch_s()
    if not result.get("steps_per_s"):
        raise OrchError(f"the probe of {job_toml} measured no steady steps (too few steps: raise --steps)")
    return result


def launch_s() -> float:
    """What starting an attempt's supervisor takes here (its interpreter and imports), before the
    job's own process starts: the daemon bills it, the probe does not see it."""
    from ..executors.base import SUPERVISOR_MODULE

    began = time.monotonic()
    try:
        subprocess.run(
            [sys.executable, "-m", SUPERVISOR_MODULE, "--help"],
            capture_output=True,
            timeout=120,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    return time.monotonic() - began


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


def _load_averages() -> list[float]:
    try:
        return list(os.getloadavg())
    except OSError:  # not available here
        return []


def public(data: dict[str, Any]) -> dict[str, Any]:
    """The estimate as printed and as --json: without the fields kept for the sweep's bound."""
    return {k: v for k, v in data.items() if not k.startswith("_")}


def ask_after(data: dict[str, Any], yes: bool) -> None:
    """`orch submit --estimate`: print the estimate, then queue only on a yes (or --yes); with no
    terminal to ask on, nothing is queued (exit 1)."""
    import typer

    print(estimate_text(data), file=sys.stderr)
    if yes:
        return
    if not sys.stdin.isatty():
        print("not queued: no terminal to ask on (--yes queues it after the estimate)", file=sys.stderr)
        raise typer.Exit(1)
    if not typer.confirm("queue it?", default=False, err=True):
        print("not queued", file=sys.stderr)
        raise typer.Exit(1)
