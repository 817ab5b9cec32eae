"""NoticeWatcher: polls every preemption source off the dispatch path and remembers what each one
last said, so a notice is acted on once and dispatch waits until it clears. A source that cannot
be read is "I don't know", never a notice."""

from __future__ import annotations

import logging
import threading
from typing import Sequence

from .preemption import Notice, NoticeSource


class NoticeWatcher:
    """Polls every source and remembers what each one last said.

    poll_all(now) returns the notices that *started* with this poll (a source that keeps saying
    "preempt" is reported once), so the daemon can act on the list directly. `notice_active` stays
    true while any source still reports a stopping notice: the daemon does not dispatch meanwhile.
    A failing source keeps its last known answer — an unreachable metadata server right after a
    preemption notice does not mean the danger has passed — and is logged once per error streak.
    """

    def __init__(self, sources: Sequence[NoticeSource], *, log: logging.Logger | None = None):
        self.sources = list(sources)
        self.log = log or logging.getLogger("orch.preemption")
        self._current: dict[str, Notice] = {}
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()
        self.passes = 0  # polls of every source done (the daemon's counters: home/wake.counters)

    def poll_all(self, now: float) -> list[Notice]:
        started = []
        for source in self.sources:
            try:
                notice = source.poll(now)
            except Exception as exc:  # noqa: BLE001 - "cannot tell" must never stop the daemon
                self._failed(source.name, exc)
                continue
            self._recovered(source.name)
            if self._record(source.name, notice):
                started.append(notice)
        self.passes += 1
        return started  # type: ignore[return-value]

    @property
    def active_notices(self) -> list[Notice]:
        with self._lock:
            return list(self._current.values())

    @property
    def notice_active(self) -> bool:
        """True while a preempt/maintenance notice has not cleared: do not start new jobs."""
        return any(n.stops_jobs for n in self.active_notices)

    def close(self) -> None:
        for source in self.sources:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _record(self, name: str, notice: Notice | None) -> bool:
        """Store the source's answer; True if it is a notice the previous poll did not have."""
        with self._lock:
            previous = self._current.pop(name, None)
            if notice is None:
                if previous is not None and previous.stops_jobs:
                    self.log.info("preemption source %s: notice cleared (%s)", name, previous.detail)
                return False
            self._current[name] = notice
        return previous is None or previous.kind != notice.kind

    def _failed(self, name: str, exc: Exception) -> None:
        count = self._failures.get(name, 0) + 1
        self._failures[name] = count
        if count == 1:
            self.log.warning(
                "preemption source %s cannot be read (%s); treating it as no notice and polling on quietly",
                name,
                exc,
            )
        else:
            self.log.debug("preemption source %s still unreadable (%d polls): %s", name, count, exc)

    def _recovered(self, name: str) -> None:
        count = self._failures.pop(name, 0)
        if count:
            self.log.info("preemption source %s answers again after %d failed polls", name, count)
