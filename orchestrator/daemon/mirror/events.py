"""What the mirror tells the rest of the daemon: the store going down and coming back (one
`mirror_failed` event and notification, then `mirror_recovered`, with the lag on each active
job's row for `orch status`). `build_mirror` (the package's __init__) wires them, and a lost
lease, into the daemon."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from ...model.states import EventKind
from ...objectstore.remote import Remote, StorageError
from ...store import Store
from .lease import ACTIVE

log = logging.getLogger("orch.mirror")


class Outage:
    """The store being down: training goes on, uploads wait and retry, one warning says so."""

    def __init__(self, store: Store, remote: Remote, on_event: Callable[[EventKind, str], None]):
        self.store, self.remote, self.on_event = store, remote, on_event
        self.down_since: Optional[float] = None
        self.down_error = ""
        self.warned = False
        self._lock = threading.Lock()  # the uploader's pass and the stall watch (stall.py) both report

    def down(self, exc: StorageError, now: float) -> None:
        with self._lock:
            self._down(exc, now)

    def up(self, now: float) -> None:
        with self._lock:
            self._up(now)

    def _down(self, exc: StorageError, now: float) -> None:
        if self.down_since is None:
            self.down_since = now
        self.down_error = str(exc)
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is not None and not row["lost"] and not row["error"]:
                self.store.mirror_set(job.id, job.uid, error=str(exc), error_since=now)
        if not self.warned:
            self.warned = True
            detail = (
                f"the mirror cannot reach {self.remote.url.raw}: {exc}; training goes on, uploads wait and "
                "retry (`orch status` shows the lag)"
            )
            log.warning("mirror: %s", detail)
            self.on_event(EventKind.MIRROR_FAILED, detail)

    def _up(self, now: float) -> None:
        if self.down_since is None:
            return
        detail = (
            f"the mirror reaches {self.remote.url.raw} again after {now - self.down_since:.0f} s; uploads catching up"
        )
        log.info("mirror: %s", detail)
        self.down_since, self.down_error = None, ""
        if self.warned:
            self.warned = False
            self.on_event(EventKind.MIRROR_RECOVERED, detail)
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is not None and row["error"]:
                self.store.mirror_set(job.id, job.uid, error="", error_since=None)
