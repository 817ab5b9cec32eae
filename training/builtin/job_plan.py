"""What one attempt of a built-in job runs with: this process's rank, the devices and precision,
the batch sizes after any OOM shrink, the checkpoint to resume from, and the total step count."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import ENV_CPU_FOR_GPUS, ENV_RESUME_CHECKED, ENV_RESUME_FROM
from orchestrator.spec.jobspec import JobSpec

from training.exits import ConfigError

RESUME_CHECKED_ENV = ENV_RESUME_CHECKED
# gpus = N run as N CPU processes (gloo) only when asked: how DDP is tested without a GPU. Without
# it, a job that asks for GPUs and finds fewer is refused, never trained on the CPU and billed as GPU hours.
GPUS_ON_CPU_ENV = ENV_CPU_FOR_GPUS


def say(msg: str) -> None:
    print(f"[orch] {msg}", file=sys.stderr, flush=True)


def is_rank_zero() -> bool:
    if under_srun():
        return int(os.environ["SLURM_PROCID"]) == 0
    return int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def under_srun() -> bool:
    """A task of an `srun` step (orch's Slurm executor runs one rank per GPU per node this way)."""
    return "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ


def srun_geometry() -> tuple[int, int]:
    """(tasks per node, nodes) of the srun step: Lightning's devices and num_nodes."""
    nodes = int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    return (int(per_node) if per_node.isdigit() else max(1, int(os.environ["SLURM_NTASKS"]) // nodes)), nodes


def plan_devices(spec: JobSpec) -> dict[str, Any]:
    """accelerator/devices/strategy/precision for this machine, plus one-line warnings."""
    import torch

    notes: list[str] = []
    train = spec.train
    assert train is not None
    cuda = torch.cuda.is_available()
    precision = train.precision
    missing = missing_gpus(spec.gpus, torch.cuda.device_count() if cuda else 0)
    if missing:
        raise ConfigError(missing)
    if cuda and spec.gpus > 0:
        plan = {"accelerator": "gpu", "devices": spec.gpus}
    else:
        # gpus > 1 without CUDA (ORCH_GPUS_ON_CPU=1) runs that many CPU processes (gloo).
        plan = {"accelerator": "cpu", "devices": max(1, spec.gpus)}
        if spec.gpus > 0 and not cuda:
            notes.append(f"no CUDA GPU visible: running on the CPU ({plan['devices']} process(es))")
        if precision == "16-mixed":
            notes.append('precision "16-mixed" needs CUDA; running in "32" on the CPU')
            precision = "32"
    plan["precision"] = "32-true" if precision == "32" else precision
    plan["num_nodes"] = 1
    if under_srun():
        # Slurm started every rank (orch's Slurm executor: nodes x gpus tasks); Lightning joins them
        # through its SLURMEnvironment, with the geometry it validates against.
        plan["devices"], plan["num_nodes"] = srun_geometry()
    plan["world"] = plan["devices"] * plan["num_nodes"]
    plan["strategy"] = "ddp" if plan["world"] > 1 else "auto"
    plan["notes"] = notes
    return plan


def sharded_run(spec: JobSpec, world: int, resume: Optional[Path]) -> bool:
    """strategy = "fsdp" shards over several ranks; one process ignores it, unless it resumes a
    sharded checkpoint (a folder), which only the sharded strategy reads (one rank holds it all)."""
    assert spec.train is not None
    if spec.train.strategy != "fsdp":
        return False
    return world > 1 or (resume is not None and resume.is_dir())


def missing_gpus(asked: int, visible: int) -> Optional[str]:
    """The one line a job that asks for more GPUs than this process sees fails with (exit 78).
    A Slurm step is exempt: each task sees the GPUs its allocation bound to it."""
    if asked <= visible or asked <= 0 or under_srun() or os.environ.get(GPUS_ON_CPU_ENV) == "1":
        return None
    seen = "no CUDA GPU is visible" if visible == 0 else f"only {visible} CUDA GPU(s) are visible"
    where = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"gpus = {asked}, but {seen} to this job"
        + (f" (CUDA_VISIBLE_DEVICES={where})" if where is not None else "")
        + ": refusing to train on the CPU (set gpus = 0 to run there)"
    )


def resolve_sizes(spec: JobSpec, run_dir: Path) -> tuple[int, int]:
    from training.resume.resize import read_sizes

    train = spec.train
    assert train is not None
    sizes = read_sizes(run_dir)
    if sizes:
        return int(sizes["batch_size"]), int(sizes["accumulate_grad_batches"])
    return train.batch_size, train.accumulate_grad_batches


def choose_resume(ckpt_dir: Path) -> Optional[Path]:
    """ORCH_RESUME_FROM if it loads, else the newest valid checkpoint by the step in its name.
    The other DDP ranks inherit the choice through the environment."""
    from training.resume.checkpoints import latest_valid_checkpoint, remove_orphan_temps

    if os.environ.get(RESUME_CHECKED_ENV) == "1" and not is_rank_zero():
        value = os.environ.get(ENV_RESUME_FROM, "")
        return Path(value) if value else None
    for orphan in remove_orphan_temps(ckpt_dir):
        say(f"removed {orphan.name}, left by a save that was interrupted")
    chosen = latest_valid_checkpoint(
        ckpt_dir, prefer=os.environ.get(ENV_RESUME_FROM) or None, warn=lambda msg: say("warning: " + msg)
    )
    os.environ[ENV_RESUME_FROM] = str(chosen) if chosen else ""
    os.environ[RESUME_CHECKED_ENV] = "1"
    return chosen


def total_steps(rows: int, world: int, batch_size: int, accumulate: int, train) -> int:
    """Lightning's estimated_stepping_batches, computed without touching the trainer's loader.
    Unchanged by an OOM shrink: ceil(ceil(n/(b/p)) / (a*p)) == ceil(n/(a*b))."""
    batches = math.ceil(math.ceil(rows / world) / batch_size)
    per_epoch = math.ceil(batches / accumulate)
    total = per_epoch * train.max_epochs if train.max_epochs else None
    if train.max_steps:
        total = min(total, train.max_steps) if total else train.max_steps
    return max(1, int(total or 1))
