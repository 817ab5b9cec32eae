"""The rows of a run's metric logs, as metrics.csv and TensorBoard both read them: a row's step,
whether it is a validation row, the columns that are no metric, and the values RateAndLR adds to
the next train-step row of every logger."""

from __future__ import annotations

from typing import Any, Optional

NOT_METRICS = frozenset({"epoch", "step"})  # columns Lightning adds to every row
FLUSH_EVERY_S = 5.0  # metrics.csv and TensorBoard lag training by at most this (and the log interval)


def is_validation(row: dict[str, Any]) -> bool:
    return any(k.startswith("val_") and v not in (None, "") for k, v in row.items() if k)


def row_step(row: dict[str, Any]) -> Optional[int]:
    try:
        return int(float(row.get("step") or ""))
    except ValueError:
        return None


class StepExtras:
    """Values added to the next train-step row of each of the run's loggers (lr, samples/s), set by
    RateAndLR without LightningModule.log: a log call runs a torchmetrics update per value, and
    was the largest single cost orch added to a step (benchmarks/callbacks.py)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.generation = 0

    def set(self, values: dict[str, float]) -> None:
        self.values, self.generation = values, self.generation + 1

    def merge_into(self, metrics: dict[str, Any], seen: int) -> tuple[dict[str, Any], int]:
        """(metrics plus the values a logger has not had yet, the generation it has now seen)."""
        if self.generation == seen or not self.values:
            return metrics, self.generation
        return {**metrics, **self.values}, self.generation
