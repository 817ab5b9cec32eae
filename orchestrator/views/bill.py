"""The goodput ledger as the CLI and the dashboard show it: one job's parts with their advice
(`orch show`), and the parts summed over jobs with the machine's idle time (`orch cost --breakdown`)."""

from __future__ import annotations

from typing import Any, Optional

from ..cost.advice import idle_advice, job_advice
from ..contract import PROGRESS, read_json
from ..cost.money import Pricing, format_duration, format_money
from ..cost.ledger import LABELS, PARTS, Ledger, job_ledger, sum_ledgers
from ..home.paths import Home
from ..model.records import Job
from ..store import Store


def ledger_of(store: Store, home: Home, job: Job, now: float) -> Ledger:
    progress = read_json(home.run_dir(job.id) / PROGRESS) if job.attempt else None
    goodput = (progress or {}).get("goodput") if isinstance(progress, dict) else None
    return job_ledger(job, store.attempts(job.id) if job.attempt else [], goodput, now)


def job_bill(store: Store, home: Home, job: Job, now: float, currency: str = "") -> dict[str, Any]:
    """`orch show`'s "bill": the ledger, its notes and the advice lines."""
    ledger = ledger_of(store, home, job, now)
    return {**ledger.as_dict(), "notes": ledger.notes, "advice": job_advice(ledger, job.spec, currency)}


def bill_lines(bill: Optional[dict[str, Any]], currency: str = "") -> list[str]:
    if not bill or bill["billed_s"] <= 0:
        return []
    lines = [f"  bill:      {format_money(bill['billed'], currency)} over {format_duration(bill['billed_s'])}"]
    for part in PARTS:
        seconds, money = bill["seconds"][part], bill["money"][part]
        share = money / bill["billed"] if bill["billed"] > 0 else seconds / bill["billed_s"]
        lines.append(
            f"    {LABELS[part]:<22} {format_money(money, currency):>14}  {format_duration(seconds):>8}  {share:>4.0%}"
        )
    lines += [f"    ({note})" for note in bill.get("notes", [])]
    lines += [f"  advice:    {line}" for line in bill.get("advice", [])]
    return lines


def breakdown_data(store: Store, home: Home, config: Any, now: float) -> dict[str, Any]:
    """Every job's ledger, their sum, the idle cost and the idle advice."""
    currency = config.pricing.currency
    jobs, ledgers = [], []
    for job in store.jobs():
        ledger = ledger_of(store, home, job, now)
        ledgers.append(ledger)
        jobs.append(
            {"id": job.id, "name": job.name, **ledger.as_dict(), "advice": job_advice(ledger, job.spec, currency)}
        )
    summed = sum_ledgers(ledgers)
    book = store.ledger()
    idle = book.get("idle_cost", 0.0)
    jobs_cost = sum(ledger.billed for ledger in ledgers)
    from ..planning.capacity import gpu_slots

    machine_hour = Pricing.from_config(config).machine_hour(len(gpu_slots(config)))
    stretches = len(store.events(kinds=["queue_drained"]))
    idle_line = idle_advice(
        idle, jobs_cost + idle, config.idle.shutdown_after_minutes, machine_hour, stretches, currency
    )
    return {
        "currency": currency,
        "jobs": jobs,
        "parts": {k: {p: round(v, 6) for p, v in d.items()} for k, d in summed.items()},
        "idle_cost": round(idle, 6),
        "jobs_cost": round(jobs_cost, 6),
        "total": round(jobs_cost + idle, 6),
        "advice": [idle_line] if idle_line else [],
    }


def breakdown_table(data: dict[str, Any]) -> str:
    cur = data["currency"]
    total = data["total"]
    lines = [f"where the money went ({len(data['jobs'])} jobs and the machine's idle time):"]
    for part in PARTS:
        money = data["parts"]["money"][part]
        lines.append(
            f"  {LABELS[part]:<22} {format_money(money, cur):>14}  "
            f"{format_duration(data['parts']['seconds'][part]):>8}  {money / total if total > 0 else 0:>4.0%}"
        )
    idle = data["idle_cost"]
    lines.append(
        f"  {'idle (nothing running)':<22} {format_money(idle, cur):>14}  {'':>8}  {idle / total if total > 0 else 0:>4.0%}"
    )
    lines.append(f"  {'total':<22} {format_money(total, cur):>14}")
    advice = [f"  job {j['id']} ({j['name']}): {a}" for j in data["jobs"] for a in j["advice"]]
    advice += [f"  {a}" for a in data["advice"]]
    if advice:
        lines.append("advice:")
        lines += advice
    return "\n".join(lines)
