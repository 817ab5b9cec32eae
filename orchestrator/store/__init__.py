"""SQLite store under $ORCH_HOME: jobs, attempts, the append-only events history, the
notification outbox and the cost ledger. The ONLY package with SQL. Every state change is a
compare-and-set inside BEGIN IMMEDIATE, checked against states.TRANSITIONS, and writes the job
row, its event and its outbox rows together, so CLI and daemon can never race a job.

The store is one class put together from its parts: connection.py (connection, transactions,
migrations), jobs.py (jobs and transitions; job_columns.py the columns they write, events.py the
attempt and event rows), outbox.py (notification outbox, cost ledger), mirror_rows.py (the
mirror's state and upload queue), sweeps.py (sweeps and their trials), recovery_rows.py (`orch watch`'s
state and events); schema.py holds the migrations."""

from __future__ import annotations

from .job_columns import implied_columns
from .mirror_rows import MirrorRows
from .recovery_rows import RecoveryRows
from .schema import MIGRATIONS, SCHEMA_VERSION


class Store(RecoveryRows, MirrorRows):
    """The whole store: jobs (JobRows), the outbox and ledger (OutboxRows), the mirror's state
    (MirrorRows), sweeps (SweepRows) and `orch watch`'s
    recovery rows (RecoveryRows), on one connection per thread."""


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Store", "implied_columns"]
