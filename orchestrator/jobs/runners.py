"""Who runs a local job's attempt, and settling an attempt whose runner is gone: `orch status`
notes such a job, `orch run --resume` settles it the way the daemon would (foreground/record.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from ..home.paths import Home
from ..host.procs import is_alive
from ..model.records import FOREGROUND_PID, FOREGROUND_START, LOCAL, Job
from ..model.states import JobState
from ..store import Store

if TYPE_CHECKING:  # `orch status` imports this module: no pydantic (spec/config.py) on its path
    from ..spec.config import Config


def runner_alive(job: Job) -> bool:
    """What runs this local job's attempt is alive: its supervisor or `orch run` (pid and start
    time), or the `orch run` that claimed it and is about to record itself."""
    ref = job.executor_ref or {}
    if job.supervisor_pid:
        return is_alive(job.supervisor_pid, job.supervisor_start)
    return is_alive(ref.get(FOREGROUND_PID), ref.get(FOREGROUND_START))


def runnerless_jobs(store: Store) -> list[Job]:
    """Local jobs recorded running with nothing running them (an `orch run` or a supervisor that
    was killed): only a daemon, or `orch run --resume`, settles them."""
    return [
        j
        for j in store.jobs([JobState.RUNNING])
        if (j.executor == LOCAL or j.in_foreground) and (j.supervisor_pid or j.executor_ref) and not runner_alive(j)
    ]


class LocalAttempts(Protocol):
    """What settling needs of the local executor (executors/local.py): the floor below cannot
    import it, so the caller hands it in."""

    def adopt(self, job: Job) -> Optional[dict[str, Any]]: ...
    def exit(self, job: Job) -> Optional[dict[str, Any]]: ...
    def strays(self, job: Job) -> list[int]: ...
    def wind_down(self, job: Job, grace_s: float) -> None: ...
    def clear_lost(self, job: Job) -> None: ...


def settle_a_runnerless_attempt(
    home: Home,
    store: Store,
    config: Config,
    job: Job,
    *,
    executor: LocalAttempts,
    daemon: Optional[int],
    say: Callable[[str], None],
) -> Optional[Job]:
    """`orch run --resume` of a job still recorded running. If what ran its attempt (an `orch run`,
    or a daemon's supervisor) is gone and no daemon (`daemon`: its pid) is here to notice, the
    attempt is settled here the way the daemon would (its exit record, else lost: its strays
    stopped, a notice checkpoint kept), and the job can resume. Otherwise it says (`say`) who has
    the job and returns None."""
    from .attempts import grace_for
    from .settling import lose_attempt, settle_attempt

    if job.executor != LOCAL and not job.in_foreground:
        say(
            f"job {job.id} runs on {job.executor}; "
            + ("the daemon settles and resumes it" if daemon else "`orch daemon start` settles and resumes it")
            + f": follow it with `orch logs -f {job.id}`",
        )
        return None
    if not job.supervisor_pid and not job.executor_ref and job.attempt and daemon is None:
        # a daemon that died between starting an attempt and recording its handle
        handle = executor.adopt(job)
        if handle:
            store.update(job.id, time.time(), only_if_state=[JobState.RUNNING], **handle)
            job = store.get(job.id)
    runner = job.supervisor_pid or (job.executor_ref or {}).get(FOREGROUND_PID)
    if runner_alive(job):
        who = "an `orch run`" if job.in_foreground else "the daemon's supervisor"
        say(
            f"job {job.id} is running under {who} (pid {runner}); follow it with `orch logs -f {job.id}`, "
            f"stop it with `orch cancel {job.id}`",
        )
        return None
    if daemon is not None:
        say(
            f"job {job.id}'s attempt lost its runner (pid {runner}); the daemon (pid {daemon}) settles it on its "
            f"next tick and resumes it: follow it with `orch logs -f {job.id}`",
        )
        return None
    now = time.time()
    exit_info = executor.exit(job)
    if exit_info is not None:
        settled = settle_attempt(store, config, home, job, exit_info, now)
    else:
        if strays := executor.strays(job):
            grace = grace_for(job, config)
            say(
                f"job {job.id}: attempt {job.attempt} still runs (pid {strays[0]}); giving it up to {grace:.0f} s "
                "to save its checkpoint and exit",
            )
            executor.wind_down(job, grace)
        executor.clear_lost(job)  # nothing of the old attempt may run beside the new one
        settled = lose_attempt(store, config, home, job, time.time())
    job = settled.job if settled is not None else store.get(job.id)
    say(
        f"job {job.id}: attempt {job.attempt} lost its runner (pid {runner}); settled here: {job.state.value}"
        + (f" ({job.reason})" if job.reason else ""),
    )
    return job
