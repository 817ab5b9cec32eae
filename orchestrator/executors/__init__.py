"""How attempts run: the interface the daemon's tick uses (base.py) and its implementations
(local.py: a supervisor process per attempt on this machine; slurm.py: one sbatch per attempt;
ray.py: one Ray job per attempt), behind by_kind.py, which sends each job's calls to the executor
that started its attempt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..spec.config import Config
    from ..home.paths import Home
    from .base import Executor
    from .by_kind import ExecutorsByKind
    from .local import LocalExecutor


def build_executor(config: "Config", home: "Home", configured: Optional["Executor"] = None) -> "ExecutorsByKind":
    """The executors the daemon watches attempts with: new attempts start on `configured` (by
    default the one config.toml's [executor] kind names); a running attempt is watched by the
    executor recorded on its job's row."""
    from .by_kind import ExecutorsByKind

    return ExecutorsByKind(
        config,
        home,
        configured or executor_of_kind(config.executor.kind, config, home),
        lambda kind: executor_of_kind(kind, config, home),
    )


def executor_of_kind(kind: str, config: "Config", home: "Home") -> "Executor":
    """One executor: "slurm" ([slurm]), "ray" ([ray]), else local (also `orch run`'s attempts)."""
    if kind == "slurm":
        from .slurm import SlurmExecutor

        return SlurmExecutor(home, config.slurm)
    if kind == "ray":
        from .ray import RayExecutor

        return RayExecutor(home, config.ray)
    return build_local_executor(home)


def build_local_executor(home: "Home") -> "LocalExecutor":
    """The local executor whatever config.toml says: `orch run` runs its attempts on this machine."""
    from .local import LocalExecutor

    return LocalExecutor(home)


def check_ray_shared(config: "Config", home: "Home") -> tuple[bool, str, str]:
    """`orch doctor` on Ray: whether a file the daemon writes is visible to a job on a GPU node
    (ok, the finding, its fix)."""
    from .ray_shared import check_shared_with_ray

    return check_shared_with_ray(home, config.ray)
