"""The job `orch run` runs, recorded before anything starts: submitted like `orch submit` does it,
or, for `--resume`, settled (an attempt whose runner is gone) and retried; then claimed for this
process, so a daemon beside it leaves the job alone while this process lives."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional

from ..home.paths import Home
from ..host.procs import start_time
from ..jobs.lifecycle import retry_job, submit_job
from ..jobs.runners import settle_a_runnerless_attempt
from ..model.errors import InvalidTransition
from ..model.records import FOREGROUND_PID, FOREGROUND_START, Job
from ..model.states import RETRYABLE, JobState
from ..spec.config import Config
from ..store import Store


def record_job(
    home: Home,
    store: Store,
    config: Config,
    managed: list[int],
    *,
    job_toml: Optional[Path],
    resume_id: Optional[int],
    say: Callable[[str], None],
) -> Optional[Job]:
    """The job `orch run` runs, recorded (submitted, or settled and retried for --resume) and
    claimed for this process; None when another runner has it (said through `say`)."""
    if job_toml is not None:
        job = submit_job(store, config, home, job_toml, now=time.time(), machine_gpus=len(managed))
        say(f"recorded job {job.id} ({job.name}); running it here (Ctrl-C checkpoints and stops)")
    else:
        job = store.get(resume_id)  # type: ignore[arg-type]
        if job.state is JobState.RUNNING:
            from ..executors import build_local_executor
            from ..home.daemon_lock import running_pid

            settled = settle_a_runnerless_attempt(
                home, store, config, job, executor=build_local_executor(home), daemon=running_pid(home), say=say
            )
            if settled is None:
                return None
            job = settled
        if job.state not in RETRYABLE and job.state is not JobState.QUEUED:
            raise InvalidTransition(
                job.id, job.state.value, "running", "only a queued, failed, cancelled or stopped job can be resumed"
            )
        if job.state in RETRYABLE:
            job = retry_job(store, config, home, job.id, time.time())
        say(f"resuming job {job.id} ({job.name}) here (Ctrl-C checkpoints and stops)")
    # Claimed for this process while it waits to begin: a daemon beside it leaves the job alone
    # (it would win the race to start it while this process lists its environment, say) unless
    # this process is gone.
    pid = os.getpid()
    store.update(
        job.id,
        time.time(),
        only_if_state=[JobState.QUEUED],
        executor_ref={FOREGROUND_PID: pid, FOREGROUND_START: start_time(pid)},
    )
    return store.get(job.id)
