"""`orch estimate` as text for people: the job's time, cost and range, its start and finish, the
checkpoint plan and, for a sweep, its bound. Rendered from the same dict `--json` prints."""

from __future__ import annotations

from typing import Any, Optional

from ..cost.money import format_duration, format_money
from ..model.clock import format_clock
from ..planning.rank_memory import memory_text


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
        if d.get("ranks"):
            lines.append(f"  ranks:       {d['ranks']}")
        if d.get("memory"):
            lines.append(f"  memory:      {memory_text(d['memory'])}")
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
