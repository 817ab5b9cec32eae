"""`orch submit` refuses a built-in job whose mistake would otherwise fail every attempt: an empty
data file, LoRA modules the model lacks, a metric the task never logs (the pre-flight, a
subprocess), and the sweep file's small traps (paths relative to the job file, a past deadline,
`name`, `[[sweep]]`, a base job's `{lr}` submitted alone). Each: exit 2, one line naming the file
and the field, no traceback, nothing queued. The pre-flight's own cases are tests/training/test_preflight.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import tomli_w

from orchestrator.store import Store
from training.toy import build_tiny_bert, sentiment_rows, write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """A folder with tiny-bert/, tiny-llama/ (config, tokenizer and a weights file that holds no
    weights: the pre-flight checks it is there and never reads it) and data/train.jsonl."""
    root = tmp_path_factory.mktemp("preflight-assets")
    build_tiny_bert(root / "tiny-bert", [r["text"] for r in sentiment_rows(200)], hidden=16, layers=1, vocab_size=200)
    build_tiny_llama(
        root / "tiny-llama", [r["text"] for r in instruction_rows(100)], hidden=16, layers=1, vocab_size=300
    )
    for weights in root.glob("*/*.safetensors"):
        weights.write_bytes(b"not weights")
    write_jsonl(root / "data" / "train.jsonl", sentiment_rows(40, seed=1))
    write_jsonl(root / "data" / "sft.jsonl", instruction_rows(20, seed=1))
    return root


def _job(folder: Path, assets: Path, name: str = "job.toml", **over: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for item in ("tiny-bert", "tiny-llama", "data"):
        if not (folder / item).exists():
            shutil.copytree(assets / item, folder / item)
    spec: dict = {
        "name": "j",
        "gpus": 0,
        "model": {"name_or_path": "./tiny-bert"},
        "data": {"train": "./data/train.jsonl", "num_workers": 0},
        "train": {"max_steps": 4, "batch_size": 8},
    }
    for key, value in over.items():
        spec[key] = {**spec.get(key, {}), **value}
    path = folder / name
    path.write_text(tomli_w.dumps(spec))
    return path


def _nothing_queued(home: Path) -> None:
    db = home / "orch.db"
    if db.exists():
        store = Store(db)
        assert store.jobs() == [] and store.sweeps() == []


def _refused(ran, *words: str) -> list[str]:
    ran.assert_failed(2)
    lines = ran.err.strip().splitlines()
    for word in words:
        assert any(word in line for line in lines), f"{word!r} not in:\n{ran.err}"
    return lines


# -- refused before the pre-flight (instant) ----------------------------------------------------


@pytest.mark.parametrize(
    "content, words",
    [
        ("", ["data.train:", "train.jsonl is empty (0 bytes)"]),
        ("\n  \n\n", ["data.train:", "train.jsonl has only blank lines"]),
    ],
    ids=["zero-bytes", "blank-lines"],
)
@pytest.mark.parametrize("verb", ["submit", "estimate", "run"])
def test_an_empty_data_file_is_refused_naming_file_and_field(tmp_path, home, cli, assets, content, words, verb):
    job = _job(tmp_path / "w", assets)
    (tmp_path / "w" / "data" / "train.jsonl").write_text(content)
    lines = _refused(cli(verb, job), *words)
    assert all(line.startswith(str(job)) for line in lines), lines
    _nothing_queued(home)


def test_an_empty_ner_validation_file_is_refused(tmp_path, home, cli, assets):
    folder = tmp_path / "w"
    job = _job(folder, assets, model={"task": "token-classification"}, data={"validation": "./data/dev.jsonl"})
    (folder / "data" / "dev.jsonl").write_text("\n")
    _refused(cli("submit", job), f"{job}: data.validation:", "dev.jsonl has only blank lines")
    _nothing_queued(home)


@pytest.mark.parametrize(
    "modules, words",
    [
        ('"q_proj"', ['lora.target_modules: write the module names as a list, e.g. ["q_proj"]']),
        ("[]", ["lora.target_modules: an empty list adapts nothing"]),
    ],
)
def test_target_modules_of_the_wrong_shape_get_one_line(tmp_path, home, cli, assets, modules, words):
    job = _job(tmp_path / "w", assets, model={"name_or_path": "./tiny-llama", "task": "causal-lm"})
    job.write_text(job.read_text() + f"\n[lora]\ntarget_modules = {modules}\n")
    lines = _refused(cli("submit", job), *words)
    assert len(lines) == 1, lines
    _nothing_queued(home)


def _sweep(folder: Path, text: str) -> Path:
    path = folder / "sweep.toml"
    path.write_text(text)
    return path


SWEEP = """\
[sweep]
job = "jobs/job.toml"
trials = 2
objective = "val_acc"
[sweep.params]
"train.learning_rate" = {{ values = [1e-3, 1e-4] }}
{extra}
"""


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            '"data.train" = { values = ["./data/train.jsonl", "./data/missing.jsonl"] }',
            ["sweep.params.'data.train': './data/missing.jsonl': no such file or folder", "jobs/data/missing.jsonl"],
        ),
        (
            '"deadline" = { values = ["2001-01-01T00:00+00:00"] }',
            ["sweep.params.deadline: 2001-01-01T00:00+00:00 is already past"],
        ),
        ('"name" = { values = ["a", "b"] }', ["sweep.params.name: trials are named by the sweep"]),
        (
            '"train.batch_size" = { log_uniform = [8, 64] }',
            ["sweep.params.'train.batch_size': train.batch_size takes whole numbers"],
        ),
    ],
    ids=["relative-data-path", "past-deadline", "name", "quoted-key"],
)
def test_sweep_parameters_are_checked_at_submit(tmp_path, home, cli, assets, extra, words):
    _job(tmp_path / "jobs", assets)
    lines = _refused(cli("submit", _sweep(tmp_path, SWEEP.format(extra=extra))), *words)
    assert all(line.startswith(str(tmp_path / "sweep.toml")) for line in lines), lines
    _nothing_queued(home)


def test_a_pydantic_problem_quotes_a_dotted_parameter_the_same_way(tmp_path, home, cli, assets):
    _job(tmp_path / "jobs", assets)
    extra = '"train.weight_decay" = { log_uniform = [0.0, 1e-2] }'
    _refused(cli("submit", _sweep(tmp_path, SWEEP.format(extra=extra))), "sweep.params.'train.weight_decay':")


def test_relative_sweep_paths_start_at_the_job_files_folder(tmp_path, home, cli, assets):
    _job(tmp_path / "jobs", assets)
    extra = '"data.train" = { values = ["./data/train.jsonl", "data/train.jsonl"] }'
    ran = cli("submit", _sweep(tmp_path, SWEEP.format(extra=extra)), "--json", env={"ORCH_PREFLIGHT": "off"})
    assert ran.rc == 0, ran.err
    sweep = Store(home / "orch.db").sweep(json.loads(ran.out)["id"])
    want = str((tmp_path / "jobs" / "data" / "train.jsonl").resolve())
    assert sweep.spec["sweep"]["params"]["data.train"]["values"] == [want, want]


def test_an_array_of_sweep_tables_gets_one_clear_line(tmp_path, home, cli, assets):
    _job(tmp_path / "jobs", assets)
    text = '[[sweep]]\njob = "jobs/job.toml"\ntrials = 2\nobjective = "val_acc"\n'
    text += 'params = { "train.learning_rate" = { values = [1e-3] } }\n'
    lines = _refused(cli("submit", _sweep(tmp_path, text)), "not [[sweep]]")
    assert len(lines) == 1 and "unknown key" not in lines[0], lines
    _nothing_queued(home)


@pytest.mark.parametrize("arg", ["{lr}", "--lr={lr}"])
def test_a_sweeps_base_job_submitted_alone_is_refused(tmp_path, home, cli, arg):
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps({"name": "base", "gpus": 0, "command": [sys.executable, "train.py", "--lr", arg]}))
    _refused(cli("submit", path), f"{path}: command[3]: '{arg}' is a sweep parameter placeholder")
    _nothing_queued(home)


def test_a_command_with_braces_that_are_not_a_placeholder_is_queued(tmp_path, home, cli):
    path = tmp_path / "job.toml"
    cmd = ["bash", "-c", "echo ${HOME} {x}"]
    path.write_text(tomli_w.dumps({"name": "braces", "gpus": 0, "command": cmd}))
    assert cli("submit", path).rc == 0


def test_a_sweep_without_a_pruner_says_no_pruner(tmp_path, home, cli):
    from sweep_harness import write_score_job, write_sweep

    write_score_job(tmp_path)
    ran = cli("submit", write_sweep(tmp_path))
    assert ran.rc == 0, ran.err
    assert "no pruner" in ran.out and "none pruner" not in ran.out, ran.out


# -- refused by the pre-flight (a subprocess: a few seconds each) -------------------------------


def test_lora_modules_the_model_lacks_are_refused_at_submit(tmp_path, home, orch, assets):
    job = _job(
        tmp_path / "w",
        assets,
        model={"name_or_path": "./tiny-llama", "task": "causal-lm"},
        data={"train": "./data/sft.jsonl", "prompt_field": "prompt", "response_field": "response"},
        lora={"target_modules": ["qkv_proj", "c_attn"]},
    )
    lines = _refused(orch("submit", job, timeout=300), f"{job}: lora.target_modules:", "not found in the base model")
    assert len(lines) == 1, lines
    _nothing_queued(home)
    # `orch run` (the foreground) checks the same before it records the job or starts the runner
    lines = _refused(orch("run", job, timeout=300), f"{job}: lora.target_modules:", "not found in the base model")
    assert len(lines) == 1, lines  # the one line: no "recorded job ...", no runner started
    _nothing_queued(home)


def test_a_metric_two_labels_never_log_is_refused_for_a_job_and_a_sweep(tmp_path, home, orch, assets):
    job = _job(tmp_path / "jobs", assets, early_stopping={"monitor": "val_f1"})
    _refused(orch("submit", job, timeout=300), f"{job}: early_stopping.monitor: 'val_f1' is logged only with 3 or more")
    _job(tmp_path / "jobs", assets)  # the same job without early stopping: the sweep's objective
    sweep = _sweep(tmp_path, SWEEP.format(extra="").replace('"val_acc"', '"val_f1"'))
    _refused(orch("submit", sweep, timeout=300), f"{sweep}: sweep.objective: 'val_f1' is logged only with 3 or more")
    _nothing_queued(home)


def test_each_value_of_a_data_or_model_parameter_gets_its_own_preflight(tmp_path, assets):
    from orchestrator.sweeps.spec import load_sweep, preflight_checks

    _job(tmp_path / "jobs", assets)
    (tmp_path / "jobs" / "data" / "other.jsonl").write_text((tmp_path / "jobs" / "data" / "train.jsonl").read_text())
    extra = '"data.train" = { values = ["./data/train.jsonl", "./data/other.jsonl"] }'
    path = _sweep(tmp_path, SWEEP.format(extra=extra))
    section, base = load_sweep(path)
    checks = preflight_checks(section, base, str(path))
    trains = [c.spec["data"]["train"] for c in checks]
    folder = (tmp_path / "jobs" / "data").resolve()
    assert trains == [str(folder / "train.jsonl"), str(folder / "train.jsonl"), str(folder / "other.jsonl")]
    assert checks[0].label == section.job and all(c.objective == "val_acc" for c in checks)
    assert checks[2].label == f"{path}: sweep.params.'data.train' = '{folder / 'other.jsonl'}'"


def test_a_data_file_of_a_type_the_runner_cannot_read_is_refused_at_submit(tmp_path, home, cli, assets):
    """A 200-byte train.xlsx was queued with "too large to peek into" and failed when it ran."""
    job = _job(tmp_path / "w", assets, data={"train": "./data/train.xlsx"})
    (tmp_path / "w" / "data" / "train.xlsx").write_bytes(b"PK\x03\x04" + bytes(196))
    _refused(cli("submit", job), "data.train:", "train.xlsx is an unsupported file type (.xlsx)")
    _nothing_queued(home)


# -- the pre-flight runs in the daemon's Python (issue 37, item 8) -------------------------------


def _recorded_python(home: Path, script: Path, body: str) -> None:
    """Record `script` as the Python this home's daemon runs jobs with, as a daemon's start does."""
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "daemon.python").write_text(f"{script}\n")


def test_the_preflight_checks_a_job_in_the_python_its_daemon_runs_jobs_with(tmp_path, home, cli, assets):
    job = _job(tmp_path / "w", assets)
    for f in (tmp_path / "w" / "tiny-bert").glob("*"):
        if "token" in f.name or f.name in ("vocab.txt", "special_tokens_map.json"):
            f.unlink()  # a model folder without its tokenizer: only the pre-flight finds it
    mark = tmp_path / "ran-in-the-daemons-python"
    _recorded_python(home, tmp_path / "daemon-python", f'touch "{mark}"\nexec "{sys.executable}" "$@"\n')
    _refused(cli("submit", job), f"{job}: ", "tokenizer")
    assert mark.exists()  # the check ran in the daemon's interpreter, not the CLI's
    _nothing_queued(home)


def test_a_daemon_python_that_lacks_the_training_stack_is_named_in_the_note(tmp_path, home, cli, assets):
    """The CLI's own Python has torch; the daemon's does not: the job would fail there, and the
    note says where the check ran instead of passing on the CLI's packages."""
    job = _job(tmp_path / "w", assets)
    script = tmp_path / "bare-python"
    _recorded_python(home, script, "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    ran = cli("submit", job)
    assert ran.rc == 0, ran.err
    assert f"the pre-flight failed in {script}, the daemon's Python (ModuleNotFoundError: No module named" in ran.err
