"""How fast a probed job will run under a load other than the probe's: the range `orch estimate`
prints. The probe measures what load does not move — the CPU time a step needs and the cores the
job kept busy — beside the load it ran under (other runnable tasks); the machine's cores are
shared fairly among runnable tasks (Linux CFS), so a job with t threads among B other runnable
tasks on N cores gets min(t, N·t / (t + B)) cores. The share of the step that waited on the CPU
slows by the ratio of shares; the rest (a GPU, the disk) does not. Pure arithmetic over numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence


def cores_for(threads: float, cpus: int, others: float) -> float:
    """Cores `threads` runnable threads get among `others` runnable tasks on `cpus` cores."""
    threads, others = max(1.0, threads), max(0.0, others)
    return min(threads, float(cpus), cpus * threads / (threads + others))


@dataclass(frozen=True)
class LoadModel:
    """The probe's view of the machine: `cpus` cores; the job runs `threads` threads and kept
    `busy` cores busy while `others` runnable tasks competed with it."""

    cpus: int
    threads: float
    busy: float
    others: float

    @property
    def cpu_bound(self) -> float:
        """The share of a step spent waiting on the CPU: 1 when the job used every core it could
        get, less when something else (a GPU, the disk) held it back."""
        return max(0.0, min(1.0, self.busy / cores_for(self.threads, self.cpus, self.others)))

    def factor(self, others: float, *, single_thread: bool = False) -> float:
        """Wall time under `others` runnable tasks ÷ wall time in the probe. `single_thread`: a
        part that runs on one thread and waits on nothing but the CPU (start-up, the end)."""
        t, bound = (1.0, 1.0) if single_thread else (self.threads, self.cpu_bound)
        ratio = cores_for(t, self.cpus, self.others) / cores_for(t, self.cpus, others)
        return (1.0 - bound) + bound * ratio


def load_model(probe: Mapping[str, Any]) -> Optional[LoadModel]:
    """From the probe's figures; None when it could not see the load (not Linux, an old probe)."""
    try:
        cpus, threads = int(probe["cpus"]), float(probe["threads"])
        busy, others = float(probe["cpu_per_wall"]), float(probe["others_runnable"])
    except (KeyError, TypeError, ValueError):
        return None
    if cpus < 1 or threads < 1 or not all(map(math.isfinite, (busy, others))) or busy <= 0:
        return None
    return LoadModel(cpus, threads, busy, max(0.0, others))


# How far a machine's load moves between the probe and the run, either way: on a shared machine
# it was seen to rise from 6.8 to 12.5 runnable tasks within four minutes.
LOAD_SWING = 1.5


def loads_around(probe_others: float, load_averages: Sequence[float], cpus: int) -> tuple[float, float, float]:
    """(low, typical, high) other runnable tasks to estimate under. Typical: the mean of three
    views of the present load, each noisy on a shared machine — the probe's, and the 1- and
    5-minute load averages. Low: the quietest of those and the 15-minute average, a third lower
    (LOAD_SWING). High: the busiest of them, half again as busy, plus one more busy neighbour per
    four cores (at least one). The load averages are read before the probe ran, so they do not
    count the probe itself."""
    seen = [probe_others, *(max(0.0, a) for a in load_averages)]
    recent = seen[:3]
    typical = sum(recent) / len(recent)
    low = min(seen) / LOAD_SWING
    high = max(seen) * LOAD_SWING + max(1.0, cpus / 4)
    return low, typical, high


def scale_parts(parts: Mapping[str, float], model: Optional[LoadModel], others: float) -> dict[str, float]:
    """The probe's parts (seconds) as they would be under `others`: training, evaluation and saves
    as the steps went; start-up and the end (imports, export) on one thread."""
    if model is None:
        return dict(parts)
    multi, single = model.factor(others), model.factor(others, single_thread=True)
    return {k: v * (single if k in ("startup", "end") else multi) for k, v in parts.items()}


def typical_share(probe: Mapping[str, Any]) -> float:
    """The probe's median batch time ÷ its mean (training/heartbeat/goodput.py): a run whose batches all go
    at the probe's typical pace trains this much faster than the probe's rate. A few slow batches
    in a short probe (page faults, a cold cache) are not the run's fate. 1 when not measured."""
    try:
        share = float(probe.get("typical_share") or 1.0)
    except (TypeError, ValueError):
        return 1.0
    return share if math.isfinite(share) and 0.0 < share <= 1.0 else 1.0


# Without the probe's load figures (not Linux, an old probe), the range is this much around it.
UNMEASURED_RANGE = (0.8, 1.6)

# Two runs of the same job on the same idle machine differ by more than load explains: a few
# seconds of start-up (imports from a cold or warm page cache), the CPU's clock, a short probe's
# sampling. Measured (benchmarks/estimate.py, quiet machine): a run took 0.91-1.02 of its estimate.
# The range is never narrower than this either way, whatever the load model says.
RUN_TO_RUN = 0.15


def with_run_to_run(point: float, low: float, high: float) -> tuple[float, float]:
    """(low, high) at least RUN_TO_RUN around `point`: a real run within ±15 % of the estimate
    (estimate ÷ real between 0.85 and 1.15) falls inside."""
    return min(low, point / (1.0 + RUN_TO_RUN)), max(high, point / (1.0 - RUN_TO_RUN))


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
    wall = sum(point.values())
    fast = scale_parts(parts, model, low)
    fast["training"] = fast.get("training", 0.0) * typical_share(probe)
    low_s, high_s = with_run_to_run(wall, sum(fast.values()), sum(scale_parts(parts, model, high).values()))
    return {
        "wall_s": wall,
        "low": low_s,
        "high": high_s,
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


def sweep_bound(data: dict[str, Any], section: Any, config: Any) -> dict[str, Any]:
    """A sweep's upper bound: every trial run to its end, as many at a time as both `parallel` and
    this machine's slots allow, each at the slow end of the base job's range with the other
    trials of its wave as more load (a probed job), or at the slowest of the trials and jobs seen
    (a command), plus a tick of the daemon per wave to start it. Pruning can only make it cheaper;
    the trials' parameters (a batch size, a step count) can make a trial slower than the base job
    measured here, which no bound from the base job can know."""
    from ..model.executor_kinds import executor_kind
    from ..planning.capacity import gpu_slots

    at_once = section.parallel
    gpus = data.get("gpus") or 0
    if executor_kind(config.executor.kind).on_this_machine:  # a cluster's capacity is the cluster's business
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
