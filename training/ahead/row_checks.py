"""The pre-flight's checks of the first rows of a job's data files against what its task needs:
the fields in every sampled row, text that is text, labels (numbers within num_labels, or names
the training data has), NER tokens and tags (lists of equal length, tag names), chat messages
(role and content, an assistant turn). A set is compared only when the training file was read
whole; otherwise a row further on may still hold the label, and the runner checks it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.spec.jobspec import TASK_CAUSAL_LM, TASK_TOKENS, JobSpec, separator_hint

from training.builtin.rows import conversation_problem
from training.ahead.samples import Sample

SHOWN = 5  # labels or tags named in one problem


@dataclass
class Findings:
    """What the rows said that later checks need: label ids, the tag map, the label count (None:
    not known from the rows read)."""

    label2id: Optional[dict[str, int]] = None
    tag2id: Optional[dict[str, int]] = None
    num_labels: Optional[int] = None
    csv_numbers: bool = False

    def labels_as_loaded(self, values: list[Any]) -> list[Any]:
        """CSV labels are text as written; the loader reads a column of whole numbers as numbers."""
        return [int(v) for v in values] if self.csv_numbers else values


def row_checks(spec: JobSpec, samples: dict[str, Sample], found: Findings) -> list[str]:
    assert spec.model is not None and spec.data is not None
    sources = {split: getattr(spec.data, split) for split in samples}
    if spec.model.task == TASK_TOKENS:
        return _tokens(spec, samples, sources, found)
    if spec.model.task == TASK_CAUSAL_LM:
        return _causal(spec, samples, sources)
    return _classify(spec, samples, sources, found)


def _where(split: str, source: str, index: int) -> str:
    return f"data.{split}: {source} row {index + 1}"


def _missing(spec: JobSpec, samples: dict[str, Sample], sources: dict[str, str], fields: list[str]) -> list[str]:
    """The first sampled row of each split without a field the task reads (data.<field> names it)."""
    assert spec.data is not None
    problems = []
    for split, sample in samples.items():
        for field in fields:
            key = getattr(spec.data, field)
            if not key:
                continue
            row_number, row = next(((i, r) for i, r in enumerate(sample.rows) if key not in r), (-1, {}))
            if row_number < 0:
                continue
            has = ", ".join(list(row)[:8]) or "no fields"
            hint = separator_hint(list(row)) if sample.csv else ""
            problems.append(
                f"{_where(split, sources[split], row_number)} has no {key!r} (data.{field}; it has: {has}){hint}"
            )
            if hint:  # every field is missing for the same reason: one line says it
                break
    return problems


def _text_problems(split: str, source: str, sample: Sample, key: str, field: str) -> list[str]:
    for i, row in enumerate(sample.rows):
        value = row.get(key)
        if not isinstance(value, str):
            return [f"{_where(split, source, i)}: {key!r} (data.{field}) must be text, not {_kind(value)}"]
    return []


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {str(value)[:40]}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int)) or (isinstance(value, float) and value.is_integer())


def _classify(spec: JobSpec, samples: dict[str, Sample], sources: dict[str, str], found: Findings) -> list[str]:
    assert spec.model is not None and spec.data is not None
    d = spec.data
    problems = _missing(spec, samples, sources, ["text_field", "text_pair_field", "label_field"])
    if problems:
        return problems
    for split, sample in samples.items():
        problems += _text_problems(split, sources[split], sample, d.text_field, "text_field")
        if d.text_pair_field:
            problems += _text_problems(split, sources[split], sample, d.text_pair_field, "text_pair_field")
    if "train" not in samples:
        return problems
    train = samples["train"]
    values = [row[d.label_field] for row in train.rows]
    if train.csv and all(isinstance(v, str) and v.strip().lstrip("-").isdigit() for v in values):
        found.csv_numbers = True
        values = [int(v) for v in values]
    numbers = [_is_number(v) for v in values]
    if all(numbers):
        n = spec.model.num_labels
        found.num_labels = n
        for split, sample in samples.items():
            for i, row in enumerate(sample.rows):
                v = row[d.label_field]
                v = int(v) if found.csv_numbers and isinstance(v, str) and v.strip().lstrip("-").isdigit() else v
                if _is_number(v) and not 0 <= int(v) < n:
                    problems.append(
                        f"{_where(split, sources[split], i)}: label {int(v)} but model.num_labels = {n}: labels must "
                        f"be 0..{n - 1} (or strings, which are mapped to ids for you)"
                    )
                    break
        return problems
    if any(numbers) or not all(isinstance(v, str) for v in values):
        # the first row of another kind than row 1's (or of neither kind)
        odd = next(
            i for i, v in enumerate(values) if numbers[i] != numbers[0] or not (numbers[i] or isinstance(v, str))
        )
        return problems + [
            f"{_where('train', sources['train'], odd)}: {d.label_field!r} (data.label_field) mixes label names and "
            f"numbers (this row has {_kind(values[odd])}); use one kind"
        ]
    names = sorted(set(values))
    found.label2id = {name: i for i, name in enumerate(names)}
    # A third name seen decides val_f1 even if more come later; fewer decide only when read whole.
    found.num_labels = len(names) if train.complete or len(names) > 2 else None
    if train.complete and "validation" in samples:
        unknown = sorted({str(row[d.label_field]) for row in samples["validation"].rows} - set(names))
        if unknown:
            problems.append(
                f"data.validation: {sources['validation']} has labels the training data lacks "
                f"({d.label_field!r}): {', '.join(unknown[:SHOWN])}"
            )
    return problems


def _tokens(spec: JobSpec, samples: dict[str, Sample], sources: dict[str, str], found: Findings) -> list[str]:
    assert spec.data is not None
    d = spec.data
    problems = _missing(spec, samples, sources, ["tokens_field", "tags_field"])
    if problems:
        return problems
    for split, sample in samples.items():
        for i, row in enumerate(sample.rows):
            words, tags = row[d.tokens_field], row[d.tags_field]
            where = _where(split, sources[split], i)
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                problems.append(f"{where}: {d.tokens_field!r} (data.tokens_field) must be a list of words")
            elif not isinstance(tags, list):
                problems.append(f"{where}: {d.tags_field!r} (data.tags_field) must be a list of tags")
            elif not all(isinstance(t, str) for t in tags):
                odd = next(t for t in tags if not isinstance(t, str))
                problems.append(
                    f'{where}: {d.tags_field!r} (data.tags_field) must be tag names such as "B-PER" (found {_kind(odd)})'
                )
            elif len(words) != len(tags):
                problems.append(f"{where}: {len(words)} tokens but {len(tags)} tags (one tag per word)")
            else:
                continue
            break  # one problem per split is enough to act on
    if problems or "train" not in samples:
        return problems
    train = samples["train"]
    names = sorted({t for row in train.rows for t in row[d.tags_field]})
    found.tag2id = {name: i for i, name in enumerate(names)}
    if train.complete:
        found.num_labels = len(names)
        if "validation" in samples:
            unknown = sorted({t for row in samples["validation"].rows for t in row[d.tags_field]} - set(names))
            if unknown:
                problems.append(
                    f"data.validation: {sources['validation']} has tags the training data lacks "
                    f"({d.tags_field!r}): {', '.join(unknown[:SHOWN])}"
                )
    return problems


def _causal(spec: JobSpec, samples: dict[str, Sample], sources: dict[str, str]) -> list[str]:
    assert spec.data is not None
    d = spec.data
    if d.messages_field:
        fields = ["messages_field"]
    elif d.prompt_field:
        fields = ["prompt_field", "response_field"]
    else:
        fields = ["text_field"]
    problems = _missing(spec, samples, sources, fields)
    if problems or not d.messages_field:
        return problems
    key = d.messages_field
    for split, sample in samples.items():
        reasons = []
        for i, row in enumerate(sample.rows):
            chat = row[key]
            reason = conversation_problem(chat)
            bad = (
                next((m for m in chat if not isinstance(m, dict) or "role" not in m or "content" not in m), None)
                if (isinstance(chat, list))
                else None
            )
            if bad is not None or (reason and not isinstance(chat, list)):
                what = (
                    reason
                    if bad is None
                    else f"a message must be an object with 'role' and 'content' (got {str(bad)[:60]})"
                )
                problems.append(f"{_where(split, sources[split], i)}: {key!r} (data.messages_field): {what}")
                break
            reasons.append(reason)
        else:
            if reasons and all(reasons) and sample.complete:
                problems.append(
                    f"data.{split}: {sources[split]}: no conversation has a turn to train on "
                    f"({key!r}, data.messages_field; row 1: {reasons[0]})"
                )
    return problems
