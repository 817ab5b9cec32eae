"""`orch watch`'s rows in the controller's own home: each watched job's recovery state, and its
events (machine_lost, relaunched, relaunch_failed) with their outbox rows, each queued once."""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from ..model.records import Outgoing
from .events import write_event
from .sweeps import SweepRows

_COLUMNS = ("name", "url", "state", "waiting_since", "launches", "losses", "market", "note")


class RecoveryRows(SweepRows):
    """Mixed into Store: uses its `db` and `_tx`."""

    def recovery_event(self, key: str, kind: str, detail: str, now: float, outgoing: Iterable[Outgoing]) -> bool:
        """Queue an event and its notifications unless `key` was queued before (a restarted
        controller seeing the same loss again). True when queued now."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM recovery_sent WHERE key=?", (key,)).fetchone() is not None:
                return False
            event_id = write_event(db, None, kind, detail, now, outgoing)
            db.execute("INSERT INTO recovery_sent(key, event_id, at) VALUES(?,?,?)", (key, event_id, now))
            return True

    def recovery_mark(self, key: str, now: float) -> bool:
        """Remember `key` (a record only this controller writes: a move it asked, a job `orch
        launch` put in the bucket, a machine it stopped). True when new."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM recovery_sent WHERE key=?", (key,)).fetchone() is not None:
                return False
            db.execute("INSERT INTO recovery_sent(key, event_id, at) VALUES(?,?,?)", (key, 0, now))
            return True

    def recovery_marked(self, key: str) -> bool:
        """`key` was queued or marked here before."""
        return self.db.execute("SELECT 1 FROM recovery_sent WHERE key=?", (key,)).fetchone() is not None

    def recovery_newest(self, key: str, value: float) -> Optional[float]:
        """Remember the largest `value` seen under `key` (the newest `written_at` of a job's manifest
        this controller has trusted) and return the largest seen before this call, or None."""
        with self._tx() as db:
            row = db.execute("SELECT at FROM recovery_sent WHERE key=?", (key,)).fetchone()
            if row is None:
                db.execute("INSERT INTO recovery_sent(key, event_id, at) VALUES(?,?,?)", (key, 0, value))
                return None
            if value > row["at"]:
                db.execute("UPDATE recovery_sent SET at=? WHERE key=?", (value, key))
            return float(row["at"])

    def recovery_set(self, uid: str, now: float, **fields: Any) -> None:
        unknown = set(fields) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown recovery columns {sorted(unknown)}")
        with self._tx() as db:
            if db.execute("SELECT 1 FROM recovery WHERE uid=?", (uid,)).fetchone() is None:
                db.execute(
                    "INSERT INTO recovery(uid, name, url, state, updated_at) VALUES(?,?,?,?,?)",
                    (uid, fields.get("name", ""), fields.get("url", ""), fields.get("state", ""), now),
                )
            sets = ", ".join(f"{k}=?" for k in fields)
            if sets:
                db.execute(f"UPDATE recovery SET {sets}, updated_at=? WHERE uid=?", (*fields.values(), now, uid))

    def recovery_rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM recovery ORDER BY uid").fetchall()]

    def recovery_row(self, uid: str) -> Optional[dict[str, Any]]:
        row = self.db.execute("SELECT * FROM recovery WHERE uid=?", (uid,)).fetchone()
        return dict(row) if row is not None else None

    def recovery_events(self) -> list[dict[str, Any]]:
        """The controller's events, oldest first (job_id is NULL: the jobs are not in this store)."""
        rows = self.db.execute(
            "SELECT e.* FROM events e JOIN recovery_sent s ON s.event_id = e.id ORDER BY e.id"
        ).fetchall()
        return [dict(r) for r in rows]

    # -- the machine ledger (recovery/ledger.py) ----------------------------------------------------

    def machine_put(self, url: str, instance_id: str, record: dict[str, Any], now: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO recovery_machines(url, instance_id, record, updated_at) VALUES(?,?,?,?) "
                "ON CONFLICT(url, instance_id) DO UPDATE SET record=excluded.record, updated_at=excluded.updated_at",
                (url, instance_id, json.dumps(record, sort_keys=True), now),
            )

    def machine_records(self, url: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT record FROM recovery_machines WHERE url=? ORDER BY instance_id", (url,)
        ).fetchall()
        return [json.loads(r[0]) for r in rows]
