"""`orch run`: record a job like submit, then run it here, in the foreground, with the same runner
and run folder the daemon uses. Ctrl-C asks the job to checkpoint (SIGTERM) and prints the
command that continues it; an out-of-memory exit goes on at once in a fresh process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..executors import local as executor
from ..config import Config
from ..errors import InvalidTransition
from ..gpus import managed_gpus
from ..lifecycle import change_state, submit_job, write_run_spec
from ..outcome import EX_CHECKPOINTED, EX_OOM, describe_exit
from ..paths import Home
from ..contract import write_json_atomic
from ..procs import start_time
from ..records import Job
from ..states import RETRYABLE, EventKind, JobState
from ..store import Store


def run_foreground(home: Home, store: Store, config: Config, *, job_toml: Optional[Path],
                   resume_id: Optional[int]) -> int:
    managed = managed_gpus(config.daemon.gpus)
    if job_toml is not None:
        job = submit_job(store, config, home, job_toml, now=time.time(), machine_gpus=len(managed))
        print(f"recorded job {job.id} ({job.name}); running it here (Ctrl-C checkpoints and stops)", file=sys.stderr)
    else:
        job = store.get(resume_id)  # type: ignore[arg-type]
        if job.state not in RETRYABLE and job.state is not JobState.QUEUED:
            raise InvalidTransition(job.id, job.state.value, "running",
                                    "only a queued, failed, cancelled or stopped job can be resumed")
        if job.state in RETRYABLE:
            from ..lifecycle import retry_job

            job = retry_job(store, config, home, job.id, time.time())
        print(f"resuming job {job.id} ({job.name}) here (Ctrl-C checkpoints and stops)", file=sys.stderr)
    gpu_ids = sorted(managed)[: job.gpus]
    interrupted = {"count": 0}
    child: dict[str, Any] = {"proc": None}

    def on_sigint(_signum: int, _frame: Any) -> None:
        interrupted["count"] += 1
        proc = child["proc"]
        if proc is None:
            return
        sig = signal.SIGTERM if interrupted["count"] == 1 else signal.SIGKILL
        if interrupted["count"] == 1:
            print("\ncheckpointing... (Ctrl-C again to kill without saving)", file=sys.stderr)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def record_exit() -> None:
        if child.get("exit"):
            write_json_atomic(home.run_dir(job.id) / f"attempt-{job.attempt}.exit", child.pop("exit"))

    # Ctrl-C, a closed terminal, or the daemon acting on `orch cancel` (it signals the process it
    # knows for the attempt: this one) all mean "checkpoint and stop"; the job runs in its own
    # process group, so it hears it only from us.
    previous = {sig: signal.signal(sig, on_sigint) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            code, sig, job = _one_attempt(home, store, config, job, gpu_ids, child)
            if code is None and sig is None:  # a daemon took the job first
                return 0
            if interrupted["count"]:
                _end(store, config, home, job, JobState.CANCELLED, EventKind.CANCELLED,
                     f"interrupted with Ctrl-C ({describe_exit(code, sig)}); continue with `orch run --resume {job.id}`")
                print(f"\njob {job.id} stopped; continue it with:  orch run --resume {job.id}", file=sys.stderr)
                return code if code is not None else 128 + (sig or 0)
            if code in (EX_OOM, EX_CHECKPOINTED):
                kind = EventKind.OOM if code == EX_OOM else EventKind.RETRYING
                job = change_state(store, config, home, job, JobState.QUEUED, kind, time.time(),
                                   reason=f"{describe_exit(code, sig)}; running again in a fresh process",
                                   expect=[JobState.RUNNING], updates={"supervisor_pid": None},
                                   end_attempt={"ended_at": time.time(), "exit_code": code,
                                                "outcome": "oom" if code == EX_OOM else "checkpointed"})
                record_exit()
                continue
            has_result = (home.run_dir(job.id) / "result.json").exists()
            if code == 0 and (has_result or job.kind == "command"):
                _end(store, config, home, job, JobState.SUCCEEDED, EventKind.SUCCEEDED, "", code=code)
                print(f"job {job.id} succeeded; run folder: {home.run_dir(job.id)}", file=sys.stderr)
                return 0
            why = describe_exit(code, sig) if code != 0 else "the built-in runner exited 0 without writing result.json"
            _end(store, config, home, job, JobState.FAILED, EventKind.FAILED, why, code=code, sig=sig)
            print(f"job {job.id} failed: {why}; after fixing, continue with `orch run --resume {job.id}`", file=sys.stderr)
            return code if code else 1
    finally:
        record_exit()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _one_attempt(home: Home, store: Store, config: Config, job: Job, gpu_ids: list[int],
                 child: dict[str, Any]) -> tuple[Optional[int], Optional[int], Job]:
    run_dir = home.run_dir(job.id)
    if not (run_dir / "job.toml").exists():
        write_run_spec(home, job.id, job.spec)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    n = job.attempt + 1
    resume_path, resume_step = executor.newest_checkpoint(run_dir / "checkpoints")
    now = time.time()
    try:
        job = change_state(
            store, config, home, job, JobState.RUNNING, EventKind.RESUMED if resume_path else EventKind.STARTED, now,
            detail=f"attempt {n} in the foreground (orch run)" + (f", resuming from step {resume_step}" if resume_path else ""),
            expect=[job.state], reason="",
            updates={"attempt": n, "gpu_ids": gpu_ids, "intent": "", "supervisor_pid": os.getpid(),
                     "supervisor_start": start_time(os.getpid()), "started_at": job.started_at or now,
                     "finished_at": None, "cancel_requested_at": None},
            begin_attempt={"n": n, "gpu_ids": gpu_ids, "resumed_from_step": resume_step})
    except InvalidTransition:
        if store.get(job.id).state is not JobState.RUNNING:
            raise
        print(f"job {job.id} was started by a running daemon; follow it with `orch logs -f {job.id}`", file=sys.stderr)
        return None, None, job
    argv, cwd = executor.job_argv(job.spec, run_dir)
    if job.kind == "builtin":
        argv.append("--progress")
    env = executor.job_env(os.environ, job_id=job.id, attempt=n, run_dir=run_dir, gpu_ids=gpu_ids,
                           resume_from=resume_path, extra=job.spec.get("env") or {})
    (run_dir / f"attempt-{n}.log").write_text("[orch] this attempt ran in the foreground (orch run); "
                                              "its output went to the terminal\n")
    started = time.time()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=False, preexec_fn=os.setpgrp)
    child["proc"] = proc
    # The job has its own process group so only we see the terminal's Ctrl-C; we pass it on as SIGTERM.
    rc = proc.wait()
    child["proc"] = None
    code, sig = (rc, None) if rc >= 0 else (None, -rc)
    # No daemon accrues a foreground run: count its running time here (cost needs the daemon's clock).
    store.update(job.id, time.time(), run_seconds=store.get(job.id).run_seconds + (time.time() - started))
    # The exit record is written only after this process has recorded the outcome (see `_record_exit`):
    # a daemon that sees the file first would decide the job's state itself.
    child["exit"] = {"code": code, "signal": sig, "started_at": started, "ended_at": time.time()}
    return code, sig, store.get(job.id)


def _end(store: Store, config: Config, home: Home, job: Job, dst: JobState, kind: EventKind, reason: str, *,
         code: Optional[int] = None, sig: Optional[int] = None) -> None:
    now = time.time()
    outcome = {JobState.SUCCEEDED: "succeeded", JobState.FAILED: "failed", JobState.CANCELLED: "interrupted"}[dst]
    change_state(store, config, home, job, dst, kind, now, reason=reason, expect=[JobState.RUNNING],
                 updates={"finished_at": now, "supervisor_pid": None, "supervisor_start": None},
                 end_attempt={"ended_at": now, "exit_code": code, "exit_signal": sig, "outcome": outcome},
                 with_log=dst is JobState.FAILED)
