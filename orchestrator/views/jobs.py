"""The data behind `orch status`, `orch show` and `orch cost`: one dict per job with the documented
keys. The table and `--json` are rendered from the same dicts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from ..cost import money as cost
from ..contract import CKPT_SUFFIX, PROGRESS, RESULT, SNAPSHOT_MEMORY, checkpoint_dir, parse_checkpoint_name, read_json
from ..planning.dispatch import hold_reason
from ..redaction import is_secret_name, redact
from ..planning.forecast import step_rate
from ..host.summary import provenance_summary
from ..home.paths import Home
from ..model.records import Attempt, Job
from ..model.states import JobState
from ..store import Store
from ..model.executor_kinds import RAY  # the key of a Ray attempt's submission and node
from .ray_where import ray_attempt, ray_now, ray_text


def read_progress(run_dir: Path) -> Optional[dict[str, Any]]:
    return read_json(run_dir / PROGRESS)


# A queued job's reason when no daemon holds this home's lock: no slot will ever come up by itself.
NO_DAEMON = "no daemon is running to start it: `orch daemon start` runs the queue"


def projection(job: Job, eta: Optional[float]) -> Optional[cost.Projection]:
    """Cost so far plus the ETA at what the job has paid per hour so far; an upper bound when
    early stopping may end it sooner."""
    rate = cost.average_hourly_rate(job.cost, job.run_seconds)
    return cost.projected_cost(job.cost, eta, rate, early_stopping=bool(job.spec.get("early_stopping")))


def status_row(
    job: Job,
    home: Home,
    now: float,
    *,
    dep_states: dict[int, JobState],
    attempt: Optional[Attempt] = None,
    with_progress: Optional[bool] = None,
    daemon_up: bool = True,
) -> dict[str, Any]:
    """One job's row. progress.json is read only for running jobs unless `with_progress` says
    otherwise, so `orch status --all` over thousands of finished jobs reads no files."""
    running = job.state is JobState.RUNNING
    if with_progress is None:
        with_progress = running
    progress = read_progress(home.run_dir(job.id)) if with_progress and job.attempt else None
    step = progress.get("step") if progress else None
    total = progress.get("total_steps") if progress else None
    rate = step_rate(progress, attempt) if running else None
    eta = cost.eta_seconds(step, total, rate) if rate is not None and step is not None else None
    projected = projection(job, eta) if running else None
    reason = job.reason
    if job.state is JobState.QUEUED:
        hold = hold_reason(job, dep_states, now)
        slot = (
            f"waiting for {job.gpus} free GPU{'s' if job.gpus > 1 else ''}"
            if job.gpus
            else "waiting for a free CPU slot ([daemon] cpu_slots)"
        )
        reason = hold.reason if hold else (job.reason or slot)
        if not hold and not daemon_up:  # no slot is coming: nothing runs the queue
            reason = (job.reason + "; " if job.reason else "") + NO_DAEMON
    # where a cluster executor says the attempt is (e.g. "Slurm 12: PENDING (Resources)"), from the row
    where = (job.executor_ref or {}).get("where") if running else None
    reason = reason or where or ""
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "attempt": job.shown_attempt,
        "started": job.attempt > 0,  # the table shows "-" for the attempt of a job never started
        "gpus": job.gpus,
        "step": step,
        "total_steps": total,
        "eta_s": None if eta is None else round(eta, 1),
        "steps_per_s": None if rate is None else round(rate, 3),
        "runtime_s": round(job.run_seconds, 1),
        "cost": round(job.cost, 4),
        "projected_cost": None if projected is None else round(projected.cost, 4),
        "projection_is_upper_bound": None if projected is None else projected.upper_bound,
        "priority": job.priority,
        "reason": reason,
        "where": where,
        # a Ray attempt's submission id, Ray's state and node (views/ray_where.py); absent otherwise
        **({RAY: ray} if (ray := ray_now(job)) else {}),
        "submitted_at": job.submitted_at,
        # the spec is parsed only when its text names a deadline (`orch status` over 10,000 jobs parses none)
        **({"deadline": job.spec.get("deadline")} if job.state.is_active and '"deadline"' in job.spec_json else {}),
    }


def status_rows(store: Store, home: Home, now: float, *, include_all: bool = False) -> list[dict[str, Any]]:
    jobs = store.jobs() if include_all else store.jobs([JobState.QUEUED, JobState.RUNNING])
    deps = {d for j in jobs if j.state is JobState.QUEUED for d in j.after_ids}
    dep_states = store.states_of(deps)
    latest = store.latest_attempts(j.id for j in jobs if j.state is JobState.RUNNING and j.attempt)
    up = daemon_running(home) if any(j.state is JobState.QUEUED for j in jobs) else True
    return [status_row(job, home, now, dep_states=dep_states, attempt=latest.get(job.id), daemon_up=up) for job in jobs]


def daemon_running(home: Home) -> bool:
    from ..home.daemon_lock import running_pid

    return running_pid(home) is not None


def list_checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    folder = checkpoint_dir(run_dir)
    out = []
    if folder.is_dir():
        for path in sorted(folder.glob("*" + CKPT_SUFFIX)):
            parsed = parse_checkpoint_name(path.name)
            step = parsed.step if parsed else None
            try:  # a Trainer checkpoint is a link to a folder: its files add up
                size = (
                    sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                    if path.is_dir()
                    else path.stat().st_size
                )
            except OSError:
                continue
            out.append({"path": str(path), "step": step, "bytes": size})
    out.sort(key=lambda c: (c["step"] is None, c["step"] or 0))
    return out


def masked_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """[env] values may be secrets (tokens, keys): `show --json` and the dashboard give their names only."""
    spec = dict(spec)
    raw_env = spec.get("env")
    env: dict[str, Any] = raw_env if isinstance(raw_env, dict) else {}
    if isinstance(spec.get("command"), list):  # `--token=hf_...`, or a secret [env] value typed again
        named = set(spec.get("secret_env") or [])
        secrets = [str(v) for k, v in env.items() if k in named or is_secret_name(k)]
        spec["command"] = [redact(str(part), secrets) for part in spec["command"]]
    if env:
        spec["env"] = {k: "***" for k in env}
    tracking = spec.get("tracking")
    if isinstance(tracking, dict) and isinstance(tracking.get("mlflow_uri"), str):  # http://user:password@host
        spec["tracking"] = {**tracking, "mlflow_uri": redact(tracking["mlflow_uri"])}  # the one masking rule
    return spec


def show_data(
    store: Store, home: Home, job_id: int, now: Optional[float] = None, *, reveal: bool = False
) -> dict[str, Any]:
    now = time.time() if now is None else now
    job = store.get(job_id)
    attempts = store.attempts(job_id)
    dep_states = store.states_of(job.after_ids)
    data = status_row(
        job,
        home,
        now,
        dep_states=dep_states,
        attempt=attempts[-1] if attempts else None,
        with_progress=True,
        daemon_up=job.state is not JobState.QUEUED or daemon_running(home),
    )
    run_dir = home.run_dir(job_id)
    result = read_json(run_dir / RESULT)
    data.update(
        {
            "spec": job.spec if reveal else masked_spec(job.spec),
            "spec_path": job.spec_path,
            "kind": job.kind,
            "run_dir": str(run_dir),
            "after": job.after_ids,
            "not_before": job.not_before,
            "retries": job.retries,
            "failures": job.failures,
            "git": {"commit": job.git_commit, "dirty": job.git_dirty},
            "provenance": provenance_summary(run_dir),
            "events": [{"at": e.at, "kind": e.kind, "detail": e.detail} for e in store.events(job_id)],
            "attempts": [
                {
                    "n": a.n,
                    "started_at": a.started_at,
                    "ended_at": a.ended_at,
                    "gpus": a.gpu_ids,
                    "exit_code": a.exit_code,
                    "signal": a.exit_signal,
                    "outcome": a.outcome,
                    "resumed_from_step": a.resumed_from_step,
                    "step_reached": a.step_reached,
                    # Ray's submission id and node of a Ray attempt, and the words for them (views/ray_where.py)
                    **({RAY: ray, "where": ray_text(ray)} if (ray := ray_attempt(job, run_dir, a.n)) else {}),
                }
                for a in attempts
            ],
            "checkpoints": list_checkpoints(run_dir),
            "result": result,
            "snapshot_memory": read_json(run_dir / SNAPSHOT_MEMORY),  # training/resume/memory_guard.py's decision
            "gpu_hours": round(job.gpu_seconds / 3600, 4),
            "steps_lost": job.steps_lost,
            "waste_s": round(job.waste_seconds, 1),
            "waste_cost": round(job.waste_cost, 4),
            "max_cost": job.max_cost,
            "max_hours": job.max_hours,
            # Every machine the job ran on, when it is mirrored (the bill above sums over them all).
            "machines": (store.mirror_state(job_id) or {}).get("machines") or [],
        }
    )
    return data
