"""`orch doctor`: check everything orch depends on and explain it in one screen — the daemon (alive,
pid file, lock, stale state), the store (SQLite integrity, permissions, schema version), each
running job (supervisor and job processes alive, progress fresh), orphan processes, free disk
where checkpoints go against the newest checkpoint's size, the config (as `config check`), the
notifiers (reachable: DNS and a TCP connect, nothing sent), the clock. Every problem comes with
the command that fixes it. Exit 0 healthy, 1 problems found. Reads only: never migrates the store,
signals a process or sends a message."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from .. import procs
from ..contract import ENV_ATTEMPT, ENV_JOB_ID, ENV_RUN_DIR
from ..executors.local import SUPERVISOR_MODULE
from ..paths import Home
from ..records import Job
from ..states import JobState

OK, WARN, BAD = "ok", "warn", "problem"
PROGRESS_STALE_S = 15 * 60  # a running job's progress.json older than this (or its watchdog) is stale


@dataclass
class Finding:
    area: str
    level: str
    text: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"area": self.area, "level": self.level, "text": self.text, "fix": self.fix}


def run_checks(home: Home, config_path: Path, config_required: bool, *, now: Optional[float] = None) -> list[Finding]:
    now = time.time() if now is None else now
    out: list[Finding] = []
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
    check_clock(home, out, now)
    return out


# -- the daemon ---------------------------------------------------------------------------------------


def check_daemon(home: Home, out: list[Finding]) -> Optional[int]:
    from ..daemon_control import running_pid
    from ..drain import requested

    pid = running_pid(home) if home.root.exists() else None
    pid_text = None
    try:
        pid_text = home.pid_file.read_text().strip()
    except OSError:
        pass
    if pid is None:
        if pid_text:
            out.append(
                Finding(
                    "daemon",
                    BAD,
                    f"no daemon holds the lock, but {home.pid_file} names pid {pid_text} "
                    "(a daemon that died without cleaning up)",
                    f"rm {home.pid_file} && orch daemon start",
                )
            )
        else:
            out.append(Finding("daemon", OK, "not running"))
        if requested(home) is not None:
            out.append(
                Finding(
                    "daemon",
                    WARN,
                    "a drain request is left over from a daemon that is gone",
                    f"rm {home.root / 'drain'}",
                )
            )
        return None
    if pid < 0:
        out.append(
            Finding(
                "daemon",
                BAD,
                f"a daemon holds {home.lock_file} but {home.pid_file} is unreadable",
                f"fuser {home.lock_file}  # then: kill -TERM <pid> && orch daemon start",
            )
        )
        return None
    if pid_text != str(pid):
        out.append(
            Finding(
                "daemon", BAD, f"pid file says {pid_text!r}, the lock holder is {pid}", f"echo {pid} > {home.pid_file}"
            )
        )
    drain = requested(home)
    state = "draining (running jobs finish, nothing new starts)" if drain is not None else "running"
    out.append(Finding("daemon", OK, f"{state}: pid {pid}, lock held"))
    return pid


# -- the store ----------------------------------------------------------------------------------------


def check_store(home: Home, out: list[Finding], now: float) -> list[Job]:
    from ..store import SCHEMA_VERSION, Store
    from ..store.inspect import StoreReadError, check_database

    db = home.db
    if not db.exists():
        out.append(Finding("store", OK, f"{db} not created yet (no job submitted)"))
        return []
    problems = []
    mode = stat.S_IMODE(db.stat().st_mode)
    if not os.access(db, os.R_OK | os.W_OK):
        problems.append(
            Finding(
                "store",
                BAD,
                f"{db} is not readable and writable by this user",
                f"chown {os.getuid()} {db} && chmod 600 {db}",
            )
        )
    if mode & 0o077:
        problems.append(
            Finding("store", BAD, f"{db} is mode {mode:o}: job [env] values may be secrets", f"chmod 600 {db}")
        )
    root_mode = stat.S_IMODE(home.root.stat().st_mode)
    if root_mode & 0o022:
        problems.append(
            Finding(
                "store", BAD, f"{home.root} is mode {root_mode:o}: others can write to it", f"chmod 700 {home.root}"
            )
        )
    jobs: list[Job] = []
    try:
        checked = check_database(db)
        if checked.problems:
            problems.append(
                Finding(
                    "store",
                    BAD,
                    "SQLite integrity check failed: " + "; ".join(checked.problems[:3]),
                    f"cp {db} {db}.broken && sqlite3 {db}.broken .recover | sqlite3 {db}.new"
                    f"  # then stop the daemon and move {db}.new over {db}",
                )
            )
        if checked.version != SCHEMA_VERSION:
            fix = (
                "orch status  # opening the store migrates it"
                if checked.version < SCHEMA_VERSION
                else "pip install -U orch  # this store was written by a newer orch"
            )
            problems.append(
                Finding("store", BAD, f"schema version {checked.version}, this orch expects {SCHEMA_VERSION}", fix)
            )
        else:
            store = Store(db, read_only=True)
            try:
                jobs = store.jobs([JobState.RUNNING, JobState.QUEUED])
            finally:
                store.close()
    except StoreReadError as exc:
        problems.append(Finding("store", BAD, f"cannot read {db}: {exc}", f"ls -l {db}  # and see `orch status`"))
    if problems:
        out.extend(problems)
    else:
        running = sum(1 for j in jobs if j.state is JobState.RUNNING)
        out.append(
            Finding(
                "store",
                OK,
                f"integrity ok, schema {SCHEMA_VERSION}, mode 600; {running} running, {len(jobs) - running} queued",
            )
        )
    return jobs


# -- running jobs and orphans -----------------------------------------------------------------------


def check_jobs(
    home: Home, config: Any, jobs: list[Job], daemon_pid: Optional[int], out: list[Finding], now: float
) -> None:
    """Each running job's attempt, as the executor that runs it sees it (the daemon's, from
    config.toml: a local supervisor, a Slurm job): ended but not settled, gone, or alive with its
    progress fresh or stale."""
    from ..config import load_config
    from ..contract import PROGRESS, attempt_pid, read_json
    from ..executors import build_executor
    from ..procs import is_alive

    running = [j for j in jobs if j.state is JobState.RUNNING]
    if not running:
        return
    executor = build_executor(config or load_config(None), home)
    try:
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
        info = (read_json(run_dir / attempt_pid(job.attempt)) or {}) if executor.name == "local" else {}
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


# -- disk ---------------------------------------------------------------------------------------------


def newest_checkpoint_size(home: Home) -> tuple[int, Optional[Path]]:
    from ..contract import checkpoint_dir, newest_checkpoint

    best, where = 0, None
    if not home.runs.is_dir():
        return 0, None
    for run in home.runs.iterdir():
        path, _ = newest_checkpoint(checkpoint_dir(run))
        try:
            if path is not None and path.stat().st_size > best:
                best, where = path.stat().st_size, path
        except OSError:
            continue
    return best, where


def check_disk(home: Home, out: list[Finding]) -> None:
    folder = home.runs if home.runs.exists() else home.root if home.root.exists() else home.root.parent
    usage = shutil.disk_usage(folder)
    size, where = newest_checkpoint_size(home)
    free = f"{usage.free / 1e9:.1f} GB free of {usage.total / 1e9:.1f} GB at {folder}"
    if size and where is not None and usage.free < size:
        out.append(
            Finding(
                "disk",
                BAD,
                f"{free}: less than one checkpoint ({size / 1e6:.0f} MB, {where.name}); the next save fails",
                f"du -sh {home.runs}/*/checkpoints  # free space, or lower [checkpoint] keep",
            )
        )
    elif size and usage.free < 3 * size:
        out.append(
            Finding(
                "disk",
                WARN,
                f"{free}: room for fewer than 3 checkpoints of {size / 1e6:.0f} MB",
                f"du -sh {home.runs}/*/checkpoints  # free space, or lower [checkpoint] keep",
            )
        )
    elif usage.free < 100e6:
        out.append(Finding("disk", BAD, f"{free}: the store and logs need room too", f"du -sh {home.root}/*"))
    else:
        room = f"; the newest checkpoint is {size / 1e6:.1f} MB" if size else ""
        out.append(Finding("disk", OK, free + room))


# -- config and notifiers ----------------------------------------------------------------------------


def check_config(path: Path, required: bool, out: list[Finding]) -> Any:
    from ..config import load_config
    from ..errors import ConfigError

    if not path.exists() and not required:
        out.append(Finding("config", OK, f"no {path}: the defaults apply"))
        return load_config(None)
    try:
        config = load_config(path, required=True, build_notifiers=True)
    except ConfigError as exc:
        first = exc.problems[0] if exc.problems else str(exc)
        more = f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        out.append(Finding("config", BAD, first + more, f"orch config check {path}"))
        return None
    out.append(Finding("config", OK, f"{path} is valid"))
    return config


def endpoint(raw: dict[str, Any]) -> Optional[tuple[str, int]]:
    """Host and port a notifier talks to, from its URL or SMTP host, without building it."""
    for key in ("url", "webhook", "webhook_url", "endpoint", "server"):
        value = raw.get(key)
        if isinstance(value, str) and "://" in value:
            parts = urlsplit(value)
            if parts.hostname:
                try:
                    port = parts.port
                except ValueError:
                    port = None
                return parts.hostname, port or (443 if parts.scheme == "https" else 80)
    for key in ("smtp_host", "host"):
        value = raw.get(key)
        if isinstance(value, str) and value:
            port = raw.get("smtp_port") or raw.get("port") or 587
            return value, int(port) if isinstance(port, int) else 587
    return None


def check_notifiers(config: Any, out: list[Finding], timeout: float = 3.0) -> None:
    if not config.notifiers:
        out.append(Finding("notifiers", OK, "none configured"))
        return
    for raw in config.notifiers:
        name = str(raw.get("name") or raw.get("type") or "?")
        target = endpoint(raw)
        if target is None:
            out.append(Finding("notifiers", OK, f"{name}: no network endpoint to check"))
            continue
        host, port = target
        try:
            addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4]
        except (socket.gaierror, UnicodeError) as exc:
            out.append(
                Finding(
                    "notifiers",
                    BAD,
                    f"{name}: cannot resolve {host}: {exc}",
                    f"getent hosts {host}  # check DNS, or the URL in config.toml",
                )
            )
            continue
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as exc:
            out.append(
                Finding(
                    "notifiers",
                    BAD,
                    f"{name}: {host}:{port} ({addr[0]}) does not accept connections: {exc}",
                    f"orch notify test --channel {name}  # after fixing the network or the URL",
                )
            )
            continue
        out.append(Finding("notifiers", OK, f"{name}: {host}:{port} reachable (nothing sent)"))


# -- the clock ------------------------------------------------------------------------------------------


def check_clock(home: Home, out: list[Finding], now: float) -> None:
    from ..store.inspect import newest_event_at

    latest = newest_event_at(home.db) if home.db.exists() else None
    if latest is not None and latest > now + 60:
        out.append(
            Finding(
                "clock",
                BAD,
                f"the clock is {latest - now:.0f}s behind the store's newest event: durations and costs will be wrong",
                "timedatectl set-ntp true",
            )
        )
        return
    synced = ntp_synchronized()
    if synced is False:
        out.append(Finding("clock", WARN, "the system clock is not NTP-synchronised", "timedatectl set-ntp true"))
        return
    out.append(
        Finding(
            "clock",
            OK,
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))
            + ("" if synced is None else ", NTP synchronised"),
        )
    )


def ntp_synchronized() -> Optional[bool]:
    """adjtimex(2) says whether the kernel clock is synchronised; None when it cannot be asked."""
    try:
        import ctypes
        import ctypes.util

        class Timex(ctypes.Structure):
            _fields_ = [("modes", ctypes.c_uint), ("pad", ctypes.c_byte * 256)]

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        state = libc.adjtimex(ctypes.byref(Timex()))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    return state != 5  # TIME_ERROR: not synchronised


# -- rendering ----------------------------------------------------------------------------------------


def render(findings: list[Finding]) -> str:
    mark = {OK: "ok  ", WARN: "warn", BAD: "FAIL"}
    lines = []
    for f in findings:
        lines.append(f"{mark[f.level]}  {f.area:<10} {f.text}")
        if f.fix and f.level != OK:
            lines.append(f"{'':16}fix: {f.fix}")
    problems = sum(1 for f in findings if f.level == BAD)
    warnings = sum(1 for f in findings if f.level == WARN)
    lines.append(
        "healthy" + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")
        if not problems
        else f"{problems} problem{'s' if problems != 1 else ''} found"
        + (f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else "")
    )
    return "\n".join(lines)
