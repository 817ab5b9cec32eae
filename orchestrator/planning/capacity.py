"""How many GPUs orch hands out at once: the one answer the daemon's dispatch and cost, `orch
status`'s deadline forecast, the bill, `orch estimate`, `orch submit` (a sweep too) and `orch run`
share, so the CLI and the daemon never size the same cluster two ways (issue 28)."""

from __future__ import annotations

from typing import Any

from ..host.gpus import managed_gpus


def gpu_slots(config: Any) -> list[int]:
    """The GPU slots of the executor config.toml names: on Slurm `[slurm] max_gpus` slots (Slurm
    places them; the login node's own GPUs do not count), on Ray `[ray] max_gpus`, else this machine's GPUs (`[daemon] gpus`,
    else nvidia-smi)."""
    if config.executor.kind == "slurm":
        return list(range(config.slurm.max_gpus))
    if config.executor.kind == "ray":  # Ray places them; the daemon also waits for the cluster's free GPUs
        return list(range(config.ray.max_gpus))
    return machine_gpus(config)


def machine_gpus(config: Any) -> list[int]:
    """This machine's GPUs, whatever the executor: where `orch run` runs its job, in the foreground."""
    return managed_gpus(config.daemon.gpus)
