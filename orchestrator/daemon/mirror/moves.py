"""The lease holder's side of a planned market move (objectstore/moves.py): at each heartbeat of
an active job, one small read of `jobs/<uid>/move.json`; a request that names this home as the
holder is honoured once, like a preemption notice for that job alone (stop_requests.stop_for_move:
SIGTERM, checkpoint, upload, exit 75, `moved`, the last manifest released). Anything else there --
a request for another home, an unreadable object -- is left alone."""

from __future__ import annotations

import logging
from typing import Callable

from ...model.records import Job
from ...objectstore import moves
from ...objectstore.remote import Remote, StorageError

log = logging.getLogger("orch.mirror")


class MoveWatch:
    def __init__(self, remote: Remote, home_id: str, on_move: Callable[[Job, str], None]):
        self.remote, self.home_id, self.on_move = remote, home_id, on_move
        self._honoured: set[str] = set()  # job uids handed over by this process

    def check(self, job: Job, now: float) -> None:
        if job.uid in self._honoured:
            return
        try:
            request = moves.read(self.remote, job.uid)
        except StorageError as exc:  # the next heartbeat asks again
            log.warning("mirror: job %s: cannot read its move request: %s", job.id, exc)
            return
        if request is None or request.status != moves.ASKED or request.from_home != self.home_id:
            return
        self._honoured.add(job.uid)
        reason = f"planned move to {request.to} asked by `orch watch` ({request.why}): checkpoint and hand over"
        log.info("mirror: job %s: %s", job.id, reason)
        self.on_move(job, reason)
