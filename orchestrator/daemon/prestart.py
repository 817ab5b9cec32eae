"""What starting a queued job needs that only a slow program can tell (the job interpreter's
packages, up to 15 s; nvidia-smi, up to 10 s), learnt at the top of each tick BEFORE the daemon
takes its lock. The preemption watcher needs that lock to SIGTERM the running jobs: a notice must
reach them within a second whatever the tick is doing, never after a job start's probes (issue 37).
The dispatch step then starts only jobs learnt here; one queued in between waits for the next tick."""

from __future__ import annotations

import logging
from typing import Optional

from ..host.env_observe import MachineFacts, Observed
from ..jobs.attempts import observe_start
from ..model.records import Job
from ..model.states import JobState
from ..planning.dispatch import edf_order, hold_reason
from .step_context import StepContext

log = logging.getLogger("orch.daemon")


class Prestart:
    """The observations for the jobs the next dispatch may start, by job id."""

    def __init__(self) -> None:
        self.machine = MachineFacts()
        self.observed: dict[int, Observed] = {}

    def learn(self, d: StepContext, now: float) -> None:
        """Observe every queued job the dispatch step may start now (off the lock; the store is
        only read). Jobs no longer startable are forgotten."""
        learnt: dict[int, Observed] = {}
        for job in startable(d, now):
            try:
                learnt[job.id] = observe_start(
                    d.home, job, d.environ, machine=self.machine, previous=self.observed.get(job.id)
                )
            except Exception:  # the start itself will say what is wrong with this job
                log.exception("job %s: cannot look at its environment before it starts", job.id)
        self.observed = learnt

    def take(self, job: Job) -> Optional[Observed]:
        """What was learnt for this job's start, or None: it was queued after this tick looked."""
        return self.observed.pop(job.id, None)


def startable(d: StepContext, now: float) -> list[Job]:
    """The queued jobs the dispatch step could start if every slot this daemon hands out were
    free (a superset of what it starts; slots freed by this very tick's reap are not missed), in
    its order. Reads the store only."""
    if d.notice_active:
        return []
    queue = edf_order(d.store.queue_order())
    if not queue:
        return []
    dep_states = d.store.states_of({dep for j in queue for dep in j.after_ids})
    gpus_left, cpu_left = len(d.managed), d.config.daemon.cpu_slots
    out = []
    for job in queue:
        if job.state is not JobState.QUEUED or hold_reason(job, dep_states, now) is not None:
            continue
        if job.gpus == 0 and cpu_left > 0:
            cpu_left -= 1
        elif 0 < job.gpus <= gpus_left:
            gpus_left -= job.gpus
        else:
            continue
        out.append(job)
    return out
