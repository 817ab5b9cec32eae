"""The daemon's side of a pending adoption (adopt/pending.py): each tick, off the tick's lock, the
adoptions `orch adopt` left pending are tried again; one completed wakes the tick, which starts
the job at once."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("orch.daemon")


def schedule_pending_adoptions(rt: Any, sched: Any, now: Any) -> None:
    from ..adopt.pending_run import complete_pending

    def step() -> None:
        try:
            if complete_pending(rt.home, rt.config, rt.store):
                rt.poke()
        except Exception:
            log.exception("pending adoptions: a pass failed; the next tick tries again")

    sched.add_job(step, "interval", seconds=rt.config.daemon.tick_seconds, id="pending-adopt", next_run_time=now)
