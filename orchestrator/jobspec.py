"""job.toml -> JobSpec. The model mirrors docs/job-toml.md's names exactly (extra keys are errors), paths
are resolved against the file's folder, and every problem in a file is reported at once.
Pure pydantic plus a few filesystem checks: `training/` imports this module too."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from .bounds import INT64_MAX, INT64_MIN, control_problem, name_problem
from .datafile_keys import first_keys
from .errors import SpecError  # raised by every loader here; training catches it from here
from .problems import TomlTable, problems_from
from .tomlfile import read_toml


class _Section(TomlTable):
    pass


TaskName = Literal["sequence-classification", "causal-lm", "token-classification"]
TASK_CLASSIFY: TaskName = "sequence-classification"
TASK_CAUSAL_LM: TaskName = "causal-lm"
TASK_TOKENS: TaskName = "token-classification"
# What each task's validation reports: the metrics early_stopping.monitor may name.
TASK_METRICS = {
    TASK_CLASSIFY: ("val_loss", "val_acc", "val_f1", "train_loss"),
    TASK_CAUSAL_LM: ("val_loss", "val_perplexity", "train_loss"),
    TASK_TOKENS: ("val_loss", "val_f1", "val_precision", "val_recall", "train_loss"),
}


class ModelSection(_Section):
    name_or_path: str = Field(min_length=1)
    task: TaskName = TASK_CLASSIFY
    num_labels: int = Field(default=2, ge=1)
    gradient_checkpointing: bool = False


class DataSection(_Section):
    train: str = Field(min_length=1)
    validation: Optional[str] = None
    text_field: str = "text"
    text_pair_field: Optional[str] = None
    label_field: str = "label"
    max_length: int = Field(default=128, gt=0, le=100_000)
    num_workers: Optional[int] = Field(default=None, ge=0)  # None: min(4, cpu count)
    shuffle: bool = True
    # causal-lm: text_field (plain language modelling), or prompt_field + response_field (loss on
    # the response only), or messages_field (chat turns, loss on the assistant's turns).
    prompt_field: Optional[str] = Field(default=None, min_length=1)
    response_field: Optional[str] = Field(default=None, min_length=1)
    messages_field: Optional[str] = Field(default=None, min_length=1)
    packing: bool = False  # causal-lm: several short examples per row, attention within each
    # token-classification: a list of words and a list of tags (one per word) per row
    tokens_field: str = "tokens"
    tags_field: str = "tags"

    def task_fields(self, task: str) -> list[str]:
        """The data fields `task` reads (the ones orch submit looks for in the data file)."""
        if task == TASK_CAUSAL_LM:
            if self.messages_field:
                return ["messages_field"]
            return ["prompt_field", "response_field"] if self.prompt_field else ["text_field"]
        if task == TASK_TOKENS:
            return ["tokens_field", "tags_field"]
        return ["text_field", "text_pair_field", "label_field"]


class LoraSection(_Section):
    """[lora] (causal-lm): train low-rank adapters through peft instead of every weight."""

    r: int = Field(default=8, gt=0, le=4096)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    # None: peft's default for the architecture (e.g. q_proj, v_proj for Llama); "all-linear": every
    # linear layer but the output head; or the module names.
    target_modules: Union[Literal["all-linear"], list[str], None] = None
    merge: bool = False  # also export the base model with the adapter merged in (model/merged/)


class TrainSection(_Section):
    max_epochs: Optional[int] = Field(default=3, gt=0)
    max_steps: Optional[int] = Field(default=None, gt=0)
    batch_size: int = Field(default=32, gt=0)
    accumulate_grad_batches: int = Field(default=1, gt=0)
    precision: Literal["32", "16-mixed", "bf16-mixed"] = "16-mixed"
    learning_rate: float = Field(default=2e-5, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    seed: int = Field(default=42, ge=INT64_MIN, le=INT64_MAX)
    val_check_interval: Union[int, float] = 1.0
    gradient_clip_val: Optional[float] = Field(default=1.0, ge=0)
    deterministic: bool = False
    # Training health: a `loss_flat` event when the loss fell by less than this fraction of its
    # first steps' mean after that many steps (None: not watched). The job goes on.
    flat_after_steps: Optional[int] = Field(default=None, gt=0)
    flat_min_improvement: float = Field(default=0.02, ge=0, lt=1)
    # Hang watchdog: no new step for this long -> stacks dumped, SIGTERM, grace, SIGKILL, retry (None: off).
    hang_minutes: Optional[float] = Field(default=None, gt=0, le=10080)

    @model_validator(mode="before")
    @classmethod
    def _max_steps_alone(cls, data: Any) -> Any:
        # max_steps given without max_epochs: the steps end training, not the default 3 epochs
        if isinstance(data, dict) and data.get("max_steps") is not None and "max_epochs" not in data:
            return {**data, "max_epochs": None}
        return data

    @model_validator(mode="after")
    def _check_interval(self) -> "TrainSection":
        v = self.val_check_interval
        if isinstance(v, float) and not (0 < v <= 1):
            raise ValueError(
                f"val_check_interval: a fraction of an epoch must be in (0, 1], or give a whole number of batches (got {v})"
            )
        if isinstance(v, int) and v < 1:
            raise ValueError(f"val_check_interval: must be at least 1 batch (got {v})")
        return self


class EarlyStoppingSection(_Section):
    monitor: Literal["val_loss", "val_acc", "val_f1", "val_precision", "val_recall", "val_perplexity", "train_loss"] = (
        "val_loss"
    )
    mode: Optional[Literal["min", "max"]] = None  # None: min for a loss, max otherwise
    patience: int = Field(default=3, ge=0)
    min_delta: float = Field(default=0.0, ge=0)

    @property
    def resolved_mode(self) -> str:
        return self.mode or ("min" if self.monitor.endswith("loss") else "max")


class CheckpointSection(_Section):
    every_n_steps: Optional[int] = Field(default=None, gt=0)
    every_minutes: Optional[float] = Field(default=10.0, gt=0)
    keep: int = Field(default=3, ge=1)
    # Periodic checkpoints: the step blocks only for a snapshot of the state; a background thread
    # writes it (training/snapshot.py). false: written inside the step, as notice checkpoints are.
    background: bool = True
    # "auto": the interval is sqrt(2 x the measured save blocking time x the MTBF) (Young/Daly),
    # re-chosen after every save; every_minutes is then only the first interval.
    every: Optional[Literal["auto"]] = None
    mtbf_hours: Optional[float] = Field(default=None, gt=0)  # for "auto": else the machine's, else 6 h


class BudgetSection(_Section):
    max_cost: Optional[float] = Field(default=None, gt=0)
    max_hours: Optional[float] = Field(default=None, gt=0)


class SlurmJobSection(_Section):
    """[slurm] in job.toml: this job's own partition, walltime and extra sbatch flags (Slurm executor)."""

    partition: Optional[str] = Field(default=None, min_length=1)
    time: Optional[str] = Field(default=None, min_length=1)
    extra_args: list[str] = []

    @model_validator(mode="after")
    def _one_line_each(self) -> "SlurmJobSection":
        # Each value becomes an `#SBATCH` line: a newline would end it and start a shell line.
        for field, value in (
            ("partition", self.partition),
            ("time", self.time),
            *((f"extra_args[{i}]", a) for i, a in enumerate(self.extra_args)),
        ):
            problem = control_problem(value, allow_tab=False) if value is not None else None
            if problem:
                raise ValueError(f"{field}: {problem} (got {value!r})")
        return self


_BUILTIN_SECTIONS = ("model", "data", "train", "early_stopping", "lora")


def kind_problem(keys: set[str]) -> Optional[str]:
    """A job is either a command job or the built-in fine-tune. Checked on the raw keys too, so
    this problem is reported together with field errors, not only after they are fixed."""
    builtin = [s for s in _BUILTIN_SECTIONS if s in keys]
    if "command" in keys:
        if builtin:
            return (
                "'command' cannot be combined with "
                + ", ".join(f"[{s}]" for s in builtin)
                + ": a command job runs your own script; the built-in fine-tune takes [model] and [data] and no command"
            )
        return None
    if "workdir" in keys:
        return "'workdir' is only for command jobs (it is where `command` runs)"
    missing = [s for s in ("model", "data") if s not in keys]
    if missing:
        return (
            "a job needs either `command = [...]` (your own script) or the built-in fine-tune's [model] and [data]"
            " sections; missing " + ", ".join(f"[{s}]" for s in missing)
        )
    return None


class JobSpec(_Section):
    name: Optional[str] = Field(default=None, min_length=1, max_length=100)
    gpus: int = Field(default=1, ge=0, le=64)
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
    slurm: Optional[SlurmJobSection] = None
    # When the job must be done, with its time zone ("2026-12-05T18:00+08:00"): among jobs of equal
    # priority the earliest deadline starts first, and `deadline_at_risk` says when it will be missed.
    deadline: Optional[Union[datetime, str]] = None

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
        if self.name is not None and name_problem(self.name):
            raise ValueError(f"name: {name_problem(self.name)} (got {self.name!r})")
        if self.command is not None:
            if any(not part for part in self.command):
                raise ValueError("command: no part of the command may be an empty string")
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
            problems = task_problems(self)
            if problems:
                raise ValueError("; ".join(problems))
        bad_env = [k for k in self.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad_env:
            raise ValueError(f"env: {bad_env[0]!r} is not a valid environment variable name")
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


def task_problems(spec: JobSpec) -> list[str]:
    """Fields that the chosen [model] task does not use, or that only make sense together."""
    assert spec.model is not None and spec.data is not None
    task, data, problems = spec.model.task, spec.data, []
    causal_only = [f"data.{f}" for f in ("prompt_field", "response_field", "messages_field") if getattr(data, f)] + (
        ["data.packing"] if data.packing else []
    )
    if task != TASK_CAUSAL_LM:
        causal_only += ["[lora]"] if spec.lora is not None else []
        if causal_only:
            problems.append(
                f'{", ".join(causal_only)}: only for model.task = "causal-lm" (this job\'s task is {task!r})'
            )
    else:
        if bool(data.prompt_field) != bool(data.response_field):
            problems.append("data.prompt_field and data.response_field go together (the loss is on the response)")
        if data.messages_field and data.prompt_field:
            problems.append("data.messages_field or data.prompt_field + data.response_field, not both")
    if task != TASK_CLASSIFY and data.text_pair_field:
        problems.append(
            f'data.text_pair_field: only for model.task = "sequence-classification" (this job\'s task is {task!r})'
        )
    es = spec.early_stopping
    if es is not None and es.monitor not in TASK_METRICS[task]:
        problems.append(
            f"early_stopping.monitor: {es.monitor!r} is not a metric of model.task = {task!r} "
            f"(use one of {', '.join(TASK_METRICS[task])})"
        )
    return problems


def data_field_problems(spec: JobSpec, label: str) -> list[str]:
    """Each data field the task reads must be a key of the data files' first row (jsonl, json,
    csv; other sources are checked when the job loads them). New tasks only: the classifier's
    fields are checked when the job runs, as before."""
    assert spec.model is not None and spec.data is not None
    if spec.model.task == TASK_CLASSIFY:
        return []
    problems = []
    for split in ("train", "validation"):
        source = getattr(spec.data, split)
        keys = first_keys(Path(source)) if source else None
        if keys is None:
            continue
        for field in spec.data.task_fields(spec.model.task):
            value = getattr(spec.data, field)
            if value and value not in keys:
                seen = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "") if keys else "no keys"
                problems.append(
                    f"{label}: data.{field}: {value!r} is not a field of {source} (its first row has: {seen})"
                )
    return problems


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
            setattr(spec.data, field, str(local))
        if check_paths and not problems:
            problems += data_field_problems(spec, label)
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
