"""The mirror's rows: each job's mirror state, the persistent upload queue, and importing an
adopted job (orchestrator/adopt/)."""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from ..model.errors import OrchError
from ..model.records import Job, Outgoing
from ..model.states import JobState
from .connection import inserted_id
from .events import write_event
from .outbox import OutboxRows


class MirrorRows(OutboxRows):
    """Mixed into Store: uses its `db`, `_tx` and `_get`."""

    # -- the mirror ([storage]) --------------------------------------------------------------

    def mirror_state(self, job_id: int) -> Optional[dict[str, Any]]:
        row = self.db.execute("SELECT * FROM mirror WHERE job_id=?", (job_id,)).fetchone()
        return _mirror_row(row) if row is not None else None

    def mirror_states(self) -> dict[int, dict[str, Any]]:
        return {r["job_id"]: _mirror_row(r) for r in self.db.execute("SELECT * FROM mirror").fetchall()}

    def mirror_set(self, job_id: int, uid: str, **fields: Any) -> None:
        """Insert or update a job's mirror row (JSON for the list columns)."""
        with self._tx() as db:
            _mirror_upsert(db, job_id, uid, fields)

    def upload_done(self, upload_id: int, job_id: int, uid: str, now: float, **fields: Any) -> None:
        """An upload finished and the job's checkpoint history names it: one transaction, so a
        daemon killed in between never leaves an upload done that the history does not hold."""
        with self._tx() as db:
            db.execute("UPDATE uploads SET done_at=?, tries=tries+1 WHERE id=?", (now, upload_id))
            _mirror_upsert(db, job_id, uid, fields)

    def upload_enqueue(self, job_id: int, uid: str, path: str, name: str, step: int, notice: bool, now: float) -> int:
        """Queue a checkpoint upload. Newest wins: pending uploads of the same job at an older
        (step, notice) are dropped, since only the newest checkpoint matters once behind."""
        with self._tx() as db:
            db.execute(
                """UPDATE uploads SET dropped_at=?, last_error='superseded by '||? WHERE job_id=? AND done_at IS NULL
                   AND dropped_at IS NULL AND (step < ? OR (step = ? AND notice <= ?))""",
                (now, name, job_id, step, step, int(notice)),
            )
            return inserted_id(
                db.execute(
                    """INSERT INTO uploads(job_id, uid, path, name, step, notice, created_at, next_try_at)
                   VALUES(?,?,?,?,?,?,?,?)""",
                    (job_id, uid, path, name, step, int(notice), now, now),
                )
            )

    def uploads_pending(self, job_id: Optional[int] = None) -> list[dict[str, Any]]:
        """Pending uploads, notice checkpoints first, then the newest step first."""
        sql = "SELECT * FROM uploads WHERE done_at IS NULL AND dropped_at IS NULL"
        params: list[Any] = []
        if job_id is not None:
            sql += " AND job_id=?"
            params.append(job_id)
        return [dict(r) for r in self.db.execute(sql + " ORDER BY notice DESC, step DESC, id", params).fetchall()]

    def mirror_behind_since(self) -> dict[int, float]:
        """job id -> when its first checkpoint not yet uploaded was queued, for each job with an
        upload waiting: how old the newest state missing from the mirror is. A checkpoint superseded
        by a newer one while waiting still counts (newest wins, but the mirror was behind since)."""
        rows = self.db.execute(
            """SELECT u.job_id, MIN(u.created_at) FROM uploads u
               WHERE u.done_at IS NULL AND (u.dropped_at IS NULL OR u.last_error LIKE 'superseded by %')
                 AND u.created_at > COALESCE((SELECT MAX(d.done_at) FROM uploads d WHERE d.job_id = u.job_id), 0)
                 AND EXISTS (SELECT 1 FROM uploads p WHERE p.job_id = u.job_id
                             AND p.done_at IS NULL AND p.dropped_at IS NULL)
               GROUP BY u.job_id"""
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def preemption_history(self) -> tuple[list[str], list[float], float]:
        """(every `notice` event's detail, when each lost attempt was settled, seconds the daemon
        has run): the facts planning/mtbf.py counts into this machine's MTBF."""
        notices = [r[0] for r in self.db.execute("SELECT detail FROM events WHERE kind='notice' ORDER BY id")]
        lost = [
            r[0] for r in self.db.execute("SELECT ended_at FROM attempts WHERE outcome='lost' AND ended_at IS NOT NULL")
        ]
        return notices, lost, self.ledger().get("uptime_s", 0.0)

    def upload_names(self, job_id: int) -> set[str]:
        """Checkpoint names ever queued for a job (done, pending or dropped)."""
        return {r[0] for r in self.db.execute("SELECT name FROM uploads WHERE job_id=?", (job_id,)).fetchall()}

    def upload_finish(self, upload_id: int, now: float, *, dropped: str = "") -> None:
        with self._tx() as db:
            if dropped:
                db.execute(
                    "UPDATE uploads SET dropped_at=?, last_error=? WHERE id=? AND done_at IS NULL",
                    (now, dropped, upload_id),
                )
            else:
                db.execute("UPDATE uploads SET done_at=?, tries=tries+1 WHERE id=?", (now, upload_id))

    def upload_retry(self, upload_id: int, next_try_at: float, error: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE uploads SET tries=tries+1, next_try_at=?, last_error=? WHERE id=?",
                (next_try_at, error, upload_id),
            )

    def import_job(
        self,
        m: dict[str, Any],
        *,
        state: JobState,
        reason: str,
        spec_path: str,
        now: float,
        attempts: list[dict[str, Any]],
        detail: str,
        outgoing: Sequence[Outgoing] = (),
    ) -> Job:
        """A job adopted from another machine's manifest (`orch adopt`): same uid, its history and
        money, a new local id, queued (or stopped) here."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE uid=?", (m["uid"],)).fetchone() is not None:
                raise OrchError(f"job {m['uid']} is already in this store")
            c, b = m.get("cost") or {}, m.get("budget") or {}
            git = m.get("git") or {}
            cur = db.execute(
                """INSERT INTO jobs(name, state, priority, gpus, kind, spec_json, spec_path, retries, failures, attempt,
                   reason, git_commit, git_dirty, submitted_at, started_at, updated_at, cost, run_seconds, gpu_seconds,
                   waste_seconds, waste_cost, steps_lost, max_cost, max_hours, uid)
                   VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (
                    m["name"],
                    state.value,
                    int(m.get("priority") or 0),
                    int(m.get("gpus") or 0),
                    m.get("kind") or "builtin",
                    json.dumps(m.get("spec") or {}),
                    spec_path,
                    int(m.get("retries") or 0),
                    int(m.get("failures") or 0),
                    int(m.get("attempt") or 0),
                    reason,
                    git.get("commit"),
                    None if git.get("dirty") is None else int(bool(git.get("dirty"))),
                    float(m.get("submitted_at") or now),
                    m.get("started_at"),
                    now,
                    float(c.get("cost") or 0),
                    float(c.get("run_seconds") or 0),
                    float(c.get("gpu_seconds") or 0),
                    float(c.get("waste_seconds") or 0),
                    float(c.get("waste_cost") or 0),
                    int(c.get("steps_lost") or 0),
                    b.get("max_cost"),
                    b.get("max_hours"),
                    m["uid"],
                ),
            )
            job_id = inserted_id(cur)
            for a in attempts:
                db.execute(
                    """INSERT INTO attempts(job_id, n, started_at, ended_at, gpu_ids, exit_code, exit_signal, outcome,
                       resumed_from_step, step_reached) VALUES(?,?,?,?,?,?,?,?,?,?)""",
                    (
                        job_id,
                        a["n"],
                        a["started_at"],
                        a.get("ended_at"),
                        json.dumps(a.get("gpu_ids") or []),
                        a.get("exit_code"),
                        a.get("exit_signal"),
                        a.get("outcome") or "",
                        a.get("resumed_from_step"),
                        a.get("step_reached"),
                    ),
                )
            write_event(db, job_id, "adopted", detail, now, outgoing)
            return self._get(db, job_id)


_MIRROR_COLUMNS = frozenset(
    """etag manifest_at checkpoints doomed step uploaded_at error error_since warned lost dirty
    files_at final released machines""".split()
)


def _mirror_upsert(db: Any, job_id: int, uid: str, fields: dict[str, Any]) -> None:
    unknown = set(fields) - _MIRROR_COLUMNS
    if unknown:
        raise ValueError(f"not a mirror column: {sorted(unknown)}")
    values = {k: (json.dumps(v) if k in ("checkpoints", "doomed", "machines") else v) for k, v in fields.items()}
    cols = ["job_id", "uid", *values]
    sets = ", ".join(f"{k}=excluded.{k}" for k in values) or "uid=excluded.uid"
    db.execute(
        f"INSERT INTO mirror({', '.join(cols)}) VALUES({','.join('?' * len(cols))}) "
        f"ON CONFLICT(job_id) DO UPDATE SET {sets}",
        (job_id, uid, *values.values()),
    )


def _mirror_row(row: Any) -> dict[str, Any]:
    d = dict(row)
    d["checkpoints"] = json.loads(d["checkpoints"] or "[]")
    d["doomed"] = json.loads(d["doomed"] or "[]")
    d["machines"] = json.loads(d.get("machines") or "[]")
    return d
