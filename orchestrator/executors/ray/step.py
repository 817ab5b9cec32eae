"""What runs on a Ray node as each attempt's entrypoint (imports nothing heavy, never `ray`):
`python -m orchestrator.executors.ray.step --run-dir D --attempt N --grace G [--with-secrets] [--cwd C] -- argv`.

It plays the local supervisor's part on the node: the job's output goes to attempt-<n>.log in the
(shared) run folder, so `orch logs -f` works whatever Ray's log API does; the attempt's secrets
come from its secret file (read and deleted first: never in Ray's job table); the job runs in its own
process group; a SIGTERM (Ray's stop_job, which orch calls for cancel, budget and notices) is
passed to that group and followed by SIGKILL after the job's grace; and attempt-<n>.exit is
written when the job ends, so the daemon settles a Ray attempt with the same outcome table.

One case is different: when Ray loses the attempt (its node's raylet or the job's supervisor actor
dies, the parent of this process), the job is killed at once and NO exit record is written: the
daemon sees Ray's FAILED / JOB_SUPERVISOR_ACTOR_DIED, reads the attempt as lost (requeued, not
charged) and starts the next one elsewhere, which must not find this one still training into the
same run folder."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from ...contract import attempt_log, attempt_ray_info, write_exit_record, write_json_atomic
from ...host.procs import group_members, own_group_dying_with_parent, signal_group
from ...host.secret_file import take_secret_file
from ...redaction import shown_command

PARENT_POLL_S = 0.5  # how often the step looks whether Ray (its parent) still holds the attempt


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator.executors.ray.step")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument("--grace", type=float, default=25.0)
    parser.add_argument("--cwd", default=None)
    parser.add_argument("--with-secrets", action="store_true")  # the daemon wrote the attempt's secret file
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    run_dir: Path = args.run_dir
    n: int = args.attempt
    fd = os.open(run_dir / attempt_log(n), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = sys.stdout

    state: dict[str, Any] = {"job": None, "stopping": False, "lost": False}
    lock = threading.Lock()

    def kill_later(pgid: int) -> None:
        time.sleep(args.grace)
        signal_group(pgid, signal.SIGKILL)

    def forward(signum: int, _frame: object) -> None:
        with lock:
            first, state["stopping"] = not state["stopping"], True
            job = state["job"]
        if job is not None:
            signal_group(job.pid, signal.SIGTERM)
            if first:
                print(f"[orch] Ray asked attempt {n} to stop: SIGTERM, SIGKILL in {args.grace:.0f}s", flush=True)
                threading.Thread(target=kill_later, args=(job.pid,), daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    parent = os.getppid()
    started_at = time.time()
    write_json_atomic(
        run_dir / attempt_ray_info(n),
        {
            "host": socket.gethostname(),
            "node_id": os.environ.get("RAY_NODE_ID", ""),
            "step_pid": os.getpid(),
            "started_at": started_at,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        },
    )
    print(
        f"[orch] attempt {n} started {time.strftime('%Y-%m-%d %H:%M:%S')} on Ray node {socket.gethostname()} "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}): {shown_command(command)}",
        flush=True,
    )
    code: Optional[int]
    sig: Optional[int] = None
    env = dict(os.environ)
    if args.with_secrets:
        try:
            env.update(take_secret_file(run_dir, n))  # read and deleted before the job starts
        except (OSError, ValueError) as exc:
            print(f"[orch] attempt {n}: cannot read its secret file ({exc}); the job is not started", flush=True)
            write_exit_record(run_dir, n, 1, None, started_at, time.time(), ray_host=socket.gethostname())
            return 1
    try:
        with lock:
            # Its own group (the grace's SIGKILL reaches its workers), and SIGKILL if this step is
            # killed first (Ray's own clean-up kills the step's group when its supervisor dies).
            job = subprocess.Popen(
                command,
                cwd=args.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                preexec_fn=own_group_dying_with_parent(signal.SIGKILL),
            )
            state["job"] = job
            pending = state["stopping"]
        if pending:  # Ray's stop came while the job was being started
            state["stopping"] = False
            forward(signal.SIGTERM, None)
        while True:
            try:
                returncode = job.wait(timeout=PARENT_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if os.getppid() != parent:  # Ray's supervisor of this attempt is gone: so is the attempt
                    state["lost"] = True
                    signal_group(job.pid, signal.SIGKILL)
        code, sig = (returncode, None) if returncode >= 0 else (None, -returncode)
    except OSError as exc:
        print(f"[orch] cannot start the job: {exc}", flush=True)
        code = 127
    if state["job"] is not None:
        clear_group(state["job"].pid)
    ended_at = time.time()
    if state["lost"]:
        print(f"[orch] attempt {n}: Ray lost it (its supervisor died); the job was killed, no exit record", flush=True)
        return 1
    how = f"exit code {code}" if sig is None else f"signal {sig}"
    print(f"[orch] attempt {n} ended after {ended_at - started_at:.1f}s: {how}", flush=True)
    write_exit_record(run_dir, n, code, sig, started_at, ended_at, ray_host=socket.gethostname())
    return 0 if code == 0 else 1


def clear_group(pgid: int, wait_s: float = 30.0) -> None:
    """What is left of the job's group must not outlive the attempt (as the local supervisor)."""
    signal_group(pgid, signal.SIGKILL)
    began = time.monotonic()
    while group_members(pgid) and time.monotonic() - began < wait_s:
        signal_group(pgid, signal.SIGKILL)
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
