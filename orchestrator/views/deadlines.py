"""Deadlines as `orch status` and `orch show` see them: the projected finish beside the deadline,
from the same forecast the daemon's deadline watch uses. Nothing is read when no active job has
a deadline, so a plain `orch status` stays as fast as before."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..model.clock import format_clock
from ..planning.forecast import queue_forecast
from ..home.paths import Home
from ..store import Store


def _capacity(config: Any) -> tuple[int, int]:
    from ..planning.capacity import gpu_slots

    if config is None:
        return 0, 1
    return len(gpu_slots(config)), config.daemon.cpu_slots


def add_deadline_notes(
    store: Store, home: Home, config: Callable[[], Any], rows: list[dict[str, Any]], now: float
) -> None:
    """Each active deadline row gets `projected_finish`, `deadline_at_risk`, and a note. `config`
    is called (config.toml read) only when there is a deadline to project."""
    wanted = [r for r in rows if r.get("deadline") and r["state"] in ("queued", "running")]
    if not wanted:
        return
    from ..spec.jobspec import deadline_ts  # pydantic: only when a deadline is there to show

    gpus, cpu_slots = _capacity(config())
    forecasts = queue_forecast(store, home, gpus, cpu_slots, now)
    for row in wanted:
        deadline = deadline_ts(row["deadline"])
        if deadline is None:
            continue
        f = forecasts.get(row["id"])
        finish = f.finish if f is not None else None
        row["projected_finish"] = finish
        row["projected_finish_is_lower_bound"] = bool(f and f.lower_bound)
        row["deadline_at_risk"] = finish is not None and finish > deadline
        note = f"deadline {_clock(deadline)}, projected {_clock(finish)}" + (
            " (late)" if row["deadline_at_risk"] else ""
        )
        row["reason"] = f"{row['reason']}; {note}" if row.get("reason") else note


def deadline_line(d: dict[str, Any]) -> Optional[str]:
    if not d.get("deadline"):
        return None
    finish = d.get("projected_finish")
    late = "  LATE: see the deadline_at_risk event" if d.get("deadline_at_risk") else ""
    bound = " or later" if d.get("projected_finish_is_lower_bound") else ""
    from ..spec.jobspec import deadline_ts

    when = deadline_ts(d["deadline"])
    shown = _clock(when) if when is not None else d["deadline"]
    return f"  deadline:  {shown}   projected finish: {_clock(finish)}{bound}{late}"


def _clock(ts: Optional[float]) -> str:
    return format_clock(ts)
