"""The runner's deterministic errors: a data or configuration error found at run time ends the
attempt with exit 78 and job_error.json ({"attempt", "message"}), so the daemon fails the job at
once instead of retrying it; a true crash still exits 1 with no such file (and is retried).
Real `python -m training.run` subprocesses on tiny models; loaders checked in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_harness import orch_home  # noqa: F401  (fixture)

from orchestrator.contract import EX_CONFIG, EX_FAIL, JOB_ERROR
from training.toy import write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows, ner_rows


def _job_error(run_dir: Path) -> dict:
    return json.loads((run_dir / JOB_ERROR).read_text())


@pytest.mark.slow
def test_ner_validation_tags_the_training_data_lacks_end_the_attempt_with_78(make_run_dir, run_job, tmp_path):
    train = write_jsonl(tmp_path / "ner_train.jsonl", ner_rows(30, seed=1))
    dev = write_jsonl(tmp_path / "ner_dev.jsonl", [{"tokens": ["x", "y"], "tags": ["B-MISC", "O"]}])
    run_dir = make_run_dir(
        "ner", model={"task": "token-classification"}, data={"train": str(train), "validation": str(dev)}
    )
    code, out = run_job(run_dir, attempt=2)
    assert code == EX_CONFIG, out
    error = _job_error(run_dir)
    assert error["attempt"] == 2
    assert "validation data has tags the training data lacks: B-MISC" in error["message"], error
    assert "orch: job failed: validation data has tags the training data lacks" in out
    assert "Traceback" not in out


@pytest.fixture
def run_in_process(monkeypatch, hf_cache):
    """training.run.main in this process (as `orch run` calls it): the exit code it returns, without
    paying a new interpreter's imports. The environment is the daemon's for attempt 1."""
    from training.run import main

    def run(run_dir: Path) -> int:
        monkeypatch.setenv("ORCH_ATTEMPT", "1")
        monkeypatch.setenv("ORCH_JOB_ID", "1")
        monkeypatch.setenv("ORCH_RUN_DIR", str(run_dir))
        monkeypatch.setenv("ORCH_CKPT_DIR", str(run_dir / "checkpoints"))
        monkeypatch.setenv("HF_DATASETS_CACHE", str(hf_cache))
        return main(run_dir)

    return run


def test_a_monitor_two_label_names_never_log_ends_the_attempt_with_78(make_run_dir, run_in_process, data_dir):
    # string labels are counted only in the data: orch submit cannot always know there are two
    run_dir = make_run_dir(
        "f1",
        data={"train": str(data_dir / "train_str.jsonl"), "validation": str(data_dir / "dev_str.jsonl")},
        early_stopping={"monitor": "val_f1"},
    )
    assert run_in_process(run_dir) == EX_CONFIG
    error = _job_error(run_dir)
    assert error["attempt"] == 1
    assert error["message"].startswith("early_stopping.monitor: 'val_f1' is logged only with 3 or more"), error


def test_lora_modules_the_model_lacks_end_the_attempt_with_78(make_run_dir, run_in_process, tmp_path):
    llama = build_tiny_llama(tmp_path / "llama", [r["text"] for r in instruction_rows(60)], hidden=16, layers=1)
    train = write_jsonl(tmp_path / "sft.jsonl", instruction_rows(20, seed=2))
    run_dir = make_run_dir(
        "lora",
        model={"name_or_path": str(llama), "task": "causal-lm"},
        data={"train": str(train), "validation": None, "prompt_field": "prompt", "response_field": "response"},
        lora={"target_modules": ["qkv_proj", "c_attn"]},
    )
    assert run_in_process(run_dir) == EX_CONFIG
    assert _job_error(run_dir)["message"].startswith("lora.target_modules: Target modules"), _job_error(run_dir)


def test_a_true_crash_still_exits_1_with_no_job_error(make_run_dir, run_job, tmp_path):
    run_dir = make_run_dir("crash")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the checkpoint folder cannot be made: not the job's data or configuration
    code, out = run_job(run_dir, ORCH_CKPT_DIR=str(blocker / "checkpoints"))
    assert code == EX_FAIL, out
    assert not (run_dir / JOB_ERROR).exists()


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("empty.jsonl", "", "data.train: {path} is empty (0 bytes)"),
        ("blank.jsonl", "\n\n  \n", "data.train: {path} has only blank lines"),
        ("header.csv", "text,label\n", "data.train: {path} has no rows"),
        ("broken.jsonl", '{"text": "a", "label": 1}\n{"text": \n', "data.train: cannot read {path} as json:"),
    ],
)
def test_the_loader_names_an_unusable_file_as_a_data_error(tmp_path, name, content, words):
    from training.builtin.data import DataError, load_split

    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as caught:
        load_split(str(path), "train")
    assert words.format(path=path) in str(caught.value)


@pytest.mark.slow
def test_a_data_error_fails_the_job_after_one_attempt_through_the_daemon(tmp_path, tiny_bert, orch_home):
    from daemon_harness import wait_for

    from orchestrator.model.states import JobState

    train = write_jsonl(tmp_path / "ner_train.jsonl", ner_rows(30, seed=1))
    dev = write_jsonl(tmp_path / "ner_dev.jsonl", [{"tokens": ["x", "y"], "tags": ["B-MISC", "O"]}])
    h = orch_home()
    job = h.jobs_dir / "ner.toml"
    job.write_text(
        f'name = "ner-bad-tags"\ngpus = 0\nretries = 2\n[model]\nname_or_path = "{tiny_bert}"\n'
        f'task = "token-classification"\n[data]\ntrain = "{train}"\nvalidation = "{dev}"\nnum_workers = 0\n'
        '[train]\nmax_steps = 2\nbatch_size = 8\nprecision = "32"\n'
    )
    job_id = h.submit(job)  # submit_job itself: the CLI's pre-flight would refuse this file
    h.start_daemon()
    # one attempt and FAILED (the outcome table's exit-78 row), or a second attempt started: stop waiting either way
    wait_for(lambda: h.state(job_id) is JobState.FAILED or len(h.store.attempts(job_id)) > 1, 240)
    assert [a.n for a in h.store.attempts(job_id)] == [1], h.diagnostics(job_id)
    failed = h.job(job_id)
    assert failed.state is JobState.FAILED
    assert "tags the training data lacks: B-MISC" in (failed.reason or "")
    assert failed.failures == 0  # not charged: a deterministic error is no retry spent
