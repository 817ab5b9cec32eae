"""Jobs, their transitions (compare-and-set in BEGIN IMMEDIATE, checked against
states.TRANSITIONS), attempts and events, and the connection and migrations under them."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from ..bounds import INT64_MAX, INT64_MIN
from ..errors import InvalidTransition, JobNotFound, OrchError
from ..records import JOB_COLUMNS, Attempt, AttemptEnd, AttemptStart, Event, Job, Outgoing
from ..states import AttemptOutcome, EventKind, JobState, ensure_allowed
from .schema import MIGRATIONS, SCHEMA_VERSION

# Columns callers may set besides the state; anything else is a programming error.
_UPDATABLE = frozenset(
    """priority after_ids not_before retries failures attempt intent cancel_requested_at reason
    started_at finished_at supervisor_pid supervisor_start gpu_ids signalled_at retry_after
    cost run_seconds gpu_seconds waste_seconds waste_cost steps_lost max_cost max_hours executor executor_ref""".split()
)
_JSON_COLUMNS = frozenset({"after_ids", "gpu_ids", "executor_ref"})


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid an INSERT just made (sqlite3 types it Optional; after an INSERT it is set)."""
    if cur.lastrowid is None:
        raise OrchError("the store inserted a row but reported no id")
    return cur.lastrowid


def implied_columns(
    src: JobState, dst: JobState, now: float, job_attempt: int, begin: Optional[AttemptStart]
) -> dict[str, Any]:
    """The columns a transition resets, written here once instead of at every call site:
    starting an attempt clears the last one's request and reason; leaving `running` forgets the
    attempt's processes and GPUs; the queue holds no intent; a finished job has its end time."""
    cols: dict[str, Any] = {}
    if dst is JobState.RUNNING:
        cols.update(
            attempt=begin.n if begin else job_attempt + 1,
            gpu_ids=list(begin.gpu_ids) if begin else [],
            intent="",
            cancel_requested_at=None,
            signalled_at=None,
            retry_after=None,
            reason="",
            finished_at=None,
            supervisor_pid=None,
            supervisor_start=None,
            executor_ref={},
        )
    if src is JobState.RUNNING and dst is not JobState.RUNNING:
        cols.update(supervisor_pid=None, supervisor_start=None, executor_ref={}, gpu_ids=[], signalled_at=None)
    if dst is JobState.QUEUED:
        cols.update(intent="", cancel_requested_at=None, signalled_at=None, finished_at=None, retry_after=None)
    if dst.is_terminal:
        cols.update(finished_at=now, retry_after=None)
    return cols


class JobRows:
    """The connection, transactions and migrations; jobs, their transitions, attempts and events."""

    def __init__(self, path: Path | str, *, read_only: bool = False):
        """`read_only`: the queries on a read-only connection (the dashboard, `orch doctor`): no
        file is created, nothing migrated, and any write raises."""
        self.path = Path(path)
        self.read_only = read_only
        self._local = threading.local()
        if read_only:
            return
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        self._migrate()

    # -- connection and transactions -------------------------------------------------------

    @property
    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect_read_only() if self.read_only else self._connect()
            self._local.conn = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=60000")
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise OrchError(f"no orch state at {self.path.parent} yet: submit a job first")
        conn = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, timeout=5, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=5000")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            conn.close()
            raise OrchError(
                f"{self.path} has schema {version}; this orch reads {SCHEMA_VERSION} "
                "(run any other orch command once to migrate it)"
            )
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise OrchError(f"{self.path} is open read-only here")
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _migrate(self) -> None:
        # Read first: a current database (every command but the first) needs no write lock, so
        # `orch status` never queues behind the daemon's writes just to open the store.
        if self._check_version(self.db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
            return
        with self._tx() as db:
            version = self._check_version(db.execute("PRAGMA user_version").fetchone()[0])
            for v in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[v].split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _check_version(self, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise OrchError(
                f"{self.path} was written by a newer orch (schema {version}, this orch knows {SCHEMA_VERSION}); "
                "upgrade orch (pip install -U orch), or point --home / ORCH_HOME at another folder"
            )
        return version

    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

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
        executor: str = "local",
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
            self._event(db, job_id, EventKind.SUBMITTED, detail, now, outgoing)
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
            implied = implied_columns(job.state, dst, now, job.attempt, begin_attempt)
            if dst is JobState.RUNNING and job.started_at is None:
                implied["started_at"] = now
            fields = {"state": dst.value, "updated_at": now, **self._columns({**implied, **(updates or {})})}
            sets = ", ".join(f"{k}=?" for k in fields)
            cur = db.execute(
                f"UPDATE jobs SET {sets} WHERE id=? AND state=?", (*fields.values(), job_id, job.state.value)
            )
            if cur.rowcount != 1:  # cannot happen inside BEGIN IMMEDIATE; kept as the CAS guard
                raise InvalidTransition(job_id, job.state.value, dst.value, "changed concurrently")
            if end_attempt is not None:
                self._end_attempt(db, job_id, job.attempt, end_attempt)
            if begin_attempt is not None:
                db.execute(
                    """INSERT INTO attempts(job_id, n, started_at, gpu_ids, resumed_from_step)
                       VALUES(?,?,?,?,?)""",
                    (
                        job_id,
                        begin_attempt.n,
                        now,
                        json.dumps(list(begin_attempt.gpu_ids)),
                        begin_attempt.resumed_from_step,
                    ),
                )
            self._event(db, job_id, kind, detail, now, outgoing)
            for also_kind, also_detail, also_outgoing in also:
                self._event(db, job_id, also_kind, also_detail, now, also_outgoing)
            return self._get(db, job_id)

    def update(
        self, job_id: int, now: float, *, only_if_state: Optional[Iterable[JobState]] = None, **updates: Any
    ) -> bool:
        """Set non-state fields (intent, pids, accounting). Returns False when the job is no
        longer in `only_if_state` (a compare-and-set, so a late write never clobbers a newer state)."""
        fields = {"updated_at": now, **self._columns(updates)}
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
                self._event(db, job_id, kind, detail, now, ())
            return cur.rowcount == 1

    def _columns(self, updates: dict[str, Any]) -> dict[str, Any]:
        unknown = set(updates) - _UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        return {
            k: (json.dumps(v) if k in _JSON_COLUMNS else (v.value if hasattr(v, "value") else v))
            for k, v in updates.items()
        }

    # -- attempts ------------------------------------------------------------------------

    def _end_attempt(self, db: sqlite3.Connection, job_id: int, n: int, end: AttemptEnd) -> None:
        db.execute(
            """UPDATE attempts SET ended_at=?, exit_code=?, exit_signal=?, outcome=?, step_reached=?
               WHERE job_id=? AND n=?""",
            (
                end.ended_at,
                end.exit_code,
                end.exit_signal,
                AttemptOutcome(end.outcome).value,
                end.step_reached,
                job_id,
                n,
            ),
        )

    def attempts(self, job_id: int) -> list[Attempt]:
        rows = self.db.execute("SELECT * FROM attempts WHERE job_id=? ORDER BY n", (job_id,)).fetchall()
        return [Attempt.from_row(r) for r in rows]

    # -- events --------------------------------------------------------------------------

    def _event(
        self,
        db: sqlite3.Connection,
        job_id: Optional[int],
        kind: EventKind | str,
        detail: str,
        now: float,
        outgoing: Iterable[Outgoing],
    ) -> int:
        cur = db.execute(
            "INSERT INTO events(job_id, at, kind, detail) VALUES(?,?,?,?)", (job_id, now, str(kind), detail)
        )
        event_id = inserted_id(cur)
        for out in outgoing:
            db.execute(
                "INSERT INTO outbox(event_id, job_id, channel, payload, created_at, next_try_at) VALUES(?,?,?,?,?,?)",
                (event_id, job_id, out.channel, json.dumps(out.payload), now, now),
            )
        return event_id

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
            return self._event(db, job_id, kind, detail, now, outgoing)

    def events(self, job_id: Optional[int] = None, *, kinds: Optional[Iterable[str]] = None) -> list[Event]:
        sql, params = "SELECT * FROM events", list[Any]()
        where = []
        if job_id is not None:
            where.append("job_id=?")
            params.append(job_id)
        if kinds is not None:
            ks = [str(k) for k in kinds]
            where.append(f"kind IN ({','.join('?' * len(ks))})")
            params += ks
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [Event.from_row(r) for r in self.db.execute(sql + " ORDER BY id", params).fetchall()]
