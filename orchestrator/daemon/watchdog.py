"""The tick's hang watchdog: a running job whose progress (the step in progress.json) has not
advanced for its `[train] hang_minutes` (built-in jobs) or `watchdog_minutes` (any job that writes
progress.json) is stuck — a collective waiting forever, a deadlocked data loader, a download that
never ends. Its Python stacks go into its log (the executor's dump_stacks), a `hang` event and
notification name the step it stuck at, then SIGTERM, the grace, SIGKILL (the supervisor's and the
escalate step's usual path) and a charged retry from the newest checkpoint.

A hang before the first step counts too: an attempt with no progress of its own is measured from
its start. The clock is the daemon's: it starts again when a daemon starts (never a false alarm
from a stale file), and each attempt is judged once."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..attempts import attempt_started_at, grace_for
from ..contract import PROGRESS, read_json
from ..lifecycle import outgoing_for, payload_for
from ..records import Job
from ..states import AttemptOutcome, EventKind, Intent, JobState

if TYPE_CHECKING:
    from .tick import Daemon

log = logging.getLogger("orch.daemon")


@dataclass
class Seen:
    step: Optional[int]  # None: no progress from this attempt yet
    since: float  # when that step was first seen (or the attempt began)
    fired: bool = False


def limit_minutes(job: Job) -> Optional[float]:
    """The job's watchdog limit: `watchdog_minutes`, else the built-in `[train] hang_minutes`."""
    spec = job.spec or {}
    minutes = spec.get("watchdog_minutes")
    if minutes is None and job.kind != "command":
        minutes = (spec.get("train") or {}).get("hang_minutes")
    return float(minutes) if minutes else None


def attempt_step(d: "Daemon", job: Job, began: float) -> tuple[Optional[int], float]:
    """The step this attempt reported (progress.json written since it began) and when; else
    (None, when the attempt began)."""
    progress = read_json(d.home.run_dir(job.id) / PROGRESS) or {}
    step, updated = progress.get("step"), progress.get("updated_at")
    if isinstance(step, int) and not isinstance(step, bool) and isinstance(updated, (int, float)) \
            and updated >= began - 1:
        return step, float(updated)
    return None, began


def check(d: "Daemon", now: float) -> None:
    charge_checkpointed_hangs(d, now)
    seen: dict[tuple[int, int], Seen] = d.__dict__.setdefault("watchdog_seen", {})
    running = d.store.jobs([JobState.RUNNING])
    live = {(j.id, j.attempt) for j in running}
    for key in [k for k in seen if k not in live]:
        del seen[key]
    for job in running:
        minutes = limit_minutes(job)
        if minutes is None or not job.attempt:
            continue
        key = (job.id, job.attempt)
        began = attempt_started_at(d.store, job)
        step, written = attempt_step(d, job, began)
        entry = seen.get(key)
        if entry is None:
            # First look (a new attempt, or one a restarted daemon adopted): the step was last
            # written then, or nothing came since the attempt began.
            entry = seen[key] = Seen(step, min(now, max(began, written)))
        elif step != entry.step:
            entry.step, entry.since = step, now
        if entry.fired or job.intent is not Intent.NONE or job.signalled_at is not None:
            continue
        stuck_s = now - entry.since
        if stuck_s >= minutes * 60:
            entry.fired = True
            hang(d, job, entry.step, stuck_s, now)


def hang(d: "Daemon", job: Job, step: Optional[int], stuck_s: float, now: float) -> None:
    where = f"at step {step}" if step is not None else "before its first step"
    reason = (f"hang: no progress for {stuck_s / 60:.1f} min, stuck {where} (watchdog "
              f"{limit_minutes(job):g} min); stacks dumped into its log, stopping it to retry from its newest checkpoint")
    _log_line(d, job, f"[orch] watchdog: {reason}")
    dump = getattr(d.executor, "dump_stacks", None)
    try:
        dumped = dump(job) if dump else f"no stack dump: the {d.executor.name} executor cannot take one"
    except Exception as exc:  # never let a dump failure keep a hung job on the bill
        dumped = f"no stack dump ({type(exc).__name__}: {exc})"
    log.warning("job %s (%s): %s; %s", job.id, job.name, reason, dumped)
    payload = payload_for(job, EventKind.HANG, d.config, d.home, reason=reason, state=job.state, with_log=True)
    payload["step"] = step
    d.store.record_event(job.id, EventKind.HANG, now, detail=f"{reason} ({dumped})",
                         outgoing=outgoing_for(d.config, EventKind.HANG, payload))
    d.on_event(EventKind.HANG.value, job)
    # No intent: the attempt ends as a failure (charged, retried with backoff), so a job that hangs
    # every time runs out of retries instead of looping. signalled_at arms the escalate backstop.
    d.store.update(job.id, now, only_if_state=[JobState.RUNNING], signalled_at=now, reason=reason)
    d.__dict__.setdefault("watchdog_hung", {})[job.id] = job.attempt
    d.executor.terminate(job)
    log.info("job %s: SIGTERM (hang); SIGKILL after %.0fs", job.id, grace_for(job, d.config))


def charge_checkpointed_hangs(d: "Daemon", now: float) -> None:
    """A hung attempt that answered the SIGTERM with exit 75 (the runner before training starts:
    a stuck download or tokenization) was requeued uncharged; a hang spends a retry all the same,
    or a job that hangs every time would run (and bill) forever."""
    hung: dict[int, int] = d.__dict__.get("watchdog_hung") or {}
    for job_id, n in list(hung.items()):
        job = d.store.get(job_id)
        if job.state is JobState.RUNNING and job.attempt == n:
            continue  # still ending
        del hung[job_id]
        attempt = next((a for a in d.store.attempts(job_id) if a.n == n), None)
        if job.state is not JobState.QUEUED or attempt is None or attempt.outcome is not AttemptOutcome.CHECKPOINTED:
            continue  # charged already (failed), or settled some other way
        if job.failures + 1 > job.retries:
            d.change(job, JobState.FAILED, EventKind.FAILED, now, reason=f"hung in attempt {n} and no retries are left "
                     f"({job.retries}); see `orch logs {job_id}` for its stacks")
        else:
            d.store.update(job_id, now, only_if_state=[JobState.QUEUED], failures=job.failures + 1)
            log.info("job %s: attempt %s hung: charged to its retries (%s of %s)", job_id, n, job.failures + 1,
                     job.retries)


def _log_line(d: "Daemon", job: Job, text: str) -> None:
    for path in d.executor.log_paths(job)[:1]:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass
