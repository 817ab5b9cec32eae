"""A sweep as `orch sweep show`, the dashboard and the end-of-sweep message see it: its trials
best first, the best trial, steps and money spent, how many were pruned and what that saved
("saved": what a pruned trial would have cost to finish at its own measured time per step and
cost per running second)."""

from __future__ import annotations

from typing import Any, Optional

from ..contract import PROGRESS, read_json
from ..home.paths import Home
from ..model.records import Job
from ..model.states import JobState
from ..store import Store
from . import objective
from ..model.sweep_records import Sweep


def describe_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def trial_steps(store: Store, home: Home, job: Job) -> int:
    """Optimizer steps the trial reached: its progress, or where its last attempt ended."""
    step, _ = objective.steps_done(home.run_dir(job.id))
    reached = [a.step_reached for a in store.attempts(job.id) if a.step_reached is not None]
    return max([step, *reached])


def seconds_per_step(run_dir, attempts, steps: int, run_seconds: float) -> float:
    """The trial's measured time per optimizer step: its last attempt's steps over the time since
    its first step (progress.json), so start-up (imports, model load) is not counted as training;
    without those figures, its running time over its steps."""
    progress = read_json(run_dir / PROGRESS) or {}
    first, updated = progress.get("first_step_at"), progress.get("updated_at")
    since = (attempts[-1].resumed_from_step or 0) if attempts else 0
    if isinstance(first, (int, float)) and isinstance(updated, (int, float)) and updated > first and steps > since:
        return (updated - first) / (steps - since)
    return run_seconds / steps if steps > 0 else 0.0


def saved_by_pruning(job: Job, steps: int, total: Optional[int], per_step: float) -> tuple[float, float]:
    """(money, running seconds) a pruned trial would have spent to reach its last step, at its
    measured time per step and cost per running second."""
    if job.state is not JobState.PRUNED or not total or steps <= 0 or total <= steps:
        return 0.0, 0.0
    seconds = (total - steps) * per_step
    rate = job.cost / job.run_seconds if job.run_seconds > 0 else 0.0
    return seconds * rate, seconds


def summarize(store: Store, home: Home, sweep: Sweep) -> dict[str, Any]:
    section = sweep.spec["sweep"]
    name, direction = section["objective"], section["direction"]
    rows: list[dict[str, Any]] = []
    saved = saved_seconds = 0.0
    for trial in store.trials(sweep.id):
        job = store.get(trial.job_id)
        run_dir = home.run_dir(job.id)
        steps = trial_steps(store, home, job)
        if job.state is JobState.SUCCEEDED:
            value = objective.final_value(run_dir, name)
        else:
            points = objective.series(run_dir, name)
            value = points[-1][1] if points else None
        per_step = seconds_per_step(run_dir, store.attempts(job.id), steps, job.run_seconds)
        money, seconds = saved_by_pruning(job, steps, objective.steps_done(run_dir)[1], per_step)
        saved += money
        saved_seconds += seconds
        rows.append(
            {
                "id": job.id,
                "number": trial.number,
                "params": trial.params,
                "state": job.state.value,
                "value": value,
                "steps": steps,
                "cost": round(job.cost, 6),
                "run_seconds": round(job.run_seconds, 3),
                "reason": job.reason,
            }
        )
    sign = -1.0 if direction == "maximize" else 1.0
    # Best first: finished trials by their value, then the rest (running, pruned) by theirs.
    rows.sort(
        key=lambda r: (
            r["state"] != JobState.SUCCEEDED.value,
            r["value"] is None,
            sign * (r["value"] if r["value"] is not None else 0.0),
            r["number"],
        )
    )
    done = [r for r in rows if r["state"] == JobState.SUCCEEDED.value and r["value"] is not None]
    best = {"trial": done[0]["id"], "value": done[0]["value"], "params": done[0]["params"]} if done else None
    return {
        "id": sweep.id,
        "name": sweep.name,
        "state": sweep.state.value,
        "objective": name,
        "direction": direction,
        "best": best,
        "trials": rows,
        "steps_total": sum(r["steps"] for r in rows),
        "cost_total": round(sum(r["cost"] for r in rows), 6),
        "pruned": sum(r["state"] == JobState.PRUNED.value for r in rows),
        "saved": round(saved, 6),
        "saved_seconds": round(saved_seconds, 3),
        "trials_planned": section["trials"],
        "reason": sweep.reason,
    }
