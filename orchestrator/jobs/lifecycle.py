"""What users and the daemon do to jobs, in named steps: submit, cancel, retry, and the
notification payload that goes into the outbox with each event. Each step is one store
transaction, so the event and its outbox rows commit with the state change or not at all."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import tomli_w

from ..spec.config import Config
from ..model.errors import HomeError, InvalidTransition, UsageError
from ..spec.jobspec import JobSpec, load_jobspec
from .admission import admit
from ..home.paths import Home
from ..contract import JOB_TOML, RESULT, atomic_file, attempt_log, read_json
from ..host.provenance import git_snapshot, write_diff
from ..model.records import AttemptEnd, AttemptStart, Job, Outgoing
from ..model.states import RETRYABLE, EventKind, JobState
from ..store import Store


def outgoing_for(config: Config, kind: EventKind | str, payload: dict[str, Any]) -> list[Outgoing]:
    """One outbox row per channel that wants this event kind."""
    return [Outgoing(name, payload) for name, events in config.routes() if str(kind) in events]


def machine_outgoing(config: Config, kind: EventKind | str, reason: str) -> list[Outgoing]:
    """The outbox rows of an event of the machine rather than of one job (a notice, the mirror down
    or back, the queue drained, an idle shutdown): one payload shape, one host-name lookup."""
    payload = {
        "event": str(kind),
        "reason": reason,
        "host": socket.gethostname(),
        "state": "",
        "currency": config.pricing.currency,
    }
    return outgoing_for(config, kind, payload)


def log_tail(run_dir: Path, attempt: int, lines: int = 20) -> str:
    path = run_dir / attempt_log(attempt)
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def payload_for(
    job: Job,
    kind: EventKind | str,
    config: Config,
    home: Home,
    *,
    reason: str = "",
    state: Optional[JobState] = None,
    with_log: bool = False,
) -> dict[str, Any]:
    """The notification for an event, as notifiers.Message fields (plain JSON for the outbox)."""
    run_dir = home.run_dir(job.id)
    result = read_json(run_dir / RESULT) or {}
    best = result.get("best_metric")
    if isinstance(best, dict):
        best = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best.items())
    elif isinstance(best, (int, float)) and not isinstance(best, bool):
        # The runner writes the score and, separately, what it scores: say both ("val_acc=0.931").
        monitor = result.get("best_monitor")
        best = f"{monitor}={best:.4g}" if monitor else f"{best:.4g}"
    return {
        "event": str(kind),
        "job_id": job.id,
        "job_name": job.name,
        "state": str(state or job.state),
        "reason": reason or job.reason,
        "attempt": job.shown_attempt,
        "duration_s": round(job.run_seconds, 1),
        "cost": round(job.cost, 4),
        "currency": config.pricing.currency,
        "best_metric": "" if best is None else str(best),  # a best of 0.0 is still a result
        "checkpoint": str(result.get("best_checkpoint") or ""),
        "host": socket.gethostname(),
        "log_tail": log_tail(run_dir, job.shown_attempt) if with_log else "",
        "steps_lost": job.steps_lost,
        # `orch cost`'s figures (notifiers.Message has no fields for these yet; hooks and the
        # outbox row keep them).
        "gpu_hours": round(job.gpu_seconds / 3600, 4),
        "waste_s": round(job.waste_seconds, 1),
        "waste_cost": round(job.waste_cost, 4),
    }


def write_run_spec(home: Home, job_id: int, spec: dict[str, Any]) -> Path:
    """runs/<id>/job.toml: the resolved spec, so the job runs the same from anywhere."""
    run_dir = home.make_run_dir(job_id)
    target = run_dir / JOB_TOML
    with atomic_file(target, "w") as fh:
        fh.write(tomli_w.dumps(spec))
    return target


def submit_job(
    store: Store,
    config: Config,
    home: Home,
    toml_path: Path,
    *,
    now: float,
    machine_gpus: int,
    priority: Optional[int] = None,
    after: Sequence[int] = (),
    not_before: Optional[float] = None,
) -> Job:
    spec = load_jobspec(toml_path)
    # the instant checks again (cheap): whoever calls submit_job, nothing unadmitted is recorded
    admit(spec, str(toml_path), machine_gpus=machine_gpus, executor=config.executor.kind, now=now)
    folder = Path(spec.workdir) if spec.is_command and spec.workdir else toml_path.resolve().parent
    snap = git_snapshot(folder)
    data = spec.to_toml_dict()
    job = store.submit(
        name=spec.name or toml_path.stem,
        kind="command" if spec.is_command else "builtin",
        gpus=spec.gpus,
        priority=spec.priority if priority is None else priority,
        retries=spec.retries,
        spec=data,
        spec_path=str(toml_path.resolve()),
        now=now,
        after_ids=list(after),
        not_before=not_before,
        git_commit=snap.commit,
        git_dirty=snap.dirty,
        max_cost=spec.budget.max_cost,
        max_hours=spec.budget.max_hours,
        detail=f"from {toml_path.resolve()}",
        outgoing=_submitted_outgoing(config, home, spec, now),
    )
    try:
        run_dir = write_run_spec(home, job.id, data).parent
        write_diff(run_dir, snap)  # the uncommitted change the commit alone does not say
    except HomeError as exc:  # a link planted at runs/<id>: the job never runs, and says why
        change_state(
            store, config, home, job, JobState.FAILED, EventKind.FAILED, now, reason=str(exc), expect=[JobState.QUEUED]
        )
        raise
    return job


def _submitted_outgoing(config: Config, home: Home, spec: JobSpec, now: float) -> list[Outgoing]:
    # The job id is not known before the insert; "submitted" messages carry the name only.
    routes = [name for name, events in config.routes() if "submitted" in events]
    payload = {"event": "submitted", "job_name": spec.name or "", "state": "queued", "host": socket.gethostname()}
    return [Outgoing(name, payload) for name in routes]


def change_state(
    store: Store,
    config: Config,
    home: Home,
    job: Job,
    dst: JobState,
    kind: EventKind,
    now: float,
    *,
    detail: str = "",
    reason: Optional[str] = None,
    expect: Optional[Iterable[JobState]] = None,
    updates: Optional[dict[str, Any]] = None,
    begin_attempt: Optional[AttemptStart] = None,
    end_attempt: Optional[AttemptEnd] = None,
    with_log: bool = False,
    also: Sequence[tuple[EventKind, str]] = (),
) -> Job:
    """store.transition plus the outbox rows the event's subscribers want; `also` names further
    events (kind, detail) recorded with it in the same transaction, each with its own messages."""
    updates = dict(updates or {})
    if reason is not None:
        updates["reason"] = reason
    payload = payload_for(job, kind, config, home, reason=reason or "", state=dst, with_log=with_log)
    # A start: the messages are about the attempt beginning now, not the one before (whose number
    # and reason the job row still holds).
    starting = begin_attempt.n if begin_attempt is not None else updates.get("attempt")
    if starting is not None:
        payload["attempt"] = starting
        payload["reason"] = reason or detail
    extra = []
    for k, d in also:
        also_payload = payload_for(job, k, config, home, reason=d, state=dst)
        if starting is not None:
            also_payload["attempt"] = starting
        extra.append((k, d, outgoing_for(config, k, also_payload)))
    return store.transition(
        job.id,
        dst,
        kind,
        now,
        detail=detail or (reason or ""),
        expect=expect,
        updates=updates,
        begin_attempt=begin_attempt,
        end_attempt=end_attempt,
        outgoing=outgoing_for(config, kind, payload),
        also=extra,
    )


def cancel_job(store: Store, config: Config, home: Home, job_id: int, now: float) -> tuple[Job, bool]:
    """Cancel a queued job at once; for a running one record the request (only the daemon
    signals processes). Returns (job, done_now)."""
    job = store.get(job_id)
    if job.state is JobState.QUEUED:
        try:
            job = change_state(
                store,
                config,
                home,
                job,
                JobState.CANCELLED,
                EventKind.CANCELLED,
                now,
                reason="cancelled by the user while queued",
                expect=[JobState.QUEUED],
            )
            return job, True
        except InvalidTransition:
            job = store.get(job_id)  # the daemon started it meanwhile: fall through to a request
    if job.state is JobState.RUNNING:
        if store.update(job_id, now, only_if_state=[JobState.RUNNING], cancel_requested_at=now):
            store.record_event(job_id, EventKind.CANCEL_REQUESTED, now, detail="orch cancel")
            return store.get(job_id), False
        job = store.get(job_id)
    raise InvalidTransition(job_id, job.state.value, "cancelled", "it has already finished")


def retry_job(
    store: Store,
    config: Config,
    home: Home,
    job_id: int,
    now: float,
    *,
    budget: Optional[float] = None,
    hours: Optional[float] = None,
    gpus: Optional[int] = None,
) -> Job:
    """A failed, cancelled or stopped job back to the queue; it resumes from its latest
    checkpoint. Its attempt count goes on; its charged retries start over. `gpus`: on that many
    GPUs from now on (jobs/regpu.py: the effective batch kept, or refused), no more than the
    executor has (submit's check: a job asking for more never starts)."""
    from ..planning.capacity import gpu_slots

    job = store.get(job_id)  # no such job: said first
    machine_gpus = len(gpu_slots(config)) if gpus is not None else 0
    if gpus is not None and gpus > machine_gpus:
        raise UsageError(
            f"orch retry --gpus {gpus}: this machine has {machine_gpus} GPU{'s' if machine_gpus != 1 else ''} "
            "(config [daemon] gpus, else nvidia-smi)"
        )
    if job.state is JobState.MOVED:
        raise InvalidTransition(
            job_id,
            job.state.value,
            "queued",
            f"{job.reason or 'another machine adopted it'}. It runs there now; retrying it here would train it "
            f"twice. Follow it on that machine (`orch status` there), or take it back with "
            f"`orch adopt URL --job {job.uid} --force`",
        )
    if job.state not in RETRYABLE:
        why = "it is still active" if job.state.is_active else "it already succeeded"
        raise InvalidTransition(job_id, job.state.value, "queued", why)
    # A limit already reached would stop the job the moment it starts (exit 2, nothing changed).
    if budget is not None and budget <= job.cost:
        raise UsageError(
            f"orch retry --budget {budget:g}: job {job_id} has already cost {job.cost:.2f}; give more than that"
        )
    if hours is not None and hours <= job.run_seconds / 3600:
        raise UsageError(
            f"orch retry --hours {hours:g}: job {job_id} has already run {job.run_seconds / 3600:.2f} h; "
            "give more than that"
        )
    updates: dict[str, Any] = {"failures": 0}
    detail = "orch retry"
    if budget is not None:
        updates["max_cost"] = budget
        detail += f" with max_cost {budget:g}"
    if hours is not None:
        updates["max_hours"] = hours
        detail += f" with max_hours {hours:g}"
    if gpus is not None and gpus != job.gpus:
        from .regpu import regpu_spec

        spec = regpu_spec(job, home.run_dir(job_id), gpus)
        write_run_spec(home, job_id, spec)
        updates.update(gpus=gpus, spec_json=spec)
        detail += f" on {gpus} GPU(s) (was {job.gpus})"
    return change_state(
        store,
        config,
        home,
        job,
        JobState.QUEUED,
        EventKind.RETRYING,
        now,
        detail=detail,
        reason="",
        expect=RETRYABLE,
        updates=updates,
    )
