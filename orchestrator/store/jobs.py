"""Jobs and their transitions (compare-and-set in BEGIN IMMEDIATE, checked against
states.TRANSITIONS), with the attempt and event rows each transition writes."""

from __future__ import annotations

import json
import sqlite3
import uuid
from typing import Any, Callable, Iterable, Optional, Sequence

from ..spec.bounds import INT64_MAX, INT64_MIN
from ..model.errors import InvalidTransition, JobNotFound
from ..model.records import JOB_COLUMNS, LOCAL, Attempt, AttemptEnd, AttemptStart, Event, Job, Outgoing
from ..model.states import EventKind, JobState, ensure_allowed
from .connection import StoreConnection, inserted_id
from .events import attempts_of, events_of, finish_attempt, start_attempt, write_event
from .job_columns import column_values, implied_columns

__all__ = ["JobRows", "implied_columns", "inserted_id"]


class JobRows(StoreConnection):
    """Jobs, their transitions, attempts and events, on the Store's connection."""

    # -- jobs ----------------------------------------------------------------------------

    def submit(
        self,
        *,
        name: str,
        kind: str,
        gpus: int,
        priority: int,
        retries: int,
        spec: dict[str, Any],
        spec_path: str,
        now: float,
        after_ids: Sequence[int] = (),
        not_before: Optional[float] = None,
        git_commit: Optional[str] = None,
        git_dirty: Optional[bool] = None,
        max_cost: Optional[float] = None,
        max_hours: Optional[float] = None,
        detail: str = "",
        outgoing: Iterable[Outgoing] = (),
        uid: Optional[str] = None,
        executor: str = LOCAL,
        link: Optional[Callable[[sqlite3.Connection, int], None]] = None,
    ) -> Job:
        """Insert a queued job and its `submitted` event; `link` writes rows that must commit with
        the job (a sweep's trial row) in the same transaction."""
        with self._tx() as db:
            for dep in after_ids:
                if db.execute("SELECT 1 FROM jobs WHERE id=?", (dep,)).fetchone() is None:
                    raise JobNotFound(dep)
            cur = db.execute(
                """INSERT INTO jobs(name, state, priority, gpus, kind, spec_json, spec_path, after_ids,
                   not_before, retries, git_commit, git_dirty, submitted_at, updated_at, max_cost, max_hours, uid,
                   executor)
                   VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (
                    name,
                    JobState.QUEUED.value,
                    priority,
                    gpus,
                    kind,
                    json.dumps(spec),
                    spec_path,
                    json.dumps(list(after_ids)),
                    not_before,
                    retries,
                    git_commit,
                    None if git_dirty is None else int(git_dirty),
                    now,
                    now,
                    max_cost,
                    max_hours,
                    uid or uuid.uuid4().hex,
                    executor,
                ),
            )
            job_id = inserted_id(cur)
            if link is not None:
                link(db, job_id)
            # Messages are built before the id exists; stamp it in.
            outgoing = [Outgoing(o.channel, {**o.payload, "job_id": job_id}) for o in outgoing]
            write_event(db, job_id, EventKind.SUBMITTED, detail, now, outgoing)
            return self._get(db, job_id)

    def by_uid(self, uid: str) -> Optional[Job]:
        row = self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE uid=?", (uid,)).fetchone()
        return Job.from_row(row) if row is not None else None

    def get(self, job_id: int) -> Job:
        return self._get(self.db, job_id)

    def _get(self, db: sqlite3.Connection, job_id: int) -> Job:
        if not INT64_MIN <= job_id <= INT64_MAX:  # an id SQLite cannot hold names no job
            raise JobNotFound(job_id)
        row = db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return Job.from_row(row)

    def jobs(self, states: Optional[Iterable[JobState]] = None) -> list[Job]:
        """Jobs in submit order; `states` narrows them (uses the state index)."""
        if states is None:
            rows = self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY id").fetchall()
        else:
            wanted = [JobState(s).value for s in states]
            marks = ",".join("?" * len(wanted))
            rows = self.db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ({marks}) ORDER BY id", wanted
            ).fetchall()
        return [Job.from_row(r) for r in rows]

    def queue_order(self) -> list[Job]:
        """Queued jobs in dispatch order: priority high first, then submit order. A requeued job
        keeps its id, so it goes ahead of work submitted after it."""
        rows = self.db.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state=? ORDER BY priority DESC, id", (JobState.QUEUED.value,)
        ).fetchall()
        return [Job.from_row(r) for r in rows]

    def states_of(self, job_ids: Iterable[int]) -> dict[int, JobState]:
        ids = list(job_ids)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(f"SELECT id, state FROM jobs WHERE id IN ({marks})", ids).fetchall()
        return {r["id"]: JobState(r["state"]) for r in rows}

    def count_by_state(self) -> dict[JobState, int]:
        rows = self.db.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state").fetchall()
        return {JobState(r["state"]): r["n"] for r in rows}

    def transition(
        self,
        job_id: int,
        dst: JobState,
        kind: EventKind | str,
        now: float,
        *,
        detail: str = "",
        expect: Optional[Iterable[JobState]] = None,
        updates: Optional[dict[str, Any]] = None,
        begin_attempt: Optional[AttemptStart] = None,
        end_attempt: Optional[AttemptEnd] = None,
        outgoing: Iterable[Outgoing] = (),
        also: Iterable[tuple[EventKind | str, str, Iterable[Outgoing]]] = (),
    ) -> Job:
        """Move a job to `dst` if the table allows it (and, with `expect`, only from those states),
        set `updates`, start/end an attempt row, and append the event and its outbox rows, then any
        events `also` names (kind, detail, outbox rows: a `diverged` beside a `failed`) — all in one
        transaction. Raises InvalidTransition when the job is not where the caller thought."""
        dst = JobState(dst)
        with self._tx() as db:
            job = self._get(db, job_id)
            if expect is not None and job.state not in set(expect):
                raise InvalidTransition(job_id, job.state.value, dst.value)
            ensure_allowed(job_id, job.state, dst)
            if begin_attempt is not None and begin_attempt.gpu_ids:
                _ensure_gpus_free(db, job_id, job.state, dst, begin_attempt.gpu_ids)
            implied = implied_columns(job.state, dst, now, job.attempt, begin_attempt)
            if dst is JobState.RUNNING and job.started_at is None:
                implied["started_at"] = now
            fields = {"state": dst.value, "updated_at": now, **column_values({**implied, **(updates or {})})}
            sets = ", ".join(f"{k}=?" for k in fields)
            cur = db.execute(
                f"UPDATE jobs SET {sets} WHERE id=? AND state=?", (*fields.values(), job_id, job.state.value)
            )
            if cur.rowcount != 1:  # cannot happen inside BEGIN IMMEDIATE; kept as the CAS guard
                raise InvalidTransition(job_id, job.state.value, dst.value, "changed concurrently")
            if end_attempt is not None:
                finish_attempt(db, job_id, job.attempt, end_attempt)
            if begin_attempt is not None:
                start_attempt(db, job_id, begin_attempt, now)
            write_event(db, job_id, kind, detail, now, outgoing)
            for also_kind, also_detail, also_outgoing in also:
                write_event(db, job_id, also_kind, also_detail, now, also_outgoing)
            return self._get(db, job_id)

    def update(
        self, job_id: int, now: float, *, only_if_state: Optional[Iterable[JobState]] = None, **updates: Any
    ) -> bool:
        """Set non-state fields (intent, pids, accounting). Returns False when the job is no
        longer in `only_if_state` (a compare-and-set, so a late write never clobbers a newer state)."""
        fields = {"updated_at": now, **column_values(updates)}
        sets = ", ".join(f"{k}=?" for k in fields)
        sql, params = f"UPDATE jobs SET {sets} WHERE id=?", [*fields.values(), job_id]
        if only_if_state is not None:
            wanted = [JobState(s).value for s in only_if_state]
            sql += f" AND state IN ({','.join('?' * len(wanted))})"
            params += wanted
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE id=?", (job_id,)).fetchone() is None:
                raise JobNotFound(job_id)
            return db.execute(sql, params).rowcount == 1

    def set_intent_once(
        self, job_id: int, intent: str, now: float, *, detail: str = "", kind: Optional[EventKind] = None
    ) -> bool:
        """Record why the daemon is about to signal a running job, unless an intent is already set."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET intent=?, updated_at=? WHERE id=? AND state=? AND intent=''",
                (intent, now, job_id, JobState.RUNNING.value),
            )
            if cur.rowcount == 1 and kind is not None:
                write_event(db, job_id, kind, detail, now, ())
            return cur.rowcount == 1

    # -- attempts and events ---------------------------------------------------------------

    def attempts(self, job_id: int) -> list[Attempt]:
        return attempts_of(self.db, job_id)

    def latest_attempts(self, job_ids: Iterable[int]) -> dict[int, Attempt]:
        """job id -> its newest attempt, for many jobs in one query (`orch status`: no query per job)."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        rows = self.db.execute(
            "SELECT a.* FROM attempts a JOIN (SELECT job_id, MAX(n) AS n FROM attempts WHERE job_id IN "
            "(SELECT value FROM json_each(?)) GROUP BY job_id) m ON a.job_id = m.job_id AND a.n = m.n",
            (json.dumps(ids),),
        ).fetchall()
        return {r["job_id"]: Attempt.from_row(r) for r in rows}

    def record_event(
        self,
        job_id: Optional[int],
        kind: EventKind | str,
        now: float,
        *,
        detail: str = "",
        outgoing: Iterable[Outgoing] = (),
    ) -> int:
        with self._tx() as db:
            return write_event(db, job_id, kind, detail, now, outgoing)

    def events(self, job_id: Optional[int] = None, *, kinds: Optional[Iterable[str]] = None) -> list[Event]:
        return events_of(self.db, job_id, kinds)


def _ensure_gpus_free(
    db: sqlite3.Connection, job_id: int, state: JobState, dst: JobState, gpu_ids: Sequence[int]
) -> None:
    """The GPUs an attempt starts on are reserved in the transaction that records it running, so
    the daemon and `orch run` (two processes choosing GPUs) never hand out the same one."""
    rows = db.execute("SELECT id, gpu_ids FROM jobs WHERE state=? AND id<>?", (JobState.RUNNING.value, job_id))
    for row in rows.fetchall():
        clash = sorted(set(json.loads(row["gpu_ids"] or "[]")) & set(gpu_ids))
        if clash:
            raise InvalidTransition(
                job_id, state.value, dst.value, f"GPU {','.join(map(str, clash))} is held by job {row['id']}"
            )
