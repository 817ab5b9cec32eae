"""What the dashboard shows, as JSON-ready dicts built by the same views as `orch status`,
`orch show` and `orch cost` (views/queue_view.py, views/job_view.py, cost_report.cost_data), read
through a store that cannot write: the SQLite file is opened read-only (mode=ro), so the page can
never change a job nor take the write lock the daemon needs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional

from ..spec.config import Config
from ..contract import HEALTH, METRICS_CSV, attempt_log, read_json
from ..reports.metrics import read_metrics
from ..home.daemon_lock import running_pid
from ..home.paths import Home
from ..redaction import redact
from ..store import Store
from ..views.cost_report import cost_data
from ..views.job_view import job_view
from ..views.queue_view import queue_view
from ..views.recovery import waiting_rows

LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 32768


def daemon_pid(home: Home) -> Optional[int]:
    """The daemon's pid, as `orch status` sees it (home/daemon_lock.running_pid)."""
    return running_pid(home)


def queue(store: Store, home: Home, config: Config, now: float) -> dict[str, Any]:
    rows = queue_view(store, home, now, include_all=True, config=lambda: config)
    active = [r for r in rows if r["state"] in ("queued", "running")]
    done = sorted((r for r in rows if r["state"] not in ("queued", "running")), key=lambda r: -r["id"])
    return {
        "now": now,
        "currency": config.pricing.currency,
        "daemon_pid": daemon_pid(home),
        "jobs": active + done,
        "recovery": waiting_rows(store),  # `orch watch` runs from this home: the jobs it waits on a machine for
    }


def log_tail(run_dir: Path, attempt: int) -> str:
    try:
        with open(run_dir / attempt_log(attempt), "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    # Progress bars redraw with \r: keep each line's last state.
    lines = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
    return redact("\n".join(lines[-LOG_TAIL_LINES:]))


def markers(attempts: list[dict[str, Any]], health: dict[str, Any]) -> list[dict[str, Any]]:
    """What happened where on the step axis: each attempt's end (preempted, oom, failed...) at the
    step it reached, each resume at the step it resumed from, divergence and a flat loss."""
    out: list[dict[str, Any]] = []
    for a in attempts:
        if a["n"] > 1:
            step = a.get("resumed_from_step")
            out.append(
                {
                    "kind": "resume" if step is not None else "restart",
                    "step": step or 0,
                    "attempt": a["n"],
                    "label": f"attempt {a['n']} "
                    + (f"resumed from step {step}" if step is not None else "started from scratch"),
                }
            )
        outcome = str(a.get("outcome") or "")
        if a.get("ended_at") is not None and outcome not in ("", "succeeded") and a.get("step_reached") is not None:
            out.append(
                {
                    "kind": outcome,
                    "step": a["step_reached"],
                    "attempt": a["n"],
                    "label": f"attempt {a['n']} {outcome} at step {a['step_reached']}",
                }
            )
    div = health.get("diverged")
    if isinstance(div, dict) and isinstance(div.get("step"), int):
        out.append(
            {
                "kind": "diverged",
                "step": div["step"],
                "attempt": div.get("attempt"),
                "label": f"diverged at step {div['step']}: {div.get('what', '')}",
            }
        )
    flat = health.get("loss_flat")
    if isinstance(flat, dict) and isinstance(flat.get("step"), int):
        out.append(
            {
                "kind": "loss_flat",
                "step": flat["step"],
                "attempt": flat.get("attempt"),
                "label": f"loss flat at step {flat['step']}",
            }
        )
    return out


def job(store: Store, home: Home, config: Config, job_id: int, now: float) -> dict[str, Any]:
    data = job_view(store, home, job_id, now, config=lambda: config)
    run_dir = home.run_dir(job_id)
    data["metrics"] = read_metrics(run_dir / METRICS_CSV)
    health = read_json(run_dir / HEALTH) or {}
    data["health"] = health
    data["markers"] = markers(data["attempts"], health)
    data["log_tail"] = log_tail(run_dir, data["attempt"]) if data.get("attempt") else ""
    for e in data["events"]:
        e["detail"] = _redact(e["detail"])
    data["tracking"] = _redact_strings(data.get("tracking"))  # a tracker URL may carry a password
    data["mirror"] = _redact_strings(data.get("mirror"))
    return data


def _redact(text: str) -> str:
    return redact(text or "")


def _redact_strings(value: Any) -> Any:
    if isinstance(value, str):
        return _redact(value)
    if isinstance(value, dict):
        return {k: _redact_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_strings(v) for v in value]
    return value


def timeline(
    store: Store, jobs: list[dict[str, Any]], idle_cost: float, now: float, *, daemon_up: bool = False
) -> dict[str, Any]:
    """Cumulative cost over time: each job's cost spread evenly over its attempts' running time;
    the idle cost (a ledger total with no timestamps) spread over the time between the first
    attempt and now (or the last attempt's end when no daemon runs) that no attempt covered. The
    totals are exact; the timing inside an attempt or a gap is an estimate."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for j in jobs:
        for a in store.attempts(j["id"]):
            spans.setdefault(j["id"], []).append((a.started_at, a.ended_at if a.ended_at is not None else now))
    all_spans = sorted(s for v in spans.values() for s in v)
    if not all_spans:
        return {"series": [], "start": None, "end": None}
    start, end = all_spans[0][0], max(e for _, e in all_spans)
    if daemon_up:
        end = max(end, now)
    gaps, cursor = [], start
    for s, e in all_spans + [(end, end)]:
        if s > cursor:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    points = sorted({start, end, *(t for s in all_spans for t in s), *(t for g in gaps for t in g)})

    def cumulative(intervals: list[tuple[float, float]], total: float) -> list[list[float]]:
        length = sum(e - s for s, e in intervals)
        out = []
        for t in points:
            done = sum(max(0.0, min(e, t) - s) for s, e in intervals)
            out.append([t, round(total * done / length, 6) if length > 0 else (total if t >= end else 0.0)])
        return out

    series = [
        {"name": f"{j['id']} {j['name']}", "job_id": j["id"], "points": cumulative(spans[j["id"]], j["cost"])}
        for j in jobs
        if j["id"] in spans
    ]
    series.append({"name": "idle", "job_id": None, "points": cumulative(gaps, idle_cost)})
    return {"series": series, "start": start, "end": end}


def bill(store: Store, home: Home, config: Config, now: float) -> dict[str, Any]:
    data = cost_data(store, config)
    total_budget = config.budget.total
    data["budget_total"] = total_budget
    data["budget_left"] = None if total_budget is None else round(total_budget - data["total"], 6)
    by_id = {j.id: j for j in store.jobs()}
    for j in data["jobs"]:
        job_ = by_id.get(j["id"])
        j["max_cost"] = job_.max_cost if job_ else None
        j["budget_left"] = round(job_.max_cost - job_.cost, 6) if job_ and job_.max_cost is not None else None
    data["timeline"] = timeline(store, data["jobs"], data["idle_cost"], now, daemon_up=daemon_pid(home) is not None)
    data["now"] = now
    from ..views.bill import breakdown_data

    data["ledger"] = breakdown_data(store, home, config, now)  # the goodput ledger: one stacked bar per job
    return data


class Snapshot:
    """One computed answer per kind per `ttl` seconds, shared by every open tab: ten tabs polling
    cost the store what one does."""

    def __init__(self, ttl: float = 1.0):
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cache: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, build):
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and now - hit[0] < self.ttl:
                return hit[1]
        value = build()
        with self._lock:
            self._cache[key] = (now, value)
        return value
