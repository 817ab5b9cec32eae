"""The built-in fine-tune end to end. The quickstart runs as `python -m training.run RUN_DIR` in a
subprocess, as the daemon starts it; the other cases call the same runner in this process (as
`orch run` does: training.run.main), where what it trains and writes is the point, not the process."""

from __future__ import annotations

import json

import shutil
import sys

import pytest
import torch

from training.resume.checkpoints import list_checkpoints, load_checkpoint_file, step_of

from conftest import REPO, read_progress, read_result

pytestmark = pytest.mark.slow


def test_quickstart_reaches_its_accuracy(tmp_path, run_job, hf_cache):
    example = tmp_path / "quickstart"
    shutil.copytree(
        REPO / "examples" / "quickstart", example, ignore=shutil.ignore_patterns("data", "tiny-bert", "__pycache__")
    )
    import subprocess

    subprocess.run(
        [sys.executable, str(example / "prepare.py")],
        check=True,
        capture_output=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    from orchestrator.spec.jobspec import load_jobspec
    import tomli_w

    spec = load_jobspec(example / "job.toml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.toml").write_bytes(tomli_w.dumps(spec.to_toml_dict()).encode())
    # A guard against a hang, not a speed check (the speed is the benchmarks' business): on a
    # loaded machine this run has taken three minutes.
    code, out = run_job(run, timeout=600)
    assert code == 0, out
    # Lightning's advertising ("💡 Tip: ... litlogger/litmodels") and its `srun` hint stay out of job logs.
    assert "Tip:" not in out and "litlogger" not in out and "litmodels" not in out, out
    assert "The `srun` command is available" not in out, out
    result = read_result(run)
    assert result["metrics"]["val_acc"] >= 0.9, result
    assert result["best_metric"] >= 0.9
    # Patience may run out in the last epoch, but training was ending anyway: not an early stop.
    assert result["epochs"] == spec.train.max_epochs and result["early_stopped"] is False
    progress = read_progress(run)
    assert progress["step"] == result["steps"] and progress["total_steps"] == result["steps"]
    assert {"epoch", "metrics", "samples_per_s", "updated_at"} <= progress.keys()
    assert (run / "metrics.csv").is_file()


def test_exported_model_loads_and_predicts_with_string_labels(make_run_dir, run_here, data_dir):
    run = make_run_dir(
        "strings",
        data={"train": str(data_dir / "train_str.jsonl"), "validation": str(data_dir / "dev_str.jsonl")},
        train={"max_epochs": 3, "learning_rate": 3e-3},
        model={"num_labels": 2},
    )
    code, out = run_here(run)
    assert code == 0, out
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(run / "model")
    tok = AutoTokenizer.from_pretrained(run / "model")
    assert model.config.id2label == {0: "negative", 1: "positive"}  # sorted, deterministic
    assert model.config.label2id == {"negative": 0, "positive": 1}
    model.eval()
    with torch.no_grad():
        logits = model(
            **tok(
                ["the movie was wonderful and great", "the plot was awful and boring"],
                return_tensors="pt",
                padding=True,
            )
        ).logits
    assert logits.shape == (2, 2)
    labels = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert labels == ["positive", "negative"]


def test_early_stopping_stops_before_max_epochs_on_a_plateau(make_run_dir, run_here):
    # A learning rate this small leaves val_acc flat: patience 1 stops after the second epoch.
    run = make_run_dir(
        "plateau",
        train={"max_epochs": 6, "learning_rate": 1e-9, "warmup_ratio": 0.0},
        early_stopping={"monitor": "val_acc", "mode": "max", "patience": 1},
        checkpoint={"every_n_steps": 1000},
    )
    code, out = run_here(run)
    assert code == 0, out
    result = read_result(run)
    assert result["early_stopped"] is True
    assert result["epochs"] == 2, result  # epochs 0 and 1 ran; 2..5 did not
    assert result["steps"] == 2 * 40


def test_periodic_checkpoints_at_configured_steps_and_keep_prunes(make_run_dir, run_here):
    run = make_run_dir("periodic", train={"max_epochs": 1}, checkpoint={"every_n_steps": 7, "keep": 2})
    code, out = run_here(run)
    assert code == 0, out
    ckpts = {p.name for p in (run / "checkpoints").iterdir()}
    # every 7 steps over 40: 7, 14, ..., 35, plus the final step 40; keep 2 periodic + best.
    assert ckpts == {"step-00000035.ckpt", "step-00000040.ckpt", "best.ckpt"}, ckpts
    ckpt = load_checkpoint_file(run / "checkpoints" / "step-00000035.ckpt")
    assert ckpt["global_step"] == 35


def test_resume_continues_global_step_and_optimizer_state(make_run_dir, run_here):
    run = make_run_dir("resume", train={"max_epochs": 1}, checkpoint={"every_n_steps": 10, "keep": 5})
    code, out = run_here(run)
    assert code == 0, out
    saved = load_checkpoint_file(run / "checkpoints" / "step-00000040.ckpt")
    # Pretend the first attempt died at step 20: only the checkpoints up to it survive.
    for path in list_checkpoints(run / "checkpoints"):
        if step_of(path) > 20:
            path.unlink()
    (run / "result.json").unlink()
    at20 = load_checkpoint_file(run / "checkpoints" / "step-00000020.ckpt")
    code, out = run_here(run, attempt=2, **{"ORCH_RESUME_FROM": str(run / "checkpoints" / "step-00000020.ckpt")})
    assert code == 0, out
    assert "resuming from step-00000020.ckpt" in out
    assert read_result(run)["steps"] == 40
    again = load_checkpoint_file(run / "checkpoints" / "step-00000040.ckpt")
    assert again["global_step"] == 40
    # Adam's step counter went on from 20, not from 0, and its moments match the straight run.
    state_at20 = at20["optimizer_states"][0]["state"]
    state = again["optimizer_states"][0]["state"]
    assert float(state_at20[0]["step"]) == 20 and float(state[0]["step"]) == 40
    for key in saved["state_dict"]:
        assert torch.equal(saved["state_dict"][key], again["state_dict"][key]), key


def test_accumulation_divides_the_optimizer_steps(make_run_dir, run_here):
    run = make_run_dir(
        "accum",
        train={"max_epochs": 1, "batch_size": 16, "accumulate_grad_batches": 4},
        checkpoint={"every_n_steps": 1000},
    )
    code, out = run_here(run)
    assert code == 0, out
    result = read_result(run)
    assert result["steps"] == 10  # 40 micro-batches / 4
    assert read_progress(run)["total_steps"] == 10


def test_bad_label_column_fails_with_one_clear_line(make_run_dir, run_here):
    run = make_run_dir("badcol", data={"label_field": "sentiment"})
    code, out = run_here(run)
    assert code == 78  # EX_CONFIG: a data error, the same on every attempt (never retried)
    last = out.strip().splitlines()[-1]
    assert last.startswith("orch: job failed:") and "no label column 'sentiment'" in last
    assert "no label column 'sentiment'" in json.loads((run / "job_error.json").read_text())["message"]


def test_val_check_interval_longer_than_an_epoch_counts_batches_across_epochs(make_run_dir, run_here):
    # 640 rows at batch 16 = 40 batches an epoch; validating every 50 batches with max_steps (the
    # sweeps guide's worked example) used to fail at the start: Lightning counted within an epoch.
    run = make_run_dir(
        "long-interval",
        train={"max_epochs": None, "max_steps": 100, "val_check_interval": 50},
        checkpoint={"every_n_steps": 50},
    )
    code, out = run_here(run)
    assert code == 0, out
    import csv

    with open(run / "metrics.csv") as fh:
        val_steps = sorted({int(row["step"]) for row in csv.DictReader(fh) if row.get("val_loss")})
    assert val_steps == [49, 99] or val_steps == [50, 100], val_steps
    assert read_result(run)["steps"] == 100
