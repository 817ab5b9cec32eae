"""The daemon's work, as one `tick(now)` made of small named, idempotent steps: reap finished
attempts (reap.py), act on cancel requests, budgets and overdue signals (stop_requests.py), start
queued jobs (spawn.py), accrue cost, notice a drained queue. Tests call the steps with a given
`now`; runtime.py drives them with APScheduler. The steps see the daemon only through
step_context.StepContext. Attempts are reached only through the executor
interface (executors/base.py), so the tick does not know where a job runs."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Mapping, Optional

from ..model.executor_kinds import executor_kind
from ..spec.config import Config
from ..model.errors import InvalidTransition
from ..executors import build_executor
from ..executors.base import Executor
from ..planning.capacity import gpu_slots
from ..jobs.lifecycle import change_state, machine_outgoing
from ..home.paths import Home
from ..model.records import Job
from ..model.states import EventKind, Intent, JobState
from ..store import Store
from . import guard, reap, spawn, stop_requests, watchdog
from .accounting import accrue_interval, bill_missed
from .executor_io import ExecutorIO
from .health_watch import LossFlatWatch
from .prestart import Prestart
from .sweep_step import advance_sweeps

log = logging.getLogger("orch.daemon")

STARTS_WORK = frozenset({"sweeps", "dispatch"})  # steps skipped while the daemon is stopping


class Daemon:
    def __init__(
        self,
        home: Home,
        config: Config,
        store: Store,
        *,
        environ: Optional[Mapping[str, str]] = None,
        gpu_ids: Optional[list[int]] = None,
        on_event: Optional[Callable[[str, Optional[Job]], None]] = None,
        executor: Optional[Executor] = None,
    ):
        self.home, self.config, self.store = home, config, store
        self.environ = dict(os.environ if environ is None else environ)
        # Each running attempt is watched by the executor that started it (executors/by_kind.py).
        self.executor: Executor = build_executor(config, home, executor)
        self.io = ExecutorIO(self.executor)  # the executor's network half, off the lock (executor_io.py)
        self.managed = gpu_slots(config) if gpu_ids is None else list(gpu_ids)  # as the CLI counts them
        self.on_event = on_event or (lambda kind, job: None)  # hooks, after the transition commits
        self.lock = threading.RLock()  # tick, the preemption watcher and shutdown take turns
        self.ticking = threading.Lock()  # one tick at a time, its slow half (prestart) included
        self.prestart = Prestart()  # what a job start needs that is slow to learn, learnt off the lock
        self.notice_active = False
        self.stopping = False
        self.ticks = 0  # ticks done (asked on the wake socket: tests wait on it instead of sleeping)
        self.last_accrual: Optional[float] = None
        self.had_work = False
        self.watchdog = watchdog.Watchdog()
        self.loss_flat = LossFlatWatch()

    # -- start-up --------------------------------------------------------------------------

    def recover(self, now: float) -> None:
        """Before the first tick: read exits written while no daemon ran, adopt attempts that
        still run (checked by the executor: pid AND start time locally), requeue the lost ones."""
        self.io.run(self.store.jobs([JobState.RUNNING]), now)  # a first look at the cluster, off the lock
        with self.lock:
            running = self.store.jobs([JobState.RUNNING])
            self.executor.refresh(running, now)
            # The time a dead daemon missed, from the attempts' own records, before any is reaped.
            guard.step("bill missed", self._bill_missed, now)
            for job in running:
                if self.executor.exit(job) is None and self.executor.alive(job):
                    log.info("job %s: adopted its running attempt %s", job.id, job.attempt)
            self.reap(now)
            self.had_work = bool(self.store.jobs([JobState.QUEUED, JobState.RUNNING]))
            self.last_accrual = now

    def _bill_missed(self, now: float) -> None:
        bill_missed(self.store, self.config, self.home, self.executor, len(self.managed), now)

    # -- the tick --------------------------------------------------------------------------

    def tick(self, now: Optional[float] = None) -> None:
        now = time.time() if now is None else now
        with self.ticking:
            # The job interpreter's packages and nvidia-smi, for the jobs dispatch may start: learnt
            # before the lock, which a preemption notice needs at once (prestart.py).
            if not self.stopping:
                guard.step("prestart", self.learn_starts, now)
            with self.lock:
                # Each step guarded (daemon/guard.py): an error in one is logged and the others run.
                for name, run in self.steps():
                    if self.stopping and name in STARTS_WORK:
                        continue
                    guard.step(name, run, now)
            # The starts and stops the steps asked for, sent off the lock, and a look at the
            # cluster: its answers are applied by the next tick's refresh (executor_io.py).
            guard.step("exchange", self.exchange, now)
            self.ticks += 1

    def exchange(self, now: float) -> None:
        self.io.run(self.store.jobs([JobState.RUNNING]), now)

    def learn_starts(self, now: float) -> None:
        self.prestart.learn(self, now)

    def steps(self) -> list[tuple[str, Callable[[float], object]]]:
        """The tick's steps in order, each a method of this daemon taking `now`."""
        return [
            ("refresh", self.refresh_attempts),
            ("reap", self.reap),
            ("watchdog", self.watch_hangs),
            ("health", self.watch_health),
            ("deadlines", self.watch_deadlines),
            ("cancels", self.apply_cancels),
            ("node notices", self.apply_node_notices),
            ("budgets", self.check_budgets),
            ("escalate", self.escalate),
            ("sweeps", self.run_sweeps),
            ("dispatch", self.dispatch),
            ("accrue", self.accrue),
            ("drained", self.notice_drained),
        ]

    def refresh_attempts(self, now: float) -> None:
        """What the executor heard of every running attempt, applied (no network: the exchange
        after the steps asks, off the lock)."""
        self.executor.refresh(self.store.jobs([JobState.RUNNING]), now)

    def watch_hangs(self, now: float) -> None:
        """Hung jobs: stacks dumped, the `hang` intent, SIGTERM (watchdog.py)."""
        self.watchdog.check(self, now)

    def run_sweeps(self, now: float) -> None:
        """Running sweeps: prune, create trials (sweep_step.py)."""
        advance_sweeps(self, now)

    def reap(self, now: float) -> None:
        reap.reap(self, now)

    def apply_cancels(self, now: float) -> None:
        stop_requests.apply_cancels(self, now)

    def watch_health(self, now: float) -> None:
        """A running job's runner reported a flat loss (health.json): one `loss_flat` event."""
        for job in self.loss_flat.check(self, now):
            self.on_event(EventKind.LOSS_FLAT.value, job)

    def watch_deadlines(self, now: float) -> None:
        """A deadline job whose projected finish crossed its deadline: one `deadline_at_risk` event."""
        from .deadlines import watch_deadlines

        for job in watch_deadlines(self, now):
            self.on_event(EventKind.DEADLINE_AT_RISK.value, job)

    def apply_node_notices(self, now: float) -> None:
        """An attempt whose machine the executor says is going away (a Ray node draining)."""
        stop_requests.apply_node_notices(self, now)

    def check_budgets(self, now: float) -> None:
        stop_requests.check_budgets(self, now)

    def escalate(self, now: float) -> None:
        stop_requests.escalate(self, now)

    def dispatch(self, now: float) -> list[int]:
        return spawn.dispatch(self, now)

    # -- shared by the steps ---------------------------------------------------------------------

    def announce(self, job: Job, new: Optional[Job], kind: EventKind, reason: str = "") -> Optional[Job]:
        """Log a committed transition and run the hooks for it."""
        if new is not None:
            log.info("job %s (%s): %s -> %s: %s", job.id, job.name, job.state.value, new.state.value, reason)
            self.on_event(kind.value, new)
        return new

    def change(self, job: Job, dst: JobState, kind: EventKind, now: float, **kw: Any) -> Optional[Job]:
        try:
            new = change_state(self.store, self.config, self.home, job, dst, kind, now, expect=[job.state], **kw)
        except InvalidTransition as exc:
            log.warning("job %s: %s", job.id, exc)
            return None
        return self.announce(job, new, kind, kw.get("reason") or "")

    def total_budget_reason(self) -> Optional[str]:
        return stop_requests.total_budget_reason(self)

    # -- cost --------------------------------------------------------------------------------

    def accrue(self, now: float) -> None:
        last = self.last_accrual
        if last is None or now < last:  # the first tick, or the clock went back: start the clock
            self.last_accrual = now
            return
        if now == last:
            return
        # A suspended machine or a stalled tick is not billed as if it ran: at most 60 s an interval.
        accrue_interval(
            self.store,
            self.config,
            len(self.managed),
            max(last, now - 60.0),
            now,
            billable=self.executor.billable if executor_kind(self.executor.name).bills_by_allocation else None,
        )
        # Only once written: a failed write leaves the interval to the next tick, not lost.
        self.last_accrual = now

    # -- queue drained -------------------------------------------------------------------------

    def notice_drained(self, now: float) -> None:
        active = self.store.count_by_state()
        busy = active.get(JobState.QUEUED, 0) + active.get(JobState.RUNNING, 0)
        if busy:
            self.had_work = True
        elif self.had_work:
            self.had_work = False
            said = "no job is queued or running"
            self.store.record_event(
                None,
                EventKind.QUEUE_DRAINED,
                now,
                detail=said,
                outgoing=machine_outgoing(self.config, EventKind.QUEUE_DRAINED, said),
            )
            log.info("queue drained")
            self.on_event(EventKind.QUEUE_DRAINED.value, None)

    # -- preemption and shutdown ---------------------------------------------------------------

    def preempt_all(self, now: float, reason: str, *, notice: bool = True) -> list[int]:
        """SIGTERM every running job (it checkpoints and is requeued). For a preemption notice,
        dispatch is held in the same critical section: a tick that takes the lock next must not
        start work on a machine about to be reclaimed (the watcher clears it with the notice).
        The daemon stopping (`notice=False`) leaves alone the jobs `orch run` runs in a terminal:
        they are the user's, not the daemon's; a notice reaches them too (the machine goes away)."""
        with self.lock:
            if notice:
                self.notice_active = True
            signalled = []
            for job in self.store.jobs([JobState.RUNNING]):
                if job.in_foreground and not notice:
                    continue
                if job.intent is Intent.NONE:
                    stop_requests.signal_job(self, job, Intent.PREEMPT, now, reason)
                    signalled.append(job.id)
            return signalled

    def counters(self) -> dict[str, int]:
        """Ticks and executor exchanges done: what a test waits on before it asserts that nothing
        happened (asked on the wake socket, home/wake.counters)."""
        return {"ticks": self.ticks, "exchanges": self.io.finished}

    def gpus_said(self) -> str:
        """The GPUs this daemon hands out, for its start line: this machine's, or a cluster's as
        its executor last heard of them (not `[ray] max_gpus`'s 64 slot numbers)."""
        kind = executor_kind(self.executor.name)
        if kind.on_this_machine:
            return str(self.managed or "none")
        seen = self.executor.cluster_gpus()
        heard = f"{seen[1]:g} in all, {seen[0]:g} in use" if seen is not None else "placed by the cluster"
        return f"the {kind.name} cluster's ({heard}; orch keeps at most {kind.max_gpus(self.config)} busy)"

    def running_count(self, *, own_only: bool = False) -> int:
        """Running jobs; `own_only`: not those an `orch run` runs beside the daemon."""
        return sum(1 for j in self.store.jobs([JobState.RUNNING]) if not (own_only and j.in_foreground))
