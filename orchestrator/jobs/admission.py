"""The one admission check at submit: what a job is refused for before anything is recorded, for
`orch submit`, `orch run` and a sweep's base job alike. The file's own checks (a past deadline,
more GPUs than the machine has, several nodes on one machine) are collected together, with any
the caller adds (a sweep placeholder in a lone job); then, when asked, the built-in job's
pre-flight (its data, tokenizer, model: a subprocess, seconds), so a bad file costs no probe."""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

from ..home.paths import Home
from ..model.errors import SpecError
from ..model.executor_kinds import KINDS, executor_kind, multi_node_kinds
from ..spec.jobspec import JobSpec, check_deadline
from .instrument import instrument_problems
from .preflight import Check, preflight


def admission_problems(
    spec: JobSpec, label: str, *, machine_gpus: int, executor: str, now: Optional[float]
) -> list[str]:
    """Every problem of the instant checks, one line each (`now` None: no deadline check, as for
    a sweep's base job, whose trials start later)."""
    checks: list[Callable[[], None]] = [
        lambda: check_gpus(spec, label, machine_gpus),
        lambda: check_nodes(spec, label, executor),
    ]
    if now is not None:
        checks.insert(0, lambda: check_deadline(spec, label, now))
    problems: list[str] = []
    for check in checks:
        try:
            check()
        except SpecError as exc:
            problems += exc.problems
    return problems + instrument_problems(spec, label)


def admit(
    spec: JobSpec,
    label: str,
    *,
    machine_gpus: int,
    executor: str,
    now: Optional[float],
    also: Iterable[str] = (),
    preflight_checks: Optional[Sequence[Check]] = None,
    note: Callable[[str], None] = lambda _text: None,
    python: Optional[str] = None,
    home: Optional[Home] = None,
) -> None:
    """Raise SpecError (exit 2) with every problem found; nothing is recorded before this passes.
    `preflight_checks`: the built-in specs to pre-flight after the instant checks pass (None:
    none, e.g. submit_job's own re-check of a file already admitted). `home`: where the daemon's
    warm pre-flight may answer (jobs/preflight_server.py)."""
    problems = admission_problems(spec, label, machine_gpus=machine_gpus, executor=executor, now=now) + list(also)
    if problems:
        raise SpecError(problems)
    if preflight_checks is not None:
        preflight(preflight_checks, note=note, python=python, home=home)


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
    why = executor_kind(executor).one_node if executor in KINDS else None
    if spec.nodes > 1 and why:
        kinds = " or ".join(f'[executor] kind = "{k}"' for k in multi_node_kinds())
        raise SpecError(
            [
                f"{label}: nodes: asks for {spec.nodes} nodes, but {why}; remove `nodes`, or run multi-node jobs with {kinds}"
            ]
        )
