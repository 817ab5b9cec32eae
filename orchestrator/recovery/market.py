"""Which market the next machine of a job is bought on, and whether the job's budget can pay for it.

The policy (docs/recovery.md): spot by default; on-demand once the job has lost `on_demand_after`
machines; and for a job with a deadline, on-demand as soon as finishing on spot -- with the losses
this job has actually seen, each costing one recovery -- plus one more recovery as a safety margin
would miss the deadline. That is the greedy policy of "Can't Be Late" (Wu et al., NSDI'24): stay
on spot while the slack covers a restart, switch to on-demand for good when it no longer does; the
loss rate is this job's own instead of a trace's. Pure functions: the controller feeds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

SPOT, ON_DEMAND = "spot", "on-demand"
BOOT_S = 300.0  # assumed: a replacement boots, installs orch and adopts in five minutes


@dataclass(frozen=True)
class Choice:
    market: str
    why: str


def remaining_s(manifest: Mapping[str, Any]) -> Optional[float]:
    """Seconds of training left at the pace the job has had so far (over every machine), or None."""
    progress = manifest.get("progress") or {}
    step, total = progress.get("step"), progress.get("total_steps")
    run_s = float((manifest.get("cost") or {}).get("run_seconds") or 0.0)
    if not isinstance(step, int) or not isinstance(total, int) or step <= 0 or total <= 0 or run_s <= 0:
        return None
    return max(0, total - step) * run_s / step


def spot_finish(*, now: float, remaining: float, losses: int, run_s: float, recovery_s: float) -> tuple[float, float]:
    """(projected finish on spot, expected further losses): this recovery, the work left, and the
    losses the job's own rate (losses per hour it ran) predicts for that work, one recovery each."""
    rate = losses / max(run_s, 60.0)  # per second of running
    future = rate * remaining
    return now + recovery_s + remaining + future * recovery_s, future


def choose_market(
    *,
    losses: int,
    on_demand_after: int,
    now: float,
    deadline: Optional[float],
    remaining: Optional[float],
    run_s: float,
    recovery_s: float,
) -> Choice:
    """`losses`: machines this job has lost, this one included."""
    if losses >= on_demand_after:
        return Choice(ON_DEMAND, f"{losses} machine(s) of this job lost (on_demand_after = {on_demand_after})")
    if deadline is not None:
        if remaining is None:
            return Choice(SPOT, "deadline set, but no pace measured yet to project it")
        finish, future = spot_finish(now=now, remaining=remaining, losses=losses, run_s=run_s, recovery_s=recovery_s)
        if finish + recovery_s > deadline:
            return Choice(
                ON_DEMAND,
                f"on spot it would finish {_clock(finish)} with {future:.1f} more loss(es) expected; "
                f"with one recovery's margin that misses the deadline {_clock(deadline)}",
            )
        return Choice(SPOT, f"spot meets the deadline {_clock(deadline)} (projected {_clock(finish)})")
    return Choice(SPOT, f"{losses} loss(es) so far (on-demand after {on_demand_after})")


def hourly_price(pricing: Any, market: str, gpus: int) -> Optional[float]:
    """What an hour of the job costs on `market` by [pricing]; None when nothing is priced."""
    gpu = pricing.gpu_hour
    if market == ON_DEMAND and pricing.on_demand_gpu_hour is not None:
        gpu = pricing.on_demand_gpu_hour
    price = gpu * max(gpus, 1) + pricing.instance_hour
    return price if price > 0 else None


def budget_problem(manifest: Mapping[str, Any], pricing: Any, market: str) -> Optional[str]:
    """Why the job's max_cost cannot pay for a machine on `market`, or None when it can (or has none)."""
    max_cost = (manifest.get("budget") or {}).get("max_cost")
    if not isinstance(max_cost, (int, float)) or isinstance(max_cost, bool):
        return None
    spent = float((manifest.get("cost") or {}).get("cost") or 0.0)
    if spent >= max_cost:
        return f"it has spent {spent:.2f} of its max_cost {max_cost:.2f}"
    left = remaining_s(manifest)
    price = hourly_price(pricing, market, int(manifest.get("gpus") or 0))
    if left is None or price is None:
        return None
    projected = spent + (left + BOOT_S) / 3600 * price
    if projected > max_cost:
        return (
            f"finishing on {market} would cost about {projected:.2f} in all "
            f"({left / 3600:.2f} h left at {price:.2f}/h), over its max_cost {max_cost:.2f}"
        )
    return None


def _clock(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
