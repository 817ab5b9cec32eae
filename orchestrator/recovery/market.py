"""Whether a job's budget can pay for its next machine on a market (the market itself is the
policy's choice: policy.py). Pure functions: the controller feeds them."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..cost.money import Pricing
from ..model.markets import ON_DEMAND, SPOT
from .deciding import work_of

BOOT_S = 300.0  # assumed: a replacement boots, installs orch and adopts in five minutes

__all__ = ["BOOT_S", "ON_DEMAND", "SPOT", "budget_problem", "hourly_price", "remaining_s"]


def remaining_s(manifest: Mapping[str, Any]) -> Optional[float]:
    """Seconds of training left at the pace the job has had so far (over every machine), or None."""
    work = work_of(manifest)
    return None if work is None else work[1]


def hourly_price(pricing: Any, market: str, gpus: int) -> Optional[float]:
    """What an hour of the job costs on `market` by [pricing]; None when nothing is priced."""
    price = Pricing.of(pricing).machine_hour(gpus, market)
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
