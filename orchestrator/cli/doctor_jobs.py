"""`orch doctor`'s checks of the running jobs (each attempt as its executor sees it: settled, gone,
alive with its progress fresh or stale) and of orphan processes of attempts orch no longer runs."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Optional

from ..model.executor_kinds import executor_kind
from ..host import procs
from ..contract import ENV_ATTEMPT, ENV_JOB_ID, ENV_RUN_DIR
from ..home.paths import Home
from ..model.records import SUPERVISOR_MODULE, Job
from ..model.states import JobState
from .doctor_findings import BAD, OK, WARN, Finding

PROGRESS_STALE_S = 15 * 60  # a running job's progress.json older than this (or its watchdog) is stale


# -- running jobs and orphans -----------------------------------------------------------------------


def check_jobs(
    home: Home, config: Any, jobs: list[Job], daemon_pid: Optional[int], out: list[Finding], now: float
) -> None:
    """Each running job's attempt, as the executor that runs it sees it (the daemon's, from
    config.toml: a local supervisor, a Slurm job): ended but not settled, gone, or alive with its
    progress fresh or stale."""
    from ..spec.config import load_config
    from ..contract import PROGRESS, attempt_pid, read_json
    from ..executors import build_executor
    from ..host.procs import is_alive

    running = [j for j in jobs if j.state is JobState.RUNNING]
    if not running:
        return
    executor = build_executor(config or load_config(None), home)
    try:
        executor.exchange(running, now)  # no daemon lock here: the look is made in this process
        executor.refresh(running, now)
    except Exception as exc:  # a cluster queue that cannot be asked: say so, do not guess
        out.append(
            Finding(
                "jobs",
                WARN,
                f"cannot ask the {executor.name} executor about its jobs: {exc}",
                "orch daemon status  # and the daemon log",
            )
        )
        return
    restart_note = "orch daemon start" if daemon_pid is None else "nothing: the daemon settles it on its next tick"
    for job in running:
        run_dir = home.run_dir(job.id)
        label = f"job {job.id} ({job.name})"
        if not job.supervisor_pid and not job.executor_ref:  # the daemon died before recording it
            job = replace(job, **(executor.adopt(job) or {}))
        if executor.exit(job) is not None:
            out.append(
                Finding(
                    "jobs",
                    WARN if daemon_pid else BAD,
                    f"{label}: attempt {job.attempt} has ended but is not settled yet",
                    restart_note,
                )
            )
            continue
        # The job's own pid means something only on this machine (a Slurm step runs on a node).
        info = (
            (read_json(run_dir / attempt_pid(job.attempt)) or {})
            if executor_kind(executor.name).on_this_machine
            else {}
        )
        job_alive = is_alive(info.get("job_pid"), info.get("job_start"))
        if not executor.alive(job):
            if job_alive:
                out.append(
                    Finding(
                        "jobs",
                        BAD,
                        f"{label}: its supervisor is gone but the job (pid {info.get('job_pid')}) runs unwatched",
                        restart_note.replace("settles", "stops and requeues"),
                    )
                )
            else:
                out.append(
                    Finding(
                        "jobs",
                        BAD,
                        f"{label}: attempt {job.attempt} is gone ({executor.name} executor)",
                        restart_note.replace("settles", "requeues"),
                    )
                )
            continue
        where = executor.describe(job)
        if info.get("job_pid") and not job_alive:
            out.append(Finding("jobs", WARN, f"{label}: supervisor alive, job process not started or just ended"))
            continue
        spec = job.spec if job.spec_json else {}
        limit = spec.get("watchdog_minutes") or (spec.get("train") or {}).get("hang_minutes")
        stale_after = float(limit) * 60 if limit else PROGRESS_STALE_S
        progress = read_json(run_dir / PROGRESS) or {}
        age = now - float(progress.get("updated_at") or info.get("started_at") or now)
        if progress and age > stale_after:
            out.append(
                Finding(
                    "jobs",
                    WARN,
                    f"{label}: progress.json not updated for {age / 60:.0f} min (step {progress.get('step')}): hung?",
                    f"orch logs {job.id} -n 50  # set watchdog_minutes / [train] hang_minutes to act on it",
                )
            )
        else:
            step = f"step {progress.get('step')}" if progress else "no progress yet"
            alive = (
                "supervisor and job alive"
                if info
                else f"{executor.name} attempt alive" + (f" ({where})" if where else "")
            )
            out.append(Finding("jobs", OK, f"{label}: {alive}, {step}"))


def orch_processes(home: Home) -> list[tuple[int, str, str, bool]]:
    """(pid, job id, attempt, is supervisor) of every process whose environment names a run folder
    of this home."""
    prefix = (str(home.runs) + os.sep).encode()
    found = []
    for pid in procs.pids():
        env = procs.environ(pid)
        if not env.get(ENV_RUN_DIR.encode(), b"").startswith(prefix) or procs.stat_fields(pid) is None:
            continue
        found.append(
            (
                pid,
                env.get(ENV_JOB_ID.encode(), b"?").decode(),
                env.get(ENV_ATTEMPT.encode(), b"?").decode(),
                SUPERVISOR_MODULE in procs.cmdline(pid),
            )
        )
    return found


def check_orphans(home: Home, jobs: list[Job], out: list[Finding]) -> None:
    current = {(str(j.id), str(j.attempt)) for j in jobs if j.state is JobState.RUNNING}
    orphans = [(pid, job, att) for pid, job, att, _ in orch_processes(home) if (job, att) not in current]
    if orphans:
        pids = " ".join(str(p) for p, _, _ in orphans)
        what = ", ".join(f"pid {p} (job {j} attempt {a})" for p, j, a in orphans[:4])
        out.append(
            Finding(
                "processes",
                BAD,
                f"{len(orphans)} orphan process(es) of attempts orch no longer runs: {what}",
                f"kill -9 {pids}",
            )
        )
    else:
        out.append(Finding("processes", OK, "no orphan job or supervisor processes"))
