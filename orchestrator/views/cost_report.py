"""`orch cost`: per-job GPU-hours, cost and preemption waste, the idle cost, and totals. The
JSON and the table come from one dict; totals are sums of the rows shown."""

from __future__ import annotations

from typing import Any

from ..spec.config import Config
from ..cost.money import Pricing, format_duration, format_money, spot_savings
from ..store import Store


def cost_data(store: Store, config: Config) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = []
    for job in store.jobs():
        jobs.append(
            {
                "id": job.id,
                "name": job.name,
                "state": job.state.value,
                "gpu_hours": round(job.gpu_seconds / 3600, 6),
                "runtime_s": round(job.run_seconds, 1),
                "cost": round(job.cost, 6),
                "waste": round(job.waste_cost, 6),
                "waste_s": round(job.waste_seconds, 1),
                "steps_lost": job.steps_lost,
            }
        )
    ledger = store.ledger()
    idle = round(ledger.get("idle_cost", 0.0), 6)
    jobs_total = round(sum(j["cost"] for j in jobs), 6)
    data: dict[str, Any] = {
        "currency": config.pricing.currency,
        "jobs": jobs,
        "jobs_cost": jobs_total,
        "idle_cost": idle,
        "total": round(jobs_total + idle, 6),
        "gpu_hours": round(sum(j["gpu_hours"] for j in jobs), 6),
        "waste": round(sum(j["waste"] for j in jobs), 6),
        "uptime_s": round(ledger.get("uptime_s", 0.0), 1),
        "note": "each attempt billed from its own start to its own end, also while no daemon ran",
    }
    pricing = Pricing.from_config(config)
    savings = spot_savings(data["gpu_hours"], pricing)
    if savings is not None:
        data["on_demand_equivalent"] = round(data["gpu_hours"] * (pricing.on_demand_gpu_hour or 0.0), 6)
        data["savings"] = round(savings, 6)
    return data


def cost_table(data: dict[str, Any]) -> str:
    cur = data["currency"]
    unit = f" ({cur})" if cur else ""
    head = f"{'ID':>5}  {'NAME':<24} {'STATE':<10} {'RUNTIME':>9} {'GPU-H':>8} {'COST' + unit:>14} {'WASTE' + unit:>14}"
    rule = "-" * len(head)
    lines = [head]
    for j in data["jobs"]:
        lines.append(
            f"{j['id']:>5}  {j['name'][:24]:<24} {j['state']:<10} {format_duration(j['runtime_s']):>9} "
            f"{j['gpu_hours']:>8.3f} {j['cost']:>14.2f} {j['waste']:>14.2f}"
            + (f"  ({j['steps_lost']} steps redone)" if j["steps_lost"] else "")
        )
    lines.append(rule)
    lines.append(
        f"{'':>5}  {'jobs':<24} {'':<10} {'':>9} {data['gpu_hours']:>8.3f} {data['jobs_cost']:>14.2f} "
        f"{data['waste']:>14.2f}"
    )
    lines.append(f"{'':>5}  {'idle (nothing running)':<24} {'':<10} {'':>9} {'':>8} {data['idle_cost']:>14.2f}")
    lines.append(
        f"{'':>5}  {'total':<24} {'':<10} {format_duration(data['uptime_s']):>9} {'':>8} {data['total']:>14.2f}"
    )
    if "savings" in data:
        lines.append(f"spot savings vs on-demand: {format_money(data['savings'], cur)}")
    lines.append(f"({data['note']}; total runtime is the uptime billed)")
    return "\n".join(lines)
