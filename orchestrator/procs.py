"""Process identity on Linux: a pid alone can be recycled, so every process orch keeps track of
is named by (pid, start time) read from /proc."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Optional


def start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    state = fields[0] if fields else "X"
    if state in ("Z", "X"):  # a zombie has finished; only its parent's wait is missing
        return None
    return fields[19] if len(fields) > 19 else None


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
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc."""
    if not pgid:
        return []
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        # fields[0] is the state, fields[2] the process group
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members
