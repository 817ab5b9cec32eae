"""The lease holder's side of a planned market move (objectstore/moves.py): once a heartbeat of
an active job (whether the heartbeat or a checkpoint's commit wrote its manifest), one small read
of `jobs/<uid>/move.json`; a request that names this home as the
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
    def __init__(self, remote: Remote, home_id: str, on_move: Callable[[Job, str], None], every_s: float = 0.0):
        self.remote, self.home_id, self.on_move, self.every_s = remote, home_id, on_move, every_s
        self._honoured: set[str] = set()  # job uids handed over by this process
        self._asked_at: dict[str, float] = {}  # job uid -> when its move request was last read

    def check(self, job: Job, now: float) -> None:
        """Read the job's move request, at most once every `every_s` (a heartbeat)."""
        if job.uid in self._honoured or now - self._asked_at.get(job.uid, -1e18) < self.every_s:
            return
        self._asked_at[job.uid] = now
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
