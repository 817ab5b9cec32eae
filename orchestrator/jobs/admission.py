"""What a job file is refused for at submit, before anything is recorded (moved from jobs/lifecycle.py)."""

from __future__ import annotations

from ..model.errors import SpecError
from ..spec.jobspec import JobSpec


def check_gpus(spec: JobSpec, label: str, machine_gpus: int) -> None:
    if spec.gpus > machine_gpus:
        raise SpecError(
            [
                f"{label}: gpus: asks for {spec.gpus} GPU{'s' if spec.gpus != 1 else ''} but this machine has "
                f"{machine_gpus} (config [daemon] gpus, else nvidia-smi); use gpus = 0 to run on the CPU"
            ]
        )


def check_nodes(spec: JobSpec, label: str, executor: str) -> None:
    """Several nodes need a cluster executor: on one machine the job would silently run on one."""
    if spec.nodes > 1 and executor == "local":
        raise SpecError(
            [
                f"{label}: nodes: asks for {spec.nodes} nodes but this orch runs jobs on this one machine; set "
                f'[executor] kind = "slurm" in config.toml to run it on a cluster, or remove `nodes`'
            ]
        )
