"""The checks of a job spec across its tables: a command job or the built-in fine-tune (never both),
the fields the chosen task uses or needs together, and the data fields present in the data files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .datafile_keys import first_keys, separator_hint
from .sections import (
    TASK_CAUSAL_LM,
    TASK_CLASSIFY,
    DataSection,
    EarlyStoppingSection,
    LoraSection,
    ModelSection,
    metric_problem,
)

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


def task_problems(
    model: Optional[ModelSection],
    data: Optional[DataSection],
    lora: Optional[LoraSection],
    early_stopping: Optional[EarlyStoppingSection],
) -> list[str]:
    """Fields that the chosen [model] task does not use, or that only make sense together."""
    assert model is not None and data is not None
    task, problems = model.task, []
    causal_only = [f"data.{f}" for f in ("prompt_field", "response_field", "messages_field") if getattr(data, f)] + (
        ["data.packing"] if data.packing else []
    )
    if task != TASK_CAUSAL_LM:
        causal_only += ["[lora]"] if lora is not None else []
        if causal_only:
            problems.append(
                f'{", ".join(causal_only)}: only for model.task = "causal-lm" (this job\'s task is {task!r})'
            )
    else:
        default_labels = type(model).model_fields["num_labels"].default
        if "num_labels" in model.model_fields_set and model.num_labels != default_labels:
            # (a resolved job.toml holds the default: only a value someone chose is refused)
            problems.append(
                f'model.num_labels: not used by model.task = "causal-lm" (it predicts the next token over the '
                f"tokenizer's vocabulary; got {model.num_labels}): remove it"
            )
        if bool(data.prompt_field) != bool(data.response_field):
            problems.append("data.prompt_field and data.response_field go together (the loss is on the response)")
        if data.messages_field and data.prompt_field:
            problems.append("data.messages_field or data.prompt_field + data.response_field, not both")
    if task != TASK_CLASSIFY and data.text_pair_field:
        problems.append(
            f'data.text_pair_field: only for model.task = "sequence-classification" (this job\'s task is {task!r})'
        )
    es = early_stopping
    # The label count is known here only for integer labels (string labels are counted in the data:
    # the pre-flight and the runner check that case against logged_metrics too).
    problem = metric_problem(es.monitor, task, None) if es is not None else None
    if problem:
        problems.append(f"early_stopping.monitor: {problem}")
    return problems


def data_field_problems(model: Optional[ModelSection], data: Optional[DataSection], label: str) -> list[str]:
    """Each data field the task reads must be a key of the data files' first row (jsonl, json,
    csv; other sources are checked when the job loads them). New tasks only: the classifier's
    fields are checked when the job runs, as before."""
    assert model is not None and data is not None
    if model.task == TASK_CLASSIFY:
        return []
    problems = []
    for split in ("train", "validation"):
        source = getattr(data, split)
        keys = first_keys(Path(source)) if source else None
        if keys is None:
            continue
        for field in data.task_fields(model.task):
            value = getattr(data, field)
            if value and value not in keys:
                seen = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "") if keys else "no keys"
                problems.append(
                    f"{label}: data.{field}: {value!r} is not a field of {source} (its first row has: {seen})"
                    + separator_hint(keys)
                )
    return problems


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by orch for every attempt: a job cannot take them from the daemon's environment.
_ORCH_SETS = ("CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")


def env_names_problem(env: dict[str, str], pass_env: list[str], secret_env: list[str]) -> Optional[str]:
    """[env]'s names, pass_env's (taken from the daemon's environment) and secret_env's (what of
    both reaches a cluster job only through its secret file): valid, not orch's own, each said once."""
    bad_env = [k for k in env if not _ENV_NAME.fullmatch(k)]
    if bad_env:
        return f"env: {bad_env[0]!r} is not a valid environment variable name"
    for field, names in (("pass_env", pass_env), ("secret_env", secret_env)):
        bad = next((n for n in names if not _ENV_NAME.fullmatch(n)), None)
        if bad is not None:
            return f"{field}: {bad!r} is not a valid environment variable name"
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            return f"{field}: {twice} is listed twice"
    for name in pass_env:
        if name.startswith("ORCH_") or name in _ORCH_SETS:
            return f"pass_env: {name} is set by orch for each attempt; it cannot be taken from the daemon's environment"
        if name in env:
            return f"pass_env: {name} is also set in [env]; keep one (pass_env takes the daemon's value)"
    for name in secret_env:
        if name not in env and name not in pass_env:
            return f"secret_env: {name} is neither in [env] nor in pass_env; list only the job's own variables"
    return None
