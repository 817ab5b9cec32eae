"""How attempts run: the interface the daemon's tick uses (base.py) and its implementations
(local.py: a supervisor process per attempt on this machine; slurm.py: one sbatch per attempt;
ray.py: one Ray job per attempt), behind by_kind.py, which sends each job's calls to the executor
that started its attempt. Which class each kind is, and what it declares (billing, GPUs, nodes,
doctor checks), is model/executor_kinds.py's table: nothing here names a kind."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Optional

from ..model.executor_kinds import KINDS, executor_kind
from ..model.records import LOCAL

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
    """One executor of the kind model/executor_kinds.py names: its class, built on its config
    table ([slurm], [ray]) when it has one. A row of a kind no longer known runs as local (an
    `orch run` attempt is local)."""
    found = KINDS.get(kind) or executor_kind(LOCAL)
    module, _, name = found.builder.partition(":")
    cls = getattr(importlib.import_module(module), name)  # only the configured kinds are ever imported
    return cls(home, getattr(config, found.section)) if found.section else cls(home)


def build_local_executor(home: "Home") -> "LocalExecutor":
    """The local executor whatever config.toml says: `orch run` runs its attempts on this machine."""
    from .local import LocalExecutor

    return LocalExecutor(home)


def run_doctor_checks(config: "Config", home: "Home") -> list[tuple[str, str, str, str]]:
    """`orch doctor`'s checks the configured kind declares: (area, level, text, fix) for each that
    has something to say, level "ok", "warn" or "bad"."""
    kind = executor_kind(config.executor.kind)
    found = []
    for ref in kind.doctor_checks:
        module, _, name = ref.partition(":")
        said = getattr(importlib.import_module(module), name)(config, home)
        if said is not None:
            level, text, fix = said
            found.append((kind.name, level, text, fix))
    return found
