"""The probe `orch estimate` runs of a built-in job: `python -m training.probe` in a subprocess (the
CLI never imports the training stack) trains the real job a few steps on this machine and prints
its speed, start-up and checkpoint stall as one JSON line. What the subprocess cannot see of itself
(the interpreter's start and shutdown, a supervisor's start) is measured here, around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..model.errors import OrchError
from ..model.records import SUPERVISOR_MODULE

PROBE_TIMEOUT_S = 1800.0


def run_probe(job_toml: Path, *, warmup: int, steps: int, env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The probe's figures: its JSON line, with the start-up, shutdown, whole run and a
    supervisor's start measured from here. OrchError (the CLI's exit 1) when it fails, runs past
    PROBE_TIMEOUT_S or measures no steady step."""
    # absolute: the probe runs in the repository's folder, not the user's
    cmd = [
        sys.executable,
        "-m",
        "training.probe",
        str(job_toml.absolute()),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
    ]
    spawned = time.time()
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=env or dict(os.environ),
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        exited = time.time()
    except subprocess.TimeoutExpired:
        raise OrchError(f"the probe of {job_toml} took over {PROBE_TIMEOUT_S:.0f} s; nothing was estimated") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise OrchError(f"the probe of {job_toml} failed (exit {done.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    # Seen from here, the probe's start-up includes the interpreter's own start, and its end the
    # interpreter's shutdown after the export (threads joined, files closed): a real attempt pays both.
    if result.get("first_step_at"):
        result["startup_s"] = max(0.0, result["first_step_at"] - spawned - float(result.get("counting_s") or 0.0))
    if result.get("last_step_at"):
        result["end_s"] = max(0.0, exited - result["last_step_at"] - float(result.get("after_last_step_s") or 0.0))
    result["probe_s"] = exited - spawned
    result["launch_s"] = launch_s()
    if not result.get("steps_per_s"):
        raise OrchError(f"the probe of {job_toml} measured no steady steps (too few steps: raise --steps)")
    return result


def launch_s() -> float:
    """What starting an attempt's supervisor takes here (its interpreter and imports), before the
    job's own process starts: the daemon bills it, the probe does not see it."""
    began = time.monotonic()
    try:
        subprocess.run(
            [sys.executable, "-m", SUPERVISOR_MODULE, "--help"],
            capture_output=True,
            timeout=120,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    return time.monotonic() - began
