"""job.toml for the causal-lm and token-classification tasks: fields a task does not use, fields
that go together, a monitor the task does not report, and a data field missing from the data
file, each refused by `orch submit` with exit 2 on one line naming the file and the field."""

from __future__ import annotations

import json

import pytest

SFT = """\
gpus = 0
[model]
name_or_path = "some-org/some-llm"
task = "causal-lm"
[data]
train = "{train}"
"""
NER = SFT.replace('"causal-lm"', '"token-classification"')
CLASSIFIER = SFT.replace('task = "causal-lm"\n', "")

CASES = [
    (
        "prompt_without_response",
        SFT + 'prompt_field = "prompt"\n',
        "data.prompt_field and data.response_field go together (the loss is on the response)",
    ),
    (
        "messages_and_prompt",
        SFT + 'prompt_field = "prompt"\nresponse_field = "response"\nmessages_field = "messages"\n',
        "data.messages_field or data.prompt_field + data.response_field, not both",
    ),
    (
        "lora_on_ner",
        NER + "[lora]\nr = 8\n",
        "[lora]: only for model.task = \"causal-lm\" (this job's task is 'token-classification')",
    ),
    (
        "packing_on_classifier",
        CLASSIFIER + "packing = true\n",
        "data.packing: only for model.task = \"causal-lm\" (this job's task is 'sequence-classification')",
    ),
    (
        "monitor_not_reported",
        SFT + '[early_stopping]\nmonitor = "val_acc"\n',
        "early_stopping.monitor: 'val_acc' is not a metric of model.task = 'causal-lm' "
        "(use one of val_loss, val_perplexity, train_loss)",
    ),
    (
        "task_unknown",
        SFT.replace('"causal-lm"', '"seq2seq"'),
        "model.task: must be one of 'sequence-classification', 'causal-lm' or 'token-classification' (got 'seq2seq')",
    ),
    ("lora_rank_zero", SFT + "[lora]\nr = 0\n", "lora.r: must be greater than 0 (got 0)"),
    (
        "num_labels_on_causal_lm",
        SFT.replace('task = "causal-lm"\n', 'task = "causal-lm"\nnum_labels = 5\n'),
        'model.num_labels: not used by model.task = "causal-lm" (it predicts the next token over the '
        "tokenizer's vocabulary; got 5): remove it",
    ),
    ("lora_targets_unknown_word", SFT + '[lora]\ntarget_modules = "everything"\n', "lora.target_modules:"),
    (
        "prompt_field_not_in_file",
        SFT + 'prompt_field = "question"\nresponse_field = "response"\n',
        "data.prompt_field: 'question' is not a field of {train} (its first row has: prompt, response, messages, text)",
    ),
    (
        "tags_field_not_in_file",
        NER.replace("{train}", "{ner}") + 'tags_field = "ner_tags"\n',
        "data.tags_field: 'ner_tags' is not a field of {ner} (its first row has: tokens, tags)",
    ),
]


@pytest.fixture
def data_files(tmp_path):
    sft, ner = tmp_path / "sft.jsonl", tmp_path / "ner.jsonl"
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    sft.write_text(json.dumps({"prompt": "q", "response": "a", "messages": chat, "text": "t"}) + "\n")
    ner.write_text(json.dumps({"tokens": ["a"], "tags": ["O"]}) + "\n")
    return {"train": str(sft), "ner": str(ner)}


@pytest.mark.parametrize("text, expected", [pytest.param(t, e, id=c) for c, t, e in CASES])
def test_bad_task_fields_are_refused_naming_the_field(text, expected, cli, write_file, job_count, data_files):
    path = write_file("job.toml", text.format(**data_files))
    ran = cli("submit", path).assert_failed(2)
    line = f"{path}: {expected.format(**data_files)}"
    assert line in ran.err, f"expected {line!r} in:\n{ran.err}"
    assert "Traceback" not in ran.err
    assert job_count() == 0


def test_a_missing_prompt_field_is_named_by_the_real_orch_with_exit_2(orch, write_file, job_count, data_files):
    path = write_file(
        "job.toml", (SFT + 'prompt_field = "instruction"\nresponse_field = "output"\n').format(**data_files)
    )
    ran = orch("submit", path).assert_failed(2)
    assert ran.err.strip().splitlines() == [
        f"{path}: data.prompt_field: 'instruction' is not a field of {data_files['train']} "
        "(its first row has: prompt, response, messages, text)",
        f"{path}: data.response_field: 'output' is not a field of {data_files['train']} "
        "(its first row has: prompt, response, messages, text)",
    ]
    assert job_count() == 0


@pytest.mark.parametrize(
    "text",
    [
        SFT
        + 'prompt_field = "prompt"\nresponse_field = "response"\npacking = true\n[lora]\ntarget_modules = "all-linear"\nmerge = true\n',
        SFT
        + 'messages_field = "messages"\n[lora]\ntarget_modules = ["q_proj", "v_proj"]\n[early_stopping]\nmonitor = "val_perplexity"\n',
        NER + '[early_stopping]\nmonitor = "val_f1"\n',
    ],
)
def test_good_task_jobs_are_queued(text, cli, write_file, job_count, data_files):
    path = write_file(
        "job.toml",
        text.replace("{train}", "{ner}" if "token-classification" in text else "{train}").format(**data_files),
    )
    ran = cli("submit", path)
    assert ran.rc == 0, ran.err
    assert job_count() == 1
