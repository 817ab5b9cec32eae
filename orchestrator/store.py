"""SQLite store under $ORCH_HOME: jobs, attempts, the append-only events history, the
notification outbox and the cost ledger. The ONLY module with SQL. Every state change is a
compare-and-set inside BEGIN IMMEDIATE, checked against states.TRANSITIONS, and writes the job
row, its event and its outbox rows together, so CLI and daemon can never race a job."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

from .errors import InvalidTransition, JobNotFound, OrchError
from .records import JOB_COLUMNS, Attempt, AttemptEnd, AttemptStart, Event, Job, OutboxRow, Outgoing
from .states import AttemptOutcome, EventKind, JobState, ensure_allowed

SCHEMA_VERSION = 3

# Forward migrations: MIGRATIONS[n] takes a database at version n to n + 1.
MIGRATIONS: dict[int, str] = {
    0: """
    CREATE TABLE jobs(
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      name TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0,
      gpus INTEGER NOT NULL, kind TEXT NOT NULL, spec_json TEXT NOT NULL, spec_path TEXT NOT NULL DEFAULT '',
      after_ids TEXT NOT NULL DEFAULT '[]', not_before REAL,
      retries INTEGER NOT NULL, failures INTEGER NOT NULL DEFAULT 0, attempt INTEGER NOT NULL DEFAULT 0,
      intent TEXT NOT NULL DEFAULT '', cancel_requested_at REAL, reason TEXT NOT NULL DEFAULT '',
      git_commit TEXT, git_dirty INTEGER,
      submitted_at REAL NOT NULL, started_at REAL, finished_at REAL, updated_at REAL NOT NULL,
      supervisor_pid INTEGER, supervisor_start TEXT, gpu_ids TEXT NOT NULL DEFAULT '[]',
      signalled_at REAL, retry_after REAL,
      cost REAL NOT NULL DEFAULT 0, run_seconds REAL NOT NULL DEFAULT 0, gpu_seconds REAL NOT NULL DEFAULT 0,
      waste_seconds REAL NOT NULL DEFAULT 0, waste_cost REAL NOT NULL DEFAULT 0, steps_lost INTEGER NOT NULL DEFAULT 0,
      max_cost REAL, max_hours REAL
    );
    CREATE INDEX jobs_by_state ON jobs(state, priority DESC, id);
    CREATE TABLE attempts(
      job_id INTEGER NOT NULL REFERENCES jobs(id), n INTEGER NOT NULL,
      started_at REAL NOT NULL, ended_at REAL, gpu_ids TEXT NOT NULL DEFAULT '[]',
      exit_code INTEGER, exit_signal INTEGER, outcome TEXT NOT NULL DEFAULT '',
      resumed_from_step INTEGER, step_reached INTEGER,
      PRIMARY KEY(job_id, n)
    );
    CREATE TABLE events(
      id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER, at REAL NOT NULL,
      kind TEXT NOT NULL, detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX events_by_job ON events(job_id, id);
    CREATE TABLE outbox(
      id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER, job_id INTEGER,
      channel TEXT NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL,
      tries INTEGER NOT NULL DEFAULT 0, next_try_at REAL NOT NULL,
      delivered_at REAL, gave_up_at REAL, last_error TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX outbox_pending ON outbox(delivered_at, gave_up_at, next_try_at);
    CREATE TABLE ledger(key TEXT PRIMARY KEY, value REAL NOT NULL);
    """,
    # A global id (local integer ids collide across machines: the mirror and `orch adopt` name
    # jobs by it) and the executor's handle for attempts that are not a local supervisor.
    1: """
    ALTER TABLE jobs ADD COLUMN uid TEXT;
    UPDATE jobs SET uid = lower(hex(randomblob(16))) WHERE uid IS NULL;
    CREATE UNIQUE INDEX jobs_by_uid ON jobs(uid);
    ALTER TABLE jobs ADD COLUMN executor TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE jobs ADD COLUMN executor_ref TEXT NOT NULL DEFAULT '{}';
    UPDATE attempts SET outcome = 'cancelled' WHERE outcome = 'interrupted';
    """,
    # The mirror ([storage]): the uploader's persistent queue and each job's mirror state (the
    # manifest's ETag for conditional writes, the checkpoints it names, the lag and the lease).
    2: """
    CREATE TABLE uploads(
      id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, uid TEXT NOT NULL,
      path TEXT NOT NULL, name TEXT NOT NULL, step INTEGER NOT NULL, notice INTEGER NOT NULL DEFAULT 0,
      created_at REAL NOT NULL, tries INTEGER NOT NULL DEFAULT 0, next_try_at REAL NOT NULL,
      done_at REAL, dropped_at REAL, last_error TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX uploads_pending ON uploads(done_at, dropped_at, job_id);
    CREATE TABLE mirror(
      job_id INTEGER PRIMARY KEY, uid TEXT NOT NULL, etag TEXT, manifest_at REAL,
      checkpoints TEXT NOT NULL DEFAULT '[]', doomed TEXT NOT NULL DEFAULT '[]', step INTEGER, uploaded_at REAL,
      error TEXT NOT NULL DEFAULT '', error_since REAL, warned INTEGER NOT NULL DEFAULT 0,
      lost TEXT NOT NULL DEFAULT '', dirty INTEGER NOT NULL DEFAULT 1, files_at REAL,
      final INTEGER NOT NULL DEFAULT 0, released INTEGER NOT NULL DEFAULT 0
    );
    """,
}

# Columns callers may set besides the state; anything else is a programming error.
_UPDATABLE = frozenset(
    """priority after_ids not_before retries failures attempt intent cancel_requested_at reason
    started_at finished_at supervisor_pid supervisor_start gpu_ids signalled_at retry_after
    cost run_seconds gpu_seconds waste_seconds waste_cost steps_lost max_cost max_hours executor executor_ref""".split()
)
_JSON_COLUMNS = frozenset({"after_ids", "gpu_ids", "executor_ref"})


def implied_columns(src: JobState, dst: JobState, now: float, job_attempt: int,
                    begin: Optional[AttemptStart]) -> dict[str, Any]:
    """The columns a transition resets, written here once instead of at every call site:
    starting an attempt clears the last one's request and reason; leaving `running` forgets the
    attempt's processes and GPUs; the queue holds no intent; a finished job has its end time."""
    cols: dict[str, Any] = {}
    if dst is JobState.RUNNING:
        cols.update(attempt=begin.n if begin else job_attempt + 1, gpu_ids=list(begin.gpu_ids) if begin else [],
                    intent="", cancel_requested_at=None, signalled_at=None, retry_after=None, reason="",
                    finished_at=None, supervisor_pid=None, supervisor_start=None, executor_ref={})
    if src is JobState.RUNNING and dst is not JobState.RUNNING:
        cols.update(supervisor_pid=None, supervisor_start=None, executor_ref={}, gpu_ids=[], signalled_at=None)
    if dst is JobState.QUEUED:
        cols.update(intent="", cancel_requested_at=None, signalled_at=None, finished_at=None, retry_after=None)
    if dst.is_terminal:
        cols.update(finished_at=now, retry_after=None)
    return cols


class Store:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._local = threading.local()
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
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=60000")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
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
    ) -> Job:
        with self._tx() as db:
            for dep in after_ids:
                if db.execute("SELECT 1 FROM jobs WHERE id=?", (dep,)).fetchone() is None:
                    raise JobNotFound(dep)
            cur = db.execute(
                """INSERT INTO jobs(name, state, priority, gpus, kind, spec_json, spec_path, after_ids,
                   not_before, retries, git_commit, git_dirty, submitted_at, updated_at, max_cost, max_hours, uid,
                   executor)
                   VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (name, JobState.QUEUED.value, priority, gpus, kind, json.dumps(spec), spec_path,
                 json.dumps(list(after_ids)), not_before, retries, git_commit,
                 None if git_dirty is None else int(git_dirty), now, now, max_cost, max_hours,
                 uid or uuid.uuid4().hex, executor),
            )
            job_id = cur.lastrowid
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
            rows = self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ({marks}) ORDER BY id", wanted).fetchall()
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
                    (job_id, begin_attempt.n, now, json.dumps(list(begin_attempt.gpu_ids)), begin_attempt.resumed_from_step),
                )
            self._event(db, job_id, kind, detail, now, outgoing)
            for also_kind, also_detail, also_outgoing in also:
                self._event(db, job_id, also_kind, also_detail, now, also_outgoing)
            return self._get(db, job_id)

    def update(self, job_id: int, now: float, *, only_if_state: Optional[Iterable[JobState]] = None, **updates: Any) -> bool:
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

    def set_intent_once(self, job_id: int, intent: str, now: float, *, detail: str = "", kind: Optional[EventKind] = None) -> bool:
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
        return {k: (json.dumps(v) if k in _JSON_COLUMNS else (v.value if hasattr(v, "value") else v)) for k, v in updates.items()}

    # -- attempts ------------------------------------------------------------------------

    def _end_attempt(self, db: sqlite3.Connection, job_id: int, n: int, end: AttemptEnd) -> None:
        db.execute(
            """UPDATE attempts SET ended_at=?, exit_code=?, exit_signal=?, outcome=?, step_reached=?
               WHERE job_id=? AND n=?""",
            (end.ended_at, end.exit_code, end.exit_signal, AttemptOutcome(end.outcome).value, end.step_reached,
             job_id, n),
        )

    def attempts(self, job_id: int) -> list[Attempt]:
        rows = self.db.execute("SELECT * FROM attempts WHERE job_id=? ORDER BY n", (job_id,)).fetchall()
        return [Attempt.from_row(r) for r in rows]

    # -- events --------------------------------------------------------------------------

    def _event(self, db: sqlite3.Connection, job_id: Optional[int], kind: EventKind | str, detail: str,
               now: float, outgoing: Iterable[Outgoing]) -> int:
        cur = db.execute(
            "INSERT INTO events(job_id, at, kind, detail) VALUES(?,?,?,?)", (job_id, now, str(kind), detail)
        )
        event_id = cur.lastrowid
        for out in outgoing:
            db.execute(
                "INSERT INTO outbox(event_id, job_id, channel, payload, created_at, next_try_at) VALUES(?,?,?,?,?,?)",
                (event_id, job_id, out.channel, json.dumps(out.payload), now, now),
            )
        return event_id

    def record_event(self, job_id: Optional[int], kind: EventKind | str, now: float, *, detail: str = "",
                     outgoing: Iterable[Outgoing] = ()) -> int:
        with self._tx() as db:
            return self._event(db, job_id, kind, detail, now, outgoing)

    def events(self, job_id: Optional[int] = None, *, kinds: Optional[Iterable[str]] = None) -> list[Event]:
        sql, params = "SELECT * FROM events", []
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
                self._event(db, row["job_id"], EventKind.NOTIFY_FAILED, f"{row['channel']}: {error}", now, ())

    # -- cost ledger ---------------------------------------------------------------------

    def accrue(self, now: float, seconds: float, per_job: dict[int, tuple[float, float]], idle_cost: float) -> None:
        """Add one accounting interval: per job (cost, gpu_seconds) and its running time, plus the
        idle cost and the uptime, in one transaction (so a crash never counts half an interval)."""
        with self._tx() as db:
            for job_id, (cost, gpu_seconds) in per_job.items():
                db.execute(
                    "UPDATE jobs SET cost=cost+?, gpu_seconds=gpu_seconds+?, run_seconds=run_seconds+? WHERE id=?",
                    (cost, gpu_seconds, seconds, job_id),
                )
            for key, value in (("idle_cost", idle_cost), ("uptime_s", seconds)):
                db.execute(
                    "INSERT INTO ledger(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=value+excluded.value",
                    (key, value),
                )

    def total_cost(self) -> float:
        """Everything spent: every job's cost plus the idle cost."""
        jobs = self.db.execute("SELECT COALESCE(SUM(cost), 0) FROM jobs").fetchone()[0]
        return jobs + self.ledger().get("idle_cost", 0.0)

    def ledger(self) -> dict[str, float]:
        return {r["key"]: r["value"] for r in self.db.execute("SELECT key, value FROM ledger").fetchall()}

    # -- the mirror ([storage]) --------------------------------------------------------------

    def mirror_state(self, job_id: int) -> Optional[dict[str, Any]]:
        row = self.db.execute("SELECT * FROM mirror WHERE job_id=?", (job_id,)).fetchone()
        return _mirror_row(row) if row is not None else None

    def mirror_states(self) -> dict[int, dict[str, Any]]:
        return {r["job_id"]: _mirror_row(r) for r in self.db.execute("SELECT * FROM mirror").fetchall()}

    def mirror_set(self, job_id: int, uid: str, **fields: Any) -> None:
        """Insert or update a job's mirror row (JSON for the list columns)."""
        unknown = set(fields) - _MIRROR_COLUMNS
        if unknown:
            raise ValueError(f"not a mirror column: {sorted(unknown)}")
        values = {k: (json.dumps(v) if k in ("checkpoints", "doomed") else v) for k, v in fields.items()}
        cols = ["job_id", "uid", *values]
        sets = ", ".join(f"{k}=excluded.{k}" for k in values) or "uid=excluded.uid"
        with self._tx() as db:
            db.execute(f"INSERT INTO mirror({', '.join(cols)}) VALUES({','.join('?' * len(cols))}) "
                       f"ON CONFLICT(job_id) DO UPDATE SET {sets}", (job_id, uid, *values.values()))

    def upload_enqueue(self, job_id: int, uid: str, path: str, name: str, step: int, notice: bool, now: float) -> int:
        """Queue a checkpoint upload. Newest wins: pending uploads of the same job at an older
        (step, notice) are dropped, since only the newest checkpoint matters once behind."""
        with self._tx() as db:
            db.execute(
                """UPDATE uploads SET dropped_at=?, last_error='superseded by '||? WHERE job_id=? AND done_at IS NULL
                   AND dropped_at IS NULL AND (step < ? OR (step = ? AND notice <= ?))""",
                (now, name, job_id, step, step, int(notice)))
            return db.execute(
                """INSERT INTO uploads(job_id, uid, path, name, step, notice, created_at, next_try_at)
                   VALUES(?,?,?,?,?,?,?,?)""", (job_id, uid, path, name, step, int(notice), now, now)).lastrowid

    def uploads_pending(self, job_id: Optional[int] = None) -> list[dict[str, Any]]:
        """Pending uploads, notice checkpoints first, then the newest step first."""
        sql = "SELECT * FROM uploads WHERE done_at IS NULL AND dropped_at IS NULL"
        params: list[Any] = []
        if job_id is not None:
            sql += " AND job_id=?"
            params.append(job_id)
        return [dict(r) for r in self.db.execute(sql + " ORDER BY notice DESC, step DESC, id", params).fetchall()]

    def preemption_history(self) -> tuple[int, float]:
        """(preemption notices + attempts lost with the machine, seconds the daemon has run): what
        `[checkpoint] every = "auto"` divides into a mean time between preemptions."""
        notices = self.db.execute("SELECT COUNT(*) FROM events WHERE kind='notice'").fetchone()[0]
        lost = self.db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='lost'").fetchone()[0]
        return notices + lost, self.ledger().get("uptime_s", 0.0)

    def upload_names(self, job_id: int) -> set[str]:
        """Checkpoint names ever queued for a job (done, pending or dropped)."""
        return {r[0] for r in self.db.execute("SELECT name FROM uploads WHERE job_id=?", (job_id,)).fetchall()}

    def upload_finish(self, upload_id: int, now: float, *, dropped: str = "") -> None:
        with self._tx() as db:
            if dropped:
                db.execute("UPDATE uploads SET dropped_at=?, last_error=? WHERE id=? AND done_at IS NULL",
                           (now, dropped, upload_id))
            else:
                db.execute("UPDATE uploads SET done_at=?, tries=tries+1 WHERE id=?", (now, upload_id))

    def upload_retry(self, upload_id: int, next_try_at: float, error: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE uploads SET tries=tries+1, next_try_at=?, last_error=? WHERE id=?",
                       (next_try_at, error, upload_id))

    def import_job(self, m: dict[str, Any], *, state: JobState, reason: str, spec_path: str, now: float,
                   attempts: list[dict[str, Any]], detail: str) -> Job:
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
                (m["name"], state.value, int(m.get("priority") or 0), int(m.get("gpus") or 0), m.get("kind") or "builtin",
                 json.dumps(m.get("spec") or {}), spec_path, int(m.get("retries") or 0), int(m.get("failures") or 0),
                 int(m.get("attempt") or 0), reason, git.get("commit"),
                 None if git.get("dirty") is None else int(bool(git.get("dirty"))),
                 float(m.get("submitted_at") or now), m.get("started_at"), now, float(c.get("cost") or 0),
                 float(c.get("run_seconds") or 0), float(c.get("gpu_seconds") or 0), float(c.get("waste_seconds") or 0),
                 float(c.get("waste_cost") or 0), int(c.get("steps_lost") or 0), b.get("max_cost"), b.get("max_hours"),
                 m["uid"]))
            job_id = cur.lastrowid
            for a in attempts:
                db.execute(
                    """INSERT INTO attempts(job_id, n, started_at, ended_at, gpu_ids, exit_code, exit_signal, outcome,
                       resumed_from_step, step_reached) VALUES(?,?,?,?,?,?,?,?,?,?)""",
                    (job_id, a["n"], a["started_at"], a.get("ended_at"), json.dumps(a.get("gpu_ids") or []),
                     a.get("exit_code"), a.get("exit_signal"), a.get("outcome") or "", a.get("resumed_from_step"),
                     a.get("step_reached")))
            self._event(db, job_id, "adopted", detail, now, ())
            return self._get(db, job_id)


_MIRROR_COLUMNS = frozenset("""etag manifest_at checkpoints doomed step uploaded_at error error_since warned lost dirty
    files_at final released""".split())


def _mirror_row(row: Any) -> dict[str, Any]:
    d = dict(row)
    d["checkpoints"] = json.loads(d["checkpoints"] or "[]")
    d["doomed"] = json.loads(d["doomed"] or "[]")
    return d
