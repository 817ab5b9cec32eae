"""Every kind of executor orch knows, in one table: what config.toml's `[executor] kind` may say, the
class that runs its attempts, how its jobs are billed, how many GPUs it hands out, whether a job
may span nodes, and what `orch doctor` checks of it. Nothing else in orch spells a kind's name:
a new executor is its module (orchestrator/executors/, the `Executor` interface of base.py) and
one `register` here. The classes and checks are named, not imported (`module:attribute`), so this
vocabulary stays at the bottom of the house: the config, the cost and the planning read it too.
Standard library only."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ExecutorKind:
    name: str  # what [executor] kind says, and the `executor` column of a job it runs
    builder: str  # "module:Class", built as Class(home, config.<section>) (Class(home) without one)
    section: Optional[str] = None  # the config.toml table it reads ([slurm], [ray])
    # How cost accrues (docs/cost.md): False — this machine's uptime is split among the running jobs
    # and the rest is idle; True — only what a job holds while it runs is charged (a cluster
    # allocation: pending costs nothing, and there is no idle machine of ours, nor its instance price).
    bills_by_allocation: bool = False
    # The GPUs it hands out at once: None — this machine's own ([daemon] gpus, else nvidia-smi), which
    # must exist (jobs/absent_gpus.py); else the config key that caps a cluster's ("slurm.max_gpus").
    max_gpus_key: Optional[str] = None
    # Why a job may not ask `nodes > 1` here (the words after "but"); None: several nodes are fine.
    one_node: Optional[str] = "this orch runs jobs on this one machine"
    # `orch doctor`'s checks when it is the configured kind: "module:function", each called as
    # function(config, home) -> (level, text, fix), level "ok", "warn" or "bad"; or None: nothing to say.
    doctor_checks: tuple[str, ...] = ()

    @property
    def on_this_machine(self) -> bool:
        """Its attempts run here: this machine's GPUs and CPU slots are what it hands out."""
        return self.max_gpus_key is None

    def max_gpus(self, config: Any) -> Optional[int]:
        """The cluster's cap from config (None on this machine)."""
        if self.max_gpus_key is None:
            return None
        value: Any = config
        for part in self.max_gpus_key.split("."):
            value = getattr(value, part)
        return int(value)


KINDS: dict[str, ExecutorKind] = {}

# The names the rest of orch may need as values (a row's `executor` column, the default kind),
# spelled here only: LOCAL is the default, RAY what views/ray_where.py shows a Ray attempt's node for.
LOCAL, SLURM, RAY = "local", "slurm", "ray"


def register(kind: ExecutorKind) -> ExecutorKind:
    KINDS[kind.name] = kind
    return kind


def executor_kind(name: str) -> ExecutorKind:
    """The kind called `name`; KeyError for a name no executor has (config.toml is checked first)."""
    return KINDS[name]


def unknown_kind_problem(name: str) -> Optional[str]:
    """One line when `name` is no kind orch knows, with the closest one; None when it is known."""
    if name in KINDS:
        return None
    close = difflib.get_close_matches(name, list(KINDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{name!r} is no executor orch knows{hint}: one of {', '.join(repr(k) for k in KINDS)}"


def multi_node_kinds() -> list[str]:
    return [k.name for k in KINDS.values() if k.one_node is None]


register(
    ExecutorKind(
        name=LOCAL,
        builder="orchestrator.executors.local:LocalExecutor",
    )
)
register(
    ExecutorKind(
        name=SLURM,
        builder="orchestrator.executors.slurm.executor:SlurmExecutor",
        section="slurm",
        bills_by_allocation=True,
        max_gpus_key="slurm.max_gpus",
        one_node=None,
    )
)
register(
    ExecutorKind(
        name=RAY,
        builder="orchestrator.executors.ray.executor:RayExecutor",
        section="ray",
        bills_by_allocation=True,
        max_gpus_key="ray.max_gpus",
        one_node="on Ray each attempt runs on one node",  # multi-node DDP through Ray Train is not built
        doctor_checks=(
            "orchestrator.executors.ray.shared:doctor_check",
            "orchestrator.executors.ray.doctor:address_check",
        ),
    )
)
