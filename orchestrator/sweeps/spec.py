"""The sweep file: a `[sweep]` table naming a base job, the trials, sampler, pruner and the
parameters to search. Validated whole before anything is stored: every problem is one line
naming the file and the field (exit 2). Also how one trial's parameters become its job spec."""

from __future__ import annotations

import builtins
import difflib
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, ValidationError, model_validator

from ..contract import ENV_PARAM_PREFIX
from ..model.errors import SpecError
from ..spec.jobspec import TASK_METRICS, JobSpec, deadline_ts, empty_problem, load_jobspec, looks_local, spec_from_dict
from ..spec.problems import TomlTable, _model_at, _unwrap, problems_from, quote_key
from ..spec.tomlfile import read_toml

Number = Union[int, float]
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# An argument that is only a placeholder, or an option set to one: never meant literally.
WHOLE_PLACEHOLDER = re.compile(r"(--?[A-Za-z0-9][\w.-]*=)?\{[A-Za-z_][A-Za-z0-9_]*\}")
ENV_PREFIX = ENV_PARAM_PREFIX  # a command job's parameters, as environment variables


class _Strict(TomlTable):
    pass


class ParamSpec(_Strict):
    """One searched parameter: exactly one of values, uniform, log_uniform, int."""

    values: Optional[list[Union[bool, int, float, str]]] = Field(default=None, min_length=1)
    uniform: Optional[tuple[float, float]] = None
    log_uniform: Optional[tuple[float, float]] = None
    int_range: Optional[tuple[builtins.int, builtins.int]] = Field(default=None, alias="int")

    @model_validator(mode="after")
    def _one_kind(self) -> "ParamSpec":
        given = [k for k, v in self._kinds() if v is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of values = [...], uniform = [a, b], log_uniform = [a, b], int = [a, b]"
                + (f" (got {', '.join(given)})" if given else "")
            )
        low, high = self.bounds or (0, 1)
        if self.bounds and not low < high:
            raise ValueError(f"{self.kind} = [{low}, {high}]: the first bound must be below the second")
        if self.log_uniform and low <= 0:
            raise ValueError(f"log_uniform = [{low}, {high}]: both bounds must be above 0")
        return self

    def _kinds(self) -> list[tuple[str, Any]]:
        return [
            ("values", self.values),
            ("uniform", self.uniform),
            ("log_uniform", self.log_uniform),
            ("int", self.int_range),
        ]

    @property
    def kind(self) -> str:
        return next(k for k, v in self._kinds() if v is not None)

    @property
    def bounds(self) -> Optional[tuple[Number, Number]]:
        return self.uniform or self.log_uniform or self.int_range

    def grid_points(self) -> Optional[list[Any]]:
        """The points a grid takes, or None for a continuous range (a grid cannot take it)."""
        if self.values is not None:
            return list(self.values)
        if self.int_range is not None:
            return list(range(self.int_range[0], self.int_range[1] + 1))
        return None

    def probes(self) -> list[Any]:
        """Values that stand for the range when checking the base job accepts it."""
        return (self.grid_points() or []) if self.values is not None else list(self.bounds or ())


class SweepSection(_Strict):
    job: str = Field(min_length=1)
    name: Optional[str] = Field(default=None, min_length=1, max_length=80)
    trials: int = Field(gt=0, le=10_000)
    parallel: int = Field(default=1, gt=0, le=1000)
    sampler: Literal["grid", "random", "tpe"] = "tpe"
    seed: Optional[int] = None
    objective: str = Field(min_length=1)
    direction: Literal["maximize", "minimize"] = "maximize"
    pruner: Literal["none", "median", "halving"] = "none"
    prune_after_steps: int = Field(default=0, ge=0)
    # Completed trials the median pruner waits for before it prunes anything (Optuna's n_startup_trials).
    prune_startup_trials: int = Field(default=2, ge=0)
    max_cost: Optional[float] = Field(default=None, gt=0)
    params: dict[str, ParamSpec] = Field(min_length=1)


class SweepFile(_Strict):
    sweep: SweepSection


def is_sweep_file(path: Path) -> bool:
    """A TOML file with a [sweep] table (anything else `orch submit` reads as a job)."""
    try:
        raw = read_toml(path, str(path), SpecError)
    except SpecError:
        return False
    table = raw.get("sweep")
    return isinstance(table, dict) or (isinstance(table, list) and all(isinstance(t, dict) for t in table))


def load_sweep(path: str | Path, *, now: Optional[float] = None) -> tuple[SweepSection, JobSpec]:
    """Read and check a sweep file and its base job; return both, the job resolved."""
    path = Path(path)
    label = str(path)
    raw = read_toml(path, label, SpecError)
    if isinstance(raw.get("sweep"), list):
        raise SpecError(
            [
                f"{label}: sweep: write the sweep as one [sweep] table (with [sweep.params]), not [[sweep]]; "
                "one sweep per file (submit each file on its own)"
            ]
        )
    problems: list[str] = []  # every problem of the sweep file and its base job, in one report
    section: Optional[SweepSection] = None
    try:
        section = SweepFile.model_validate(raw).sweep
    except ValidationError as exc:
        problems += problems_from(exc, SweepFile, label)
    table = raw.get("sweep")
    job = section.job if section else table.get("job") if isinstance(table, dict) else None
    base: Optional[JobSpec] = None
    job_path = None
    if isinstance(job, str) and job:
        job_path = (path.resolve().parent / job).resolve()
        if not job_path.is_file():
            problems.append(
                f"{label}: sweep.job: no such job file {str(job_path)!r} (relative paths start at this file's folder)"
            )
        else:
            try:
                base = load_jobspec(job_path)
            except SpecError as exc:
                problems += exc.problems
    if section is not None and base is not None and job_path is not None:
        section, path_problems = resolve_path_params(section, job_path.parent, label)
        problems += path_problems
        problems += check_params(section, base, label, now=time.time() if now is None else now)
    if problems:
        raise SpecError(problems)
    assert section is not None and base is not None
    section = section.model_copy(update={"job": str(job_path), "name": section.name or path.stem})
    return section, base


# Parameters that name files: their values are resolved against the job file's folder, as the
# job file's own paths are, and checked at submit (a hub id, with no ./ or extension, is left as is).
PATH_PARAMS = {
    "model.name_or_path": "local model folder",
    "data.train": "file or folder",
    "data.validation": "file or folder",
}


def param_label(key: str) -> str:
    """How a problem names a parameter: `sweep.params.'train.lr'` (one key with a dot in it, as
    TOML quotes it), the same in every message."""
    return f"sweep.params.{quote_key(key)}"


def resolve_path_params(section: SweepSection, folder: Path, label: str) -> tuple[SweepSection, list[str]]:
    """The section with path parameters' values made absolute, and the problems with them."""
    problems: list[str] = []
    params = dict(section.params)
    for key, what in PATH_PARAMS.items():
        param = params.get(key)
        if param is None or param.values is None:
            continue
        resolved: list[Any] = []
        for value in param.values:
            if not isinstance(value, str) or not looks_local(value, folder):
                resolved.append(value)
                continue
            local = (folder / os.path.expanduser(value)).resolve()
            where = f"{label}: {param_label(key)}: {value!r}"
            if not local.exists():
                problems.append(
                    f"{where}: no such {what} {str(local)!r} (relative paths start at the job file's folder, {folder})"
                )
            elif key.startswith("data.") and empty_problem(local):
                problems.append(f"{where}: {local} {empty_problem(local)}")
            resolved.append(str(local))
        params[key] = param.model_copy(update={"values": resolved})
    return section.model_copy(update={"params": params}), problems


def placeholder_problems(spec: JobSpec, label: str) -> list[str]:
    """A command job submitted on its own whose argument is a sweep placeholder (`{lr}`,
    `--lr={lr}`) would run with the braces literally: it is a sweep's base job."""
    problems = []
    for i, part in enumerate(spec.command or []):
        if WHOLE_PLACEHOLDER.fullmatch(part):
            problems.append(
                f"{label}: command[{i}]: {part!r} is a sweep parameter placeholder: submit the sweep file whose "
                "sweep.job names this file (its trials fill it in), or write a value here"
            )
    return problems


def check_params(section: SweepSection, base: JobSpec, label: str, *, now: float) -> list[str]:
    problems: list[str] = []
    data = base.to_toml_dict()
    for key, param in section.params.items():
        where = f"{label}: {param_label(key)}"
        if key == "name" and not base.is_command:  # a command job's parameters are free names
            problems.append(
                f"{where}: trials are named by the sweep (<sweep name>-t1, -t2, ...); set sweep.name to choose the prefix"
            )
            continue
        if key == "deadline" and not base.is_command:
            past = [v for v in param.values or [] if (deadline_ts(v) or math.inf) <= now]
            if past:
                problems.append(f"{where}: {past[0]} is already past")
                continue
        if base.is_command:
            if not NAME.fullmatch(key):
                problems.append(f"{where}: a command job's parameter needs a plain name (letters, digits, _)")
            continue
        field = _field_at(key)
        if isinstance(field, str):
            problems.append(f"{where}: {field}")
            continue
        if param.kind in ("uniform", "log_uniform") and _is_int_field(field):
            problems.append(
                f"{where}: {key} takes whole numbers; {param.kind} gives fractions (use int = [a, b] or values)"
            )
            continue
        for value in param.probes():
            try:
                spec_from_dict(apply_params(data, {key: value}, is_command=False), "")
            except SpecError as exc:
                why = "; ".join(p.split(": ", 2)[-1] for p in exc.problems)
                problems.append(f"{where}: the job cannot take {value!r}: {why}")
                break
    if not base.is_command and base.model is not None:
        logged = TASK_METRICS[base.model.task]
        if section.objective not in logged:
            problems.append(
                f"{label}: sweep.objective: the built-in {base.model.task} job does not log "
                f"{section.objective!r}; it logs {', '.join(logged)}"
            )
    if base.is_command:
        used = {m for part in base.command or [] for m in PLACEHOLDER.findall(part)}
        for name in sorted(used - set(section.params)):
            problems.append(
                f"{label}: sweep.params: the job's command uses {{{name}}} but no parameter is named {name!r}"
            )
    if section.sampler == "grid":
        points: float = 1
        for key, param in section.params.items():
            grid = param.grid_points()
            if grid is None:
                problems.append(
                    f"{label}: {param_label(key)}: a grid needs values = [...] or int = [a, b], "
                    f'not {param.kind}; or use sampler = "random" / "tpe"'
                )
                points = math.inf
            else:
                points *= len(grid)
        if points < section.trials:
            problems.append(
                f"{label}: sweep.trials: the grid has {points} point{'s' if points != 1 else ''}, "
                f"fewer than trials = {section.trials}; lower trials or add values"
            )
    return problems


def _field_at(key: str) -> Any:
    """The pydantic field a dotted job.toml path names, or a sentence saying why there is none."""
    model: Any = JobSpec
    parts = key.split(".")
    for i, part in enumerate(parts):
        owner = _model_at(JobSpec, tuple(parts[:i]))
        fields = owner.model_fields if owner else {}
        if part not in fields:
            prefix = ".".join(parts[:i])
            choices = [f"{prefix}.{f}" if prefix else f for f in fields]
            choices += [
                f"{s}.{f}"
                for s in ("train", "model", "data")
                for f in (_model_at(JobSpec, (s,)) or JobSpec).model_fields
            ]
            near = difflib.get_close_matches(key, choices, n=1, cutoff=0.6) or [
                c for c in choices if c.endswith("." + key)
            ]
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            return f"unknown job.toml path '{key}'{hint}"
        model = fields[part]
        if i < len(parts) - 1 and _model_at(JobSpec, tuple(parts[: i + 1])) is None:
            return f"unknown job.toml path '{key}': '{'.'.join(parts[: i + 1])}' is not a table"
    if _model_at(JobSpec, tuple(parts)) is not None:
        return f"'{key}' is a table; name one of its keys (e.g. '{key}.{next(iter(_unwrap(model.annotation).model_fields))}')"
    return model


def _is_int_field(field: Any) -> bool:
    annotation = field.annotation
    args = getattr(annotation, "__args__", None) or (annotation,)
    return int in args and float not in args


def apply_params(data: dict[str, Any], params: dict[str, Any], *, is_command: bool) -> dict[str, Any]:
    """The job spec (resolved, as plain data) of one trial: a built-in job's dotted paths set;
    a command job's `{name}` placeholders filled and ORCH_PARAM_<NAME> variables added."""
    import copy

    out = copy.deepcopy(data)
    if is_command:
        out["command"] = [
            PLACEHOLDER.sub(lambda m: str(params[m.group(1)]) if m.group(1) in params else m.group(0), part)
            for part in out.get("command") or []
        ]
        out["env"] = {**out.get("env", {}), **{ENV_PREFIX + k.upper(): str(v) for k, v in params.items()}}
        return out
    for key, value in params.items():
        *parents, leaf = key.split(".")
        table = out
        for part in parents:
            table = table.setdefault(part, {})
        table[leaf] = value
    return out


# The parameters that change what the pre-flight checks: the data, the model, LoRA, the metric.
_PREFLIGHT_TABLES = ("model.", "data.", "lora.", "early_stopping.")
MAX_PREFLIGHT_SPECS = 24  # distinct trial specs checked at submit (each value of such a parameter once)


def preflight_checks(section: SweepSection, base: JobSpec, label: str) -> list[Any]:
    """The built-in job specs a sweep's trials can take, for the pre-flight: the base job (with the
    sweep's objective) and, for each parameter that names data, a model, LoRA or the monitored
    metric, the base with each of its values (ranges: their bounds). Command sweeps: none."""
    from ..jobs.preflight import Check

    if base.is_command:
        return []
    data = base.to_toml_dict()
    checks = [Check(section.job, data, section.objective, objective_label=label)]
    for key, param in section.params.items():
        if not key.startswith(_PREFLIGHT_TABLES) and key != "train.batch_size":
            continue
        for value in param.probes():
            if len(checks) >= MAX_PREFLIGHT_SPECS:
                return checks
            trial = apply_params(data, {key: value}, is_command=False)
            checks.append(
                Check(f"{label}: {param_label(key)} = {value!r}", trial, section.objective, objective_label=label)
            )
    return checks
