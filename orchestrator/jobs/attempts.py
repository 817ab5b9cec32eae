"""Beginning an attempt, shared by the daemon and `orch run`: choose the checkpoint to resume
from, count the steps lost, build the contract's command and environment, record the start.
Settling one is settling.py's. Both entry points call these, so they cannot drift apart."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..spec.config import Config
from ..contract import (
    CHECKPOINTS,
    ENV_ATTEMPT,
    ENV_CKPT_DIR,
    ENV_JOB_ID,
    ENV_MTBF_S,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    JOB_TOML,
    ENV_SNAPSHOTS_HELD,
    ENV_TENSORBOARD_DIR,
    PACKAGES_TXT,
    SNAPSHOT_MEMORY,
    TRACKING,
    newest_checkpoint,
    provenance_dir,
    read_json,
    tracker_env,
)
from ..model.errors import InvalidTransition
from ..host.gpus import visible_devices
from ..host.env_observe import MachineFacts, Observed, observe
from ..host.env_record import EnvCheck, check_environment
from .instrument import instrument_env
from .lifecycle import change_state, write_run_spec
from ..home.paths import Home
from ..model.records import Attempt, AttemptLaunch, AttemptStart, Job
from ..model.states import EventKind, JobState
from ..store import Store

# -- the contract's command and environment ---------------------------------------------------


def job_argv(spec: Mapping, run_dir: Path) -> tuple[list[str], Optional[str]]:
    """(argv, cwd) for a job: its own command, or the built-in runner on the run folder."""
    if spec.get("command"):
        # `orch submit` always records a workdir; a hand-written manifest may not: its run folder,
        # never wherever the daemon happened to be started
        return list(spec["command"]), spec.get("workdir") or str(run_dir)
    return [sys.executable, "-m", "training.run", str(run_dir)], str(run_dir)


def job_env(
    base: Mapping[str, str],
    *,
    job_id: int,
    attempt: int,
    run_dir: Path,
    gpu_ids: Sequence[int],
    resume_from: Optional[Path],
    extra: Mapping[str, str],
    trackers: Optional[Mapping[str, str]] = None,
    instrument: str = "off",
) -> dict[str, str]:
    """The attempt's whole environment: `base` (the machine's) and job_vars over it."""
    own = job_vars(
        job_id=job_id,
        attempt=attempt,
        run_dir=run_dir,
        gpu_ids=gpu_ids,
        resume_from=resume_from,
        extra=extra,
        trackers=trackers,
        instrument=instrument,
        base=base,
    )
    return {**base, **own}


def job_vars(
    *,
    job_id: int,
    attempt: int,
    run_dir: Path,
    gpu_ids: Sequence[int],
    resume_from: Optional[Path],
    extra: Mapping[str, str],
    trackers: Optional[Mapping[str, str]] = None,
    instrument: str = "off",
    base: Optional[Mapping[str, str]] = None,
) -> dict[str, str]:
    """What orch gives the attempt beyond the machine's environment (`base`): the trackers'
    variables, the job's `extra` ([env], and the pass_env names' values) and the contract's, in that
    order of say; with `instrument`, its bootstrap first on PYTHONPATH, before the job's own
    PYTHONPATH ([env]'s, else the machine's), which stays."""
    env = dict(trackers or {})  # the job's own [env] may override a tracker variable
    env.update(extra)
    env.update(
        {
            ENV_JOB_ID: str(job_id),
            ENV_ATTEMPT: str(attempt),
            ENV_RUN_DIR: str(run_dir),
            ENV_CKPT_DIR: str(run_dir / CHECKPOINTS),
            ENV_RESUME_FROM: str(resume_from) if resume_from else "",
            "CUDA_VISIBLE_DEVICES": visible_devices(gpu_ids),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(instrument_env(instrument, {**(base or {}), **env}))  # after [env]: its PYTHONPATH kept, behind
    return env


def grace_for(job: Job, config: Config) -> float:
    """SIGTERM -> SIGKILL for this job: its own `grace_seconds`, else the config's."""
    return float(job.spec.get("grace_seconds") or config.daemon.grace_seconds)


@dataclass(frozen=True)
class Command:
    """What an attempt runs, and with which environment."""

    argv: list[str]
    cwd: Optional[str]
    env: dict[str, str]
    resume_path: Optional[Path]
    resume_step: Optional[int]
    job_vars: dict[str, str]  # what of `env` orch gives beyond the machine's environment


def attempt_command(run_dir: Path, job: Job, n: int, gpu_ids: Sequence[int], environ: Mapping[str, str]) -> Command:
    """Attempt n's command and contract environment (no side effects: observe_start builds it too)."""
    resume_path, resume_step = newest_checkpoint(run_dir / CHECKPOINTS)
    argv, cwd = job_argv(job.spec, run_dir)
    # pass_env: what the job takes from the daemon's environment by name (all of it is there on
    # this machine anyway; a cluster job is given nothing else of it). ORCH_MTBF_S is the daemon's
    # word for its jobs, kept in its environment.
    passed = {name: environ[name] for name in [*(job.spec.get("pass_env") or []), ENV_MTBF_S] if name in environ}
    own = job_vars(
        job_id=job.id,
        attempt=n,
        run_dir=run_dir,
        gpu_ids=gpu_ids,
        resume_from=resume_path,
        extra={**passed, **(job.spec.get("env") or {})},
        trackers=tracker_env(job.uid, job.spec.get("tracking"), job.name, read_json(run_dir / TRACKING)),
        instrument=job.spec.get("instrument") or "off",
        base=environ,
    )
    return Command(argv, cwd, {**environ, **own}, resume_path, resume_step, own)


def observe_start(
    home: Home,
    job: Job,
    environ: Mapping[str, str],
    *,
    machine: Optional[MachineFacts] = None,
    previous: Optional[Observed] = None,
) -> Observed:
    """The slow half of begin_attempt's environment check for this queued job's next attempt,
    learnt without touching the store (the daemon runs it before it takes its lock)."""
    cmd = attempt_command(home.run_dir(job.id), job, job.attempt + 1, [], environ)
    return observe(cmd.argv, cmd.env, cmd.cwd, machine=machine, previous=previous)


# -- begin ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Begun:
    job: Job  # the job as recorded running (stopped, when `launch` is None)
    launch: Optional[AttemptLaunch]  # None: stopped before training (on_env_change = "stop")
    resume_step: Optional[int]
    also: tuple[EventKind, ...] = ()  # events recorded beside the start (env_changed; their hooks run too)


def begin_attempt(
    store: Store,
    config: Config,
    home: Home,
    job: Job,
    gpu_ids: list[int],
    now: float,
    *,
    environ: Mapping[str, str],
    executor: str,
    where: str = "",
    observed: Optional[Observed] = None,
) -> Optional[Begun]:
    """Record the next attempt of a queued job as running and build its launch. None when the job
    is no longer where the caller read it (another process moved it first). `executor` is the kind
    that will start it (records.LOCAL, "slurm", "ray", records.FOREGROUND), recorded in the same
    transaction, so whoever watches the attempt asks the executor that started it. `observed`: what
    observe_start learnt of its environment beforehand (the daemon, off its lock); without it the
    job's interpreter is asked here."""
    run_dir = home.make_run_dir(job.id)  # a link planted at runs/<id> is refused, never followed
    if not (run_dir / JOB_TOML).exists():
        write_run_spec(home, job.id, job.spec)
    (run_dir / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    n = job.attempt + 1
    cmd = attempt_command(run_dir, job, n, gpu_ids, environ)
    argv, cwd, env, resume_path, resume_step = cmd.argv, cmd.cwd, cmd.env, cmd.resume_path, cmd.resume_step
    kind = EventKind.RESUMED if resume_path else EventKind.STARTED
    detail = f"attempt {n}" + (f" on GPU {','.join(map(str, gpu_ids))}" if gpu_ids else " on the CPU") + where
    if resume_path:
        detail += f", resuming from step {resume_step} ({resume_path.name})"
    checked = check_environment(run_dir, argv, env, cwd, n, now, observed)
    also = [(EventKind.ENV_CHANGED, checked.detail)] if checked.detail else []
    if checked.detail and job.spec.get("on_env_change") == "stop":
        return _stop_for_environment(store, config, home, job, n, checked, now)
    try:
        started = change_state(
            store,
            config,
            home,
            job,
            JobState.RUNNING,
            kind,
            now,
            detail=detail,
            expect=[job.state],
            updates={**lost_steps_updates(job, store.attempts(job.id), resume_step), "executor": executor},
            begin_attempt=AttemptStart(n, list(gpu_ids), resume_step),
            also=also,
        )
    except InvalidTransition:
        return None

    own = dict(cmd.job_vars)
    own[ENV_SNAPSHOTS_HELD] = str(snapshots_held(store, home, job.id))
    if config.logging.tensorboard_dir:  # the runner links its TensorBoard folder there
        own[ENV_TENSORBOARD_DIR] = str(Path(config.logging.tensorboard_dir).expanduser())
    env.update(own)
    launch = AttemptLaunch(
        job_id=job.id,
        attempt=n,
        run_dir=run_dir,
        argv=argv,
        cwd=cwd,
        env=env,
        grace_s=grace_for(started, config),
        gpu_ids=list(gpu_ids),
        spec=started.spec,
        job_uid=started.uid,
        job_vars=own,
    )
    return Begun(started, launch, resume_step, tuple(kind for kind, _ in also))


def _stop_for_environment(
    store: Store, config: Config, home: Home, job: Job, n: int, checked: EnvCheck, now: float
) -> Optional[Begun]:
    """on_env_change = "stop": the job is stopped before attempt n trains (no attempt is recorded),
    like a budget stop: its checkpoints stay, and `orch retry` runs it again once the environment is
    back (or accepted with --accept-env)."""
    names = ", ".join(str(c) for c in checked.changed[:3]) + (
        f" and {len(checked.changed) - 3} more" if len(checked.changed) > 3 else ""
    )
    reason = (
        f'its environment changed since its first attempt ({names}) and on_env_change = "stop": '
        f"reinstall what {provenance_dir(home.run_dir(job.id)) / PACKAGES_TXT} lists and `orch retry {job.id}`, "
        f"or go on in this one with `orch retry {job.id} --accept-env`"
    )
    try:
        stopped = change_state(
            store,
            config,
            home,
            job,
            JobState.STOPPED,
            EventKind.STOPPED,
            now,
            detail=f"before attempt {n} started: " + reason,
            reason=reason,
            expect=[job.state],
            also=[(EventKind.ENV_CHANGED, checked.detail)],
        )
    except InvalidTransition:
        return None
    return Begun(stopped, None, None, (EventKind.ENV_CHANGED,))


def snapshots_held(store: Store, home: Home, job_id: int) -> int:
    """Host memory the other running jobs' background snapshots hold (their SNAPSHOT_MEMORY)."""
    held = 0
    for other in store.jobs([JobState.RUNNING]):
        info = read_json(home.run_dir(other.id) / SNAPSHOT_MEMORY) if other.id != job_id else None
        if info and info.get("background") and isinstance(info.get("state_bytes"), int):
            held += max(0, info["state_bytes"])
    return held


def lost_steps_updates(job: Job, attempts: Sequence[Attempt], resume_step: Optional[int]) -> dict[str, Any]:
    """Steps the previous attempt reached beyond the checkpoint the next one resumes from had to
    be recomputed: that is the preemption waste, in steps, seconds (at the previous attempt's mean
    step time) and money (at the job's own mean rate)."""
    if not attempts:
        return {}
    prev = attempts[-1]
    if prev.step_reached is None or prev.ended_at is None:
        return {}
    lost = max(0, prev.step_reached - (resume_step or 0))
    if not lost:
        return {}
    done = prev.step_reached - (prev.resumed_from_step or 0)
    step_s = (prev.ended_at - prev.started_at) / done if done > 0 else 0.0
    rate = job.cost / job.run_seconds if job.run_seconds > 0 else 0.0
    return {
        "steps_lost": job.steps_lost + lost,
        "waste_seconds": job.waste_seconds + lost * step_s,
        "waste_cost": job.waste_cost + lost * step_s * rate,
    }
