"""`orch cost`: per-job GPU-hours, cost and preemption waste, the idle cost, and totals. The
JSON and the table come from one dict; totals are sums of the rows shown."""

from __future__ import annotations

from typing import Any

from .config import Config
from .cost import format_money
from .store import Store


def cost_data(store: Store, config: Config) -> dict[str, Any]:
    jobs = []
    for job in store.jobs():
        jobs.append({
            "id": job.id, "name": job.name, "state": job.state.value,
            "gpu_hours": round(job.gpu_seconds / 3600, 6),
            "runtime_s": round(job.run_seconds, 1),
            "cost": round(job.cost, 6),
            "waste": round(job.waste_cost, 6),
            "waste_s": round(job.waste_seconds, 1),
            "steps_lost": job.steps_lost,
        })
    ledger = store.ledger()
    idle = round(ledger.get("idle_cost", 0.0), 6)
    jobs_total = round(sum(j["cost"] for j in jobs), 6)
    data = {
        "currency": config.pricing.currency,
        "jobs": jobs,
        "jobs_cost": jobs_total,
        "idle_cost": idle,
        "total": round(jobs_total + idle, 6),
        "gpu_hours": round(sum(j["gpu_hours"] for j in jobs), 6),
        "waste": round(sum(j["waste"] for j in jobs), 6),
        "uptime_s": round(ledger.get("uptime_s", 0.0), 1),
        "note": "counted only while a daemon runs; time with no daemon is not billed here",
    }
    p = config.pricing
    if p.on_demand_gpu_hour is not None and p.gpu_hour:
        data["on_demand_equivalent"] = round(data["gpu_hours"] * p.on_demand_gpu_hour, 6)
        data["savings"] = round(data["gpu_hours"] * (p.on_demand_gpu_hour - p.gpu_hour), 6)
    return data


def cost_table(data: dict[str, Any]) -> str:
    cur = data["currency"]
    head = f"{'ID':>5}  {'NAME':<24} {'STATE':<10} {'GPU-H':>8} {'COST':>14} {'WASTE':>14}"
    lines = [head]
    for j in data["jobs"]:
        lines.append(f"{j['id']:>5}  {j['name'][:24]:<24} {j['state']:<10} {j['gpu_hours']:>8.3f} "
                     f"{format_money(j['cost'], cur):>14} {format_money(j['waste'], cur):>14}")
    lines.append("")
    lines.append(f"jobs {format_money(data['jobs_cost'], cur)} + idle {format_money(data['idle_cost'], cur)}"
                 f" = total {format_money(data['total'], cur)}   ({data['gpu_hours']:.3f} GPU-hours,"
                 f" waste {format_money(data['waste'], cur)})")
    if "savings" in data:
        lines.append(f"spot savings vs on-demand: {format_money(data['savings'], cur)}")
    lines.append(f"({data['note']})")
    return "\n".join(lines)
