"""The tick's dispatch step: which queued jobs start now (dispatch.py decides; this applies it),
each through the same begin step as `orch run`, then handed to the executor."""

from __future__ import annotations

import logging
import sqlite3

from ..jobs.attempts import begin_attempt
from ..contract import EX_CONFIG, attempt_log, write_exit_record
from ..jobs.absent_gpus import absent_gpus_reason, refuse_attempt
from ..planning.dispatch import choose_slot, edf_order, free_slots, hold_reason
from ..host.env_observe import Observed
from ..host.procs import is_alive
from ..model.executor_kinds import executor_kind
from ..model.records import FOREGROUND_PID, FOREGROUND_START, AttemptLaunch, Job
from ..model.states import EventKind, JobState
from .guard import fail_job, reason_for
from .step_context import StepContext
from .stop_requests import total_budget_hold

log = logging.getLogger("orch.daemon")


def _foreground_alive(job: Job) -> bool:
    """The `orch run` that recorded this queued job still runs (pid and start time)."""
    ref = job.executor_ref or {}
    return is_alive(ref.get(FOREGROUND_PID), ref.get(FOREGROUND_START))


def dispatch(d: StepContext, now: float) -> list[int]:
    queue = edf_order(d.store.queue_order())
    if not queue:
        return []
    free_gpus, free_cpu = free_slots(d.store.jobs([JobState.RUNNING]), d.managed, d.config.daemon.cpu_slots)
    # A cluster whose free GPUs the executor reads (Ray): no more GPU jobs start than it has free.
    room = d.executor.gpu_room(now)
    if room is not None:
        free_gpus = free_gpus[: room[0]]
    dep_states = d.store.states_of({dep for j in queue for dep in j.after_ids})
    budget_reason = total_budget_hold(d)
    started = []
    gpus_reserved = False  # a GPU job ahead in the queue is waiting for GPUs to free up
    for job in queue:
        if job.in_foreground and _foreground_alive(job):
            continue  # `orch run` waits to begin it in its own terminal
        hold = hold_reason(job, dep_states, now, budget_reason=budget_reason, notice_active=d.notice_active)
        if hold is not None:
            if hold.fail:
                d.change(job, JobState.FAILED, EventKind.FAILED, now, reason=hold.reason, with_log=False)
            elif budget_reason and hold.reason == budget_reason and job.reason != budget_reason:
                d.store.update(job.id, now, only_if_state=[JobState.QUEUED], reason=budget_reason)
            continue
        if job.gpus > len(d.managed):
            d.change(
                job,
                JobState.FAILED,
                EventKind.FAILED,
                now,
                reason=f"asks for {job.gpus} GPUs but this daemon manages {len(d.managed)} "
                "(config [daemon] gpus, else nvidia-smi)",
            )
            continue
        if job.gpus > 0 and gpus_reserved:
            continue  # GPUs freed meanwhile are kept for it, or it could starve behind later jobs
        gpu_ids = choose_slot(job, free_gpus, free_cpu)
        if gpu_ids is None:
            gpus_reserved = gpus_reserved or 0 < job.gpus <= len(d.managed)
            if room is not None and job.gpus > 0 and job.reason != room[1]:  # `orch status` says what it waits for
                d.store.update(job.id, now, only_if_state=[JobState.QUEUED], reason=room[1])
            continue
        observed = d.prestart.take(job)
        if observed is None:
            # Queued after this tick's prestart looked: its environment is learnt, off the lock,
            # at the top of the next tick. Its slot is kept for it meanwhile.
            gpus_reserved = gpus_reserved or job.gpus > 0
            free_cpu -= 1 if job.gpus == 0 else 0
            continue
        if start(d, job, gpu_ids, now, observed):
            started.append(job.id)
            free_gpus = [g for g in free_gpus if g not in gpu_ids]
            free_cpu -= 1 if job.gpus == 0 else 0
    return started


def start(d: StepContext, job: Job, gpu_ids: list[int], now: float, observed: Observed) -> bool:
    try:
        begun = begin_attempt(
            d.store,
            d.config,
            d.home,
            job,
            gpu_ids,
            now,
            environ=d.environ,
            observed=observed,
            executor=d.executor.name,
        )
    except sqlite3.Error:
        raise  # the store, not this job
    except Exception as exc:  # e.g. a link planted at its run folder: this job ends, the queue goes on
        fail_job(d, job, now, "prepare an attempt of", exc)
        return False
    if begun is None:
        return False
    if begun.launch is None:  # on_env_change = "stop": stopped before it trained
        d.announce(job, begun.job, EventKind.STOPPED, begun.job.reason)
        for kind in begun.also:
            d.on_event(kind.value, begun.job)
        return False
    d.announce(job, begun.job, EventKind.RESUMED if begun.resume_step is not None else EventKind.STARTED)
    for kind in begun.also:
        d.on_event(kind.value, begun.job)
    here = executor_kind(d.executor.name).on_this_machine  # a cluster places GPUs on its nodes
    absent = absent_gpus_reason(begun.launch, observed.machine[1]) if here else None
    if absent:  # GPUs nvidia-smi does not show: a configuration error, settled by the reap (exit 78)
        log.error("job %s: attempt %s not started: %s", job.id, begun.launch.attempt, absent)
        refuse_attempt(begun.launch, absent)
        write_exit_record(begun.launch.run_dir, begun.launch.attempt, EX_CONFIG, None, now, now)
        return True
    try:
        handle = d.executor.start(begun.launch)
    except Exception as exc:  # any type: one job that cannot start must not stop the ones behind it
        log.error("job %s: cannot start attempt %s: %s", job.id, begun.launch.attempt, reason_for("start", exc))
        note_start_failure(begun.launch, exc)
        # Write the exit record ourselves so the normal reap path decides (a retry after the
        # backoff, or failed): never a tight loop of starts.
        write_exit_record(begun.launch.run_dir, begun.launch.attempt, 127, None, now, now)
        return True
    d.store.update(job.id, now, only_if_state=[JobState.RUNNING], **handle)
    return True


def note_start_failure(launch: AttemptLaunch, exc: BaseException) -> None:
    """One line in the attempt's log, so `orch logs` and the failure notice say why."""
    try:
        with open(launch.run_dir / attempt_log(launch.attempt), "a", encoding="utf-8") as out:
            out.write(f"[orch] cannot start attempt {launch.attempt}: {reason_for('start', exc)}\n")
    except OSError:
        pass
