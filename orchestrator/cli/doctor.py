"""`orch doctor`: check everything orch depends on and explain it in one screen — the daemon (alive,
pid file, lock, stale state), the store (SQLite integrity, permissions, schema version), each
running job (supervisor and job processes alive, progress fresh), orphan processes, free disk
where checkpoints go against the newest checkpoint's size, the config (as `config check`), the
notifiers (reachable: DNS and a TCP connect, nothing sent), the clock, and on Ray whether the nodes
share the run folders and whether the head's Jobs API is plain HTTP on a public address. Every problem comes with the command that fixes it. Exit 0 healthy, 1
problems found. Reads only: never migrates the store, signals a process or sends a message (on Ray
it runs one tiny probe job, the only thing it starts)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from ..home.paths import Home
from .doctor_config import check_config, check_notifiers
from .doctor_findings import BAD, OK, WARN, Finding
from .doctor_home import check_clock, check_daemon, check_disk, check_store
from .doctor_jobs import check_jobs, check_orphans


def run_checks(home: Home, config_path: Path, config_required: bool, *, now: Optional[float] = None) -> list[Finding]:
    now = time.time() if now is None else now
    out: list[Finding] = []
    unusable = home.unusable()
    if unusable:  # nothing else can be looked at
        return [Finding("home", BAD, f"orch's home: {unusable}", "set ORCH_HOME (or --home) to a folder you can write")]
    daemon_pid = check_daemon(home, out)
    jobs = check_store(home, out, now)
    if daemon_pid is None and jobs:
        out.append(
            Finding("daemon", BAD, f"{len(jobs)} job(s) queued or running but no daemon runs them", "orch daemon start")
        )
    config_findings: list[Finding] = []
    config = check_config(config_path, config_required, config_findings)
    check_jobs(home, config, jobs, daemon_pid, out, now)
    check_orphans(home, jobs, out)
    check_disk(home, out)
    out.extend(config_findings)
    if config is not None:
        check_notifiers(config, out)
        check_executor(home, config, out)
    check_clock(home, out, now)
    return out


def check_executor(home: Home, config, out: list[Finding]) -> None:
    """The configured executor's own checks, as its kind declares them (model/executor_kinds.py):
    on Ray, that the run folders are on a filesystem every node shares (one tiny Ray job reads a
    file written here and writes one back: the only thing doctor starts)."""
    from ..executors import run_doctor_checks

    levels = {"ok": OK, "warn": WARN, "bad": BAD}
    for area, level, text, fix in run_doctor_checks(config, home):
        out.append(Finding(area, levels[level], text, "" if level == "ok" else fix))
