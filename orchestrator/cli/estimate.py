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
from ..cost.money import Pricing, format_duration, format_money, job_hourly_rates
from ..model.clock import format_clock
from ..model.errors import OrchError
from ..planning.forecast import History, history_of, queue_forecast
from ..spec.jobspec import JobSpec, load_jobspec
from ..jobs.lifecycle import check_gpus
from ..planning.speed_range import load_model, loads_around, scale_parts
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


# Without the probe's load figures (not Linux, an old probe), the range is this much around it.
UNMEASURED_RANGE = (0.8, 1.6)


def speed_range(
    probe: dict[str, Any],
    parts: dict[str, float],
    load_averages: Sequence[float],
    concurrent: int = 1,
    *,
    others: Optional[float] = None,
) -> dict[str, Any]:
    """The wall time (point, low, high) under the load this machine is likely to have, from the
    probe's parts (measured under the probe's load) and its load figures (planning/speed_range.py).
    `concurrent`: copies of the job running at once (a sweep's trials), each one more load;
    `others`: the parts under exactly that many other runnable tasks instead of the typical load."""
    model = load_model(probe)
    probed = sum(parts.values())
    if model is None:
        if others is not None:
            return {"wall_s": probed, "low": probed, "high": probed, "parts": dict(parts), "load": None}
        return {
            "wall_s": probed,
            "low": probed * UNMEASURED_RANGE[0],
            "high": probed * UNMEASURED_RANGE[1],
            "parts": dict(parts),
            "load": None,
        }
    low, typical, high = loads_around(model.others, load_averages, model.cpus)
    neighbours = (concurrent - 1) * max(model.busy, model.threads * model.cpu_bound)
    typical, high = typical + neighbours, high + neighbours
    point = scale_parts(parts, model, typical if others is None else others)
    return {
        "wall_s": sum(point.values()),
        "low": sum(scale_parts(parts, model, low).values()),
        "high": sum(scale_parts(parts, model, high).values()),
        "parts": point,
        "load": {
            "cpus": model.cpus,
            "threads": model.threads,
            "busy_cores": round(model.busy, 3),
            "cpu_bound": round(model.cpu_bound, 3),
            "others_in_probe": round(model.others, 2),
            "load_averages": [round(a, 2) for a in load_averages],
            "others_low": round(low, 2),
            "others_typical": round(typical, 2),
            "others_high": round(high, 2),
        },
    }


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
        ranged["low"] = sum(v * (1.0 if k in ("startup", "end") else stop_share) for k, v in low_parts.items())
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
    p = config.pricing
    rate = hourly_rate(
        Pricing(currency=p.currency, gpu_hour=p.gpu_hour, instance_hour=p.instance_hour), spec.gpus, managed
    )
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
            "currency": p.currency,
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


def sweep_bound(data: dict[str, Any], section: Any, config: Any) -> dict[str, Any]:
    """A sweep's upper bound: every trial run to its end, as many at a time as both `parallel` and
    this machine's slots allow, each at the slow end of the base job's range with the other
    trials of its wave as more load (a probed job), or at the slowest of the trials and jobs seen
    (a command), plus a tick of the daemon per wave to start it. Pruning can only make it cheaper;
    the trials' parameters (a batch size, a step count) can make a trial slower than the base job
    measured here, which no bound from the base job can know."""
    from ..planning.capacity import gpu_slots

    at_once = section.parallel
    gpus = data.get("gpus") or 0
    if config.executor.kind == "local":  # a cluster's capacity is the cluster's business
        slots = config.daemon.cpu_slots if gpus == 0 else len(gpu_slots(config)) // gpus
        at_once = max(1, min(at_once, slots))
    waves = math.ceil(section.trials / at_once)
    trial_high = data.get("wall_s_high")
    probe = data.get("_probe")
    if probe is not None and trial_high is not None:
        parts = data.get("probed_parts_s") or {}
        trial_high = speed_range(probe, parts, (data.get("load") or {}).get("load_averages") or (), at_once)["high"]
    rate = data.get("hourly_rate")
    wall = cost = None
    if trial_high is not None and rate is not None:
        wall = waves * (trial_high + config.daemon.tick_seconds)
        cost = section.trials * trial_high / 3600.0 * rate
        if gpus == 0:  # CPU trials share the instance price: together never more than it for the wall
            cost = min(cost, wall / 3600.0 * rate)
    return {
        "trials": section.trials,
        "parallel": section.parallel,
        "at_once_here": at_once,
        "trial_wall_s_at_most": None if trial_high is None else round(trial_high, 1),
        "cost_at_most": None if cost is None else round(cost, 6),
        "wall_s_at_most": None if wall is None else round(wall, 1),
        "max_cost": section.max_cost,
    }


def sweep_text(d: dict[str, Any]) -> str:
    s, cur = d["sweep"], d["currency"]
    if s["cost_at_most"] is None:
        return f"sweep of {s['trials']} trials: no bound without an estimate of its base job"
    here = (
        ""
        if s["at_once_here"] == s["parallel"]
        else f" (parallel = {s['parallel']}, but this machine's slots run {s['at_once_here']})"
    )
    lines = [
        f"sweep of {s['trials']} trials, {s['at_once_here']} at a time{here}, each like the base job above "
        "(its parameters may make a trial slower or faster):",
        f"  at most:     {format_money(s['cost_at_most'], cur)} and {format_duration(s['wall_s_at_most'])} "
        f"if no trial is pruned (each trial at most {format_duration(s['trial_wall_s_at_most'])}, "
        "at the slow end of the range with the other trials of its wave running beside it)",
    ]
    if s["max_cost"] is not None:
        lines.append(f"  budget:      max_cost = {format_money(s['max_cost'], cur)} stops the sweep there")
    return "\n".join(lines)


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


def _range(d: dict[str, Any], key: str, fmt: Any) -> str:
    """'5m 10s (4m 50s – 7m 20s)': the estimate and its range."""
    low, high = d.get(f"{key}_low"), d.get(f"{key}_high")
    if low is None or high is None or fmt(low) == fmt(high):
        return fmt(d[key])
    return f"{fmt(d[key])} (range {fmt(low)} – {fmt(high)})"


def _load_line(load: Optional[dict[str, Any]]) -> str:
    if not load:
        return "not measured by the probe here: the range is a fixed -20 % / +60 %"
    return (
        f"the probe kept {load['busy_cores']:g} of {load['cpus']} cores busy beside {load['others_in_probe']:g} "
        f"other runnable task(s); estimated at {load['others_typical']:g}, the range from {load['others_low']:g} "
        f"(the quietest of the last 15 min, a third lower) to {load['others_high']:g} (the busiest, half again as "
        "busy, and one more busy neighbour)"
    )


def estimate_text(d: dict[str, Any]) -> str:
    cur = d["currency"]
    lines = [
        f"estimate for {d['job']} ({d['gpus']} GPU{'s' if d['gpus'] != 1 else ''}, "
        f"{format_money(d['hourly_rate'], cur)}/h on this machine)"
    ]
    if d.get("cannot_estimate"):
        lines.append(f"  cannot estimate: {d['cannot_estimate']}")
    elif d["kind"] == "command":
        lines.append(f"  wall time:   {_range(d, 'wall_s', format_duration)} ({d['basis']})")
        lines.append(
            f"  cost:        {_range(d, 'cost', lambda v: format_money(v, cur))}   gpu-hours: {d['gpu_hours']:.3f}"
        )
    else:
        parts = d["parts_s"]
        lines += [
            f"  speed:       {d['steps_per_s']:.3g} steps/s (measured over {d['probe']['measured_steps']} steps after "
            f"{d['probe']['warmup_steps']} warm-up)",
            f"  steps:       {d['total_steps']}",
            f"  wall time:   {_range(d, 'wall_s', format_duration)} (start-up {format_duration(parts['startup'])}, "
            f"training {format_duration(parts['training'])}, {d['evals']:g} evaluations "
            f"{format_duration(parts['eval'])}, {d['saves']} saves {parts['checkpoint']:.2f}s)"
            + ("; early stopping may end it sooner" if d["early_stopping"] else ""),
            f"  load:        {_load_line(d.get('load'))}",
            f"  cost:        {_range(d, 'cost', lambda v: format_money(v, cur))}   gpu-hours: {d['gpu_hours']:.3f}",
            f"  checkpoints: every {format_duration(d['checkpoint_interval_s'])} ({d['checkpoint_interval_why']}); "
            f"each blocks the step {d['checkpoint_stall_s']:.3f}s",
            f"  preemption:  expect {format_duration(d['preemption_waste_s'])} redone and restarting "
            f"({format_money(d['preemption_waste_cost'], cur)}) at an MTBF of {format_duration(d['mtbf_s'])} ({d['mtbf_source']})",
            f"  the probe:   {format_duration(d['probe']['seconds'])}, {format_money(d['probe']['cost'], cur)}",
        ]
    wait = d.get("queue_wait_s")
    wait_text = (
        "never on this machine (it asks for more than it has)"
        if wait is None
        else (
            ("now" if wait == 0 else f"in {format_duration(wait)}")
            # a job ahead with no ETA yet counts as ending now: the start is the earliest it can be
            + (" or later (a job ahead has no ETA yet)" if d["queue_wait_is_lower_bound"] else "")
        )
    )
    lines.append(
        f"  starts:      {wait_text} ({d['queue_ahead']} job(s) queued or running)"
        + ("" if d.get("daemon_running") else "; no daemon is running: `orch daemon start`")
    )
    if d.get("projected_finish"):
        latest = d.get("projected_finish_latest")
        lines.append(
            f"  finishes:    {format_clock(d['projected_finish'])}"
            + (f", at the latest {format_clock(latest)}" if latest and latest > d["projected_finish"] + 30 else "")
        )
    if d.get("sweep"):
        lines.append(sweep_text(d))
    return "\n".join(lines)
