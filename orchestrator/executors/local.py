"""Start, signal and poll job processes on this machine. Each attempt runs under its own
supervisor (orchestrator/supervisor.py) in a new session; the daemon only ever signals the
supervisor, checked by pid AND start time, and reads the exit from attempt-<n>.exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..gpus import visible_devices
from ..contract import newest_checkpoint, read_json  # noqa: F401 (newest_checkpoint: the daemon's)
from ..procs import is_alive, signal_group, signal_process, start_time

@dataclass(frozen=True)
class Launch:
    supervisor_pid: int
    supervisor_start: Optional[str]
    log_path: Path


def job_argv(spec: Mapping, run_dir: Path) -> tuple[list[str], Optional[str]]:
    """(argv, cwd) for a job: its own command, or the built-in runner on the run folder."""
    if spec.get("command"):
        return list(spec["command"]), spec.get("workdir")
    return [sys.executable, "-m", "training.run", str(run_dir)], str(run_dir)


def job_env(base: Mapping[str, str], *, job_id: int, attempt: int, run_dir: Path, gpu_ids: Sequence[int],
            resume_from: Optional[Path], extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(extra)
    env.update({
        "ORCH_JOB_ID": str(job_id),
        "ORCH_ATTEMPT": str(attempt),
        "ORCH_RUN_DIR": str(run_dir),
        "ORCH_CKPT_DIR": str(run_dir / "checkpoints"),
        "ORCH_RESUME_FROM": str(resume_from) if resume_from else "",
        "CUDA_VISIBLE_DEVICES": visible_devices(gpu_ids),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def start(*, run_dir: Path, attempt: int, argv: Sequence[str], cwd: Optional[str], env: Mapping[str, str],
          grace_s: float, wake: Optional[Path]) -> Launch:
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    log_path = run_dir / f"attempt-{attempt}.log"
    sup = [sys.executable, "-m", "orchestrator.supervisor", "--run-dir", str(run_dir), "--attempt", str(attempt),
           "--grace", str(grace_s)]
    if cwd:
        sup += ["--cwd", cwd]
    if wake:
        sup += ["--wake", str(wake)]
    with open(log_path, "ab", buffering=0) as log:
        proc = subprocess.Popen(
            [*sup, "--", *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env), start_new_session=True, close_fds=True,
        )
    return Launch(proc.pid, start_time(proc.pid), log_path)


def read_exit(run_dir: Path, attempt: int) -> Optional[dict]:
    return read_json(run_dir / f"attempt-{attempt}.exit")


def supervisor_alive(pid: Optional[int], started: Optional[str]) -> bool:
    return is_alive(pid, started)


def terminate(pid: Optional[int], started: Optional[str]) -> bool:
    """Ask the supervisor to SIGTERM the job's group; it SIGKILLs after the grace itself."""
    return signal_process(pid, started, signal.SIGTERM)


def kill(run_dir: Path, attempt: int, pid: Optional[int], started: Optional[str]) -> bool:
    """SIGKILL the job's group now: through the supervisor if it lives, else directly."""
    if signal_process(pid, started, signal.SIGUSR1):
        return True
    return kill_orphan(run_dir, attempt)


def kill_orphan(run_dir: Path, attempt: int) -> bool:
    """The supervisor is gone but the job may not be (someone killed only the supervisor): kill
    the job's process group, identified by pid and start time, so it never runs twice."""
    info = read_json(run_dir / f"attempt-{attempt}.pid") or {}
    pid, started = info.get("job_pid"), info.get("job_start")
    if pid and is_alive(pid, started):
        return signal_group(pid, signal.SIGKILL)
    return False


def reap_children() -> None:
    """Collect exited supervisors we started, so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
