"""job.toml -> JobSpec. The model mirrors docs/job-toml.md's names exactly (extra keys are errors), paths
are resolved against the file's folder, and every problem in a file is reported at once. Its tables are
job_sections.py's, its checks across them job_checks.py's. Pure pydantic plus a few filesystem checks:
`training/` imports this module too (and reaches those two only through it)."""

from __future__ import annotations

import os
import re
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from .. import contract as c
from .bounds import INT64_MAX, INT64_MIN, control_problem, name_problem
from ..model.errors import SpecError  # raised by every loader here; training catches it from here
from .checks import data_field_problems, env_names_problem, kind_problem, task_problems
from .datafile_keys import empty_problem, separator_hint
from .sections import (  # the tables and task names, importable from here as before
    TASK_CAUSAL_LM,
    TASK_CLASSIFY,
    TASK_METRICS,
    TASK_TOKENS,
    BudgetSection,
    CheckpointSection,
    DataSection,
    EarlyStoppingSection,
    JobTable,
    LoraSection,
    ModelSection,
    SlurmJobSection,
    TaskName,
    TrackingSection,
    TrainSection,
    logged_metrics,
    metric_problem,
)
from .problems import problems_from
from .tomlfile import read_toml

__all__ = [
    "TASK_CAUSAL_LM",
    "TASK_CLASSIFY",
    "TASK_METRICS",
    "TASK_TOKENS",
    "BudgetSection",
    "CheckpointSection",
    "DataSection",
    "EarlyStoppingSection",
    "JobSpec",
    "LoraSection",
    "ModelSection",
    "SlurmJobSection",
    "SpecError",
    "TaskName",
    "TrackingSection",
    "TrainSection",
    "check_deadline",
    "deadline_ts",
    "empty_problem",
    "load_jobspec",
    "load_resolved",
    "logged_metrics",
    "metric_problem",
    "looks_local",
    "resolve",
    "separator_hint",
    "spec_from_dict",
]


class JobSpec(JobTable):
    name: Optional[str] = Field(default=None, min_length=1, max_length=100)
    gpus: int = Field(default=1, ge=0, le=64)
    # May resume on as few as this many GPUs: an adoption onto a machine with fewer than `gpus`
    # reshards onto what it has (jobs/regpu.py); not set: never on fewer.
    min_gpus: Optional[int] = Field(default=None, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=1024)  # Slurm executor: `gpus` is then per node
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    retries: int = Field(default=2, ge=0, le=1000)
    grace_seconds: Optional[float] = Field(default=None, gt=0)  # default: config [daemon]
    watchdog_minutes: Optional[float] = Field(default=None, gt=0, le=10080)  # any job writing progress.json
    command: Optional[list[str]] = Field(default=None, min_length=1)
    workdir: Optional[str] = None
    model: Optional[ModelSection] = None
    data: Optional[DataSection] = None
    train: Optional[TrainSection] = None
    early_stopping: Optional[EarlyStoppingSection] = None
    lora: Optional[LoraSection] = None
    checkpoint: CheckpointSection = CheckpointSection()
    budget: BudgetSection = BudgetSection()
    env: dict[str, str] = {}
    # Names the job takes from the daemon's environment (a cluster job is given nothing else of it),
    # and the names of [env] and pass_env that reach a cluster job only through its secret file
    # (besides every name the redaction rule calls a credential): docs/job-toml.md.
    pass_env: list[str] = []
    secret_env: list[str] = []
    slurm: Optional[SlurmJobSection] = None
    tracking: Optional[TrackingSection] = None  # experiment trackers, one run per job (docs/tracking.md)
    # When the job must be done, with its time zone ("2026-12-05T18:00+08:00"): among jobs of equal
    # priority the earliest deadline starts first, and `deadline_at_risk` says when it will be missed.
    deadline: Optional[Union[datetime, str]] = None
    # An attempt whose installed distributions differ from the first attempt's: "warn" (an
    # env_changed event, then it trains) or "stop" (the job is stopped before it trains).
    on_env_change: Literal["warn", "stop"] = "warn"
    # A command job whose program is not orch-aware (LLaMA-Factory, TRL, a Lightning script): orch
    # attaches its callback to the program's Trainer through a bootstrap on PYTHONPATH.
    instrument: Literal["transformers", "lightning", "auto", "off"] = "off"

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_a_moment(cls, value: Any) -> Any:
        # a TOML time of day (10:00:00) or a number: one plain line, not one per branch of the union
        if value is not None and not isinstance(value, (datetime, date, str)):
            raise ValueError(
                f"must be a date and time with its zone, e.g. 2026-12-05T18:00+08:00 (got {str(value).lower() if isinstance(value, bool) else value})"
            )
        if isinstance(value, date) and not isinstance(value, datetime):  # a TOML date: no time, no zone
            return datetime(value.year, value.month, value.day)
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline_with_zone(cls, value: Any) -> Optional[str]:
        if value is None:
            return None
        when = value if isinstance(value, datetime) else _parse_time(str(value))
        if when.tzinfo is None:
            raise ValueError(f"{value!s} has no time zone; write it as 2026-12-05T18:00+08:00 (or Z for UTC)")
        return when.isoformat()

    @model_validator(mode="after")
    def _one_kind(self) -> "JobSpec":
        problem = kind_problem(self.model_fields_set - {k for k in ("model", "data") if getattr(self, k) is None})
        if problem:
            raise ValueError(problem)
        if self.min_gpus is not None and self.min_gpus > self.gpus:
            raise ValueError(
                f"min_gpus: {self.min_gpus} is more than gpus ({self.gpus}); it is the fewest GPUs the job may resume on"
            )
        if self.name is not None and name_problem(self.name):
            raise ValueError(f"name: {name_problem(self.name)} (got {self.name!r})")
        if self.command is not None:
            if any(not part for part in self.command):
                raise ValueError("command: no part of the command may be an empty string")
        elif self.instrument != "off":
            raise ValueError(
                f"instrument: {self.instrument!r} is for command jobs (the built-in fine-tune resumes exactly "
                "already); remove it, or give the job a command"
            )
        for field, value in _texts(self):
            problem = control_problem(value)
            if problem:  # an env value may be a secret: never echoed
                shown = "" if field.startswith("env.") else f" (got {value[:60]!r})"
                raise ValueError(f"{field}: {problem}{shown}")
        if self.command is None:
            if self.train is None:
                self.train = TrainSection()
            if self.train.max_epochs is None and self.train.max_steps is None:
                raise ValueError("train: set max_epochs or max_steps (or both), or training never ends")
            problems = task_problems(self.model, self.data, self.lora, self.early_stopping)
            if problems:
                raise ValueError("; ".join(problems))
        problem = env_names_problem(self.env, self.pass_env, self.secret_env)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def deadline_ts(self) -> Optional[float]:
        return deadline_ts(self.deadline)

    @property
    def is_command(self) -> bool:
        return self.command is not None

    def to_toml_dict(self) -> dict[str, Any]:
        """The resolved spec as plain data for runs/<id>/job.toml (None values dropped)."""
        return self.model_dump(mode="json", exclude_none=True)


def _texts(spec: "JobSpec") -> list[tuple[str, str]]:
    """The text a job hands to exec, its environment and its working folder (field, value)."""
    out = [(f"command[{i}]", part) for i, part in enumerate(spec.command or [])]
    out += [(f"env.{k}", v) for k, v in spec.env.items()]
    if spec.workdir is not None:
        out.append(("workdir", spec.workdir))
    return out


def _parse_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a date and time; write it as 2026-12-05T18:00+08:00") from None


def deadline_ts(value: Any) -> Optional[float]:
    """A stored deadline (ISO text with its zone) as Unix seconds; None when there is none."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def check_deadline(spec: JobSpec, label: str, now: float) -> None:
    """At submit: a deadline already past cannot be met (exit 2)."""
    when = spec.deadline_ts
    if when is not None and when <= now:
        raise SpecError([f"{label}: deadline: {spec.deadline} is already past"])


_EXT = re.compile(r"^\.[A-Za-z][A-Za-z0-9]{0,9}$")


def looks_local(value: str, base: Path) -> bool:
    """A value that starts with . / or ~, has a file extension, or exists is a local path;
    anything else is a hub id (checked when the job runs)."""
    if value.startswith((".", "/", "~")):
        return True
    if _EXT.match(Path(value).suffix or ""):
        return True
    return (base / value).exists()


def _resolve(value: str, base: Path) -> Path:
    return (base / os.path.expanduser(value)).resolve()


def load_jobspec(path: str | Path, *, check_paths: bool = True) -> JobSpec:
    """Read and validate job.toml; return it resolved (absolute paths, name filled in).
    Raises SpecError with every problem found, each line naming the file and field."""
    path = Path(path)
    label = str(path)
    raw = read_toml(path, label, SpecError)
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        problems = problems_from(exc, JobSpec, label)
        kind = kind_problem({k for k in raw if k in JobSpec.model_fields})
        if kind and f"{label}: {kind}" not in problems:
            problems.append(f"{label}: {kind}")
        raise SpecError(problems) from None
    return resolve(spec, path.resolve().parent, label, check_paths=check_paths, stem=path.stem)


# [env] names orch sets for every attempt after [env] (jobs/attempts.job_vars): a value there would never
# reach the job. Refused at submit only, so a job stored before this check still loads.
_OWN = "orch sets it for every attempt, so the job would never see this value: remove it"
_ORCH_OWN_ENV = {
    "CUDA_VISIBLE_DEVICES": "orch sets it to the GPUs it gives each attempt: ask with gpus = N (and choose "
    "the machine's GPUs with config.toml [daemon] gpus); remove it",
    **dict.fromkeys(
        (c.ENV_JOB_ID, c.ENV_ATTEMPT, c.ENV_RUN_DIR, c.ENV_CKPT_DIR, c.ENV_RESUME_FROM, "PYTHONUNBUFFERED"), _OWN
    ),
}


def resolve(spec: JobSpec, base: Path, label: str, *, check_paths: bool = True, stem: str = "job") -> JobSpec:
    problems: list[str] = []
    spec = spec.model_copy(deep=True)
    if spec.name is None:
        spec.name = stem
        if name_problem(stem):
            problems.append(
                f"{label}: name: the file's name {stem!r} is not a usable job name "
                f'({name_problem(stem)}); set name = "..." in the file'
            )
    problems += [f"{label}: env.{name}: {why}" for name, why in _ORCH_OWN_ENV.items() if name in spec.env]
    if spec.is_command:
        workdir = _resolve(spec.workdir or ".", base)
        if check_paths and not workdir.is_dir():
            problems.append(f"{label}: workdir: no such folder {str(workdir)!r}")
        spec.workdir = str(workdir)
    else:
        assert spec.model is not None and spec.data is not None
        if looks_local(spec.model.name_or_path, base):
            local = _resolve(spec.model.name_or_path, base)
            if check_paths and not local.exists():
                problems.append(
                    f"{label}: model.name_or_path: no such local model folder {str(local)!r} "
                    "(a hub id has no leading ./ or / and no file extension)"
                )
            spec.model.name_or_path = str(local)
        for field in ("train", "validation"):
            value = getattr(spec.data, field)
            if value is None or not looks_local(value, base):
                continue
            local = _resolve(value, base)
            if check_paths and not local.exists():
                problems.append(f"{label}: data.{field}: no such file or folder {str(local)!r}")
            elif check_paths and empty_problem(local):
                problems.append(f"{label}: data.{field}: {local} {empty_problem(local)}")
            setattr(spec.data, field, str(local))
        if check_paths and not problems:
            problems += data_field_problems(spec.model, spec.data, label)
    if problems:
        raise SpecError(problems)
    return spec


def spec_from_dict(data: dict[str, Any], label: str = "job spec") -> JobSpec:
    """Rebuild an already-resolved spec (the stored JSON or runs/<id>/job.toml)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from(exc, JobSpec, label)) from None


def load_resolved(path: str | Path) -> JobSpec:
    """Read runs/<id>/job.toml, written by orch with absolute paths: no re-resolution."""
    path = Path(path)
    return spec_from_dict(read_toml(path, str(path), SpecError), str(path))
