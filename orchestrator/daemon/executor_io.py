"""The executor's network half (a Ray head's submits, stops and job list) on its own thread, off
the tick's lock: the tick asks the executor under the lock (a start, a stop: queued, never sent
there) and, after its steps, lets one exchange run here for at most `EXCHANGE_WAIT_S`. What the
exchange hears is applied by the next tick's refresh. A head that takes a request and never
answers holds this thread only: the preemption watcher takes the lock within a second, and the
next ticks go on (reaping, signalling local jobs) while that one exchange is still out. Never two
exchanges at once: a tick that finds the last one still out waits on it again, within its bound."""

from __future__ import annotations

import logging
import threading
from typing import Optional, Sequence

from ..executors.base import Executor
from ..model.records import Job

log = logging.getLogger("orch.daemon")

EXCHANGE_WAIT_S = 2.0  # how long one tick waits for the executor's exchange before going on


class ExecutorIO:
    def __init__(self, executor: Executor, wait_s: float = EXCHANGE_WAIT_S):
        self.executor, self.wait_s = executor, wait_s
        self._thread: Optional[threading.Thread] = None
        self.finished = 0  # exchanges done (tests wait on it instead of sleeping)
        self.out_since: Optional[float] = None  # when the exchange still out began

    def run(self, jobs: Sequence[Job], now: float, wait_s: Optional[float] = None) -> bool:
        """Start an exchange about `jobs` unless one is still out, then wait for it at most the
        bound. True: it finished (what it heard is there for the next refresh)."""
        if self._thread is None or not self._thread.is_alive():
            self.out_since = now
            self._thread = threading.Thread(
                target=self._exchange, args=(list(jobs), now), name="orch-executor-io", daemon=True
            )
            self._thread.start()
        self._thread.join(self.wait_s if wait_s is None else wait_s)
        return not self._thread.is_alive()

    def _exchange(self, jobs: list[Job], now: float) -> None:
        try:
            self.executor.exchange(jobs, now)
        except Exception:  # the next tick tries again; the attempts are left as they are meanwhile
            log.exception("the %s executor's exchange failed", self.executor.name)
        finally:
            self.out_since = None
            self.finished += 1
