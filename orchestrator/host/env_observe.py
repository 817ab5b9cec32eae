"""The slow half of an attempt's environment check: what orch learns by running programs (the job
interpreter listing its packages, up to 15 s; nvidia-smi, up to 10 s), kept apart from the
comparison (env_record.py) so the daemon can learn it before it takes its lock: a preemption
notice, which needs that lock, must never wait behind a job start."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .interpreter import ENV_KEYS, Probe, job_interpreter, probe

# The driver and the GPU names change with a reboot or a driver reinstall, not between two job
# starts: one nvidia-smi per this long serves every start in between.
MACHINE_FACTS_TTL_S = 300.0
# A failed listing (an interpreter that hangs or crashes) is not cached by probe(); the daemon
# keeps the failure this long for a job that waits to start, instead of paying it every tick.
FAILED_PROBE_TTL_S = 60.0


def driver_and_gpus(timeout_s: float = 10.0) -> tuple[Optional[str], list[str]]:
    """The NVIDIA driver and the machine's GPU names from nvidia-smi; (None, []) without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.SubprocessError):
        return None, []
    rows = [line.rsplit(",", 1) for line in out.stdout.splitlines() if "," in line] if out.returncode == 0 else []
    return (rows[0][1].strip() if rows else None), [name.strip() for name, _ in rows]


class MachineFacts:
    """driver_and_gpus(), asked at most once per MACHINE_FACTS_TTL_S."""

    def __init__(self, ttl_s: float = MACHINE_FACTS_TTL_S):
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._known: Optional[tuple[float, tuple[Optional[str], list[str]]]] = None

    def get(self) -> tuple[Optional[str], list[str]]:
        with self._lock:
            if self._known is None or time.monotonic() - self._known[0] > self.ttl_s:
                self._known = (time.monotonic(), driver_and_gpus())
            return self._known[1]


def launch_key(argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str]) -> tuple[object, ...]:
    """What decides which Python a launch runs and what that Python finds installed."""
    return (tuple(argv), cwd, *(env.get(k) for k in ENV_KEYS))


@dataclass(frozen=True)
class Observed:
    """What running programs told about a launch's environment, and for which launch."""

    key: tuple[object, ...]
    found: Probe
    machine: tuple[Optional[str], list[str]]  # nvidia-smi's driver and GPU names
    at: float  # time.monotonic() when it was learnt

    def fits(self, argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str]) -> bool:
        return self.key == launch_key(argv, env, cwd)


def observe(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Optional[str],
    *,
    machine: Optional[MachineFacts] = None,
    previous: Optional[Observed] = None,
) -> Observed:
    """The job interpreter's listing (cached by probe() while its folders are unchanged) and the
    machine's driver and GPUs. A failed listing in `previous` for the same launch is kept for
    FAILED_PROBE_TTL_S rather than run again."""
    key = launch_key(argv, env, cwd)
    facts = machine.get() if machine is not None else driver_and_gpus()
    if (
        previous is not None
        and previous.key == key
        and previous.found.error
        and time.monotonic() - previous.at < FAILED_PROBE_TTL_S
    ):
        return Observed(key, previous.found, facts, previous.at)
    return Observed(key, probe(job_interpreter(argv, env, cwd), env, cwd), facts, time.monotonic())
