"""The pre-flight `orch submit` runs for a built-in job (training/ahead/preflight.py), called in-process
on real files and real tiny models: each bad input gives one line naming the file and the field,
a good job gives none, and nothing reads the weights (a folder whose weights file is not weights
passes; one without a weights file is refused)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from training.ahead.preflight import run
from training.toy import sentiment_rows, write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows, ner_rows

CHAT_OK = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bert: Path) -> dict[str, Path]:
    """tiny BERT and tiny Llama folders whose weights file holds no weights: the pre-flight checks the
    file is there and never loads it."""
    root = tmp_path_factory.mktemp("preflight-models")
    llama = build_tiny_llama(root / "llama-full", [r["text"] for r in instruction_rows(200, seed=3)], vocab_size=300)
    out = {}
    for name, folder in (("bert", tiny_bert), ("llama", llama)):
        light = root / name
        shutil.copytree(folder, light)
        for weights in light.glob("*.safetensors"):
            weights.write_bytes(b"not weights: loading this would fail")
        out[name] = light
    return out


def _jsonl(folder: Path, name: str, rows: list[Any]) -> str:
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _spec(model: Path, task: str, train: str, validation: str | None = None, **sections: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "p",
        "gpus": 0,
        "model": {"name_or_path": str(model), "task": task},
        "data": {"train": train, "max_length": 32},
        "train": {"max_steps": 5, "batch_size": 8},
    }
    if validation:
        spec["data"]["validation"] = validation
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value}
    return spec


CLS, NER, LM = "sequence-classification", "token-classification", "causal-lm"
NER_OK = ner_rows(40, seed=1)


def _cases(d: Path, m: dict[str, Path]) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """name -> (spec, words every problem line must hold; [] = no problem)."""
    bert, llama = m["bert"], m["llama"]
    train = _jsonl(d, "train.jsonl", sentiment_rows(60, seed=1))
    train_str3 = _jsonl(d, "train3.jsonl", [{"text": "a b", "label": x} for x in ("neg", "pos", "mid") * 10])
    train_str2 = _jsonl(d, "train2.jsonl", [{"text": "a b", "label": x} for x in ("neg", "pos") * 10])
    dev_unknown = _jsonl(d, "dev_unknown.jsonl", [{"text": "a", "label": "neg"}, {"text": "b", "label": "meh"}])
    header_only = d / "header.csv"
    header_only.write_text("text,label\n")
    broken = d / "broken.jsonl"
    broken.write_text('{"text": "a", "label": 0}\n{"text": "b", "label": \n')
    ner_dev_new = _jsonl(d, "ner_dev.jsonl", [{"tokens": ["x", "y"], "tags": ["B-MISC", "O"]}])
    ner_len = _jsonl(d, "ner_len.jsonl", NER_OK[:5] + [{"tokens": ["a", "b", "c"], "tags": ["O", "O"]}])
    ner_int = _jsonl(d, "ner_int.jsonl", [{"tokens": ["a", "b"], "tags": [0, 1]}] * 4)
    lm_rows = instruction_rows(20, seed=2)
    no_role = _jsonl(d, "no_role.jsonl", [{"messages": CHAT_OK}, {"messages": [{"content": "who am i"}]}])
    no_assistant = _jsonl(
        d, "no_assistant.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 3 + [{"messages": []}]
    )
    lm_train = _jsonl(d, "lm.jsonl", lm_rows)
    prompt = {"prompt_field": "prompt", "response_field": "response"}
    no_config = d / "no-config"
    shutil.copytree(bert, no_config)
    (no_config / "config.json").unlink()
    no_tokenizer = d / "no-tokenizer"  # transformers would build a 5-token tokenizer: all [UNK]
    shutil.copytree(bert, no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    no_weights = d / "no-weights"
    shutil.copytree(bert, no_weights)
    (no_weights / "model.safetensors").unlink()
    adapter = d / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "x"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"adapter")
    big_vocab = d / "big-vocab"  # a 300-token tokenizer beside a 30 522-row embedding table
    shutil.copytree(bert, big_vocab)
    config = json.loads((big_vocab / "config.json").read_text())
    (big_vocab / "config.json").write_text(json.dumps({**config, "vocab_size": 30522}))
    xlsx = d / "train.xlsx"
    xlsx.write_bytes(b"PK\x03\x04" + bytes(196))  # 200 bytes: small enough to peek into, never read
    tsv = d / "train.tsv"
    tsv.write_text("text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in sentiment_rows(30, seed=1)))
    bom = d / "bom.csv"
    bom.write_text("\ufefftext,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in sentiment_rows(30, seed=1)))
    semicolons = d / "semicolons.csv"
    semicolons.write_text("text;label\n" + "".join(f"{r['text']};{r['label']}\n" for r in sentiment_rows(30, seed=1)))
    foreign = _jsonl(d, "foreign.jsonl", [{"text": "ΩΨΦ жизнь 漢字", "label": i % 2} for i in range(10)])
    return {
        "quickstart-like job": (_spec(bert, CLS, train, train), []),
        "ner job": (_spec(bert, NER, _jsonl(d, "ner.jsonl", NER_OK), _jsonl(d, "ner_ok_dev.jsonl", NER_OK[:5])), []),
        "lora all-linear": (_spec(llama, LM, lm_train, data=prompt, lora={"target_modules": "all-linear"}), []),
        "lora q_proj": (_spec(llama, LM, lm_train, data=prompt, lora={"target_modules": ["q_proj"]}), []),
        "lora default modules": (_spec(llama, LM, lm_train, data=prompt, lora={}), []),
        "csv with a header only": (_spec(bert, CLS, str(header_only)), ["data.train:", "header.csv", "no rows"]),
        "a line that is not JSON": (
            _spec(bert, CLS, str(broken)),
            ["data.train:", "broken.jsonl", "line 2 is not JSON"],
        ),
        "a row without the text field": (
            _spec(bert, CLS, train, data={"text_field": "sentence"}),
            ["data.train:", "train.jsonl row 1", "'sentence'", "data.text_field"],
        ),
        "a label beyond num_labels": (
            _spec(bert, CLS, _jsonl(d, "big.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 5}])),
            ["data.train:", "row 2", "label 5", "model.num_labels = 2"],
        ),
        "validation labels the training data lacks": (
            _spec(bert, CLS, train_str2, dev_unknown),
            ["data.validation:", "dev_unknown.jsonl", "lacks", "meh"],
        ),
        "labels of two kinds": (
            _spec(bert, CLS, _jsonl(d, "mixed.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": "pos"}])),
            ["data.train:", "mixed.jsonl row 2", "data.label_field", "mixes"],
        ),
        "null text": (
            _spec(bert, CLS, _jsonl(d, "null.jsonl", [{"text": "a", "label": 1}, {"text": None, "label": 0}])),
            ["data.train:", "null.jsonl row 2", "data.text_field", "must be text"],
        ),
        "val_f1 with 2 labels": (
            _spec(bert, CLS, train, early_stopping={"monitor": "val_f1"}),
            ["early_stopping.monitor:", "'val_f1'", "3 or more labels", "has 2"],
        ),
        "val_f1 with 3 label names": (_spec(bert, CLS, train_str3, early_stopping={"monitor": "val_f1"}), []),
        "val_f1 with 2 label names": (
            _spec(bert, CLS, train_str2, early_stopping={"monitor": "val_f1"}),
            ["early_stopping.monitor:", "'val_f1'"],
        ),
        "ner validation tags the training data lacks": (
            _spec(bert, NER, _jsonl(d, "ner_t.jsonl", NER_OK), ner_dev_new),
            ["data.validation:", "ner_dev.jsonl", "tags the training data lacks", "B-MISC"],
        ),
        "ner token/tag lengths": (
            _spec(bert, NER, ner_len),
            ["data.train:", "ner_len.jsonl row 6", "3 tokens but 2 tags"],
        ),
        "ner tags that are numbers": (
            _spec(bert, NER, ner_int),
            ["data.train:", "ner_int.jsonl row 1", "data.tags_field", "tag names"],
        ),
        "chat message without a role": (
            _spec(llama, LM, no_role, data={"messages_field": "messages"}),
            ["data.train:", "no_role.jsonl row 2", "data.messages_field", "'role' and 'content'"],
        ),
        "chats without an assistant turn": (
            _spec(llama, LM, no_assistant, data={"messages_field": "messages"}),
            ["data.train:", "no_assistant.jsonl", "data.messages_field", "no assistant turn"],
        ),
        "lora modules the model lacks": (
            _spec(llama, LM, lm_train, data=prompt, lora={"target_modules": ["qkv_proj", "c_attn"]}),
            ["lora.target_modules:", "not found in the base model"],
        ),
        "a model folder without tokenizer files": (
            _spec(no_tokenizer, CLS, train),
            ["model.name_or_path:", "no-tokenizer", "has no tokenizer files", "tokenizer.json", "vocab.txt"],
        ),
        "a model folder without a weights file": (
            _spec(no_weights, CLS, train),
            ["model.name_or_path:", "no-weights", "has no weights file", "model.safetensors"],
        ),
        "a PEFT adapter folder given as the model": (
            _spec(adapter, CLS, train),
            ["model.name_or_path:", "this is a PEFT adapter (adapter_config.json)", "base model in model.name_or_path"],
        ),
        "a tokenizer far smaller than the model's vocabulary": (
            _spec(big_vocab, CLS, train),
            ["model.name_or_path:", "tokens and the model's vocab_size is 30522", "not the model's tokenizer"],
        ),
        "first rows that tokenize to the unknown token only": (
            _spec(bert, CLS, foreign),
            ["data.train:", "foreign.jsonl", "unknown token only", "[UNK]"],
        ),
        "an .xlsx data file": (
            _spec(bert, CLS, str(xlsx)),
            ["data.train:", "train.xlsx", "unsupported file type (.xlsx)", "csv, tsv, json, jsonl or parquet"],
        ),
        "a .tsv data file": (_spec(bert, CLS, str(tsv)), []),
        "a csv with a UTF-8 byte-order mark": (_spec(bert, CLS, str(bom)), []),
        "a ;-separated csv": (
            _spec(bert, CLS, str(semicolons)),
            ["data.train:", "row 1 has no 'text'", "it has: text;label", "looks ';'-separated"],
        ),
        "a model folder without config.json": (
            _spec(no_config, CLS, train),
            ["model.name_or_path:", "no-config", "configuration"],
        ),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory, models) -> dict[str, tuple[dict[str, Any], list[str]]]:
    return _cases(tmp_path_factory.mktemp("preflight-data"), models)


def _names() -> list[str]:
    """The table's keys, read from _cases' source: pytest collects before the fixtures exist."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_cases))
    table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Return))
    assert isinstance(table, ast.Dict)
    return [k.value for k in table.keys if isinstance(k, ast.Constant)]


@pytest.mark.parametrize("name", _names())
def test_preflight_case(cases, name: str) -> None:
    spec, words = cases[name]
    answer = run({"checks": [{"label": "job.toml", "spec": copy.deepcopy(spec)}]})
    if not words:
        assert answer["problems"] == [], answer
        return
    assert len(answer["problems"]) == 1, answer
    line = answer["problems"][0]
    assert line.startswith("job.toml: "), line
    for word in words:
        assert word in line, line


def test_a_sweep_objective_the_task_does_not_log_is_named_on_the_sweep_file(cases) -> None:
    spec, _ = cases["quickstart-like job"]
    answer = run(
        {"checks": [{"label": "job.toml", "spec": spec, "objective": "val_f1", "objective_label": "sweep.toml"}]}
    )
    assert answer["problems"] == [
        "sweep.toml: sweep.objective: 'val_f1' is logged only with 3 or more labels and this job has 2; "
        "use one of val_loss, val_acc, train_loss"
    ], answer


def test_hub_ids_not_in_the_cache_are_left_to_the_run_with_a_note(cases, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    spec, _ = cases["quickstart-like job"]
    spec = copy.deepcopy(spec)
    spec["model"]["name_or_path"] = "nobody/no-such-model"
    spec["data"]["validation"] = "imdb"
    answer = run({"checks": [{"label": "job.toml", "spec": spec}]})
    assert answer["problems"] == [], answer
    assert any("imdb is not a local file" in n for n in answer["notes"]), answer
    assert any("'nobody/no-such-model' is not in the local cache" in n for n in answer["notes"]), answer


def test_a_multi_line_error_is_kept_whole_on_one_line() -> None:
    """transformers' first line ends in "from one of: " and lists the files on the next lines."""
    from training.ahead.preflight import _first

    error = OSError(
        "Can't load tokenizer for 'x'. Make sure it has the files from one of: \n- vocab.txt\n- tokenizer.json"
    )
    assert _first(error) == (
        "Can't load tokenizer for 'x'. Make sure it has the files from one of: - vocab.txt - tokenizer.json"
    )
    assert _first(OSError("y" * 1000)).endswith("…") and len(_first(OSError("y" * 1000))) == 400


def test_a_command_job_gets_no_preflight() -> None:
    answer = run({"checks": [{"label": "job.toml", "spec": {"name": "c", "command": ["true"]}}]})
    assert answer["problems"] == [] and answer["notes"] == []


def test_the_sample_is_bounded(tmp_path: Path) -> None:
    from training.ahead.samples import MAX_ROWS, read_sample

    big = write_jsonl(tmp_path / "big.jsonl", sentiment_rows(MAX_ROWS + 5, seed=1))
    sample = read_sample(big)
    assert sample is not None and len(sample.rows) == MAX_ROWS and not sample.complete
    small = write_jsonl(tmp_path / "small.jsonl", sentiment_rows(MAX_ROWS, seed=1))
    sample = read_sample(small)
    assert sample is not None and len(sample.rows) == MAX_ROWS and sample.complete


def test_a_max_length_past_the_model_is_cut_to_it_with_a_note_and_a_long_row_trains(tmp_path, tiny_bert) -> None:
    """data.max_length = 4096 on a 64-position BERT: without the cut, the one long row would
    index past the position embeddings and crash the run at whatever step draws it."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from orchestrator.spec.jobspec import spec_from_dict
    from training.builtin.tasks import make_data

    rows = sentiment_rows(30, seed=4) + [{"text": " ".join(["good"] * 300), "label": 1}]
    train = _jsonl(tmp_path, "long.jsonl", rows)
    spec = _spec(tiny_bert, CLS, train, data={"max_length": 4096, "num_workers": 0})
    answer = run({"checks": [{"label": "job.toml", "spec": spec}]})
    assert answer["problems"] == []
    assert (
        "job.toml: data.max_length = 4096 is more than this model takes (64 tokens, its tokenizer's "
        "model_max_length): rows are cut at 64" in answer["notes"]
    ), answer["notes"]

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    data = make_data(spec_from_dict(spec, "job.toml"), tokenizer, 8)
    data.prepare()
    lengths = [len(ids) for ids in data.splits["train"]["input_ids"]]
    assert max(lengths) == 64  # the long row, cut
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    longest = torch.tensor([data.splits["train"]["input_ids"][lengths.index(64)]])
    assert model(input_ids=longest).logits.shape == (1, 2)
