"""`orch run`'s supervisor: this process runs the job here, in the foreground, with the same
runner, run folder and steps the daemon uses: `attempts.begin_attempt` starts each attempt and
`settling.settle_attempt` decides what its exit makes of the job (retries, the result.json rule,
OOM). Ctrl-C records a cancel and asks the job to checkpoint (SIGTERM), then says the command
that continues it; during a retry's backoff or while waiting for a GPU it cancels the queued job.

Its signals are the supervisor's (signals.py): the handlers only count; this loop writes. What it
has to tell the user goes to `say` (the CLI's stderr), also from record.py and jobs/runners.py:
nothing in this room prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable, Optional
from pathlib import Path

from ..jobs.absent_gpus import absent_gpus_reason, refuse_attempt
from ..jobs.attempts import Begun, begin_attempt
from ..jobs.settling import Settled, settle_attempt
from ..spec.config import Config
from ..contract import EX_CHECKPOINTED, EX_CONFIG, attempt_exit, attempt_log, exit_record, write_json_atomic
from ..model.errors import InvalidTransition
from ..cost.money import Pricing
from ..cost.own_share import own_share
from ..jobs.budget_stop import budget_reason, record_stop, total_budget_reason
from ..jobs.lifecycle import cancel_job
from ..planning.capacity import machine_gpus
from ..planning.dispatch import choose_slot, free_slots
from ..home.paths import Home
from ..host.env_observe import driver_and_gpus
from ..host.procs import own_group_dying_with_parent, start_time
from ..model.records import FOREGROUND, FOREGROUND_PID, Job
from ..jobs.outcome import Decision
from ..model.states import AttemptOutcome, EventKind, Intent, JobState
from ..store import Store
from .record import record_job
from .signals import RunSignals


def run_foreground(
    home: Home,
    store: Store,
    config: Config,
    *,
    job_toml: Optional[Path],
    resume_id: Optional[int],
    say: Callable[[str], None],
) -> int:
    """Record the job (a job file, or `resume_id`) and run it here until it ends or is stopped;
    the exit code `orch run` exits with (the job's own, 75 when preempted, 130 after a Ctrl-C
    between attempts, 1 when another runner has the job)."""
    managed = machine_gpus(config)  # the job runs here, whatever executor the daemon uses
    foreground = _Foreground(home, store, config, managed, say)
    # The handlers from the first write on: a Ctrl-C while the job is recorded is one more
    # "stop" the loop acts on, never a KeyboardInterrupt between two writes.
    with foreground.sig.installed():
        job = record_job(home, store, config, managed, job_toml=job_toml, resume_id=resume_id, say=say)
        if job is None:
            return 1
        return foreground.run(job)


class _Foreground:
    def __init__(self, home: Home, store: Store, config: Config, managed: list[int], say: Callable[[str], None]):
        self.home, self.store, self.config, self.managed, self.say = home, store, config, managed, say
        self.pricing = Pricing.from_config(config)
        self.accrue_every_s = max(1.0, config.daemon.tick_seconds)
        self.proc: Optional[subprocess.Popen] = None
        self.job: Optional[Job] = None
        self.sig = RunSignals()  # what the handlers counted (signals.py)
        self.acted = 0  # of the stop signals, the ones the loop has acted on for the running attempt

    def _act_on_signals(self) -> None:
        """What the handlers counted, done outside them: the intent recorded before the job is
        signalled (the outcome table decides with it), then SIGTERM; SIGKILL for a second stop
        signal or a SIGUSR1."""
        proc, job = self.proc, self.job
        if proc is None:
            return
        kill = self.sig.kill_now or (self.sig.stops > self.acted and self.sig.stops >= 2)
        if self.sig.stops > self.acted and self.acted == 0:
            if job is not None:  # the daemon may have recorded its own intent already; keep it
                self.store.set_intent_once(job.id, Intent.CANCEL.value, time.time())
            self.say("\ncheckpointing... (Ctrl-C again to kill without saving)")
            self._signal_job(proc, signal.SIGTERM)
        self.acted, self.sig.kill_now = self.sig.stops, False
        if kill:
            self._signal_job(proc, signal.SIGKILL)

    @staticmethod
    def _signal_job(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def run(self, job: Job) -> int:
        while True:
            if job.retry_after and job.retry_after > time.time() and not self.sig.stops:
                wait = job.retry_after - time.time()
                self.say(f"retrying in {wait:.0f}s ({job.reason})")
                self._sleep(wait)
            if self.sig.stops:
                return self._stop_queued(job)
            settled = self._one_attempt(job)
            if self.sig.stops and settled is None and self.store.get(job.id).state is JobState.QUEUED:
                return self._stop_queued(job)  # Ctrl-C while waiting for a GPU
            if settled is None:
                return 0  # a daemon took the job first
            job, d = settled.job, settled.decision
            if d.state is JobState.QUEUED and d.event is EventKind.PREEMPTED:
                return self._preempted(job, d)
            if d.state is JobState.QUEUED:
                self.say(f"job {job.id}: {d.reason}; running it again here")
                continue
            return self._report(job, settled)

    def _sleep(self, seconds: float) -> None:
        """Sleep that Ctrl-C ends at once (the self-pipe wakes it)."""
        until = time.monotonic() + seconds
        while not self.sig.stops and time.monotonic() < until:
            self.sig.wait(until - time.monotonic())

    def _preempted(self, job: Job, d: Decision) -> int:
        """A preemption notice reached the daemon beside us (the machine is going away): the job
        checkpointed and is queued to resume, as the outcome table says. Not run again here, nor
        cancelled: the daemon resumes it once this process is gone, or `orch run --resume` does."""
        self.say(
            f"\njob {job.id} was preempted ({job.reason or d.reason}); it is queued and resumes from its checkpoint "
            f"when the daemon runs again, or here with:  orch run --resume {job.id}",
        )
        return EX_CHECKPOINTED

    def _stop_queued(self, job: Job) -> int:
        """Ctrl-C between attempts: the queued job is cancelled (no daemon starts it behind the
        user's back), to be continued with `orch run --resume`."""
        try:
            job, done = cancel_job(self.store, self.config, self.home, job.id, time.time())
        except InvalidTransition:
            done = False
        if done:
            self.say(
                f"\njob {job.id} cancelled before its next attempt; continue it with:  orch run --resume {job.id}",
            )
        else:
            self.say(f"\njob {job.id} is no longer waiting here; see `orch show {job.id}`")
        return 130

    def _begin(self, job: Job) -> Optional[Begun]:
        """Begin the next attempt where the daemon would start it (planning/dispatch.py's one
        choice): on GPUs no running job holds, or, for a GPU-free job, in a free CPU slot
        ([daemon] cpu_slots, shared with the daemon's jobs). Waits (Ctrl-C ends it) while none is
        free. None: the job left the queue meanwhile (a daemon started it), or Ctrl-C."""
        said = False
        while not self.sig.stops:
            free_gpus, free_cpu = free_slots(
                self.store.jobs([JobState.RUNNING]), self.managed, self.config.daemon.cpu_slots
            )
            gpu_ids = choose_slot(job, free_gpus, free_cpu)
            if gpu_ids is not None:
                begun = begin_attempt(
                    self.store,
                    self.config,
                    self.home,
                    job,
                    gpu_ids,
                    time.time(),
                    environ=os.environ,
                    executor=FOREGROUND,
                    where=" in the foreground (orch run)",
                )
                if begun is not None:
                    return begun
            job = self.store.get(job.id)
            if job.state is not JobState.QUEUED:
                return None
            if not said:
                what = (
                    f"{job.gpus} free GPU(s)"
                    if job.gpus
                    else f"a free CPU slot ([daemon] cpu_slots = {self.config.daemon.cpu_slots}, all taken)"
                )
                self.say(f"job {job.id}: waiting for {what} (Ctrl-C cancels)")
                said = True
            self._sleep(1.0)
        return None

    def _accrue(self, job: Job, seconds: float, now: float) -> None:
        """Charge this job one interval by the daemon's formula (cost/own_share.py)."""
        if seconds <= 0:
            return
        running = [(j.id, j.gpus) for j in self.store.jobs([JobState.RUNNING])]
        cost = own_share(seconds, job.id, job.gpus, running, len(self.managed), self.pricing)
        self.store.charge_job(job.id, seconds, cost, job.gpus * seconds)

    def _check_budget(self, job_id: int, now: float) -> None:
        """The daemon's budget stop (jobs/budget_stop.py) for the job this process runs: a lone
        `orch run` has no daemon to apply it. The job checkpoints and ends `stopped`."""
        job, proc = self.store.get(job_id), self.proc
        if proc is None:
            return
        reason = budget_reason(job, self.config, total_budget_reason(self.store, self.config))
        if reason is None or not record_stop(self.store, job, Intent.BUDGET, now, reason):
            return
        self.say(f"\n{reason}: checkpointing and stopping")
        self._signal_job(proc, signal.SIGTERM)

    def _one_attempt(self, job: Job) -> Optional[Settled]:
        begun = self._begin(job)
        if begun is None:
            if self.sig.stops:
                return None
            self.say(f"job {job.id} was started by a running daemon; follow it with `orch logs -f {job.id}`")
            return None
        if begun.launch is None:  # on_env_change = "stop"
            self.exit_info = {"code": 1, "signal": None}  # `orch run` exits 1, as for a failed job
            stop = Decision(JobState.STOPPED, EventKind.STOPPED, AttemptOutcome.STOPPED, begun.job.reason)
            return Settled(begun.job, stop)
        launch = begun.launch
        absent = absent_gpus_reason(launch, driver_and_gpus()[1])
        if absent:  # GPUs nvidia-smi does not show: failed at once, exit 78 (jobs/absent_gpus.py)
            refuse_attempt(launch, absent)
            now = time.time()
            self.exit_info = exit_record(EX_CONFIG, None, now, now)
            settled = settle_attempt(self.store, self.config, self.home, self.store.get(job.id), self.exit_info, now)
            write_json_atomic(launch.run_dir / attempt_exit(launch.attempt), self.exit_info)
            return settled
        # This process stands in for the attempt's supervisor: a daemon sees it alive, and its
        # cancel SIGTERMs reach us. The foreground mark: this process accrues the attempt's time.
        self.store.update(
            job.id,
            time.time(),
            only_if_state=[JobState.RUNNING],
            supervisor_pid=os.getpid(),
            supervisor_start=start_time(os.getpid()),
            executor_ref={FOREGROUND_PID: os.getpid()},
        )
        argv = list(launch.argv) + (["--progress"] if begun.job.kind == "builtin" else [])
        (launch.run_dir / attempt_log(launch.attempt)).write_text(
            "[orch] this attempt ran in the foreground (orch run); its output went to the terminal\n"
        )
        started = time.time()
        self.job = self.store.get(job.id)
        # The job has its own process group so only we see the terminal's Ctrl-C; we pass it on.
        # It also gets a SIGTERM when this process dies (kill -9, the OOM killer): it checkpoints
        # and exits 75 instead of training on with no one to record it.
        self.proc = subprocess.Popen(argv, cwd=launch.cwd, env=launch.env, preexec_fn=own_group_dying_with_parent())
        # A Ctrl-C that came while the attempt was being recorded: one "checkpoint and stop".
        # A SIGUSR1 was meant for an earlier attempt: it never kills this one.
        self.acted, self.sig.stops, self.sig.kill_now = 0, min(self.sig.stops, 1), False
        accrued = started
        next_accrual = time.monotonic() + self.accrue_every_s
        while True:
            self._act_on_signals()
            rc = self.proc.poll()
            if rc is not None:
                break
            if time.monotonic() >= next_accrual:
                now = time.time()
                self._accrue(begun.job, now - accrued, now)
                accrued = now
                self._check_budget(job.id, now)
                next_accrual = time.monotonic() + self.accrue_every_s
                continue
            # woken by a signal at once; a job's exit is seen within 0.1 s
            self.sig.wait(min(0.1, next_accrual - time.monotonic()))
        self.proc = None
        code, sig = (rc, None) if rc >= 0 else (None, -rc)
        ended = time.time()
        self._accrue(begun.job, ended - accrued, ended)
        exit_info = exit_record(code, sig, started, ended)
        settled = settle_attempt(self.store, self.config, self.home, self.store.get(job.id), exit_info, ended)
        # The exit record only after the outcome is recorded: a daemon that saw the file first
        # would settle the attempt itself.
        write_json_atomic(launch.run_dir / attempt_exit(launch.attempt), exit_info)
        self.exit_info = exit_info
        return settled

    def _report(self, job: Job, settled: Settled) -> int:
        code, sig = self.exit_info.get("code"), self.exit_info.get("signal")
        if job.state is JobState.SUCCEEDED:
            self.say(f"job {job.id} succeeded; run folder: {self.home.run_dir(job.id)}")
            return 0
        if job.state is JobState.CANCELLED:
            self.say(f"\njob {job.id} stopped; continue it with:  orch run --resume {job.id}")
        elif job.state is JobState.STOPPED and (job.reason or "").startswith("budget"):
            raise_it = (
                "raise [budget] total in config.toml"
                if "[budget] total" in (job.reason or "")
                else f"`orch retry {job.id} --budget N` (or `--hours N`)"
            )
            self.say(
                f"job {job.id} stopped at its budget ({job.reason}). To go on: {raise_it}, then "
                f"`orch run --resume {job.id}` (it resumes from its latest checkpoint)",
            )
        else:
            self.say(
                f"job {job.id} {job.state.value}: {settled.decision.reason or job.reason}; after fixing, continue with "
                f"`orch run --resume {job.id}`",
            )
        if code is not None:
            return code or 1
        return 128 + (sig or 0)
