"""Advice with a number: for each large wasted part of a ledger, one line saying which setting to
change and what it would have saved at the job's own rates. Pure rules over a Ledger and the job's
spec; each saving is stated as the arithmetic that gave it, so a user can check it."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from .money import format_duration, format_money
from .ledger import Ledger

LARGE_SHARE = 0.05  # a part worth a line: at least this share of the bill
MIN_SAVING = 0.005  # and a saving that prints as at least 0.01: never "saves up to 0.00"


def _large(ledger: Ledger, part: str, saved_share: float = 1.0) -> bool:
    """The part is a large share of the bill, and what fixing it saves (`saved_share` of it) is money."""
    money = ledger.money[part]
    return ledger.billed > 0 and money >= LARGE_SHARE * ledger.billed and money * saved_share >= MIN_SAVING


def _share(ledger: Ledger, part: str) -> str:
    return f"{ledger.money[part] / ledger.billed:.0%}"


def checkpoint_advice(ledger: Ledger, spec: Mapping[str, Any], currency: str) -> Optional[str]:
    background = ((spec.get("checkpoint") or {}).get("background")) is False
    if not _large(ledger, "checkpoint", 1.0 if background else 0.5):
        return None
    cost = ledger.money["checkpoint"]
    ck = spec.get("checkpoint") or {}
    head = f"checkpoint stall {format_money(cost, currency)} ({_share(ledger, 'checkpoint')}, {format_duration(ledger.seconds['checkpoint'])})"
    if ck.get("background") is False:
        return (
            f"{head}: set [checkpoint] background = true (a save then blocks the step only for a copy of the "
            f"state): saves up to {format_money(cost, currency)}"
        )
    if ck.get("every") == "auto":
        return None  # already the interval that balances stall against redone work
    if ck.get("every_n_steps"):
        setting = f"every_n_steps = {int(ck['every_n_steps']) * 2}"
    else:
        setting = f"every_minutes = {float(ck.get('every_minutes') or 10.0) * 2:g}"
    return (
        f"{head}: checkpoint half as often ([checkpoint] {setting}): saves {format_money(cost / 2, currency)} "
        f"(half the saves)"
    )


def redone_advice(ledger: Ledger, spec: Mapping[str, Any], currency: str) -> Optional[str]:
    if not _large(ledger, "redone"):
        return None
    cost = ledger.money["redone"]
    ck = spec.get("checkpoint") or {}
    fix = (
        "a [preemption] notice source (a checkpoint at the notice: nothing redone)"
        if ck.get("every") == "auto"
        else '[checkpoint] every = "auto" (the interval from the save cost and this machine\'s MTBF) or a '
        "[preemption] notice source (a checkpoint at the notice: nothing redone)"
    )
    return (
        f"redone steps {format_money(cost, currency)} ({_share(ledger, 'redone')}, "
        f"{format_duration(ledger.seconds['redone'])}): {fix}: saves up to {format_money(cost, currency)}"
    )


def data_wait_advice(ledger: Ledger, spec: Mapping[str, Any], currency: str) -> Optional[str]:
    if not _large(ledger, "data_wait"):
        return None
    cost = ledger.money["data_wait"]
    workers = (spec.get("data") or {}).get("num_workers")
    suggest = 4 if not workers else int(workers) * 2
    now = "unset: min(4, CPUs)" if workers is None else str(workers)
    return (
        f"data wait {format_money(cost, currency)} ({_share(ledger, 'data_wait')}, "
        f"{format_duration(ledger.seconds['data_wait'])}): the step waited on the DataLoader; set [data] "
        f"num_workers = {suggest} (now {now}): saves up to {format_money(cost, currency)}"
    )


def startup_advice(ledger: Ledger, spec: Mapping[str, Any], currency: str) -> Optional[str]:
    """Only the restarts' share can be saved by a kept cache: the first start tokenizes anyway."""
    if ledger.attempts < 2 or not _large(ledger, "startup", (ledger.attempts - 1) / ledger.attempts):
        return None
    cost = ledger.money["startup"]
    saved = cost * (ledger.attempts - 1) / ledger.attempts
    return (
        f"start-up and restore {format_money(cost, currency)} ({_share(ledger, 'startup')}, "
        f"{format_duration(ledger.seconds['startup'])} over {ledger.attempts} attempts): keep the dataset cache "
        f"on a disk that survives a restart (HF_DATASETS_CACHE): saves up to {format_money(saved, currency)} "
        f"({ledger.attempts - 1} of {ledger.attempts} starts)"
    )


JOB_RULES: tuple[Callable[[Ledger, Mapping[str, Any], str], Optional[str]], ...] = (
    checkpoint_advice,
    redone_advice,
    data_wait_advice,
    startup_advice,
)


def job_advice(ledger: Ledger, spec: Mapping[str, Any], currency: str = "") -> list[str]:
    return [line for rule in JOB_RULES if (line := rule(ledger, spec, currency))]


def idle_advice(
    idle_cost: float,
    total: float,
    shutdown_after_minutes: Optional[float],
    machine_hour: float,
    idle_stretches: int,
    currency: str = "",
) -> Optional[str]:
    """Idle is the machine's, not a job's. With idle shutdown at m minutes, each idle stretch would
    have cost at most m minutes of machine time."""
    if total <= 0 or idle_cost < LARGE_SHARE * total:
        return None
    minutes = shutdown_after_minutes / 2 if shutdown_after_minutes else 10.0
    kept = min(idle_cost, max(1, idle_stretches) * minutes / 60.0 * machine_hour)
    saved = idle_cost - kept
    if saved < MIN_SAVING:
        return None
    setting = f"[idle] shutdown_after_minutes = {minutes:g}" + (
        f" (now {shutdown_after_minutes:g})" if shutdown_after_minutes else ""
    )
    return (
        f"idle {format_money(idle_cost, currency)} ({idle_cost / total:.0%} of the bill): {setting}: saves "
        f"{format_money(saved, currency)} (at most {minutes:g} min billed per idle stretch)"
    )
