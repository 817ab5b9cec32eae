"""`orch status` with sweeps: each row says its sweep (JSON "sweep": id or null), and the table
lists a sweep's trials together under one line naming the sweep and its progress."""

from __future__ import annotations

from typing import Any, Callable

from ..store import Store


def mark_trials(store: Store, rows: list[dict[str, Any]]) -> None:
    by_job = store.trials_by_job()
    for row in rows:
        trial = by_job.get(row["id"])
        row["sweep"] = trial.sweep_id if trial else None


def grouped_table(store: Store, rows: list[dict[str, Any]], table: Callable[[list[dict[str, Any]]], str]) -> str:
    sweep_ids = sorted({r["sweep"] for r in rows if r.get("sweep") is not None})
    if not sweep_ids:
        return table(rows)
    alone = [r for r in rows if r.get("sweep") is None]
    groups = [(sid, [{**r, "name": "  " + r["name"]} for r in rows if r.get("sweep") == sid]) for sid in sweep_ids]
    lines = table(alone + [r for _, group in groups for r in group]).split("\n")
    out, at = lines[: 1 + len(alone)], 1 + len(alone)
    for sid, group in groups:
        sweep = store.sweep(sid)
        planned = sweep.spec["sweep"]["trials"]
        made = len(store.trials(sid))
        out.append(
            f"sweep {sid} ({sweep.name}): {sweep.state.value}, {made} of {planned} trials created"
            f"  (`orch sweep show {sid}`)"
        )
        out += lines[at : at + len(group)]
        at += len(group)
    return "\n".join(out)
