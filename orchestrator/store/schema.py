"""The store's schema: its version and the forward migrations that reach it."""

from __future__ import annotations

SCHEMA_VERSION = 6

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
    # Sweeps: one row per sweep (its spec and state) and one per trial, linking the Optuna trial
    # number to the job that runs it (written in the job's own insert, so no trial is ever run twice).
    3: """
    CREATE TABLE sweeps(
      id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, state TEXT NOT NULL,
      spec_json TEXT NOT NULL, spec_path TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
      finished_at REAL, reason TEXT NOT NULL DEFAULT '', cancel_requested_at REAL
    );
    CREATE TABLE sweep_trials(
      sweep_id INTEGER NOT NULL REFERENCES sweeps(id), number INTEGER NOT NULL,
      job_id INTEGER NOT NULL UNIQUE REFERENCES jobs(id), params TEXT NOT NULL, created_at REAL NOT NULL,
      PRIMARY KEY(sweep_id, number)
    );
    """,
    # `orch watch`, the recovery controller: each watched job's state in the controller's own home
    # (what `orch status` shows there), and the keys of the events it queued, each exactly once.
    # On a machine that ran a job: the machines the job ran on (host, market, from-to, steps).
    4: """
    CREATE TABLE recovery(
      uid TEXT PRIMARY KEY, name TEXT NOT NULL, url TEXT NOT NULL, state TEXT NOT NULL,
      waiting_since REAL, launches INTEGER NOT NULL DEFAULT 0, losses INTEGER NOT NULL DEFAULT 0,
      market TEXT NOT NULL DEFAULT '', note TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL
    );
    CREATE TABLE recovery_sent(key TEXT PRIMARY KEY, event_id INTEGER NOT NULL, at REAL NOT NULL);
    ALTER TABLE mirror ADD COLUMN machines TEXT NOT NULL DEFAULT '[]';
    """,
    # `orch watch`'s machine ledger: every machine it launched, per mirror, as one JSON record
    # (recovery/ledger.py owns its fields), until it is stopped and long after.
    5: """
    CREATE TABLE recovery_machines(
      url TEXT NOT NULL, instance_id TEXT NOT NULL, record TEXT NOT NULL, updated_at REAL NOT NULL,
      PRIMARY KEY(url, instance_id)
    );
    """,
}
