"""`orch run`: record a job like submit, then run it here, in the foreground, with the same runner,
run folder and steps the daemon uses: `attempts.begin_attempt` starts each attempt and
`attempts.settle_attempt` decides what its exit makes of the job (retries, the result.json rule,
OOM). Ctrl-C records a cancel and asks the job to checkpoint (SIGTERM), then prints the command
that continues it; during a retry's backoff or while waiting for a GPU it cancels the queued job.

This process accrues its job's time and cost (the same formula as the daemon, cost/money.py); a
daemon beside it counts the job's share as busy but charges it nothing (docs/cost.md). Its GPUs
are chosen among those no running job holds and reserved by the store in the transition that
records the attempt, so the daemon and `orch run` never share one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Optional
from pathlib import Path

from ..jobs.attempts import Begun, Settled, begin_attempt, grace_for, lose_attempt, settle_attempt
from ..spec.config import Config
from ..contract import attempt_exit, attempt_log, exit_record, write_json_atomic
from ..model.errors import InvalidTransition
from ..cost.money import Pricing, running_job_budget_exceeded, split_interval, total_budget_exceeded
from ..jobs.lifecycle import cancel_job, retry_job, submit_job
from ..planning.capacity import machine_gpus
from ..home.paths import Home
from ..host.procs import is_alive, own_group_dying_with_parent, start_time
from ..model.records import FOREGROUND, FOREGROUND_PID, FOREGROUND_START, Job
from ..jobs.outcome import Decision
from ..model.states import RETRYABLE, AttemptOutcome, EventKind, Intent, JobState
from ..store import Store


def run_foreground(
    home: Home, store: Store, config: Config, *, job_toml: Optional[Path], resume_id: Optional[int]
) -> int:
    managed = machine_gpus(config)  # the job runs here, whatever executor the daemon uses
    if job_toml is not None:
        job = submit_job(store, config, home, job_toml, now=time.time(), machine_gpus=len(managed))
        print(f"recorded job {job.id} ({job.name}); running it here (Ctrl-C checkpoints and stops)", file=sys.stderr)
    else:
        job = store.get(resume_id)  # type: ignore[arg-type]
        if job.state is JobState.RUNNING:
            settled = settle_a_runnerless_attempt(home, store, config, job)
            if settled is None:
                return 1
            job = settled
        if job.state not in RETRYABLE and job.state is not JobState.QUEUED:
            raise InvalidTransition(
                job.id, job.state.value, "running", "only a queued, failed, cancelled or stopped job can be resumed"
            )
        if job.state in RETRYABLE:
            job = retry_job(store, config, home, job.id, time.time())
        print(f"resuming job {job.id} ({job.name}) here (Ctrl-C checkpoints and stops)", file=sys.stderr)
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
    job = store.get(job.id)
    return _Foreground(home, store, config, managed).run(job)


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
        if (j.executor == "local" or j.in_foreground) and (j.supervisor_pid or j.executor_ref) and not runner_alive(j)
    ]


def settle_a_runnerless_attempt(home: Home, store: Store, config: Config, job: Job) -> Optional[Job]:
    """`orch run --resume` of a job still recorded running. If what ran its attempt (an `orch run`,
    or a daemon's supervisor) is gone and no daemon is here to notice, the attempt is settled here
    the way the daemon would (its exit record, else lost: its strays stopped, a notice checkpoint
    kept), and the job can resume. Otherwise it says who has the job and returns None."""
    from ..executors import build_local_executor
    from .context import daemon_pid

    daemon = daemon_pid(home)
    if job.executor != "local" and not job.in_foreground:
        print(
            f"job {job.id} runs on {job.executor}; "
            + ("the daemon settles and resumes it" if daemon else "`orch daemon start` settles and resumes it")
            + f": follow it with `orch logs -f {job.id}`",
            file=sys.stderr,
        )
        return None
    executor = build_local_executor(home)
    if not job.supervisor_pid and not job.executor_ref and job.attempt and daemon is None:
        # a daemon that died between starting an attempt and recording its handle
        handle = executor.adopt(job)
        if handle:
            store.update(job.id, time.time(), only_if_state=[JobState.RUNNING], **handle)
            job = store.get(job.id)
    runner = job.supervisor_pid or (job.executor_ref or {}).get(FOREGROUND_PID)
    if runner_alive(job):
        who = "an `orch run`" if job.in_foreground else "the daemon's supervisor"
        print(
            f"job {job.id} is running under {who} (pid {runner}); follow it with `orch logs -f {job.id}`, "
            f"stop it with `orch cancel {job.id}`",
            file=sys.stderr,
        )
        return None
    if daemon is not None:
        print(
            f"job {job.id}'s attempt lost its runner (pid {runner}); the daemon (pid {daemon}) settles it on its "
            f"next tick and resumes it: follow it with `orch logs -f {job.id}`",
            file=sys.stderr,
        )
        return None
    now = time.time()
    exit_info = executor.exit(job)
    if exit_info is not None:
        settled = settle_attempt(store, config, home, job, exit_info, now)
    else:
        if strays := executor.strays(job):
            grace = grace_for(job, config)
            print(
                f"job {job.id}: attempt {job.attempt} still runs (pid {strays[0]}); giving it up to {grace:.0f} s "
                "to save its checkpoint and exit",
                file=sys.stderr,
            )
            executor.wind_down(job, grace)
        executor.clear_lost(job)  # nothing of the old attempt may run beside the new one
        settled = lose_attempt(store, config, home, job, time.time())
    job = settled.job if settled is not None else store.get(job.id)
    print(
        f"job {job.id}: attempt {job.attempt} lost its runner (pid {runner}); settled here: {job.state.value}"
        + (f" ({job.reason})" if job.reason else ""),
        file=sys.stderr,
    )
    return job


class _Foreground:
    def __init__(self, home: Home, store: Store, config: Config, managed: list[int]):
        self.home, self.store, self.config, self.managed = home, store, config, managed
        p = config.pricing
        self.pricing = Pricing(currency=p.currency, gpu_hour=p.gpu_hour, instance_hour=p.instance_hour)
        self.accrue_every_s = max(1.0, config.daemon.tick_seconds)
        self.proc: Optional[subprocess.Popen] = None
        self.job: Optional[Job] = None
        self.interrupts = 0

    def on_signal(self, _signum: int, _frame: Any) -> None:
        """Ctrl-C, a closed terminal, or the daemon acting on `orch cancel` (it signals the
        process it knows for the attempt: this one) all mean "checkpoint and stop"; the job runs
        in its own process group, so it hears it only from us."""
        self.interrupts += 1
        proc, job = self.proc, self.job
        if proc is None:
            return
        if self.interrupts == 1:
            if job is not None:  # the daemon may have recorded its own intent already; keep it
                self.store.set_intent_once(job.id, Intent.CANCEL.value, time.time())
            print("\ncheckpointing... (Ctrl-C again to kill without saving)", file=sys.stderr)
        try:
            os.killpg(proc.pid, signal.SIGTERM if self.interrupts == 1 else signal.SIGKILL)
        except ProcessLookupError:
            pass

    def run(self, job: Job) -> int:
        previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while True:
                if job.retry_after and job.retry_after > time.time() and not self.interrupts:
                    wait = job.retry_after - time.time()
                    print(f"retrying in {wait:.0f}s ({job.reason})", file=sys.stderr)
                    self._sleep(wait)
                if self.interrupts:
                    return self._stop_queued(job)
                settled = self._one_attempt(job)
                if self.interrupts and settled is None and self.store.get(job.id).state is JobState.QUEUED:
                    return self._stop_queued(job)  # Ctrl-C while waiting for a GPU
                if settled is None:
                    return 0  # a daemon took the job first
                job, d = settled.job, settled.decision
                if d.state is JobState.QUEUED:
                    print(f"job {job.id}: {d.reason}; running it again here", file=sys.stderr)
                    continue
                return self._report(job, settled)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _sleep(self, seconds: float) -> None:
        """Sleep that Ctrl-C ends: time.sleep resumes after a signal handler that returns."""
        until = time.monotonic() + seconds
        while not self.interrupts and time.monotonic() < until:
            time.sleep(min(0.1, max(0.0, until - time.monotonic())))

    def _stop_queued(self, job: Job) -> int:
        """Ctrl-C between attempts: the queued job is cancelled (no daemon starts it behind the
        user's back), to be continued with `orch run --resume`."""
        try:
            job, done = cancel_job(self.store, self.config, self.home, job.id, time.time())
        except InvalidTransition:
            done = False
        if done:
            print(
                f"\njob {job.id} cancelled before its next attempt; continue it with:  orch run --resume {job.id}",
                file=sys.stderr,
            )
        else:
            print(f"\njob {job.id} is no longer waiting here; see `orch show {job.id}`", file=sys.stderr)
        return 130

    def _free_gpus(self) -> list[int]:
        held = {g for j in self.store.jobs([JobState.RUNNING]) for g in j.gpu_ids}
        return [g for g in self.managed if g not in held]

    def _begin(self, job: Job) -> Optional[Begun]:
        """Begin the next attempt on GPUs no running job holds, waiting (Ctrl-C ends it) while a
        daemon's jobs hold them. None: the job left the queue meanwhile (a daemon started it), or
        the user pressed Ctrl-C."""
        said = False
        while not self.interrupts:
            free = self._free_gpus()
            if len(free) >= job.gpus:
                begun = begin_attempt(
                    self.store,
                    self.config,
                    self.home,
                    job,
                    sorted(free)[: job.gpus],
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
                print(f"job {job.id}: waiting for {job.gpus} free GPU(s) (Ctrl-C cancels)", file=sys.stderr)
                said = True
            self._sleep(1.0)
        return None

    def _accrue(self, job: Job, seconds: float, now: float) -> None:
        """Charge this job one interval by the daemon's formula: its share of the machine among
        the jobs running now (the same split the daemon makes, cost/money.py)."""
        if seconds <= 0:
            return
        running = [(j.id, j.gpus) for j in self.store.jobs([JobState.RUNNING])]
        if job.id not in {i for i, _ in running}:
            running.append((job.id, job.gpus))
        try:
            costs, _ = split_interval(seconds, running, len(self.managed), self.pricing)
            cost = costs.get(job.id, 0.0)
        except ValueError:  # more GPUs held than managed (a config changed): its own GPUs only
            cost = job.gpus * self.pricing.gpu_hour * seconds / 3600.0
        self.store.charge_job(job.id, seconds, cost, job.gpus * seconds)

    def _check_budget(self, job_id: int, now: float) -> None:
        """The daemon's budget rule (its [budget] and config.toml's total) for the job this process
        runs: a lone `orch run` has no daemon to apply it. The job checkpoints and ends `stopped`."""
        job, proc = self.store.get(job_id), self.proc
        if proc is None or job.intent is not Intent.NONE:
            return
        currency = self.config.pricing.currency
        total_reason = total_budget_exceeded(self.store.total_cost(), self.config.budget.total, currency)
        reason = running_job_budget_exceeded(
            job.cost, job.run_seconds / 3600, job.max_cost, job.max_hours, total_reason, currency
        )
        if reason is None or not self.store.set_intent_once(job.id, Intent.BUDGET.value, now):
            return
        self.store.update(job.id, now, only_if_state=[JobState.RUNNING], signalled_at=now, reason=reason)
        print(f"\n{reason}: checkpointing and stopping", file=sys.stderr)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _one_attempt(self, job: Job) -> Optional[Settled]:
        begun = self._begin(job)
        if begun is None:
            if self.interrupts:
                return None
            print(
                f"job {job.id} was started by a running daemon; follow it with `orch logs -f {job.id}`", file=sys.stderr
            )
            return None
        if begun.launch is None:  # on_env_change = "stop"
            self.exit_info = {"code": 1, "signal": None}  # `orch run` exits 1, as for a failed job
            stop = Decision(JobState.STOPPED, EventKind.STOPPED, AttemptOutcome.STOPPED, begun.job.reason)
            return Settled(begun.job, stop)
        launch = begun.launch
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
        if self.interrupts:
            self.interrupts = 0
            self.on_signal(signal.SIGINT, None)
        accrued = started
        while True:
            try:
                rc = self.proc.wait(timeout=self.accrue_every_s)
                break
            except subprocess.TimeoutExpired:
                now = time.time()
                self._accrue(begun.job, now - accrued, now)
                accrued = now
                self._check_budget(job.id, now)
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
            print(f"job {job.id} succeeded; run folder: {self.home.run_dir(job.id)}", file=sys.stderr)
            return 0
        if job.state is JobState.CANCELLED:
            print(f"\njob {job.id} stopped; continue it with:  orch run --resume {job.id}", file=sys.stderr)
        elif job.state is JobState.STOPPED and (job.reason or "").startswith("budget"):
            raise_it = (
                "raise [budget] total in config.toml"
                if "[budget] total" in (job.reason or "")
                else f"`orch retry {job.id} --budget N` (or `--hours N`)"
            )
            print(
                f"job {job.id} stopped at its budget ({job.reason}). To go on: {raise_it}, then "
                f"`orch run --resume {job.id}` (it resumes from its latest checkpoint)",
                file=sys.stderr,
            )
        else:
            print(
                f"job {job.id} {job.state.value}: {settled.decision.reason or job.reason}; after fixing, continue with "
                f"`orch run --resume {job.id}`",
                file=sys.stderr,
            )
        if code is not None:
            return code or 1
        return 128 + (sig or 0)
