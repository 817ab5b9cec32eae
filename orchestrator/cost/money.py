"""Money and time: the one cost formula (docs/cost.md), spot savings, ETA and projected cost, budget checks,
and the one way amounts and durations are printed. Pure functions over numbers; the daemon passes
pricing, intervals and clocks in, and the store keeps the running totals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable, Optional, Sequence

from ..model.executor_kinds import executor_kind
from ..model.markets import ON_DEMAND

if TYPE_CHECKING:  # only for the annotation: money.py stays importable without the config's pydantic
    from ..spec.config import Config

JobId = Hashable


@dataclass(frozen=True)
class Pricing:
    """config.toml [pricing]. Prices are per hour; `spot` and `on_demand_gpu_hour` only feed the
    savings line of the cost report."""

    currency: str = ""
    gpu_hour: float = 0.0
    instance_hour: float = 0.0
    spot: bool = False
    on_demand_gpu_hour: float | None = None

    @classmethod
    def from_config(cls, config: "Config") -> "Pricing":
        """The one price of an hour built from config.toml, for every process that quotes or bills
        one (the daemon, `orch run`, `orch estimate`, the reports): on a cluster executor the
        instance price is not ours to pay, so it is dropped here rather than at each caller."""
        p = config.pricing
        by_allocation = executor_kind(config.executor.kind).bills_by_allocation
        return cls(
            currency=p.currency,
            gpu_hour=p.gpu_hour,
            instance_hour=0.0 if by_allocation else p.instance_hour,
            spot=p.spot,
            on_demand_gpu_hour=p.on_demand_gpu_hour,
        )

    @classmethod
    def of(cls, pricing: Any) -> "Pricing":
        """A Pricing as it is, or one from a [pricing] table as written (a machine orch watch
        launches pays its instance price whatever this home's executor)."""
        if isinstance(pricing, Pricing):
            return pricing
        return cls(
            currency=pricing.currency,
            gpu_hour=pricing.gpu_hour,
            instance_hour=pricing.instance_hour,
            spot=pricing.spot,
            on_demand_gpu_hour=pricing.on_demand_gpu_hour,
        )

    def machine_hour(self, gpus: int, market: Optional[str] = None) -> float:
        """THE price of an hour: a machine with `gpus` GPUs, busy or not (the daemon's uptime, `orch
        run`'s share, an estimate, the bill, the recovery controller's budget and policy). On
        `market` ON_DEMAND a GPU costs [pricing] on_demand_gpu_hour when it is given; otherwise,
        and on spot, gpu_hour. A machine without GPUs costs its instance alone."""
        gpu = self.gpu_hour
        if market == ON_DEMAND and self.on_demand_gpu_hour is not None:
            gpu = self.on_demand_gpu_hour
        return self.instance_hour + gpu * gpus


# --- the one formula ------------------------------------------------------------------------


def job_hourly_rates(
    running: Sequence[tuple[JobId, int]], managed_gpus: int, pricing: Pricing
) -> tuple[dict[JobId, float], float]:
    """Each running job's price per hour, and the machine's, for the current mix of jobs.

    A job with g GPUs takes g × gpu_hour + instance_hour × g / managed_gpus. CPU jobs
    (g = 0) take nothing of gpu_hour and share equally the part of instance_hour that GPU jobs
    leave unclaimed — on a GPU-less machine that is all of it; on a GPU machine
    it is the share of the idle GPUs. So a CPU job is charged only for machine time nothing else
    is paying for, a busy GPU box stays fully charged to its GPU jobs, and the rule is the same
    with or without GPUs. Raises ValueError if the jobs hold more GPUs than the machine has:
    the accounting would then exceed what the machine costs, which is a bookkeeping bug.
    """
    held = sum(gpus for _, gpus in running)
    if any(gpus < 0 for _, gpus in running) or held > managed_gpus:
        raise ValueError(f"running jobs hold {held} GPUs but the daemon manages {managed_gpus}")
    instance_per_gpu = pricing.instance_hour / managed_gpus if managed_gpus else 0.0
    cpu_jobs = sum(1 for _, gpus in running if gpus == 0)
    unclaimed_instance = pricing.instance_hour - instance_per_gpu * held
    cpu_rate = unclaimed_instance / cpu_jobs if cpu_jobs else 0.0
    rates: dict[JobId, float] = {}
    for job_id, gpus in running:
        rate = gpus * (pricing.gpu_hour + instance_per_gpu) if gpus else cpu_rate
        rates[job_id] = rates.get(job_id, 0.0) + rate
    return rates, pricing.machine_hour(managed_gpus)


def split_interval(
    seconds: float, running: Sequence[tuple[JobId, int]], managed_gpus: int, pricing: Pricing
) -> tuple[dict[JobId, float], float]:
    """Charge `seconds` of uptime: (cost per running job, idle cost).

    Idle is what the machine cost minus what the jobs took, so Σ jobs + idle equals
    seconds × machine_hour up to one float rounding (see `job_hourly_rates` for the shares).
    """
    if seconds < 0:
        raise ValueError(f"an interval cannot be negative ({seconds} s)")
    rates, machine_rate = job_hourly_rates(running, managed_gpus, pricing)
    hours = seconds / 3600.0
    costs = {job_id: rate * hours for job_id, rate in rates.items()}
    idle = machine_rate * hours - math.fsum(costs.values())
    return costs, (0.0 if abs(idle) < 1e-12 * max(1.0, machine_rate * hours) else idle)


@dataclass(frozen=True)
class Span:
    """One attempt's share of the clock: it held `gpus` from `start` to `end` (None: still running)."""

    job_id: JobId
    gpus: int
    start: float
    end: float | None = None


@dataclass
class SpanBill:
    """What `split_spans` charged: per job its cost, GPU-seconds and running seconds, and idle."""

    costs: dict[JobId, float]
    gpu_seconds: dict[JobId, float]
    run_seconds: dict[JobId, float]
    idle: float
    over_held: str = ""  # set when jobs held more GPUs than managed (each billed its own GPUs)


def split_spans(
    lo: float, hi: float, spans: Sequence[Span], managed_gpus: int, pricing: Pricing, *, jobs_are_machine: bool = False
) -> SpanBill:
    """Charge the uptime [lo, hi] to the attempts that ran inside it, each only while it ran.

    The interval is cut where an attempt started or ended; each piece is split by the one formula
    (`split_interval`) among the attempts running through it, so Σ jobs + idle = (hi − lo) ×
    machine_hour still holds. With `jobs_are_machine` (a cluster allocation) the machine is just
    the GPUs the running jobs hold: no idle cost of ours."""
    bill = SpanBill({}, {}, {}, 0.0)
    if hi <= lo:
        return bill
    cuts = {lo, hi}
    for s in spans:
        cuts.update(t for t in (s.start, s.end) if t is not None and lo < t < hi)
    edges = sorted(cuts)
    for a, b in zip(edges, edges[1:]):
        inside = [s for s in spans if s.start <= a and (s.end is None or s.end >= b)]
        held = [(s.job_id, s.gpus) for s in inside]
        managed = sum(g for _, g in held) if jobs_are_machine else managed_gpus
        try:
            costs, idle = split_interval(b - a, held, managed, pricing)
        except ValueError as exc:
            bill.over_held = str(exc)
            costs, idle = {j: g * pricing.gpu_hour * (b - a) / 3600 for j, g in held}, 0.0
        bill.idle += idle
        for s in inside:
            bill.costs[s.job_id] = bill.costs.get(s.job_id, 0.0) + costs.get(s.job_id, 0.0)
            bill.gpu_seconds[s.job_id] = bill.gpu_seconds.get(s.job_id, 0.0) + s.gpus * (b - a)
            bill.run_seconds[s.job_id] = bill.run_seconds.get(s.job_id, 0.0) + (b - a)
    return bill


def average_hourly_rate(cost: float, seconds: float) -> float | None:
    """What a job has actually paid per hour so far (it varies for CPU jobs as the mix changes)."""
    return cost / (seconds / 3600.0) if seconds > 0 else None


def spot_savings(gpu_hours_used: float, pricing: Pricing) -> float | None:
    """What the same GPU-hours would have cost more on demand; None when not configured."""
    if not pricing.spot or pricing.on_demand_gpu_hour is None:
        return None
    return gpu_hours_used * (pricing.on_demand_gpu_hour - pricing.gpu_hour)


# --- ETA and projection --------------------------------------------------------------------------


def eta_seconds(step: int, total_steps: int | None, rate: float | None) -> float | None:
    """Seconds until total_steps at `rate` steps/s; None when either is unknown."""
    if total_steps is None or rate is None or rate <= 0:
        return None
    return max(0, total_steps - step) / rate


@dataclass(frozen=True)
class Projection:
    """Projected final cost. With early stopping the job may end sooner, so it is an upper bound."""

    cost: float
    upper_bound: bool


def projected_cost(
    cost_so_far: float, eta_s: float | None, hourly_rate: float | None, *, early_stopping: bool = False
) -> Projection | None:
    """Cost so far plus the remaining time at the job's rate; None without an ETA or a rate."""
    if eta_s is None or hourly_rate is None:
        return None
    return Projection(cost_so_far + eta_s / 3600.0 * hourly_rate, upper_bound=early_stopping)


# --- budgets ----------------------------------------------------------------------------------


def budget_exceeded(
    job_cost: float,
    job_hours: float,
    max_cost: float | None,
    max_hours: float | None,
    currency: str = "",
) -> str | None:
    """Why a job must stop for its [budget], or None. Reaching the limit counts: the next tick
    would pass it. Cost is checked first since it is what users set budgets for."""
    if max_cost is not None and job_cost >= max_cost:
        return f"budget: spent {format_money(job_cost, currency)} of max_cost {max_cost:.2f}"
    if max_hours is not None and job_hours >= max_hours:
        return f"budget: ran {job_hours:.2f} h of max_hours {max_hours:g}"
    return None


def running_job_budget_exceeded(
    job_cost: float,
    job_hours: float,
    max_cost: float | None,
    max_hours: float | None,
    total_reason: str | None,
    currency: str = "",
) -> str | None:
    """Why a running job must stop for a budget: config.toml's total spent (`total_reason`, from
    total_budget_exceeded), else its own [budget]. The one rule the daemon and a lone `orch run`
    apply."""
    return total_reason or budget_exceeded(job_cost, job_hours, max_cost, max_hours, currency=currency)


def total_budget_exceeded(total_spent: float, total: float | None, currency: str = "") -> str | None:
    """Why nothing more may run under config.toml [budget] total, or None."""
    if total is not None and total_spent >= total:
        return f"budget: spent {format_money(total_spent, currency)} in all, [budget] total is {total:.2f}"
    return None


# --- formatting -------------------------------------------------------------------------------


def format_money(amount: float, currency: str = "") -> str:
    """2.25, "CNY" -> "2.25 CNY"; no currency configured -> "2.25"."""
    text = f"{amount:.2f}"
    return f"{text} {currency}" if currency else text


def format_duration(seconds: float | None) -> str:
    """ETA and runtime in tables: '45s', '1m 55s', '12m', '3h 05m', '2d 4h'; '-' when unknown."""
    if seconds is None or seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:  # "1m 55s", not "1m", for 114.5 s: a minute is too much to drop
        return f"{s // 60}m" + (f" {s % 60:02d}s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
