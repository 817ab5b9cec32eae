"""What a job would cost if its scheduler knew the trace's future: the cheapest schedule that finishes
the job by its deadline, found by dynamic programming on a time grid (no policy, no controller).
A lower bound for any policy run through the controller on the same start: it may start, stop and
overlap machines at any grid step, with the same rules as the simulated world (world.py) --

- a new machine boots for the changeover (billed, no progress), takes the job over for the
  hand-over (billed, no progress: the checkpoint's download and the resume), then makes progress
  at the job's pace; a spot one only while the trace says 1 (the oracle never loses one by
  surprise: it knows);
- a machine on one market may boot while one on the other works (a planned move's new machine
  comes up before the old one hands over, both ways), and two machines never work at once;
- billed: every machine hour, on-demand at 1, spot at 1 / k; the paper's accounting (its own
  omniscient policy, Table 3's last row): only the hours of work, boots free.

No detection delay and no first minutes without a measured pace, which the controller has: the
bound is optimistic for it. The grid is the greatest common divisor of the trace's tick and the
changeover and the hand-over (60 s for Table 3's with 5-minute hand-overs); the job's work is
rounded up to the grid, the deadline down."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

INF = 1e18
MIN_GRID_S = 60.0  # a finer grid (a changeover of 0.02 h is 72 s) is too slow to be worth it


def grid_s(gap_s: float, changeover_s: float, handover_s: float = 0.0) -> Optional[float]:
    """The oracle's time step for this trace, changeover and hand-over, or None when it would be too fine."""
    g = math.gcd(math.gcd(int(round(gap_s)), int(round(changeover_s))), int(round(handover_s)))
    return float(g) if g >= MIN_GRID_S and abs(gap_s - round(gap_s)) < 1e-9 else None


def cheapest(
    available: list[int], work: int, steps: int, boot: int, k: float, paper: bool = False, handover: int = 0
) -> float:
    """The least cost (in on-demand machine steps) to do `work` steps of work within `steps` steps,
    spot usable at step i when available[i]; inf when even on-demand from the start is too late.
    Every machine that takes the job over pays `handover` steps after its boot (no progress).

    States at a step's start, by (what runs, boot steps left), over the lag (steps not spent
    working so far, 0 .. steps - work): "I" nothing; "O"/"S" one machine on on-demand / spot;
    "OS" on-demand working while a spot machine boots; "SO" the reverse."""
    if work > steps:
        return math.inf
    width = steps - work + 1
    start = np.full(width, INF)
    start[0] = 0.0
    states: dict[tuple[str, int], np.ndarray] = {("I", 0): start}
    boot_od, boot_spot = (0.0, 0.0) if paper else (1.0, 1.0 / k)
    best = INF

    def idle(x: np.ndarray) -> np.ndarray:  # a step without progress: the lag grows by one
        y = np.full(width, INF)
        y[1:] = x[:-1]
        return y

    for t in range(steps):
        if t >= work:  # work done by now at lag t - work: finished, nothing more to pay
            for x in states.values():
                best = min(best, float(x[t - work]))
                x[t - work] = INF
        if not states:  # finished (or nothing can finish any more)
            break
        up = bool(available[t])
        chosen: dict[tuple[str, int], np.ndarray] = {}

        def choose(key: tuple[str, int], x: np.ndarray) -> None:
            chosen[key] = x if key not in chosen else np.minimum(chosen[key], x)

        anything = np.minimum.reduce(list(states.values()))  # any machine may be let go
        choose(("I", 0), anything)
        choose(("O", boot + handover), anything)
        if up:
            choose(("S", boot + handover), anything)
        for (what, left), x in states.items():
            if what == "O":
                choose(("O", left), x)
                if up and left == 0:
                    choose(("OS", boot), x)
            elif what == "S" and up:
                choose(("S", left), x)
                if left == 0:
                    choose(("SO", boot), x)
            elif what == "OS":
                if up:
                    choose(("OS", left) if left > 0 else ("S", handover), x)
                choose(("O", 0), x)
            elif what == "SO":
                if up:
                    choose(("SO", left) if left > 0 else ("S", 0), x)
                choose(("O", left + handover), x)  # spot lost (or let go): the on-demand one boots on, then takes over
        after: dict[tuple[str, int], np.ndarray] = {}

        def put(key: tuple[str, int], x: np.ndarray) -> None:
            after[key] = x if key not in after else np.minimum(after[key], x)

        for (what, left), x in chosen.items():
            if what == "I":
                put(("I", 0), idle(x))
            elif what in ("O", "S"):
                rate, boot_cost = (1.0, boot_od) if what == "O" else (1.0 / k, boot_spot)
                if left > 0:
                    put((what, left - 1), idle(x + boot_cost))
                else:
                    put((what, 0), x + rate)
            elif what == "OS":  # the on-demand one works, the spot one boots
                put(("OS", left - 1), x + 1.0 + boot_spot)
            else:
                put(("SO", left - 1), x + 1.0 / k + boot_od)
        states = {key: x for key, x in after.items() if x.min() < INF / 2}
    for x in states.values():
        best = min(best, float(x[steps - work]))
    return best if best < INF / 2 else math.inf


def job_cost_h(
    values: list[int],
    gap_s: float,
    start_tick: int,
    *,
    job_h: float,
    deadline_h: float,
    changeover_h: float,
    price_ratio: float,
    handover_h: float = 0.0,
    paper: bool = False,
) -> Optional[float]:
    """The oracle's cost of one job started at `start_tick`, in on-demand hours; None when the
    grid would be too fine."""
    dt = grid_s(gap_s, changeover_h * 3600, handover_h * 3600)
    if dt is None:
        return None
    per_tick = int(round(gap_s / dt))
    steps = int(deadline_h * 3600 // dt)
    work = int(math.ceil(job_h * 3600 / dt - 1e-9))
    available = [
        values[start_tick + i // per_tick] if start_tick + i // per_tick < len(values) else 0 for i in range(steps)
    ]
    boot, handover = int(round(changeover_h * 3600 / dt)), int(round(handover_h * 3600 / dt))
    cost = cheapest(available, work, steps, boot, price_ratio, paper=paper, handover=handover)
    return cost * dt / 3600
