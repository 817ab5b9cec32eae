"""The local executor: each attempt runs under its own supervisor (supervisor.py) in
a new session on this machine. The daemon only ever signals the supervisor, checked by pid AND
start time, and reads the exit from attempt-<n>.exit, which the supervisor writes even when no
daemon runs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..home.paths import Home
from ..contract import attempt_exit, attempt_log, attempt_pid, checkpoint_dir, read_json
from ..host.procs import (
    boot_id,
    group_members,
    is_alive,
    signal_group,
    signal_process,
    start_time,
    with_environment,
)
from ..model.records import SUPERVISOR_MODULE, AttemptLaunch, Job

log = logging.getLogger("orch.executor.local")

# What the local executor runs as each attempt's parent (`python -m ...`); doctor finds it by name.

# How long a lost attempt's process group may take to die before the next attempt starts anyway
# (with a line in the daemon log): a dying process on a GPU still holds its memory.
GROUP_EXIT_WAIT_S = 30.0


def attempt_processes(run_dir: str, attempt: int) -> list[int]:
    """Live processes (not zombies, not this one) whose environment says ORCH_RUN_DIR=run_dir and
    ORCH_ATTEMPT=attempt."""
    return with_environment(ORCH_RUN_DIR=str(run_dir), ORCH_ATTEMPT=str(attempt))


class LocalExecutor:
    name = "local"

    def __init__(self, home: Home, python: str = sys.executable):
        self.home = home
        self.python = python

    # -- start -----------------------------------------------------------------------------

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        run_dir = launch.run_dir
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        checkpoint_dir(run_dir).mkdir(exist_ok=True)
        sup = [
            self.python,
            "-m",
            SUPERVISOR_MODULE,
            "--run-dir",
            str(run_dir),
            "--attempt",
            str(launch.attempt),
            "--grace",
            str(launch.grace_s),
        ]
        if launch.cwd:
            sup += ["--cwd", launch.cwd]
        sup += ["--wake", str(self.home.wake_socket)]
        with open(run_dir / attempt_log(launch.attempt), "ab", buffering=0) as out:
            proc = subprocess.Popen(
                [*sup, "--", *launch.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(launch.env),
                start_new_session=True,
                close_fds=True,
            )
        return {"supervisor_pid": proc.pid, "supervisor_start": start_time(proc.pid)}

    # -- watching --------------------------------------------------------------------------

    def exchange(self, jobs: Sequence[Job], now: float) -> None:
        """Nothing to ask: a local attempt is a process of this machine."""

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        """Collect exited supervisors we started, so they do not linger as zombies."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def adopt(self, job: Job) -> Optional[dict[str, Any]]:
        """The supervisor names itself in attempt-<n>.pid, so a job whose pid the daemon never
        recorded is adopted, not run twice."""
        info = self._pid_file(job)
        pid, started = info.get("supervisor_pid"), info.get("supervisor_start")
        if not is_alive(pid, started):
            return None
        return {"supervisor_pid": pid, "supervisor_start": started}

    def alive(self, job: Job) -> bool:
        return is_alive(job.supervisor_pid, job.supervisor_start)

    def exit(self, job: Job) -> Optional[dict[str, Any]]:
        return read_json(self.home.run_dir(job.id) / attempt_exit(job.attempt)) if job.attempt else None

    # -- signals -----------------------------------------------------------------------------

    def terminate(self, job: Job) -> bool:
        """Ask the supervisor to SIGTERM the job's group; it SIGKILLs after the grace itself."""
        return signal_process(job.supervisor_pid, job.supervisor_start, signal.SIGTERM)

    def kill(self, job: Job) -> bool:
        """SIGKILL the job's group now: through the supervisor if it lives, else directly."""
        if signal_process(job.supervisor_pid, job.supervisor_start, signal.SIGUSR1):
            return True
        return self._kill_job_group(job)

    def clear_lost(self, job: Job) -> None:
        """The supervisor is gone but the job may not be (someone killed only the supervisor):
        kill the attempt's processes and wait until every one has exited, so the next attempt
        never runs beside the old one. They are found by what a stranger cannot share: their
        environment (ORCH_RUN_DIR and ORCH_ATTEMPT), and the job's process group only while it is
        provably still the attempt's (attempt_group) — never by the recorded number alone, which
        after a reboot or pid reuse may be anyone's group."""
        if not job.attempt:
            return
        pgid = self.attempt_group(job)  # proved before the environment's processes are killed
        deadline = time.monotonic() + GROUP_EXIT_WAIT_S
        self._clear_by_environment(job, deadline)
        if pgid is None:
            return
        known: set[tuple[int, Optional[str]]] = set()
        waited = time.monotonic()
        while True:
            members = {(pid, start_time(pid)) for pid in group_members(pgid)}
            if not members or (known and not members & known):
                break  # emptied: whatever holds the number from now on is not this attempt's
            known |= members
            if time.monotonic() > deadline:
                log.warning(
                    "job %s: attempt %s's processes (group %s) still exist after %.0fs of SIGKILL; "
                    "starting the next attempt anyway",
                    job.id,
                    job.attempt,
                    pgid,
                    GROUP_EXIT_WAIT_S,
                )
                return
            signal_group(pgid, signal.SIGKILL)
            time.sleep(0.05)
        if time.monotonic() - waited > 2.0:
            log.info(
                "job %s: attempt %s's processes took %.1fs to exit after SIGKILL",
                job.id,
                job.attempt,
                time.monotonic() - waited,
            )

    def attempt_group(self, job: Job) -> Optional[int]:
        """The job's process group as attempt-<n>.pid recorded it, while it is provably still the
        attempt's: recorded under this boot with its leader still the recorded process (pid and
        start time), or with a member carrying the attempt's environment. A group id is not handed
        out again while any member lives, so one proof holds for the whole group; None otherwise
        (a stranger holding the number is left alone, with a line in the log)."""
        info = self._pid_file(job)
        pgid = info.get("job_pid")
        members = group_members(pgid) if isinstance(pgid, int) else []
        if not members:
            return None
        if (
            info.get("boot_id") is not None
            and info.get("boot_id") == boot_id()
            and is_alive(pgid, info.get("job_start"))
        ):
            return pgid
        ours = set(self.strays(job))
        if any(pid in ours for pid in members):
            return pgid
        log.warning(
            "job %s: attempt %s's recorded process group %s is held by processes that are not this "
            "attempt's (%s; a reboot or pid reuse): left alone",
            job.id,
            job.attempt,
            pgid,
            " ".join(map(str, members[:8])),
        )
        return None

    def strays(self, job: Job) -> list[int]:
        """The current attempt's processes that still run, found by their environment."""
        return attempt_processes(str(self.home.run_dir(job.id)), job.attempt)

    def wind_down(self, job: Job, grace_s: float) -> None:
        """Before clear_lost, where nothing else waits on it (`orch run --resume`, not the daemon's
        tick): a lost attempt's strays (the job of an `orch run` that was killed, saving its notice
        checkpoint) get SIGTERM and up to grace_s to checkpoint and exit by themselves."""
        strays = self.strays(job)
        for pid in strays:
            try:
                os.kill(pid, signal.SIGTERM)  # the runner takes a repeated SIGTERM as the same request
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while strays and time.monotonic() < deadline:
            time.sleep(0.1)
            strays = self.strays(job)

    def _clear_by_environment(self, job: Job, deadline: float) -> None:
        """Processes of this attempt found by their environment (ORCH_RUN_DIR and ORCH_ATTEMPT):
        the supervisor may have died before it wrote attempt-<n>.pid, or a job may have moved a
        child out of its process group. SIGKILL them and wait, bounded like the group."""
        strays = self.strays(job)
        if not strays:
            return
        log.warning(
            "job %s: attempt %s: %d process(es) found by their environment (%s); killing them before the next attempt",
            job.id,
            job.attempt,
            len(strays),
            " ".join(map(str, strays[:8])),
        )
        while strays and time.monotonic() < deadline:
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
            strays = self.strays(job)

    def _kill_job_group(self, job: Job) -> bool:
        pgid = self.attempt_group(job)
        return bool(pgid and signal_group(pgid, signal.SIGKILL))

    def dump_stacks(self, job: Job) -> str:
        """Built-in runner: SIGUSR1 to the job's main process (faulthandler writes every thread's
        stack to its stderr, the attempt log). Any other job: `py-spy dump` if installed, appended
        to the log; never SIGUSR1, whose default action would kill a program that did not ask."""
        info = self._pid_file(job)
        pid, started = info.get("job_pid"), info.get("job_start")
        if not is_alive(pid, started):
            return "no stack dump: the job's process is gone"
        if job.kind != "command":
            return (
                "Python stacks dumped into the log (SIGUSR1, faulthandler)"
                if signal_process(pid, started, signal.SIGUSR1)
                else "no stack dump: the signal failed"
            )
        import shutil

        beside = Path(self.python).with_name("py-spy")  # installed into the same environment as orch
        spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
        if not spy:
            return "no stack dump: py-spy is not installed (pip install py-spy)"
        try:
            out = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            text = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"no stack dump: py-spy failed ({exc})"
        for path in self.log_paths(job)[:1]:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"[orch] py-spy dump of pid {pid}:\n{text}\n")
        return "Python stacks dumped into the log (py-spy)"

    # -- looking -----------------------------------------------------------------------------

    def log_paths(self, job: Job) -> list[Path]:
        return [self.home.run_dir(job.id) / attempt_log(job.attempt)] if job.attempt else []

    def describe(self, job: Job) -> Optional[str]:
        return None

    def billable(self, job: Job) -> bool:
        return True  # a local attempt holds its share of the machine from its start

    def notice(self, job: Job) -> Optional[str]:
        return None  # this machine's notices are the daemon's own ([preemption])

    def cluster_gpus(self) -> Optional[tuple[float, float]]:
        return None

    def gpu_room(self, now: float) -> Optional[tuple[int, str]]:
        return None  # this machine's GPUs are the daemon's own slots

    def _pid_file(self, job: Job) -> dict[str, Any]:
        return (read_json(self.home.run_dir(job.id) / attempt_pid(job.attempt)) if job.attempt else None) or {}
