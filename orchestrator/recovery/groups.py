"""Provider commands as process groups: each launch, stop or alive command runs in a session of its
own, and the whole group is killed at its timeout and when `orch watch` exits (kill_all). A slow
`aws ec2 run-instances` or `sky launch` cut off at its limit therefore cannot create a machine
after orch counted the launch as failed: the children it started go with it.

A command that returned in time keeps what it started in the background (a launch script that
boots a machine with `nohup ... &` is doing its job): only groups still running are killed."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Optional

_live: dict[int, subprocess.Popen[bytes]] = {}  # pid (= process group id) -> a command still running
_lock = threading.Lock()


class CannotRun(Exception):
    """The command could not start (message: why, without the word 'command')."""


class TimedOut(Exception):
    """The command ran past its limit; its whole group was killed."""


def run(argv: list[str], env: dict[str, str], cwd: Optional[str], timeout_s: float) -> tuple[int, str]:
    """(exit code, output: stdout and stderr together) of `argv` in a new session. Raises CannotRun
    or TimedOut (after killing the group and waiting for it)."""
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise CannotRun("not found") from None
    except PermissionError:
        raise CannotRun("is not executable") from None
    except OSError as exc:
        raise CannotRun(f"could not start: {exc.strerror or exc}") from None
    with _lock:
        _live[proc.pid] = proc
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise TimedOut() from None
    finally:
        with _lock:
            _live.pop(proc.pid, None)
    return proc.returncode, out.decode("utf-8", "replace").strip()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's whole process group, then reap the command (its pipe is closed here,
    so a child that escaped the group cannot keep the caller waiting)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def running() -> list[int]:
    """The process groups of the provider commands running now."""
    with _lock:
        return sorted(_live)


def kill_all() -> list[int]:
    """Kill every provider command still running, with its group (`orch watch` exiting): the
    groups killed."""
    with _lock:
        procs = list(_live.values())
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return [p.pid for p in procs]
