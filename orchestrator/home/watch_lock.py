"""One `orch watch` per $ORCH_HOME, enforced with flock on watch.lock (held for the controller's
whole life; the kernel releases it if the process dies). The holder's pid is written into the lock
file, so a second `orch watch` can name it. Two controllers of one home would share one store and
one machine ledger and stop each other's machines twice."""

from __future__ import annotations

import fcntl
import os
from typing import Optional

from ..model.errors import OrchError
from .paths import Home

LOCK_NAME = "watch.lock"
STATE_NAME = "watch.json"  # the running controller's passes: {"pid", "passes", "at"}


class WatchRunning(OrchError):
    """Another `orch watch` holds this home."""


class WatchLock:
    def __init__(self, home: Home):
        self.path = home.root / LOCK_NAME
        self.home = home
        self.fd: Optional[int] = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise WatchRunning(
                f"another `orch watch` runs for {self.home.root}"
                + (f" (pid {other})" if other.isdigit() else "")
                + ": one controller per home (stop it first, or give this one its own --home)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def record_pass(home: Home, passes: int, now: float) -> None:
    """The controller's pass count, for `orch status` in its home and for tests that count polls."""
    import json

    path = home.root / STATE_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "passes": passes, "at": now}))
    tmp.replace(path)
