"""What runs on the Slurm nodes (standard library only; it sits beside every job).

`python -m orchestrator.executors.slurm.step batch ...` is the batch script's one command, on the
job's first node. It plays the local supervisor's part: it runs the job under `srun`, then writes
attempt-<n>.exit into the (shared) run folder, so settle_attempt decides exactly as on one machine
(75 requeue and resume, 76 the OOM path, anything else a retry).

The attempt's secrets come from its secret file (read and deleted before srun starts, so they are
never in the script or the environment Slurm keeps with the job); srun passes them to the ranks.

It does NOT forward signals. Measured (slurm-facts.md): `scancel --signal=TERM <id>`, preemption
(GraceTime) and `--signal=TERM@N` deliver SIGTERM to the srun tasks themselves on every node; a
SIGTERM to the srun client instead makes srun kill the tasks without a checkpoint. So this wrapper
catches SIGTERM and friends and keeps going (it must outlive srun to write the exit record), and
SIGUSR2 (sent by orch with `scancel --batch`) only means "a stop was asked": if srun has not
started yet it is not started at all.

`... slurm.step task --log-dir D --attempt N [--cwd C] -- argv` runs once per rank under srun:
rank 0 appends to attempt-<n>.log, rank r > 0 to attempt-<n>.rank-<r>.log, then it execs argv."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ...contract import (
    ENV_SRUN,
    EX_CHECKPOINTED,
    RESULT,
    attempt_log,
    attempt_slurm_info,
    checkpoint_dir,
    parse_checkpoint_name,
    write_exit_record,
    write_json_atomic,
)
from ...host.secret_file import take_secret_file
from ...redaction import shown_command


def rank_log(n: int, rank: int) -> str:
    return attempt_log(n, rank)


def batch(args: argparse.Namespace, command: list[str]) -> int:
    run_dir: Path = args.run_dir
    n = args.attempt
    state: dict[str, Any] = {"stop": False, "srun": None}

    def note(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGUSR2:
            state["stop"] = True
        if signum != signal.SIGCONT:
            print(
                f"[orch] batch step got {name}"
                + (" (the job's tasks get their own signal from Slurm)" if state["srun"] is not None else ""),
                flush=True,
            )

    for caught in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(caught, note)
    started_at = time.time()
    job_id = os.environ.get("SLURM_JOB_ID", "")
    write_json_atomic(
        run_dir / attempt_slurm_info(n),
        {
            "slurm_job_id": job_id,
            "batch_host": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
            "nodes": os.environ.get("SLURM_JOB_NODELIST", ""),
            "wrapper_pid": os.getpid(),
            "started_at": started_at,
        },
    )
    # Files' times come from the filesystem's clock (coarse, and on NFS the server's), not from
    # time.time(): a notice saved a moment after the start can read older than started_at. The
    # record just written is this attempt's start on that same clock.
    since = mtime_or(run_dir / attempt_slurm_info(n), started_at)
    print(
        f"[orch] attempt {n} started {time.strftime('%Y-%m-%d %H:%M:%S')} as Slurm job {job_id} on "
        f"{os.environ.get('SLURM_JOB_NODELIST', '?')}: {shown_command(command)}",
        flush=True,
    )
    step = os.environ.get(ENV_SRUN, "srun")
    srun = (
        [
            step,
            "--kill-on-bad-exit=1",
            f"--nodes={args.nodes}",
            f"--ntasks-per-node={args.ntasks_per_node}",
            sys.executable,
            "-m",
            "orchestrator.executors.slurm.step",
            "task",
            "--log-dir",
            str(run_dir),
            "--attempt",
            str(n),
        ]
        + (["--cwd", args.cwd] if args.cwd else [])
        + ["--", *command]
    )
    code: Optional[int] = None
    sig: Optional[int] = None
    env = dict(os.environ)
    if args.with_secrets:
        try:
            # read and deleted before srun starts; srun hands them to every rank on every node
            env.update(take_secret_file(run_dir, n))
        except (OSError, ValueError) as exc:
            print(f"[orch] attempt {n}: cannot read its secret file ({exc}); the job is not started", flush=True)
            write_exit_record(run_dir, n, 1, None, started_at, time.time(), slurm_job_id=job_id)
            return 0
    if state["stop"]:
        print("[orch] a stop was asked before the job started; not starting it", flush=True)
        code, sig = None, signal.SIGTERM.value
    else:
        try:
            proc = subprocess.Popen(srun, stdin=subprocess.DEVNULL, env=env)
            state["srun"] = proc
            while True:
                try:
                    rc = proc.wait()
                    break
                except InterruptedError:  # pragma: no cover (PEP 475 retries)
                    continue
            code, sig = split_returncode(rc)
        except OSError as exc:
            print(f"[orch] cannot start srun: {exc}", flush=True)
            code = 127
    ended_at = time.time()
    if sig == signal.SIGTERM and finished_before(run_dir, since):
        # A walltime warning or preemption that lands after the job wrote result.json (its last
        # act) can only hit the interpreter's shutdown: the work is complete and durable.
        print("[orch] SIGTERM came after the job wrote result.json: it had finished", flush=True)
        code, sig = 0, None
    elif sig in (signal.SIGTERM, signal.SIGKILL) and (notice := notice_saved_since(run_dir, since)):
        # Every rank passed the save's barrier before rank 0 exits 75; srun (--kill-on-bad-exit)
        # then stops the ranks still shutting down, and a rank killed there loses nothing. srun
        # reports that kill (128+sig outranks 75), but the attempt ended checkpointed.
        print(
            f"[orch] a rank was stopped by signal {sig} after {notice} was saved: the attempt checkpointed",
            flush=True,
        )
        code, sig = EX_CHECKPOINTED, None
    how = f"exit code {code}" if sig is None else f"signal {sig}"
    print(f"[orch] attempt {n} ended after {ended_at - started_at:.1f}s: {how}", flush=True)
    write_exit_record(run_dir, n, code, sig, started_at, ended_at, slurm_job_id=job_id)
    return 0


def mtime_or(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default


def finished_before(run_dir: Path, started_at: float) -> bool:
    try:
        return (run_dir / RESULT).stat().st_mtime >= started_at
    except OSError:
        return False


def notice_saved_since(run_dir: Path, started_at: float) -> Optional[str]:
    """The name of a notice checkpoint this attempt wrote (a complete file: it is renamed into
    place), or None."""
    try:
        entries = list(os.scandir(checkpoint_dir(run_dir)))
    except OSError:
        return None
    for entry in entries:
        name = parse_checkpoint_name(entry.name)
        try:
            if name is not None and name.notice and entry.stat().st_mtime >= started_at:
                return entry.name
        except OSError:
            continue
    return None


def split_returncode(rc: int) -> tuple:
    """srun's status -> (code, signal). srun reports a task killed by a signal as 128+sig (or
    Python's negative status when srun itself was killed)."""
    if rc < 0:
        return None, -rc
    if 128 < rc <= 128 + 64:
        return None, rc - 128
    return rc, None


def task(args: argparse.Namespace, command: list[str]) -> int:
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    path = Path(args.log_dir) / rank_log(args.attempt, rank)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if args.cwd:
        os.chdir(args.cwd)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"[orch] rank {rank}: cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    return 0  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator.executors.slurm.step")
    sub = parser.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("batch")
    b.add_argument("--run-dir", required=True, type=Path)
    b.add_argument("--attempt", required=True, type=int)
    b.add_argument("--nodes", type=int, default=1)
    b.add_argument("--ntasks-per-node", type=int, default=1)
    b.add_argument("--cwd", default=None)
    b.add_argument("--with-secrets", action="store_true")  # the daemon wrote the attempt's secret file
    b.add_argument("command", nargs=argparse.REMAINDER)
    t = sub.add_parser("task")
    t.add_argument("--log-dir", required=True)
    t.add_argument("--attempt", required=True, type=int)
    t.add_argument("--cwd", default=None)
    t.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    return batch(args, command) if args.mode == "batch" else task(args, command)


if __name__ == "__main__":
    sys.exit(main())
