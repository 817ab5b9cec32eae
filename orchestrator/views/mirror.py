"""The mirror as `orch status` and `orch show` see it: read from the local store only (never the
network), so both stay fast whether the store is up or not."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..objectstore.stall import STALL_S


def mirror_view(store: Any, config: Any, job: Any) -> Optional[dict[str, Any]]:
    """`orch show --json`'s "mirror": where, the newest mirrored checkpoint's step, uploads still
    queued, when the last one finished, and the store's error if it is down."""
    if not config.storage.url:
        return None
    row = store.mirror_state(job.id) or {}
    pending = store.uploads_pending(job.id)
    behind = store.mirror_behind_since().get(job.id)
    return {
        "url": config.storage.url,
        "step": row.get("step"),
        "pending": len(pending),
        "uploaded_at": row.get("uploaded_at"),
        "manifest_at": row.get("manifest_at"),
        "error": row.get("error") or None,
        "lease_lost_to": row.get("lost") or None,
        "lag_s": round(time.time() - behind, 1) if behind is not None else None,
    }


def lag_notes(store: Any, now: Optional[float] = None) -> dict[int, str]:
    """job id -> a short note for `orch status` when its mirror lags: the store down, or a
    checkpoint waiting for its upload longer than STALL_S (a store that hangs instead of refusing
    raises no error until its requests time out). The lag is the age of the first checkpoint the
    mirror still lacks."""
    now = time.time() if now is None else now
    notes: dict[int, str] = {}
    pending: dict[int, int] = {}
    for row in store.uploads_pending():
        pending[row["job_id"]] = pending.get(row["job_id"], 0) + 1
    behind = store.mirror_behind_since()
    for job_id, row in store.mirror_states().items():
        if row["lost"]:
            notes[job_id] = f"mirror: adopted by {row['lost']}"
        elif row["error"]:
            since = min(behind.get(job_id, now), row["error_since"] or now)
            notes[job_id] = (
                f"mirror lagging {now - since:.0f}s ({pending.get(job_id, 0)} upload(s) waiting; store unreachable)"
            )
    for job_id, since in behind.items():
        if now - since >= STALL_S:
            notes.setdefault(
                job_id, f"mirror lagging {now - since:.0f}s ({pending.get(job_id, 0)} upload(s) waiting, no answer yet)"
            )
    for job_id, n in pending.items():
        notes.setdefault(job_id, f"mirror: {n} upload(s) waiting")
    return notes


def add_lag_notes(store: Any, rows: list[dict[str, Any]], now: Optional[float] = None) -> None:
    """Append the mirror's lag to each lagging job's NOTE in `orch status` (and `"mirror_lag"` in --json)."""
    notes = lag_notes(store, now)
    for row in rows:
        note = notes.get(row["id"])
        row["mirror_lag"] = note
        if note:
            row["reason"] = f"{row['reason']}; {note}" if row.get("reason") else note
