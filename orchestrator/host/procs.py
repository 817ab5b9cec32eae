"""Process identity on Linux: a pid alone can be recycled, so every process orch keeps track of
is named by (pid, start time) read from /proc."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable, Iterator, Optional


# Indices into stat_fields(): /proc/PID/stat after the command name.
STATE, PGRP, SESSION, STARTTIME = 0, 2, 3, 19


def pids() -> Iterator[int]:
    """Every process on this machine (a snapshot of /proc; any may be gone by the time it is read)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def stat_fields(pid: int) -> Optional[list[str]]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses, so
    the split is after the last ')'), or None for a process that is gone or a zombie (it has
    finished; only its parent's wait is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields if len(fields) > STARTTIME and fields[STATE] not in ("Z", "X") else None


def environ(pid: int) -> dict[bytes, bytes]:
    """A process's environment (empty when it cannot be read: gone, or another user's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    fields = stat_fields(pid)
    return fields[STARTTIME] if fields else None


def boot_id() -> Optional[str]:
    """This boot's id (/proc/sys/kernel/random/boot_id): a pid and a start time recorded under
    another boot name nothing that runs now (after a reboot the same numbers come round again)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def is_alive(pid: Optional[int], started: Optional[str]) -> bool:
    if not pid:
        return False
    now_start = start_time(pid)
    return now_start is not None and (started is None or now_start == started)


def signal_process(pid: Optional[int], started: Optional[str], sig: int) -> bool:
    """Send `sig` to pid only if it is still the process we started."""
    if not is_alive(pid, started):
        return False
    try:
        os.kill(pid, sig)  # type: ignore[arg-type]
        return True
    except ProcessLookupError:
        return False


def signal_group(pgid: Optional[int], sig: int = signal.SIGKILL) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_members(pgid: Optional[int]) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    return _members(PGRP, pgid)


def session_members(sid: Optional[int]) -> list[int]:
    """Live (non-zombie) processes whose session is `sid` (a local attempt's supervisor leads one)."""
    return _members(SESSION, sid)


def with_environment(**wanted: str) -> list[int]:
    """Live processes (not this one) whose environment has every NAME=value given."""
    want = {k.encode(): v.encode() for k, v in wanted.items()}
    found = []
    for pid in pids():
        if pid == os.getpid():
            continue
        env = environ(pid)
        if env and all(env.get(k) == v for k, v in want.items()) and stat_fields(pid) is not None:
            found.append(pid)
    return found


def _members(index: int, value: Optional[int]) -> list[int]:
    if not value:
        return []
    out = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields is not None and fields[index] == str(value):
            out.append(pid)
    return out


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def own_group_dying_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn: the child gets its own process group, and `sig` (SIGTERM: "checkpoint and
    exit") when this process dies (Linux's PR_SET_PDEATHSIG; elsewhere only the process group)."""
    import ctypes  # only here: most commands never start a job

    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    except (OSError, AttributeError):
        prctl = None

    def setup() -> None:
        os.setpgrp()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig)
            if os.getppid() != parent:  # it died before the request took
                os.kill(os.getpid(), sig)

    return setup
