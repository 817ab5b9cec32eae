"""How attempts run: the interface the daemon's tick uses (base.py) and its implementations
(local.py: a supervisor process per attempt on this machine; slurm.py: one sbatch per attempt)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..spec.config import Config
    from ..home.paths import Home
    from .base import Executor
    from .local import LocalExecutor


def build_executor(config: "Config", home: "Home") -> "Executor":
    """The executor config.toml asks for ([executor] kind; local by default)."""
    if config.executor.kind == "slurm":
        from .slurm import SlurmExecutor

        return SlurmExecutor(home, config.slurm)
    return build_local_executor(home)


def build_local_executor(home: "Home") -> "LocalExecutor":
    """The local executor whatever config.toml says: `orch run` runs its attempts on this machine."""
    from .local import LocalExecutor

    return LocalExecutor(home)
