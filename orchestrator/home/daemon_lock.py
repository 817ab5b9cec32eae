"""One daemon per $ORCH_HOME, enforced with flock on daemon.lock (a pid file alone lies after a
crash); starting it detached, stopping it, and asking whether it runs."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from typing import Any, Optional

from ..model.errors import DaemonError
from .paths import Home
from ..host.polling import poll
from .wake import poke


class DaemonLock:
    """Held for the daemon's whole life; the kernel releases it if the daemon dies."""

    def __init__(self, home: Home):
        self.home = home
        self.fd: Optional[int] = None

    def acquire(self, wait_s: float = 1.0) -> None:
        fd = os.open(self.home.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        # `running_pid` (the CLI, the dashboard's polls) takes the lock for an instant to ask: a
        # daemon starting in that instant tries again for a moment instead of refusing to start.
        if not poll(lambda: _try_lock(fd), wait_s, 0.05):
            os.close(fd)
            pid = _read_pid(self.home)
            raise DaemonError(
                f"a daemon is already running for {self.home.root}"
                + (f" (pid {pid})" if pid else "")
                + "; `orch daemon stop` stops it"
            ) from None
        self.fd = fd
        tmp = self.home.pid_file.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        tmp.replace(self.home.pid_file)
        # kept after the daemon stops: the next one is started the same way, and submit's
        # pre-flight checks a job in the Python its daemon runs jobs with (Home.job_python)
        tmp = self.home.daemon_python_file.with_suffix(".tmp")
        tmp.write_text(f"{sys.executable}\n")
        tmp.replace(self.home.daemon_python_file)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _read_pid(self.home) == os.getpid():
                self.home.pid_file.unlink()
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_pid(home: Home) -> Optional[int]:
    try:
        return int(home.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def running_pid(home: Home) -> Optional[int]:
    """The daemon's pid if one holds the lock, else None (-1: one holds it, its pid file is
    unreadable). The one answer to "is a daemon running?" for the CLI and the dashboard: the lock,
    not the pid file, which lies after a crash (and its pid may be another process's by now).
    Read-only: a dashboard that may not write the home can still ask."""
    if not home.lock_file.exists():
        return None
    try:
        fd = os.open(home.lock_file, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(home) or -1
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def start_detached(home: Home, config_arg: Optional[str], wait_s: float = 15.0) -> int:
    pid = running_pid(home)
    if pid is not None:
        raise DaemonError(f"a daemon is already running for {home.root} (pid {pid})")
    argv = [sys.executable, "-m", "orchestrator.cli", "--home", str(home.root)]
    if config_arg:
        argv += ["--config", config_arg]
    argv += ["daemon", "run", "--detached"]
    err_path = home.root / "daemon.err"
    with open(err_path, "ab") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True, close_fds=True
        )

    def listening() -> bool:
        if proc.poll() is not None:
            tail = err_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise DaemonError("the daemon exited at start:\n  " + "\n  ".join(tail))
        # Ready once it listens on the wake socket (it takes the lock first, then recovers and
        # binds): a submit right after `daemon start` then reaches it instead of printing "no daemon".
        return running_pid(home) == proc.pid and poke(home.wake_socket)

    if poll(listening, wait_s, 0.02):
        return proc.pid
    raise DaemonError(f"the daemon (pid {proc.pid}) did not start listening within {wait_s:g}s; see {err_path}")


def stop(home: Home, timeout: float = 120.0) -> int:
    pid = running_pid(home)
    if pid is None:
        raise DaemonError(f"no daemon is running for {home.root}")
    if pid < 0:
        raise DaemonError(
            f"a daemon holds {home.lock_file} but {home.pid_file} is unreadable; "
            f"find it with `fuser {home.lock_file}` and send it SIGTERM"
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise DaemonError(f"no daemon is running for {home.root} (stale pid {pid})") from None
    if poll(lambda: running_pid(home) is None, timeout, 0.1):
        return pid
    raise DaemonError(
        f"the daemon (pid {pid}) is still checkpointing its jobs after {timeout:g}s; "
        "wait, or `orch daemon stop --timeout` longer"
    )


def describe(home: Home) -> dict[str, Any]:
    pid = running_pid(home)
    uptime = None
    if pid:
        try:
            uptime = time.time() - home.pid_file.stat().st_mtime
        except OSError:
            pass
    return {"running": pid is not None, "pid": pid, "uptime_s": uptime, "home": str(home.root)}
