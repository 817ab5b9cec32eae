"""Sweeps and their trials: the sweep row (spec, state) and the trial rows that link an Optuna
trial number to its job. A trial row is written in the same transaction as its job's insert."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable, Optional

from ..model.errors import OrchError
from ..model.sweep_records import Sweep, SweepState, Trial
from .connection import inserted_id
from .jobs import JobRows


class SweepNotFound(OrchError):
    exit_code = 1

    def __init__(self, sweep_id: int):
        super().__init__(f"no sweep with id {sweep_id}; `orch status --all` lists the sweeps and their trials")


class SweepRows(JobRows):
    """Mixed into Store: uses its `db`, `_tx` and `submit`."""

    def create_sweep(self, *, name: str, spec: dict[str, Any], spec_path: str, now: float) -> Sweep:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO sweeps(name, state, spec_json, spec_path, created_at, updated_at) VALUES(?,?,?,?,?,?)",
                (name, SweepState.RUNNING.value, json.dumps(spec), spec_path, now, now),
            )
            return self._sweep(db, inserted_id(cur))

    def sweep(self, sweep_id: int) -> Sweep:
        return self._sweep(self.db, sweep_id)

    def _sweep(self, db: sqlite3.Connection, sweep_id: int) -> Sweep:
        row = db.execute("SELECT * FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        if row is None:
            raise SweepNotFound(sweep_id)
        return Sweep.from_row(row)

    def sweeps(self, states: Optional[Iterable[SweepState]] = None) -> list[Sweep]:
        rows = self.db.execute("SELECT * FROM sweeps ORDER BY id").fetchall()
        wanted = None if states is None else {SweepState(s) for s in states}
        return [s for s in map(Sweep.from_row, rows) if wanted is None or s.state in wanted]

    def has_running_sweep(self) -> bool:
        """The daemon's cheap check every tick: with no sweep running, optuna is never imported."""
        return (
            self.db.execute("SELECT 1 FROM sweeps WHERE state=? LIMIT 1", (SweepState.RUNNING.value,)).fetchone()
            is not None
        )

    def finish_sweep(self, sweep_id: int, state: SweepState, now: float, *, reason: str = "") -> bool:
        """Running -> a terminal state, once (compare-and-set)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE sweeps SET state=?, finished_at=?, updated_at=?, reason=? WHERE id=? AND state=?",
                (state.value, now, now, reason, sweep_id, SweepState.RUNNING.value),
            )
            return cur.rowcount == 1

    def request_sweep_cancel(self, sweep_id: int, now: float) -> bool:
        self._sweep(self.db, sweep_id)
        with self._tx() as db:
            cur = db.execute(
                "UPDATE sweeps SET cancel_requested_at=?, updated_at=? WHERE id=? AND state=?",
                (now, now, sweep_id, SweepState.RUNNING.value),
            )
            return cur.rowcount == 1

    def submit_trial(self, sweep_id: int, number: int, params: dict[str, Any], now: float, **job: Any):
        """The trial's job and its trial row in one transaction: a crash leaves both or neither."""

        def link(db: sqlite3.Connection, job_id: int) -> None:
            db.execute(
                "INSERT INTO sweep_trials(sweep_id, number, job_id, params, created_at) VALUES(?,?,?,?,?)",
                (sweep_id, number, job_id, json.dumps(params), now),
            )

        return self.submit(now=now, link=link, **job)

    def trials(self, sweep_id: int) -> list[Trial]:
        rows = self.db.execute("SELECT * FROM sweep_trials WHERE sweep_id=? ORDER BY number", (sweep_id,)).fetchall()
        return [Trial.from_row(r) for r in rows]

    def trials_by_job(self) -> dict[int, Trial]:
        """Every trial, by its job id (`orch status` groups trials under their sweep)."""
        return {r["job_id"]: Trial.from_row(r) for r in self.db.execute("SELECT * FROM sweep_trials").fetchall()}
