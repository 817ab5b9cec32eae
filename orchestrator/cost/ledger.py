"""A job's goodput ledger: where its billed seconds and money went — redone steps, checkpoint stall,
start-up and restore, data wait, evaluation, and the useful training that is left. Pure: the
caller passes the job, its attempts and the runner's figures (progress.json "goodput", written by
training/heartbeat/goodput.py); the same parts feed `orch show`, `orch cost --breakdown` and the dashboard.

Like Google's ML goodput, the wasted parts are measured and useful training is the rest of what
was billed, so the parts add up to the bill by construction; what the figures can be trusted for
is each measured part (the tests check those against real runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ..model.records import Attempt, Job

# In the order they are printed and stacked; "useful" first, the wasted parts after it.
PARTS = ("useful", "redone", "checkpoint", "startup", "data_wait", "eval")
LABELS = {
    "useful": "useful training",
    "redone": "redone steps",
    "checkpoint": "checkpoint stall",
    "startup": "start-up and restore",
    "data_wait": "data wait",
    "eval": "evaluation",
}


@dataclass(frozen=True)
class Ledger:
    seconds: dict[str, float]
    money: dict[str, float]
    billed_s: float
    billed: float
    measured: bool  # the job's process reported figures (the built-in runner does)
    scaled: bool = False  # the measured parts exceeded the billed time and were scaled down to it
    attempts: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return math.fsum(self.money.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "money": {k: round(v, 6) for k, v in self.money.items()},
            "billed_s": round(self.billed_s, 3),
            "billed": round(self.billed, 6),
            "measured": self.measured,
            "scaled": self.scaled,
            "attempts": self.attempts,
        }


def job_ledger(job: Job, attempts: Sequence[Attempt], goodput: Optional[Mapping[str, Any]], now: float) -> Ledger:
    """The ledger of one job from its billed totals, its attempts and the runner's per-attempt figures."""
    figures = {str(k): v for k, v in (goodput or {}).items() if isinstance(v, Mapping)}
    waste = dict.fromkeys(PARTS[1:], 0.0)
    step_s = steps = 0.0
    for attempt in attempts:
        fig = figures.get(str(attempt.n))
        first = _number(fig.get("first_step_at")) if fig else None
        if first is not None:
            waste["startup"] += max(0.0, first - attempt.started_at)
        elif figures:  # a measured job whose attempt never reached a step: all of it was start-up
            waste["startup"] += max(0.0, (attempt.ended_at or now) - attempt.started_at)
        if fig:
            waste["data_wait"] += _number(fig.get("data_wait_s")) or 0.0
            waste["checkpoint"] += _number(fig.get("checkpoint_s")) or 0.0
            waste["eval"] += _number(fig.get("eval_s")) or 0.0
            step_s += _number(fig.get("step_s")) or 0.0
            steps += _number(fig.get("steps")) or 0.0
    # Redone steps at the measured time of a step; without figures, the daemon's own estimate.
    waste["redone"] = job.steps_lost * step_s / steps if steps > 0 else job.waste_seconds
    billed_s, billed = max(0.0, job.run_seconds), max(0.0, job.cost)
    spent = math.fsum(waste.values())
    scaled = spent > billed_s
    if scaled:
        factor = billed_s / spent if spent > 0 else 0.0
        waste = {k: v * factor for k, v in waste.items()}
    seconds = {"useful": max(0.0, billed_s - math.fsum(waste.values())), **waste}
    rate = billed / billed_s if billed_s > 0 else 0.0
    money = {k: v * rate for k, v in seconds.items()}
    notes = []
    if not figures:
        notes.append("this job's process reports no breakdown (the built-in runner does): only redone steps are known")
    if scaled:
        notes.append("the measured parts exceeded the billed time: scaled to it")
    return Ledger(seconds, money, billed_s, billed, bool(figures), scaled, len(attempts), notes)


def sum_ledgers(ledgers: Sequence[Ledger]) -> dict[str, dict[str, float]]:
    """`orch cost --breakdown`: each part summed over jobs, in seconds and money."""
    return {
        "seconds": {p: math.fsum(ledger.seconds[p] for ledger in ledgers) for p in PARTS},
        "money": {p: math.fsum(ledger.money[p] for ledger in ledgers) for p in PARTS},
    }


def _number(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
