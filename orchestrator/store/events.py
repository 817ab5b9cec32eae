"""Attempt and event rows, as functions on a connection the caller holds: an event and its outbox
rows written together, an attempt's start and end, and the queries that read them back."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable, Optional

from ..model.records import Attempt, AttemptEnd, AttemptStart, Event, Outgoing
from ..model.states import AttemptOutcome, EventKind
from .connection import inserted_id


def write_event(
    db: sqlite3.Connection,
    job_id: Optional[int],
    kind: EventKind | str,
    detail: str,
    now: float,
    outgoing: Iterable[Outgoing],
) -> int:
    """Append an event and the outbox rows it sends, inside the caller's transaction."""
    cur = db.execute("INSERT INTO events(job_id, at, kind, detail) VALUES(?,?,?,?)", (job_id, now, str(kind), detail))
    event_id = inserted_id(cur)
    for out in outgoing:
        db.execute(
            "INSERT INTO outbox(event_id, job_id, channel, payload, created_at, next_try_at) VALUES(?,?,?,?,?,?)",
            (event_id, job_id, out.channel, json.dumps(out.payload), now, now),
        )
    return event_id


def start_attempt(db: sqlite3.Connection, job_id: int, begin: AttemptStart, now: float) -> None:
    db.execute(
        """INSERT INTO attempts(job_id, n, started_at, gpu_ids, resumed_from_step)
           VALUES(?,?,?,?,?)""",
        (
            job_id,
            begin.n,
            now,
            json.dumps(list(begin.gpu_ids)),
            begin.resumed_from_step,
        ),
    )


def finish_attempt(db: sqlite3.Connection, job_id: int, n: int, end: AttemptEnd) -> None:
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


def attempts_of(db: sqlite3.Connection, job_id: int) -> list[Attempt]:
    rows = db.execute("SELECT * FROM attempts WHERE job_id=? ORDER BY n", (job_id,)).fetchall()
    return [Attempt.from_row(r) for r in rows]


def events_of(db: sqlite3.Connection, job_id: Optional[int], kinds: Optional[Iterable[str]]) -> list[Event]:
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
    return [Event.from_row(r) for r in db.execute(sql + " ORDER BY id", params).fetchall()]
