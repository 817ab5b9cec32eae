"""The notification outbox and the cost ledger: rows the daemon's outbox thread and accrual write."""

from __future__ import annotations

from typing import Optional

from ..model.records import OutboxRow
from ..model.states import EventKind, JobState
from .events import write_event
from .jobs import JobRows


class OutboxRows(JobRows):
    """Mixed into Store: uses its `db` and `_tx`."""

    # -- outbox --------------------------------------------------------------------------

    def pending_channels(self) -> list[str]:
        """Channels with undelivered rows (not given up), the one with the oldest row first."""
        rows = self.db.execute(
            """SELECT channel, MIN(id) AS oldest FROM outbox WHERE delivered_at IS NULL AND gave_up_at IS NULL
               GROUP BY channel ORDER BY oldest"""
        ).fetchall()
        return [r["channel"] for r in rows]

    def pending_outbox_for(self, channel: str, limit: int = 100) -> list[OutboxRow]:
        """One channel's undelivered rows in the order they were written, due or not."""
        rows = self.db.execute(
            """SELECT * FROM outbox WHERE channel=? AND delivered_at IS NULL AND gave_up_at IS NULL
               ORDER BY id LIMIT ?""",
            (channel, limit),
        ).fetchall()
        return [OutboxRow.from_row(r) for r in rows]

    def pending_outbox(self) -> int:
        return self.db.execute(
            "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL AND gave_up_at IS NULL"
        ).fetchone()[0]

    def outbox(self) -> list[OutboxRow]:
        return [OutboxRow.from_row(r) for r in self.db.execute("SELECT * FROM outbox ORDER BY id").fetchall()]

    def mark_delivered(self, row_id: int, now: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE outbox SET delivered_at=?, tries=tries+1 WHERE id=?", (now, row_id))

    def mark_retry(self, row_id: int, now: float, next_try_at: float, error: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE outbox SET tries=tries+1, next_try_at=?, last_error=? WHERE id=?", (next_try_at, error, row_id)
            )

    def mark_gave_up(self, row_id: int, now: float, error: str) -> None:
        with self._tx() as db:
            row = db.execute("SELECT job_id, channel FROM outbox WHERE id=?", (row_id,)).fetchone()
            db.execute("UPDATE outbox SET tries=tries+1, gave_up_at=?, last_error=? WHERE id=?", (now, error, row_id))
            if row is not None:
                write_event(db, row["job_id"], EventKind.NOTIFY_FAILED, f"{row['channel']}: {error}", now, ())

    # -- cost ledger ---------------------------------------------------------------------

    def accrue(
        self,
        now: float,
        seconds: float,
        per_job: dict[int, tuple[float, float]] | dict[int, tuple[float, float, float]],
        idle_cost: float,
    ) -> None:
        """Add one accounting interval ending at `now`: per job (cost, gpu_seconds[, run_seconds]; its
        running time is `seconds` unless given), plus the idle cost and the uptime, in one transaction
        (so a crash never counts half an interval); `accrued_until` records how far the bill goes."""
        with self._tx() as db:
            for job_id, parts in per_job.items():
                cost, gpu_seconds = parts[0], parts[1]
                run_seconds = parts[2] if len(parts) > 2 else seconds
                db.execute(
                    "UPDATE jobs SET cost=cost+?, gpu_seconds=gpu_seconds+?, run_seconds=run_seconds+? WHERE id=?",
                    (cost, gpu_seconds, run_seconds, job_id),
                )
            for key, value in (("idle_cost", idle_cost), ("uptime_s", seconds)):
                db.execute(
                    "INSERT INTO ledger(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=value+excluded.value",
                    (key, value),
                )
            db.execute(
                "INSERT INTO ledger(key, value) VALUES('accrued_until', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=MAX(value, excluded.value)",
                (now,),
            )

    def billing_spans(self, since: float) -> list[tuple[int, int, float, Optional[float]]]:
        """(job id, GPUs, started_at, ended_at) of every attempt still open on a running job or
        ended after `since`: what the next accounting interval is split among."""
        rows = self.db.execute(
            """SELECT a.job_id, j.gpus, a.started_at, a.ended_at FROM attempts a JOIN jobs j ON j.id = a.job_id
               WHERE (a.ended_at IS NULL AND j.state = ? AND a.n = j.attempt) OR a.ended_at > ?""",
            (JobState.RUNNING.value, since),
        ).fetchall()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def charge_job(self, job_id: int, seconds: float, cost: float, gpu_seconds: float) -> None:
        """Add one interval of a job that `orch run` runs in the foreground (it accrues its own job:
        no uptime, no idle, which are the daemon's)."""
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET cost=cost+?, gpu_seconds=gpu_seconds+?, run_seconds=run_seconds+? WHERE id=?",
                (cost, gpu_seconds, seconds, job_id),
            )

    def total_cost(self) -> float:
        """Everything spent: every job's cost plus the idle cost."""
        jobs = self.db.execute("SELECT COALESCE(SUM(cost), 0) FROM jobs").fetchone()[0]
        return jobs + self.ledger().get("idle_cost", 0.0)

    def ledger(self) -> dict[str, float]:
        return {r["key"]: r["value"] for r in self.db.execute("SELECT key, value FROM ledger").fetchall()}
