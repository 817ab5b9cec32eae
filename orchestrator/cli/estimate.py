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
from typing import Any, Optional, Sequence

from ..contract import mtbf_choice, young_daly
from ..views.estimate import estimate_text, sweep_text  # noqa: F401 (re-exported: the CLI prints them)
from ..cost.money import Pricing, format_duration, job_hourly_rates
from ..model.errors import OrchError
from ..planning.forecast import History, history_of, queue_forecast
from ..spec.jobspec import JobSpec, load_jobspec
from ..jobs.lifecycle import check_gpus
from ..planning.speed_range import speed_range, sweep_bound, typical_share, with_run_to_run  # noqa: F401 (sweep_bound: the CLI's)
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


def checkpoint_plan(spec: JobSpec, steps_per_s: float, save_s: float, mtbf_s: float) -> tuple[float, str]:
    """(seconds between periodic saves, how that was chosen) for the job's [checkpoint]."""
    ck = spec.checkpoint
    if ck.every == "auto":
        return young_daly(save_s, mtbf_s), f'every = "auto": sqrt(2 x {save_s:.3f} s x {mtbf_s:.0f} s)'
    choices = []
    if ck.every_n_steps:
        choices.append((ck.every_n_steps / steps_per_s, f"every_n_steps = {ck.every_n_steps}"))
    if ck.every_minutes:
        choices.append((ck.every_minutes * 60.0, f"every_minutes = {ck.every_minutes:g}"))
    return min(choices) if choices else (math.inf, "no periodic checkpoints")


def mtbf_of(store: Store, spec: JobSpec) -> tuple[float, str]:
    from ..planning.mtbf import machine_mtbf

    notices, lost_at, uptime = store.preemption_history()
    machine = machine_mtbf(notices, lost_at, uptime)
    if machine is None:
        return mtbf_choice(spec.checkpoint.mtbf_hours, None)
    why = f"this machine: {machine[1]} preemption(s) in {format_duration(uptime)} of daemon uptime"
    return mtbf_choice(spec.checkpoint.mtbf_hours, machine[0], why)


def earliest_stop_share(spec: JobSpec, probe: dict[str, Any], evals: float) -> float:
    """The share of the run's steps early stopping may end it after at the earliest: the first
    check sets the best, then `patience` checks without improvement stop it. Checks are the
    evaluations (a validation metric) or the epochs (train_loss). 1 without early stopping."""
    es = spec.early_stopping
    if es is None:
        return 1.0
    if es.monitor.startswith("val_"):
        checks = evals
    else:
        per_epoch = float(probe.get("steps_per_epoch") or 0)
        checks = float(probe["total_steps"]) / per_epoch if per_epoch > 0 else 0.0
    return min(1.0, (es.patience + 1) / checks) if checks > 0 else 1.0


def builtin_projection(
    spec: JobSpec,
    probe: dict[str, Any],
    rate_hour: float,
    mtbf: tuple[float, str],
    load_averages: Sequence[float] = (),
) -> dict[str, Any]:
    """Wall time = start-up + steps / (steps/s) + evaluations + periodic saves + the end, as the
    probe measured them (the supervisor's start added to the start-up), scaled to the load this
    machine is likely to have, with a range from a quieter to a busier machine (`speed_range`);
    cost at the rate."""
    sps = float(probe["steps_per_s"])
    total = int(probe["total_steps"])
    startup = float(probe.get("startup_s") or 0.0) + float(probe.get("launch_s") or 0.0)
    save_s = float(probe.get("checkpoint_s") or 0.0)
    eval_pass = float(probe.get("eval_pass_s") or 0.0)
    end_s = float(probe.get("end_s") or 0.0)
    train_s = total / sps
    evals = float(probe.get("evals") or 0.0)
    interval_s, interval_why = checkpoint_plan(spec, sps, save_s, mtbf[0])
    saves = (math.floor(train_s / interval_s) if math.isfinite(interval_s) else 0) + 1  # + the final one
    probed_parts = {
        "startup": startup,
        "training": train_s,
        "eval": evals * eval_pass,
        "checkpoint": saves * save_s,
        "end": end_s,
    }
    ranged = speed_range(probe, probed_parts, load_averages)
    stop_share = earliest_stop_share(spec, probe, evals)
    if stop_share < 1.0:  # early stopping: the low end is its earliest stop, at the low end's load
        low_others = (ranged["load"] or {}).get("others_low")
        low_parts = speed_range(probe, probed_parts, load_averages, others=low_others)["parts"]
        low_parts["training"] = low_parts.get("training", 0.0) * typical_share(probe)
        earliest = sum(v * (1.0 if k in ("startup", "end") else stop_share) for k, v in low_parts.items())
        ranged["low"] = with_run_to_run(earliest, earliest, earliest)[0]
    wall, parts = ranged["wall_s"], ranged["parts"]
    preemptions = wall / mtbf[0]
    per_preemption = (min(interval_s, wall) / 2.0) + startup  # half an interval redone, and a restart
    waste_s = preemptions * per_preemption
    return {
        "kind": "builtin",
        "steps_per_s": round(sps, 4),
        "total_steps": total,
        "wall_s": round(wall, 1),
        "wall_s_low": round(ranged["low"], 1),
        "wall_s_high": round(ranged["high"], 1),
        "parts_s": {k: round(v, 3) for k, v in parts.items()},
        "probed_parts_s": {k: round(v, 3) for k, v in probed_parts.items()},  # as measured, under the probe's load
        "load": ranged["load"],
        "evals": round(evals, 2),
        "saves": saves,
        "checkpoint_interval_s": None if math.isinf(interval_s) else round(interval_s, 1),
        "checkpoint_interval_why": interval_why,
        "checkpoint_stall_s": round(save_s, 4),
        "gpu_hours": round(wall * spec.gpus / 3600.0, 4),
        "cost": round(wall / 3600.0 * rate_hour, 6),
        "cost_low": round(ranged["low"] / 3600.0 * rate_hour, 6),
        "cost_high": round(ranged["high"] / 3600.0 * rate_hour, 6),
        "mtbf_s": round(mtbf[0], 1),
        "mtbf_source": mtbf[1],
        "preemption_waste_s": round(waste_s, 1),
        "preemption_waste_cost": round(waste_s / 3600.0 * rate_hour, 6),
        "probe": {
            "warmup_steps": probe.get("warmup_steps"),
            "measured_steps": probe.get("steady_steps"),
            "seconds": round(float(probe["probe_s"]), 1),
            "cost": round(float(probe["probe_s"]) / 3600.0 * rate_hour, 6),
        },
        "early_stopping": spec.early_stopping is not None,
    }


def command_projection(
    spec: JobSpec, history: Optional[History], rate_hour: float, sweep: Optional[str] = None
) -> dict[str, Any]:
    if history is None:
        trials = f" nor trial of an earlier sweep {sweep!r}" if sweep else ""
        return {
            "kind": "command",
            "wall_s": None,
            "cost": None,
            "cannot_estimate": f"no finished job named {spec.name!r}{trials} yet: orch cannot estimate a command "
            "it has never seen run (the built-in job is measured by a probe instead)",
        }
    low = history.seconds if history.seconds_min is None else history.seconds_min
    high = history.seconds if history.seconds_max is None else history.seconds_max
    return {
        "kind": "command",
        "wall_s": round(history.seconds, 1),
        "wall_s_low": round(low, 1),
        "wall_s_high": round(high, 1),
        "gpu_hours": round(history.seconds * spec.gpus / 3600, 4),
        "cost": round(history.seconds / 3600.0 * rate_hour, 6),
        "cost_low": round(low / 3600.0 * rate_hour, 6),
        "cost_high": round(high / 3600.0 * rate_hour, 6),
        "history_runs": history.runs,
        "history_mean_cost": round(history.cost, 6),
        "basis": f"the mean of {history.runs} finished job(s) named {spec.name!r}"
        + (f" or trials of earlier sweeps {sweep!r}" if sweep else "")
        + (", the range their least and most" if history.runs > 1 else ""),
    }


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
    """`sweep`: the job is a sweep's base job, and the sweep's name finds its earlier trials."""
    from ..planning.capacity import gpu_slots

    spec = load_jobspec(job_toml)
    managed = len(gpu_slots(config))
    rate = hourly_rate(Pricing.from_config(config), spec.gpus, managed)
    if spec.is_command:
        history = history_of(store.jobs([JobState.SUCCEEDED]), spec.name or "", sweep=sweep)
        data = command_projection(spec, history, rate, sweep)
    else:
        if config.executor.kind == "local":  # as `orch submit` refuses it: a CPU probe would mean nothing
            check_gpus(spec, str(job_toml), managed)
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
