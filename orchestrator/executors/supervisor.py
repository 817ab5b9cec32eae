"""`python -m orchestrator.executors.supervisor`: the local executor's tiny parent for one attempt. It runs in its own session
(so it outlives the daemon and the terminal), starts the job in its own process group, forwards
the daemon's SIGTERM to the whole group, enforces the grace period with SIGKILL itself, and writes
attempt-<n>.exit atomically when the job ends — so an exit is never lost while no daemon runs.
Imports nothing heavy: it sits beside every job for its whole life."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..contract import attempt_pid, write_exit_record, write_json_atomic
from ..host.procs import boot_id, group_members, signal_group, start_time
from ..home.wake import poke
from ..redaction import shown_command

# How long the job's leftover processes may take to die after the SIGKILL (as local.py).
GROUP_EXIT_WAIT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator.executors.supervisor")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument("--grace", type=float, default=25.0)
    parser.add_argument("--cwd", default=None)
    parser.add_argument("--wake", default=None, type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    run_dir: Path = args.run_dir
    n = args.attempt

    state: dict[str, Any] = {"job": None, "term_at": None}
    lock = threading.Lock()

    def kill_later(pgid: int, grace: float) -> None:
        time.sleep(grace)
        signal_group(pgid, signal.SIGKILL)

    def forward(signum: int, _frame: object) -> None:
        with lock:
            if state["term_at"] is None:
                state["term_at"] = time.time()
            job = state["job"]
        if job is not None:
            signal_group(job.pid, signal.SIGTERM)
            if signum != signal.SIGUSR2:  # USR2: a second, gentle nudge only
                threading.Thread(target=kill_later, args=(job.pid, args.grace), daemon=True).start()

    def kill_now(_signum: int, _frame: object) -> None:
        job = state["job"]
        if job is not None:
            signal_group(job.pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGUSR1, kill_now)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    started_at = time.time()
    print(f"[orch] attempt {n} started {time.strftime('%Y-%m-%d %H:%M:%S')}: {shown_command(command)}", flush=True)
    try:
        with lock:
            job = subprocess.Popen(command, cwd=args.cwd, start_new_session=False, preexec_fn=os.setpgrp)
            state["job"] = job
            pending = state["term_at"] is not None
        if pending:  # a SIGTERM came while the job was being started
            forward(signal.SIGTERM, None)
        write_json_atomic(
            run_dir / attempt_pid(n),
            {
                "supervisor_pid": os.getpid(),
                "supervisor_start": start_time(os.getpid()),
                "job_pid": job.pid,
                "job_start": start_time(job.pid),
                "boot_id": boot_id(),
                "started_at": started_at,
            },
        )
        returncode = job.wait()
        code, sig = (returncode, None) if returncode >= 0 else (None, -returncode)
    except OSError as exc:
        print(f"[orch] cannot start the job: {exc}", flush=True)
        code, sig = 127, None
    # Leftovers in the job's group (dataloader workers, a backgrounded child) must not outlive it:
    # a requeued attempt would otherwise run beside them.
    if state["job"] is not None:
        if state["term_at"] is not None:
            # A launcher that dies of the SIGTERM at once (accelerate's simple launcher under `trl sft`)
            # leaves its training process writing the notice checkpoint: the group keeps its grace.
            _await_group(state["job"].pid, state["term_at"] + args.grace)
        _clear_group(state["job"].pid)
    ended_at = time.time()
    how = f"exit code {code}" if sig is None else f"signal {sig} ({_signame(sig)})"
    print(f"[orch] attempt {n} ended after {ended_at - started_at:.1f}s: {how}", flush=True)
    write_exit_record(run_dir, n, code, sig, started_at, ended_at)
    if args.wake:
        poke(args.wake)
    return 0


def _await_group(pgid: int, deadline: float) -> None:
    """Wait until the job's group is empty or the wall clock passes `deadline`."""
    while group_members(pgid) and time.time() < deadline:
        time.sleep(0.05)


def _clear_group(pgid: int, wait_s: float = GROUP_EXIT_WAIT_S) -> None:
    """SIGKILL what is left of the job's group and wait (bounded) until every member is gone:
    the exit record lets the daemon start the next attempt, which must not run beside a dying
    worker (on a GPU it still holds its memory)."""
    signal_group(pgid, signal.SIGKILL)
    began = time.monotonic()
    while group_members(pgid):
        if time.monotonic() - began > wait_s:
            print(
                f"[orch] the job's processes (group {pgid}) still exist {wait_s:.0f}s after SIGKILL; "
                "ending the attempt anyway",
                flush=True,
            )
            return
        signal_group(pgid, signal.SIGKILL)
        time.sleep(0.02)
    if time.monotonic() - began > 2.0:
        print(f"[orch] the job's processes took {time.monotonic() - began:.1f}s to exit after SIGKILL", flush=True)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
