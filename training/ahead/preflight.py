"""`python -m training.preflight < REQUEST.json`: what `orch submit` asks of a built-in job before
it is queued, without loading weights or a whole dataset. For each job spec (a sweep sends one per
distinct trial): the first rows of each data file (empty, unreadable, the fields and label/tag
sets the task needs), one batch tokenized by the runner's own map function, the model's
configuration, LoRA's target_modules resolved on the model built on the meta device, and the
monitored metric and sweep objective against what this task and label count log.

Request: {"checks": [{"label": "job.toml", "spec": {resolved spec}, "objective": null}]}.
Answer on stdout: {"problems": ["job.toml: data.train: ...", ...], "notes": [...], "seconds": s}.
What only the whole data or the run can show (a label in row 50 000, a hub model not in the cache,
memory) is checked when the job runs, which then exits 78 (training/builtin/run.py)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from orchestrator.spec.jobspec import (
    TASK_CAUSAL_LM,
    TASK_CLASSIFY,
    TASK_TOKENS,
    JobSpec,
    SpecError,
    metric_problem,
    spec_from_dict,
)

from training.ahead.model_files import folder_problems, unknown_only_problem, vocabulary_problem
from training.ahead.row_checks import Findings, row_checks
from training.builtin.rows import (
    DataError,
    align_tokenize,
    max_length_note,
    sft_tokenize,
    tokenize_batch,
    usable_max_length,
)
from training.ahead.samples import Sample, SampleError, read_sample

BATCH_ROWS = 64  # the batch tokenized at submit: the job's batch size, at most this


def check(
    spec: JobSpec, label: str, objective: Optional[str], notes: list[str], objective_label: str = ""
) -> list[str]:
    """Every problem of one built-in job spec, each line naming `label` and the field."""
    assert spec.model is not None and spec.data is not None and spec.train is not None
    model, data, task = spec.model, spec.data, spec.model.task
    problems: list[str] = []
    samples: dict[str, Sample] = {}
    for split in ("train", "validation"):
        source = getattr(data, split)
        if not source:
            continue
        path = Path(source)
        if not path.is_file():
            notes.append(f"{label}: data.{split}: {source} is not a local file; its rows are checked when the job runs")
            continue
        try:
            sample = read_sample(path)
        except (SampleError, UnicodeDecodeError, OSError) as exc:
            problems.append(f"{label}: data.{split}: {source} {_reason(exc)}")
            continue
        if sample is None:
            notes.append(f"{label}: data.{split}: {source} is read when the job runs (too large to peek into)")
        elif not sample.rows:
            problems.append(f"{label}: data.{split}: {source} has no rows: there is nothing to train on")
        else:
            samples[split] = sample
    found = Findings()
    if samples:
        problems += [f"{label}: {p}" for p in row_checks(spec, samples, found)]
    if not _local(model.name_or_path) and not _cached(model.name_or_path):
        # nothing to read here, and no reason to import torch and transformers for it
        notes.append(
            f"{label}: model.name_or_path: {model.name_or_path!r} is not in the local cache; checked when the job runs"
        )
        return problems + _metric_problems(spec, label, objective, objective_label, found)
    if _local(model.name_or_path):
        missing = folder_problems(Path(model.name_or_path))
        if missing:  # nothing to load a tokenizer or a model from: say what is missing, once
            return problems + [f"{label}: {p}" for p in missing]
    tokenizer = _tokenizer(model.name_or_path, label, problems, notes)
    if tokenizer is not None and _local(model.name_or_path):
        unfit = vocabulary_problem(tokenizer, _vocab_size(Path(model.name_or_path)), model.name_or_path)
        if unfit is None and "train" in samples:
            unfit = unknown_only_problem(tokenizer, _row_texts(samples["train"].rows), str(data.train))
        if unfit:
            return problems + [f"{label}: {unfit}"]
    if tokenizer is not None and task == TASK_TOKENS and not getattr(tokenizer, "is_fast", False):
        problems.append(f"{label}: model.name_or_path: token-classification needs a fast tokenizer (word ids)")
    elif tokenizer is not None and "train" in samples and not problems:
        cut = max_length_note(spec.data.max_length, tokenizer)
        if cut:
            notes.append(f"{label}: {cut}")
        problem = _tokenize_one_batch(spec, tokenizer, samples["train"], found)
        if problem:
            problems.append(f"{label}: data.train: {problem}")
    problems += [f"{label}: {p}" for p in _model_problems(spec, notes)]
    return problems + _metric_problems(spec, label, objective, objective_label, found)


def _metric_problems(
    spec: JobSpec, label: str, objective: Optional[str], objective_label: str, found: Findings
) -> list[str]:
    """The monitored metric and the sweep's objective against what this task and label count log."""
    assert spec.model is not None
    problems = []
    monitor = spec.early_stopping.monitor if spec.early_stopping else None
    for where, metric, field in (
        (label, monitor, "early_stopping.monitor"),
        (objective_label or label, objective, "sweep.objective"),
    ):
        problem = metric_problem(metric, spec.model.task, found.num_labels) if metric else None
        if problem and found.num_labels is not None:  # None: the rows read do not decide; the run does
            problems.append(f"{where}: {field}: {problem}")
    return problems


def _vocab_size(folder: Path) -> Optional[int]:
    """config.json's vocab_size, read as text (the configuration itself is checked later)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) else None


def _row_texts(rows: list[dict[str, Any]]) -> list[str]:
    """Each row's text, whatever field holds it: strings, lists of words, chat messages' content."""
    out = []
    for row in rows:
        parts: list[str] = []
        for value in row.values():
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, dict):
                    item = item.get("content")
                if isinstance(item, str):
                    parts.append(item)
        out.append(" ".join(parts))
    return out


def _cached(repo_id: str) -> bool:
    """A hub model whose configuration is in the local cache (huggingface_hub alone: no torch)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id: transformers says why when the job runs
        return False


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"is not UTF-8 text (byte {exc.start})"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    return str(exc)


def _local(name_or_path: str) -> bool:
    return Path(name_or_path).is_absolute()


def _tokenizer(name_or_path: str, label: str, problems: list[str], notes: list[str]) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError or its own errors here
        if _local(name_or_path):
            problems.append(f"{label}: model.name_or_path: cannot load a tokenizer from {name_or_path}: {_first(exc)}")
        else:
            notes.append(
                f"{label}: model.name_or_path: {name_or_path!r} is not in the local cache; checked when the job runs"
            )
        return None


def _first(exc: BaseException, limit: int = 400) -> str:
    """The error on one line, whole up to `limit` (transformers' first line may end in "from one of: ")."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return {k: [row.get(k) for row in rows] for k in keys}


def _tokenize_one_batch(spec: JobSpec, tokenizer: Any, sample: Sample, found: Findings) -> Optional[str]:
    """The runner's own map function on the first batch: the error the job would hit, or None."""
    assert spec.model is not None and spec.data is not None and spec.train is not None
    d, task = spec.data, spec.model.task
    max_length = usable_max_length(d.max_length, tokenizer)
    rows = sample.rows[: max(1, min(spec.train.batch_size, BATCH_ROWS))]
    batch = _columns(rows)
    try:
        if task == TASK_TOKENS:
            align_tokenize(batch, tokenizer, d.tokens_field, d.tags_field, max_length, found.tag2id)
        elif task == TASK_CAUSAL_LM:
            mode = "messages" if d.messages_field else "prompt" if d.prompt_field else "text"
            fields = {
                "text": d.text_field,
                "prompt": d.prompt_field,
                "response": d.response_field,
                "messages": d.messages_field,
            }
            out = sft_tokenize(batch, tokenizer, mode, fields, max_length)
            if not out["input_ids"] and len(rows) == len(sample.rows) and sample.complete:
                return (
                    f"no example has a token to train on within {max_length} tokens (data.max_length = {d.max_length})"
                )
        else:
            batch[d.label_field] = found.labels_as_loaded(batch.get(d.label_field, []))
            tokenize_batch(batch, tokenizer, d.text_field, d.text_pair_field, max_length, d.label_field, found.label2id)
    except DataError as exc:
        return str(exc)
    except Exception as exc:  # the tokenizer's own complaint about a value (None, a number)
        return f"the first batch cannot be tokenized: {type(exc).__name__}: {_first(exc)}"
    return None


def _model_problems(spec: JobSpec, notes: list[str]) -> list[str]:
    """The model's configuration, the task's head for its type, and LoRA's modules on the meta device."""
    assert spec.model is not None
    path, task = spec.model.name_or_path, spec.model.task
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        if _local(path):
            return [f"model.name_or_path: cannot read the model's configuration in {path}: {_first(exc)}"]
        notes.append(f"model.name_or_path: {path!r} is not in the local cache; checked when the job runs")
        return []
    auto = {
        TASK_CLASSIFY: transformers.AutoModelForSequenceClassification,
        TASK_TOKENS: transformers.AutoModelForTokenClassification,
        TASK_CAUSAL_LM: transformers.AutoModelForCausalLM,
    }[task]
    try:
        known = type(config) in auto._model_mapping
    except Exception:  # a transformers without that mapping: the run finds out
        known = True
    if not known:
        return [f"model.task: the model in {path} ({config.model_type}) has no {task} head in this transformers"]
    if spec.lora is None:
        return []
    import torch

    from training.builtin.tasks.lora import apply_lora

    with torch.device("meta"):  # the modules and their names, no weights read or allocated
        try:
            apply_lora(auto.from_config(config), spec.lora, gradient_checkpointing=False)
        except Exception as exc:  # ConfigError: peft found no such module (its message names them)
            return [str(exc) if str(exc).startswith("lora.") else f"lora: {type(exc).__name__}: {_first(exc)}"]
    return []


def run(request: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    problems: list[str] = []
    notes: list[str] = []
    for item in request.get("checks", []):
        label = str(item.get("label") or "job")
        try:
            spec = spec_from_dict(item["spec"], label)
        except SpecError as exc:
            problems += exc.problems
            continue
        if spec.is_command:
            continue
        problems += check(spec, label, item.get("objective"), notes, str(item.get("objective_label") or ""))
    return {
        "problems": list(dict.fromkeys(problems)),
        "notes": list(dict.fromkeys(notes)),
        "seconds": round(time.perf_counter() - started, 3),
    }


def main() -> int:
    import logging
    import os
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # transformers' and peft's notices would clutter `orch submit`
    started = time.perf_counter()
    answer = run(json.load(sys.stdin))
    answer["seconds_total"] = round(time.perf_counter() - started, 3)
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
