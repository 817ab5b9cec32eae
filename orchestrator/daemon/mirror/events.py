"""What the mirror tells the rest of the daemon: the store going down and coming back (one
`mirror_failed` event and notification, then `mirror_recovered`, with the lag on each active
job's row for `orch status`), and `build_mirror`, which wires a lost lease and those events into
the daemon."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from ...records import Job
from ...states import EventKind, JobState
from ...storage.remote import Remote, StorageError
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

    def down(self, exc: StorageError, now: float) -> None:
        if self.down_since is None:
            self.down_since = now
        self.down_error = str(exc)
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is not None and not row["lost"] and not row["error"]:
                self.store.mirror_set(job.id, job.uid, error=str(exc), error_since=now)
        if not self.warned:
            self.warned = True
            detail = (f"the mirror cannot reach {self.remote.url.raw}: {exc}; training goes on, uploads wait and "
                      "retry (`orch status` shows the lag)")
            log.warning("mirror: %s", detail)
            self.on_event(EventKind.MIRROR_FAILED, detail)

    def up(self, now: float) -> None:
        if self.down_since is None:
            return
        detail = f"the mirror reaches {self.remote.url.raw} again after {now - self.down_since:.0f} s; uploads catching up"
        log.info("mirror: %s", detail)
        self.down_since, self.down_error = None, ""
        if self.warned:
            self.warned = False
            self.on_event(EventKind.MIRROR_RECOVERED, detail)
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is not None and row["error"]:
                self.store.mirror_set(job.id, job.uid, error="", error_since=None)


def build_mirror(rt: Any) -> Optional[Any]:
    """The runtime's uploader, wired to its daemon: a lost lease stops the job here with a
    checkpoint (its own intent: SIGTERM, exit 75, `stopped`), or cancels it if it is queued; the
    store going down and coming back are recorded events with notifications."""
    if not rt.config.storage.url:
        return None
    import socket

    from ...lifecycle import outgoing_for
    from .. import stop_requests
    from .uploader import Mirror

    d = rt.daemon

    def lease_lost(job: Job, reason: str) -> None:
        now = time.time()
        with d.lock:
            stop_requests.stop_for_lost_lease(d, job.id, reason, now)

    def event(kind: EventKind, detail: str) -> None:
        payload = {"event": kind.value, "reason": detail, "host": socket.gethostname(), "state": "",
                   "currency": rt.config.pricing.currency}
        rt.store.record_event(None, kind, time.time(), detail=detail, outgoing=outgoing_for(rt.config, kind, payload))
        rt.hooks.submit_event(kind.value, None)

    return Mirror(rt.home, rt.config, rt.store, on_lease_lost=lease_lost, on_event=event)
