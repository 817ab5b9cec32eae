"""Plain records: a job, an attempt, an event, an outbox row (read from the store), and an
attempt launch (handed to an executor). No I/O here, so the CLI, the daemon, the executors and the
renderers share one vocabulary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from .executor_kinds import LOCAL as LOCAL  # the default `executor` column (kinds are named there)
from .states import AttemptOutcome, Intent, JobState

# The key of a job's executor_ref that `orch run` sets while its attempt runs in the foreground.
FOREGROUND_PID = "foreground_pid"
FOREGROUND_START = "foreground_start"  # with the pid: the process's start time (a pid alone is recycled)

# The `executor` column: which executor started the job's current attempt (a kind of
# model/executor_kinds.py, or FOREGROUND for `orch run`), written when the attempt begins, so each attempt is watched and
# reaped by the executor that started it whatever config.toml says now (executors/by_kind.py).
FOREGROUND = "foreground"  # `orch run`: a process on this machine that accrues its own attempt

# The local executor's per-attempt parent process: executors/local.py starts it, `orch doctor`
# recognises it in a command line, `orch estimate` times its start (jobs/probe.py).
SUPERVISOR_MODULE = "orchestrator.executors.supervisor"


@dataclass
class Job:
    id: int
    name: str
    state: JobState
    priority: int
    gpus: int
    kind: str  # "command" | "builtin"
    spec_json: str  # parsed on demand: `orch status` over 10,000 jobs never needs it
    spec_path: str
    after_ids: list[int]
    not_before: Optional[float]
    retries: int
    failures: int
    attempt: int  # attempts started so far (the current/last one's number)
    intent: Intent
    cancel_requested_at: Optional[float]
    reason: str
    git_commit: Optional[str]
    git_dirty: Optional[bool]
    submitted_at: float
    started_at: Optional[float]
    finished_at: Optional[float]
    updated_at: float
    supervisor_pid: Optional[int]
    supervisor_start: Optional[str]
    gpu_ids: list[int]
    signalled_at: Optional[float]
    retry_after: Optional[float]
    cost: float
    run_seconds: float
    gpu_seconds: float
    waste_seconds: float
    waste_cost: float
    steps_lost: int
    max_cost: Optional[float]
    max_hours: Optional[float]
    uid: str  # global id: stays the same when the job is adopted on another machine
    executor: str  # which executor started its current attempt: a kind (model/executor_kinds.py), FOREGROUND
    executor_ref: dict[str, Any]  # that executor's handle on the current attempt (local uses supervisor_*)

    @property
    def in_foreground(self) -> bool:
        """Its attempt runs under `orch run`, which accrues the attempt's time and cost itself; a
        daemon beside it only watches it (one process accrues a job's time: docs/cost.md)."""
        return bool((self.executor_ref or {}).get(FOREGROUND_PID))

    @classmethod
    def from_row(cls, row: Any) -> "Job":
        """A job from a row of `SELECT {JOB_COLUMNS} FROM jobs` (columns in field order).
        Positional, with the JSON parser skipped for the empty lists and maps nearly every row
        holds: `orch status --all` builds one per job."""
        v = list(row)
        v[_STATE] = _STATES[v[_STATE]]
        v[_INTENT] = _INTENTS[v[_INTENT] or ""]
        for i, empty in _JSON_AT:
            v[i] = json.loads(v[i]) if v[i] and v[i] != empty else ([] if empty == "[]" else {})
        if v[_DIRTY] is not None:
            v[_DIRTY] = bool(v[_DIRTY])
        return cls(*v)

    @cached_property
    def spec(self) -> dict[str, Any]:
        return json.loads(self.spec_json)

    @property
    def shown_attempt(self) -> int:
        """1-based; a job that never started is on its first attempt."""
        return max(1, self.attempt)


_JOB_FIELDS = tuple(Job.__dataclass_fields__)
JOB_COLUMNS = ", ".join(_JOB_FIELDS)  # what the store selects for Job.from_row, in field order
_STATE, _INTENT, _DIRTY = (_JOB_FIELDS.index(k) for k in ("state", "intent", "git_dirty"))
_JSON_AT = tuple(
    (_JOB_FIELDS.index(k), empty) for k, empty in (("after_ids", "[]"), ("gpu_ids", "[]"), ("executor_ref", "{}"))
)
_STATES = {s.value: s for s in JobState}
_INTENTS = {i.value: i for i in Intent}


@dataclass
class Attempt:
    job_id: int
    n: int
    started_at: float
    ended_at: Optional[float]
    gpu_ids: list[int]
    exit_code: Optional[int]
    exit_signal: Optional[int]
    outcome: AttemptOutcome
    resumed_from_step: Optional[int]
    step_reached: Optional[int]

    @classmethod
    def from_row(cls, row: Any) -> "Attempt":
        d = dict(row)
        d["gpu_ids"] = json.loads(d["gpu_ids"] or "[]")
        d["outcome"] = AttemptOutcome(d["outcome"] or "")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class AttemptStart:
    """The attempt row a transition to `running` opens."""

    n: int
    gpu_ids: list[int] = field(default_factory=list)
    resumed_from_step: Optional[int] = None


@dataclass(frozen=True)
class AttemptEnd:
    """How the attempt a transition out of `running` closes ended."""

    ended_at: float
    outcome: AttemptOutcome
    exit_code: Optional[int] = None
    exit_signal: Optional[int] = None
    step_reached: Optional[int] = None


@dataclass
class Event:
    id: int
    job_id: Optional[int]
    at: float
    kind: str
    detail: str

    @classmethod
    def from_row(cls, row: Any) -> "Event":
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})


@dataclass
class OutboxRow:
    id: int
    event_id: Optional[int]
    job_id: Optional[int]
    channel: str
    payload: dict[str, Any]
    created_at: float
    tries: int
    next_try_at: float
    last_error: str
    delivered_at: Optional[float] = None
    gave_up_at: Optional[float] = None

    @classmethod
    def from_row(cls, row: Any) -> "OutboxRow":
        d = dict(row)
        d["payload"] = json.loads(d["payload"])
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass
class Outgoing:
    """A notification to queue with an event: one row per channel."""

    channel: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptLaunch:
    """What `start` needs: the command and environment built from the contract (attempts.py)."""

    job_id: int
    attempt: int
    run_dir: Path
    argv: list[str]
    cwd: Optional[str]
    env: dict[str, str]
    grace_s: float
    gpu_ids: list[int] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    job_uid: str = ""  # the job's global id (a Ray attempt's submission id is built from it)
    # What orch gives the attempt beyond the machine's environment (`env` holds both): the contract's
    # variables, the trackers', [env] and pass_env. A cluster job is given only these (host/cluster_env.py).
    job_vars: dict[str, str] = field(default_factory=dict)
