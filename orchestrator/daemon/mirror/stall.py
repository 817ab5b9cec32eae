"""Watching the upload in flight for a store that stops answering (frozen, not refusing). Uploads
go through a client without a read timeout (a slow link sends a part for minutes and reads
nothing meanwhile), so such a store would hold the uploader for the whole-request bound. While an
upload has run longer than READ_TIMEOUT_S, a small probe through the client that has the timeout
asks whether the store still answers; when it does not, the outage is declared at once (the
`mirror_failed` event, the log line, the lag in `orch status`) while the upload goes on waiting."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from ...objectstore.remote import Remote, StorageError
from ...objectstore.stall import READ_TIMEOUT_S
from .events import Outage
from .uploads import UploadQueue

log = logging.getLogger("orch.mirror")


class StallWatch:
    def __init__(self, remote: Remote, uploads: UploadQueue, outage: Outage, stopping: threading.Event):
        self.remote, self.uploads, self.outage, self.stopping = remote, uploads, outage, stopping
        self._probed_at = 0.0
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mirror-stall-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                self.check(time.monotonic())
            except Exception:  # a bug here must never take the daemon down
                log.exception("mirror: the stall watch failed; it goes on")

    def check(self, now: float) -> bool:
        """Probe when an upload has waited long enough; True when the store did not answer."""
        running = self.uploads.in_flight()
        if running is None:
            return False
        since, name = running
        if now - since < READ_TIMEOUT_S or now - self._probed_at < READ_TIMEOUT_S:
            return False
        self._probed_at = now
        try:
            self.remote.probe()
        except StorageError as exc:
            if self.uploads.in_flight() != running:
                return False  # the upload ended meanwhile: the pass reports what happened
            stalled = StorageError(f"no answer from the store while uploading {name} for {now - since:.0f} s ({exc})")
            self.outage.down(stalled, time.time())
            return True
        return False
