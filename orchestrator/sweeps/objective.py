"""A trial's objective as it was logged: (step, value) pairs from the run's metrics.csv (the
built-in runner logs every validation there at its step) or, for a command job, from the
progress.json it writes; and the final value once the trial ended. Standard library only."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from ..contract import METRICS_CSV, PROGRESS, RESULT, read_json
from ..reports.metrics import read_metrics


def _finite(value: object) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(run_dir: Path, objective: str) -> list[tuple[int, float]]:
    """Every logged value of the objective with its step, in step order (one value a step: the last)."""
    points: dict[int, float] = {}
    for step, value in read_metrics(run_dir / METRICS_CSV).get("series", {}).get(objective, []):
        if value is not None:
            points[int(step)] = float(value)
    progress = read_json(run_dir / PROGRESS) or {}
    value = _finite((progress.get("metrics") or {}).get(objective))
    if value is not None and isinstance(progress.get("step"), int) and not points:
        points[progress["step"]] = value  # a command job: what progress.json says now
    return sorted(points.items())


def final_value(run_dir: Path, objective: str) -> Optional[float]:
    """The value a finished trial is judged by: result.json's metric, else the last one logged."""
    result = read_json(run_dir / RESULT) or {}
    value = _finite((result.get("metrics") or {}).get(objective))
    if value is not None:
        return value
    progress = read_json(run_dir / PROGRESS) or {}
    value = _finite((progress.get("metrics") or {}).get(objective))
    if value is not None:
        return value
    points = series(run_dir, objective)
    return points[-1][1] if points else None


def steps_done(run_dir: Path) -> tuple[int, Optional[int]]:
    """(the step the trial reached, the steps it would take in all) from progress.json."""
    progress = read_json(run_dir / PROGRESS) or {}
    step, total = progress.get("step"), progress.get("total_steps")
    return (step if isinstance(step, int) else 0), (total if isinstance(total, int) else None)
