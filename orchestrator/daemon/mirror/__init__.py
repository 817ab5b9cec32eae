"""The daemon's uploader: every job's durable copy in [storage] (see storage/manifest.py for the
layout), off the training path. One thread, one persistent queue (the `uploads` table, the
outbox's pattern: it survives a daemon restart), one pass at a time:

1. scan: a checkpoint newer than the newest one queued or mirrored is queued; newest wins (the
   store drops older pending uploads of the same job) — uploads.py;
2. upload the pending checkpoints, notice checkpoints first, under an immutable content-named
   key (a killed upload leaves no visible object) — uploads.py;
3. write each changed job's manifest with a conditional write: it names only complete uploads,
   and carries the owner lease; then retention — lease.py;
4. progress, metrics, batch sizes and the current log, at most every throttle_seconds; on
   success the result and the exported model, then the last manifest — files.py.

The store being down never touches training: uploads wait with backoff, one `mirror_failed`
event (and notification) says so, `orch status` shows the lag, and `mirror_recovered` follows
(events.py). On a preemption notice the upload in flight is cancelled unless it is a notice
checkpoint, and the notice checkpoint goes out at [storage] notice_concurrency; a stopping daemon
waits up to notice_deadline_seconds for it, then releases its leases so `orch adopt` elsewhere
needs no wait (uploader.py: the thread)."""

from .events import build_mirror
from .uploader import Mirror

__all__ = ["Mirror", "build_mirror"]
