"""The estimate's projection maths, pure: a built-in job's wall time, cost and range from a
probe's figures (`python -m training.probe`'s JSON), and a command job's from its name's history
(jobs/estimate.py runs the probe, reads the store and calls these)."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..contract import young_daly
from ..spec.jobspec import JobSpec
from .forecast import History
from .speed_range import speed_range, typical_share, with_run_to_run


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
