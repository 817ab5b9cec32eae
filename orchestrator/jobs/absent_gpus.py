"""A job never gets GPUs this machine does not have: `[daemon] gpus = [0, 1]` copied onto a
machine without them would hand a command job GPU ids that find nothing, and bill GPU-hours for
a run on the CPU. Checked when an attempt on this machine begins, for the daemon's local executor
and `orch run` alike (a cluster executor places GPUs on its nodes: not here). Such an attempt ends
at once as a configuration error (exit 78, `job_error.json`): failed, never retried, not charged.
`ORCH_GPUS_ON_CPU=1` rehearses a GPU job on the CPU, as the built-in runner allows."""

from __future__ import annotations

from typing import Optional, Sequence

from ..contract import ENV_CPU_FOR_GPUS, JOB_ERROR, attempt_log, write_json_atomic
from ..model.records import AttemptLaunch


def absent_gpus_reason(launch: AttemptLaunch, shown: Sequence[str]) -> Optional[str]:
    """Why the attempt cannot have its GPUs (`shown`: nvidia-smi's GPUs, in index order), or None."""
    if not launch.gpu_ids or launch.env.get(ENV_CPU_FOR_GPUS) == "1":
        return None
    missing = [i for i in launch.gpu_ids if i >= len(shown)]
    if not missing:
        return None
    found = "nvidia-smi finds no GPU here" if not shown else f"nvidia-smi shows only {len(shown)}"
    return (
        f"asks for GPU {', '.join(str(i) for i in missing)}, which this machine does not have ({found}); "
        'set [daemon] gpus = "auto" (or list only the GPUs nvidia-smi shows), '
        f"or {ENV_CPU_FOR_GPUS}=1 in the job's [env] to rehearse it on the CPU"
    )


def refuse_attempt(launch: AttemptLaunch, why: str) -> None:
    """The reason in the attempt's log and in job_error.json, which the outcome reads with exit 78."""
    with open(launch.run_dir / attempt_log(launch.attempt), "a", encoding="utf-8") as out:
        out.write(f"[orch] attempt {launch.attempt} not started: {why}\n")
    write_json_atomic(launch.run_dir / JOB_ERROR, {"attempt": launch.attempt, "message": why})
