"""Process identity on Linux: a pid alone can be recycled, so every process orch keeps track of
is named by (pid, start time) read from /proc. Also: atomic small-file writes."""

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


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: a reader sees the old
    file or the new one, never half of one, even after a power cut."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
