"""The daemon's work, as one `tick(now)` made of small named, idempotent steps: reap finished
attempts, act on cancel requests and budgets, dispatch queued jobs, accrue cost, notice a drained
queue. Tests call the steps with a given `now`; daemon_loop.py drives them with APScheduler."""

from __future__ import annotations

import logging
from dataclasses import replace
import os
import threading
import time
from typing import Any, Callable, Mapping, Optional

from ..executors import local as executor
from .accounting import accrue_interval, lost_steps_updates
from ..config import Config
from ..dispatch import fits, hold_reason
from ..errors import InvalidTransition
from ..gpus import managed_gpus
from ..lifecycle import change_state, outgoing_for, write_run_spec
from ..outcome import EX_OOM, decide, describe_exit
from ..paths import Home
from ..contract import read_json
from ..records import Job
from ..states import EventKind, Intent, JobState
from ..store import Store

log = logging.getLogger("orch.daemon")


class Daemon:
    def __init__(self, home: Home, config: Config, store: Store, *, environ: Optional[Mapping[str, str]] = None,
                 gpu_ids: Optional[list[int]] = None, on_event: Optional[Callable[[str, Optional[Job]], None]] = None):
        self.home, self.config, self.store = home, config, store
        self.environ = dict(os.environ if environ is None else environ)
        self.managed = managed_gpus(config.daemon.gpus) if gpu_ids is None else list(gpu_ids)
        self.on_event = on_event or (lambda kind, job: None)  # hooks, after the transition commits
        self.lock = threading.RLock()  # tick, the preemption watcher and shutdown take turns
        self.notice_active = False
        self.stopping = False
        self.last_accrual: Optional[float] = None
        self.had_work = False

    # -- start-up --------------------------------------------------------------------------

    def recover(self, now: float) -> None:
        """Before the first tick: read exits written while no daemon ran, adopt jobs whose
        supervisor still lives (pid AND start time), requeue the ones whose processes are gone."""
        with self.lock:
            for job in self.store.jobs([JobState.RUNNING]):
                if self._exit_of(job) is None and executor.supervisor_alive(job.supervisor_pid, job.supervisor_start):
                    log.info("job %s: adopted its running attempt %s (supervisor pid %s)", job.id, job.attempt,
                             job.supervisor_pid)
            self.reap(now)
            self.had_work = bool(self.store.jobs([JobState.QUEUED, JobState.RUNNING]))

    # -- the tick --------------------------------------------------------------------------

    def tick(self, now: Optional[float] = None) -> None:
        now = time.time() if now is None else now
        with self.lock:
            executor.reap_children()
            self.reap(now)
            self.apply_cancels(now)
            self.check_budgets(now)
            self.escalate(now)
            if not self.stopping:
                self.dispatch(now)
            self.accrue(now)
            self.notice_drained(now)

    # -- reap ------------------------------------------------------------------------------

    def _exit_of(self, job: Job) -> Optional[dict]:
        return executor.read_exit(self.home.run_dir(job.id), job.attempt) if job.attempt else None

    def reap(self, now: float) -> None:
        for job in self.store.jobs([JobState.RUNNING]):
            exit_info = self._exit_of(job)
            if exit_info is None:
                if job.supervisor_pid is None:
                    job = self._adopt_unrecorded(job, now)
                if executor.supervisor_alive(job.supervisor_pid, job.supervisor_start):
                    continue
                exit_info = self._exit_of(job)  # it may have been written just now
            if exit_info is None:
                self._lost(job, now)
            else:
                self._finish(job, exit_info, now)

    def _adopt_unrecorded(self, job: Job, now: float) -> Job:
        """A daemon that died between starting a supervisor and recording its pid left a running
        job with no pid; the supervisor names itself in attempt-<n>.pid, so it is adopted, not run twice."""
        info = read_json(self.home.run_dir(job.id) / f"attempt-{job.attempt}.pid") if job.attempt else None
        pid, started = (info or {}).get("supervisor_pid"), (info or {}).get("supervisor_start")
        if not executor.supervisor_alive(pid, started):
            return job
        self.store.update(job.id, now, only_if_state=[JobState.RUNNING], supervisor_pid=pid, supervisor_start=started)
        log.info("job %s: adopted attempt %s from its pid file (supervisor pid %s)", job.id, job.attempt, pid)
        return self.store.get(job.id)

    def _step_reached(self, job: Job, since: float) -> Optional[int]:
        """The attempt's last step: progress.json, or a checkpoint this attempt wrote at a later step
        (progress is written every few seconds; the notice checkpoint is the step it really ended at)."""
        run_dir = self.home.run_dir(job.id)
        progress = read_json(run_dir / "progress.json")
        step = None
        if progress and isinstance(progress.get("step"), int) and (progress.get("updated_at") or 0) >= since - 1:
            step = progress["step"]
        path, ckpt_step = executor.newest_checkpoint(run_dir / "checkpoints")
        try:
            if path is not None and ckpt_step is not None and path.stat().st_mtime >= since - 1:
                step = max(step or 0, ckpt_step)
        except OSError:  # pruned meanwhile
            pass
        return step

    def _attempt_started(self, job: Job) -> float:
        attempts = self.store.attempts(job.id)
        return attempts[-1].started_at if attempts else (job.started_at or 0.0)

    def _finish(self, job: Job, exit_info: dict, now: float) -> None:
        run_dir = self.home.run_dir(job.id)
        started = self._attempt_started(job)
        result = run_dir / "result.json"
        has_result = result.exists() and result.stat().st_mtime >= started - 1
        code, sig = exit_info.get("code"), exit_info.get("signal")
        shrink = self._oom_shrink(job)
        if shrink is not None and code != EX_OOM and job.intent is Intent.NONE:
            # Under DDP an OOM on another rank makes Lightning kill rank 0 (signal 9): the runner's
            # batch.json entry for this attempt is the truth, not the exit code.
            code = EX_OOM
        d = decide(job.intent, code, sig if code != EX_OOM else None, has_result=has_result,
                   is_command=job.kind == "command", failures=job.failures, retries=job.retries)
        if d.outcome == "oom" and shrink is not None:
            d = replace(d, reason=f"out of GPU memory at step {shrink.get('step')}: running again in a fresh process with "
                                  f"batch {shrink['from']['batch_size']} -> {shrink['to']['batch_size']}, accumulation "
                                  f"{shrink['from']['accumulate_grad_batches']} -> {shrink['to']['accumulate_grad_batches']}")
        updates: dict[str, Any] = {"supervisor_pid": None, "supervisor_start": None, "gpu_ids": [],
                                   "signalled_at": None, "failures": job.failures + int(d.charged)}
        if d.state is JobState.QUEUED:
            updates.update(intent="", cancel_requested_at=None)
            stalls = self._stalled_resumes(job) if d.outcome == "checkpointed" else 0
            if d.backoff or stalls:
                # A job that keeps exiting 75 without a newer checkpoint would otherwise restart
                # several times a second, uncharged: back off as if it were failing.
                base = self.config.daemon.retry_backoff_seconds
                delay = min(self.config.daemon.max_retry_backoff_seconds, base * 2 ** (job.failures + stalls - 1 if stalls else job.failures))
                updates["retry_after"] = now + delay
        else:
            updates["finished_at"] = now
        end = {"ended_at": exit_info.get("ended_at") or now, "exit_code": code, "exit_signal": sig,
               "outcome": d.outcome, "step_reached": self._step_reached(job, started)}
        reason = d.reason or job.reason
        if job.intent is Intent.PREEMPT and job.reason and d.state is JobState.QUEUED:
            reason = f"{job.reason}; {d.reason}"  # which notice (AWS, GCP, daemon stop...) and how it ended
        detail = reason if d.state is not JobState.SUCCEEDED else f"attempt {job.attempt}: {describe_exit(code, sig)}"
        if d.state is JobState.FAILED or d.charged:
            from ..lifecycle import log_tail

            tail = log_tail(run_dir, job.attempt, 10)
            if tail:
                detail += "\nlast log lines:\n" + tail
        self._change(job, d.state, d.event, now, detail=detail, reason=reason, updates=updates, end_attempt=end,
                     with_log=d.state is JobState.FAILED)

    def _oom_shrink(self, job: Job) -> Optional[dict]:
        """The runner's batch.json entry for this attempt, if it ran out of memory."""
        sizes = read_json(self.home.run_dir(job.id) / "batch.json") or {}
        history = sizes.get("history") or []
        last = history[-1] if history and isinstance(history[-1], dict) else None
        if last and str(last.get("attempt")) == str(job.attempt) and "from" in last and "to" in last:
            return last
        return None

    def _stalled_resumes(self, job: Job) -> int:
        """How many attempts in a row (this one included) exited 75 with no checkpoint newer
        than the one they resumed from."""
        _, newest = executor.newest_checkpoint(self.home.run_dir(job.id) / "checkpoints")
        attempts = self.store.attempts(job.id)
        if not attempts or (newest or -1) > (attempts[-1].resumed_from_step or -1):
            return 0
        stalls = 1
        for prev in reversed(attempts[:-1]):
            if prev.outcome != "checkpointed" or prev.resumed_from_step != attempts[-1].resumed_from_step:
                break
            stalls += 1
        return stalls

    def _lost(self, job: Job, now: float) -> None:
        """No exit record and no supervisor: the machine restarted or someone killed the attempt's
        whole session. Its own processes must not survive the requeue."""
        run_dir = self.home.run_dir(job.id)
        if job.attempt:
            executor.kill_orphan(run_dir, job.attempt)
        started = self._attempt_started(job)
        end = {"ended_at": now, "outcome": "lost", "step_reached": self._step_reached(job, started)}
        updates: dict[str, Any] = {"supervisor_pid": None, "supervisor_start": None, "gpu_ids": [], "signalled_at": None}
        if job.intent is Intent.CANCEL:
            dst, kind, reason = JobState.CANCELLED, EventKind.CANCELLED, "cancelled by the user"
        elif job.intent is Intent.BUDGET:
            dst, kind, reason = JobState.STOPPED, EventKind.STOPPED, job.reason
        else:
            dst, kind = JobState.QUEUED, EventKind.PREEMPTED
            reason = "its processes vanished (killed, or the machine restarted); queued to resume from its latest checkpoint"
            updates.update(intent="", cancel_requested_at=None)
        if dst is not JobState.QUEUED:
            updates["finished_at"] = now
        self._change(job, dst, kind, now, detail=reason, reason=reason, updates=updates, end_attempt=end)

    def _change(self, job: Job, dst: JobState, kind: EventKind, now: float, **kw: Any) -> Optional[Job]:
        try:
            new = change_state(self.store, self.config, self.home, job, dst, kind, now,
                               expect=[job.state], **kw)
        except InvalidTransition as exc:
            log.warning("job %s: %s", job.id, exc)
            return None
        log.info("job %s (%s): %s -> %s: %s", job.id, job.name, job.state.value, dst.value, kw.get("reason") or "")
        self.on_event(kind.value, new)
        return new

    # -- requests: cancel, budget, escalation -------------------------------------------------

    def _signal(self, job: Job, intent: Intent, now: float, reason: str) -> None:
        if self.store.set_intent_once(job.id, intent.value, now):
            self.store.update(job.id, now, only_if_state=[JobState.RUNNING], signalled_at=now, reason=reason)
            log.info("job %s: SIGTERM (%s): %s", job.id, intent.value, reason)
            executor.terminate(job.supervisor_pid, job.supervisor_start)

    def apply_cancels(self, now: float) -> None:
        for job in self.store.jobs([JobState.RUNNING]):
            if job.cancel_requested_at is not None and job.intent is not Intent.CANCEL:
                if job.intent is Intent.NONE:
                    self._signal(job, Intent.CANCEL, now, "cancelled by the user")
                else:  # already being stopped for another reason: the user's word wins the outcome
                    self.store.update(job.id, now, only_if_state=[JobState.RUNNING], intent=Intent.CANCEL.value)

    def check_budgets(self, now: float) -> None:
        from ..cost import budget_exceeded

        running = self.store.jobs([JobState.RUNNING])
        total_reason = self.total_budget_reason()
        for job in running:
            if job.intent is not Intent.NONE:
                continue
            reason = total_reason or budget_exceeded(job.cost, job.run_seconds / 3600, job.max_cost, job.max_hours,
                                                     currency=self.config.pricing.currency)
            if reason:
                self._signal(job, Intent.BUDGET, now, reason)

    def total_budget_reason(self) -> Optional[str]:
        from ..cost import total_budget_exceeded

        if self.config.budget.total is None:
            return None
        return total_budget_exceeded(self.store.total_cost(), self.config.budget.total, currency=self.config.pricing.currency)

    def total_budget_hold(self) -> Optional[str]:
        """Why queued jobs wait while the total budget is spent. Worded without the running
        figure, so it is written once and not rewritten every tick."""
        if self.total_budget_reason() is None:
            return None
        from ..cost import format_money

        total = format_money(self.config.budget.total or 0.0, self.config.pricing.currency)
        return f"held: the total budget of {total} is spent; raise [budget] total in config.toml to go on"

    def grace_for(self, job: Job) -> float:
        """SIGTERM -> SIGKILL for this job: its own `grace_seconds`, else the config's."""
        return float(job.spec.get("grace_seconds") or self.config.daemon.grace_seconds)

    def escalate(self, now: float) -> None:
        """The supervisor SIGKILLs after the grace by itself; this is the daemon's backstop."""
        for job in self.store.jobs([JobState.RUNNING]):
            if job.signalled_at is not None and now - job.signalled_at > self.grace_for(job) + 5:
                executor.kill(self.home.run_dir(job.id), job.attempt, job.supervisor_pid, job.supervisor_start)

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, now: float) -> list[int]:
        queue = self.store.queue_order()
        if not queue:
            return []
        running = self.store.jobs([JobState.RUNNING])
        used = {g for j in running for g in j.gpu_ids}
        free_gpus = [g for g in self.managed if g not in used]
        free_cpu = self.config.daemon.cpu_slots - sum(1 for j in running if j.gpus == 0)
        dep_states = self.store.states_of({d for j in queue for d in j.after_ids})
        budget_reason = self.total_budget_hold()
        started = []
        gpus_reserved = False  # a GPU job ahead in the queue is waiting for GPUs to free up
        for job in queue:
            hold = hold_reason(job, dep_states, now, budget_reason=budget_reason, notice_active=self.notice_active)
            if hold is not None:
                if hold.fail:
                    self._change(job, JobState.FAILED, EventKind.FAILED, now, reason=hold.reason,
                                 updates={"finished_at": now}, with_log=False)
                elif budget_reason and hold.reason == budget_reason and job.reason != budget_reason:
                    self.store.update(job.id, now, only_if_state=[JobState.QUEUED], reason=budget_reason)
                continue
            if job.gpus > len(self.managed):
                self._change(job, JobState.FAILED, EventKind.FAILED, now, updates={"finished_at": now},
                             reason=f"asks for {job.gpus} GPUs but this daemon manages {len(self.managed)} "
                                    "(config [daemon] gpus, else nvidia-smi)")
                continue
            if job.gpus > 0 and gpus_reserved:
                continue  # GPUs freed meanwhile are kept for it, or it could starve behind later jobs
            if not fits(job, free_gpus, free_cpu):
                gpus_reserved = gpus_reserved or 0 < job.gpus <= len(self.managed)
                continue
            gpu_ids = sorted(free_gpus)[: job.gpus]
            if self._start(job, gpu_ids, now):
                started.append(job.id)
                free_gpus = [g for g in free_gpus if g not in gpu_ids]
                free_cpu -= 1 if job.gpus == 0 else 0
        return started

    def _start(self, job: Job, gpu_ids: list[int], now: float) -> bool:
        run_dir = self.home.run_dir(job.id)
        if not (run_dir / "job.toml").exists():
            write_run_spec(self.home, job.id, job.spec)
        n = job.attempt + 1
        resume_path, resume_step = executor.newest_checkpoint(run_dir / "checkpoints")
        lost = self._account_lost_steps(job, resume_step)
        kind = EventKind.RESUMED if resume_path else EventKind.STARTED
        detail = f"attempt {n}" + (f" on GPU {','.join(map(str, gpu_ids))}" if gpu_ids else " on the CPU")
        if resume_path:
            detail += f", resuming from step {resume_step} ({resume_path.name})"
        updates: dict[str, Any] = {"attempt": n, "gpu_ids": gpu_ids, "intent": "", "signalled_at": None,
                                   "retry_after": None, "reason": "", **lost}
        if job.started_at is None:
            updates["started_at"] = now
        job = self._change(job, JobState.RUNNING, kind, now, detail=detail, updates=updates,
                           begin_attempt={"n": n, "gpu_ids": gpu_ids, "resumed_from_step": resume_step})
        if job is None:
            return False
        argv, cwd = executor.job_argv(job.spec, run_dir)
        env = executor.job_env(self.environ, job_id=job.id, attempt=n, run_dir=run_dir, gpu_ids=gpu_ids,
                               resume_from=resume_path, extra=job.spec.get("env") or {})
        grace = self.grace_for(job)
        try:
            launch = executor.start(run_dir=run_dir, attempt=n, argv=argv, cwd=cwd, env=env, grace_s=grace,
                                    wake=self.home.wake_socket)
        except OSError as exc:
            log.error("job %s: cannot start its supervisor: %s", job.id, exc)
            # Write the exit record ourselves so the normal reap path decides (retry or fail).
            from ..contract import write_json_atomic

            write_json_atomic(run_dir / f"attempt-{n}.exit", {"code": 127, "signal": None, "started_at": now, "ended_at": now})
            return True
        self.store.update(job.id, now, only_if_state=[JobState.RUNNING], supervisor_pid=launch.supervisor_pid,
                          supervisor_start=launch.supervisor_start)
        return True

    def _account_lost_steps(self, job: Job, resume_step: Optional[int]) -> dict[str, Any]:
        return lost_steps_updates(job, self.store.attempts(job.id), resume_step)

    # -- cost --------------------------------------------------------------------------------

    def accrue(self, now: float) -> None:
        last, self.last_accrual = self.last_accrual, now
        if last is None or now <= last:
            return
        # A suspended machine or a stalled tick is not billed twice: at most 60 s an interval.
        accrue_interval(self.store, self.config, len(self.managed), min(now - last, 60.0), now)

    # -- queue drained -------------------------------------------------------------------------

    def notice_drained(self, now: float) -> None:
        active = self.store.count_by_state()
        busy = active.get(JobState.QUEUED, 0) + active.get(JobState.RUNNING, 0)
        if busy:
            self.had_work = True
        elif self.had_work:
            self.had_work = False
            payload = {"event": "queue_drained", "reason": "no job is queued or running", "host": os.uname().nodename,
                       "currency": self.config.pricing.currency}
            self.store.record_event(None, EventKind.QUEUE_DRAINED, now, detail="no job is queued or running",
                                    outgoing=outgoing_for(self.config, EventKind.QUEUE_DRAINED, payload))
            log.info("queue drained")
            self.on_event(EventKind.QUEUE_DRAINED.value, None)

    # -- preemption and shutdown ---------------------------------------------------------------

    def preempt_all(self, now: float, reason: str) -> list[int]:
        with self.lock:
            signalled = []
            for job in self.store.jobs([JobState.RUNNING]):
                if job.intent is Intent.NONE:
                    self._signal(job, Intent.PREEMPT, now, reason)
                    signalled.append(job.id)
            return signalled

    def running_count(self) -> int:
        return len(self.store.jobs([JobState.RUNNING]))
