"""Completing pending adoptions (pending.py): each tried once more through `orch adopt`'s own use
case; the daemon's scheduler calls this every tick, off the tick's lock."""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from .candidates import Held
from .pending import MAX_AGE_S, drop, pending
from .use_case import adopt_jobs

log = logging.getLogger("orch.adopt")


def complete_pending(home: Any, config: Any, store: Any, *, now: Optional[float] = None) -> int:
    """Try each pending adoption once: the jobs adopted now (the daemon's scheduler calls this)."""
    done = 0
    for record in pending(home):
        t = time.time() if now is None else now
        uid = str(record["uid"])
        if t - float(record.get("since") or t) > MAX_AGE_S:
            log.warning("pending adoption of %s: not handed over in %.0f h; given up", uid[:12], MAX_AGE_S / 3600)
            drop(home, uid)
            continue
        said: list[str] = []
        try:
            adopted, refused = adopt_jobs(
                home,
                config,
                store,
                str(record["url"]),
                wanted=[uid],
                take_all=False,
                force=False,
                say=said.append,
                warn=said.append,
                confirm=_yes,
                maps=[str(m) for m in record.get("maps") or []],
                park_held=False,
                gpus=_count(record.get("gpus")),
            )
        except Exception as exc:  # the bucket unreachable, a usage error: try again at the next tick
            log.warning("pending adoption of %s: %s", uid[:12], exc)
            continue
        if adopted:
            done += len(adopted)
            drop(home, uid)
            log.info("pending adoption completed: %s", "; ".join(said))
        elif refused and not all(isinstance(r, Held) for r in refused):
            drop(home, uid)
            log.warning("pending adoption of %s given up: %s", uid[:12], "; ".join(str(r) for r in refused))
    return done


def _count(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _yes(lines: list[str]) -> bool:
    return True
