"""How many GPUs orch hands out at once: the one answer the daemon's dispatch and cost, `orch
status`'s deadline forecast, the bill, `orch estimate`, `orch submit` (a sweep too) and `orch run`
share, so the CLI and the daemon never size the same cluster two ways (issue 28)."""

from __future__ import annotations

from typing import Any

from ..host.gpus import managed_gpus
from ..model.executor_kinds import executor_kind


def gpu_slots(config: Any) -> list[int]:
    """The GPU slots of the executor config.toml names, as its kind declares them
    (model/executor_kinds.py): a cluster's cap (`[slurm] max_gpus`, `[ray] max_gpus`: the cluster
    places them; the login node's own GPUs do not count), else this machine's GPUs (`[daemon] gpus`,
    else nvidia-smi)."""
    cap = executor_kind(config.executor.kind).max_gpus(config)
    return machine_gpus(config) if cap is None else list(range(cap))


def machine_gpus(config: Any) -> list[int]:
    """This machine's GPUs, whatever the executor: where `orch run` runs its job, in the foreground."""
    return managed_gpus(config.daemon.gpus)
