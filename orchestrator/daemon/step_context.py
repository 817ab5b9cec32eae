"""What the tick's steps (reap, stop_requests, spawn, watchdog) may use of the daemon: a small
Protocol, so the steps do not import `Daemon` (tick.py imports them) and say what they touch."""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from ..spec.config import Config
from ..executors.base import Executor
from ..home.paths import Home
from ..model.records import Job
from ..model.states import EventKind, JobState
from ..store import Store
from ..host.env_observe import Observed


class StartObservations(Protocol):
    """What dispatch sees of prestart.Prestart: the environment learnt for a job, off the lock."""

    def take(self, job: Job) -> Optional[Observed]: ...


class StepContext(Protocol):
    home: Home
    config: Config
    store: Store
    executor: Executor
    environ: dict[str, str]
    managed: list[int]  # the GPU ids this daemon hands out
    notice_active: bool  # a preemption notice is pending: nothing new starts
    on_event: Callable[[str, Optional[Job]], None]  # hooks, after a transition commits

    @property
    def prestart(self) -> StartObservations:
        """What the next dispatch may start, its environment learnt off the lock (prestart.py)."""
        ...

    def announce(self, job: Job, new: Optional[Job], kind: EventKind, reason: str = "") -> Optional[Job]:
        """Log a committed transition and run the hooks for it."""
        ...

    def change(self, job: Job, dst: JobState, kind: EventKind, now: float, **kw: Any) -> Optional[Job]:
        """Apply a transition (compare-and-set on the job's current state), then `announce` (log it, run its hooks)."""
        ...
