"""`orch doctor`'s checks of the home: the daemon (alive, pid file, lock, a drain left over), the
store (integrity, permissions, schema version), free disk against the newest checkpoint, the clock."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import Optional

from ..home.paths import Home
from ..model.records import Job
from ..model.states import JobState
from .doctor_findings import BAD, OK, WARN, Finding

# -- the daemon ---------------------------------------------------------------------------------------


def check_daemon(home: Home, out: list[Finding]) -> Optional[int]:
    from ..home.daemon_lock import running_pid
    from ..home.drain import requested

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
                else "pip install -U orch-gpu  # this store was written by a newer orch"
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
