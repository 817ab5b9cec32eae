"""The daemon's uploader: every job's durable copy in [storage] (see objectstore/manifest.py for the
layout), off the training path. One thread, one persistent queue (the `uploads` table, the
outbox's pattern: it survives a daemon restart), one pass at a time:

1. scan: a checkpoint newer than the newest one queued or mirrored is queued; newest wins (the
   store drops older pending uploads of the same job) — uploads.py;
2. upload the pending checkpoints, notice checkpoints first, each under an immutable key of its
   own, hashing the bytes as they go out (one read; a killed upload leaves no visible object),
   then the job's manifest at once — uploads.py;
3. write each changed job's manifest with a conditional write: it names only complete uploads,
   and carries the owner lease; then retention — lease.py;
4. progress, metrics, batch sizes and the current log, at most every throttle_seconds; on
   success the result and the exported model, then the last manifest — files.py.

The store being down never touches training: uploads wait with backoff, one `mirror_failed`
event (and notification) says so, `orch status` shows the lag, and `mirror_recovered` follows
(events.py). On a preemption notice the upload in flight is cancelled unless it is a notice
checkpoint, and the notice checkpoint goes out at [storage] notice_concurrency; a stopping daemon
waits up to notice_deadline_seconds for it, then releases its leases so `orch adopt` elsewhere
needs no wait. Between passes the thread watches the active jobs' checkpoint folders, so an
upload starts within ~0.1 s of a checkpoint appearing (uploader.py: the thread)."""

from __future__ import annotations

import time
from typing import Any, Optional

from ...model.records import Job
from ...model.states import EventKind
from .uploader import Mirror

__all__ = ["Mirror", "build_mirror"]


def build_mirror(rt: Any) -> Optional[Mirror]:
    """The runtime's uploader, wired to its daemon: a lost lease stops the job here with a
        checkpoint (its own intent: SIGTERM, exit 75, `moved`), or cancels it if it is queued; a planned
    market move asked through the mirror (moves.py) hands the job over the same way; the
        store going down and coming back are recorded events with notifications."""
    if not rt.config.storage.url:
        return None
    from ...jobs.lifecycle import machine_outgoing
    from .. import stop_requests

    d = rt.daemon

    def lease_lost(job: Job, reason: str) -> None:
        now = time.time()
        with d.lock:
            stop_requests.stop_for_lost_lease(d, job.id, reason, now)

    def move_asked(job: Job, reason: str) -> None:
        now = time.time()
        with d.lock:
            stop_requests.stop_for_move(d, job.id, reason, now)

    def event(kind: EventKind, detail: str) -> None:
        rt.store.record_event(
            None, kind, time.time(), detail=detail, outgoing=machine_outgoing(rt.config, kind, detail)
        )
        rt.hooks.submit_event(kind.value, None)

    return Mirror(rt.home, rt.config, rt.store, on_lease_lost=lease_lost, on_event=event, on_move=move_asked)
