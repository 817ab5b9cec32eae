"""Preemption end to end with the built-in runner: a real daemon, a real tiny-BERT fine-tune
(shuffle on, dropout on), and three ways to lose the machine — the daemon's sentinel-file notice,
`orch daemon stop` + `orch daemon start`, and a SIGKILL of the job's process group. Each
interrupted run must end with exactly the weights of an uninterrupted one, and with its metrics.csv
row for row (the job validates after every step, so whatever step a notice lands on has a
validation due, and the SIGKILLed run resumes from a checkpoint taken just before one); `orch show
--json` must say how each attempt ended, where it got to, where the next resumed, and the steps lost."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from daemon_harness import OrchHome, wait_for
from metrics_rows import assert_same_metrics, metric_rows, validation_rows

from orchestrator.spec.config import load_config
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.contract import read_json
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow

ROWS, BATCH, EPOCHS = 320, 16, 2
STEPS_PER_EPOCH = ROWS // BATCH  # 20
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS  # 40
EVERY = 25  # periodic checkpoints at 25 (mid-epoch 2) and the final one at 40
NOTICE_AFTER = 3  # raise the notice once progress.json shows this step: far from 20 and 25
SLOW_STEP_S = 0.1  # per-step sleep in the runner (ORCH_FAULT_SLOW_STEP_S): the window to act in
# progress.json lags the real step by up to this (several steps): the step an attempt ended at must
# come from its notice checkpoint, not from a stale heartbeat.
PROGRESS_EVERY_S = 0.3


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> dict[str, Path]:
    """A tiny BERT (hidden 32, 2 layers; BertConfig's default dropout 0.1) and its data."""
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    root = tmp_path_factory.mktemp("workload")
    texts = [r["text"] for r in sentiment_rows(1000, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11))
    dev = write_jsonl(root / "dev.jsonl", sentiment_rows(16, seed=12))  # one batch: a cheap validation per step
    return {"model": model, "train": train, "dev": dev, "hf_cache": root / "hf-cache", "root": root}


def job_toml(workload: dict[str, Path], folder: Path, name: str, workers: int = 0) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "retries": 2,
        "grace_seconds": 30,
        "model": {"name_or_path": str(workload["model"]), "num_labels": 2},
        "data": {
            "train": str(workload["train"]),
            "validation": str(workload["dev"]),
            "max_length": 32,
            "num_workers": workers,
            "shuffle": True,
        },
        "train": {
            "max_epochs": EPOCHS,
            "batch_size": BATCH,
            "precision": "32",
            "learning_rate": 1e-3,
            "seed": 7,
            "val_check_interval": 1,
        },
        "checkpoint": {"every_n_steps": EVERY, "keep": 2},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(workload["hf_cache"]),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": str(PROGRESS_EVERY_S),
            "ORCH_FAULT_SLOW_STEP_S": str(SLOW_STEP_S),
        },
    }
    path = folder / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return path


def make_home(folder: Path, **preemption: Any) -> OrchHome:
    folder.mkdir(parents=True)
    h = OrchHome(folder, cpu_slots=1, grace_seconds=30)
    if preemption:
        config = h.root / "config.toml"
        lines = ["", "[preemption]"] + [f"{k} = {json.dumps(v)}" for k, v in preemption.items()]
        config.write_text(config.read_text() + "\n".join(lines) + "\n")
        h.config = load_config(config, required=True)
    return h


def submit_builtin(h: OrchHome, workload: dict[str, Path], name: str, workers: int = 0) -> int:
    path = job_toml(workload, h.jobs_dir, name, workers)
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


def progress_step(h: OrchHome, job_id: int) -> int:
    return (read_json(h.run_dir(job_id) / "progress.json") or {}).get("step") or 0


def notice_checkpoint_step(h: OrchHome, job_id: int) -> int:
    notices = sorted((h.run_dir(job_id) / "checkpoints").glob("notice-step-*.ckpt"))
    assert len(notices) == 1, notices
    return int(notices[0].stem.rsplit("-", 1)[1])


def show(h: OrchHome, job_id: int) -> dict[str, Any]:
    out = h.cli("show", str(job_id), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def exported_weights(run_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(run_dir / "model"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(expected: dict[str, Any], got: dict[str, Any]) -> None:
    import torch

    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"{len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"


def attempt_log(h: OrchHome, job_id: int, n: int) -> str:
    try:
        return (h.run_dir(job_id) / f"attempt-{n}.log").read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def wait_succeeded(h: OrchHome, job_id: int, timeout: float = 120) -> None:
    def done() -> bool:
        state = h.state(job_id)
        if state in (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED):
            job = h.job(job_id)
            raise AssertionError(
                f"job {job_id} ended {state.value}: {job.reason}\n{attempt_log(h, job_id, job.attempt)}\n{h.log_tail()}"
            )
        return state is JobState.SUCCEEDED

    wait_for(done, timeout, interval=0.2, what=f"job {job_id} to succeed (daemon log: {h.log_tail()})")


@pytest.fixture
def homes(tmp_path: Path) -> Iterator[list[OrchHome]]:
    made: list[OrchHome] = []
    yield made
    for h in made:
        h.cleanup()


@pytest.fixture(scope="module")
def uninterrupted(workload, tmp_path_factory) -> dict[str, Any]:
    """Run A: the same job under a daemon with nothing in its way."""
    h = make_home(tmp_path_factory.mktemp("run-a") / "a")
    try:
        h.start_daemon()
        job_id = submit_builtin(h, workload, "a")
        wait_succeeded(h, job_id)
        data = show(h, job_id)
        assert [a["outcome"] for a in data["attempts"]] == ["succeeded"], data["attempts"]
        assert data["result"]["steps"] == TOTAL_STEPS
        metrics = h.root / "a-metrics"
        metrics.mkdir()
        (metrics / "metrics.csv").write_bytes((h.run_dir(job_id) / "metrics.csv").read_bytes())
        assert len(validation_rows(metric_rows(metrics))) == TOTAL_STEPS
        return {"weights": exported_weights(h.run_dir(job_id)), "show": data, "metrics": metrics}
    finally:
        h.cleanup()


def test_file_notice_mid_epoch_resumes_to_identical_weights_with_no_steps_lost(
    workload, uninterrupted, homes, tmp_path
):
    h = make_home(tmp_path / "b", sources=["file"], poll_seconds=0.2, on_notice="wait")
    homes.append(h)
    sentinel = h.root / "preempt-notice"
    h.start_daemon()
    job_id = submit_builtin(h, workload, "b")

    wait_for(lambda: progress_step(h, job_id) >= NOTICE_AFTER, 90, interval=0.02, what="step 3 of attempt 1")
    sentinel.touch()
    wait_for(
        lambda: h.state(job_id) is JobState.QUEUED,
        40,
        interval=0.05,
        what=f"the notice to requeue the job: {attempt_log(h, job_id, 1)}",
    )
    # While the notice stands the daemon starts nothing: the job waits in the queue.
    h.wait_ticks(3)
    job = h.job(job_id)
    assert job.state is JobState.QUEUED and job.attempt == 1, (job.state, job.attempt)
    sentinel.unlink()
    wait_succeeded(h, job_id)

    data = show(h, job_id)
    first, second = data["attempts"]
    notice_step = notice_checkpoint_step(h, job_id)
    assert first["outcome"] == "preempted" and first["exit_code"] == 75, first
    assert first["step_reached"] == notice_step, data["attempts"]
    assert notice_step % EVERY and notice_step % STEPS_PER_EPOCH, f"notice at step {notice_step}: not mid-epoch"
    assert second["resumed_from_step"] == notice_step, data["attempts"]
    assert second["outcome"] == "succeeded"
    assert data["steps_lost"] == 0 and data["waste_s"] == 0
    kinds = [e["kind"] for e in data["events"]]
    assert "preempted" in kinds and "resumed" in kinds
    resumed = next(e for e in data["events"] if e["kind"] == "resumed")
    assert f"notice-step-{notice_step:08d}.ckpt" in resumed["detail"]
    assert data["result"]["steps"] == TOTAL_STEPS
    assert_same_weights(uninterrupted["weights"], exported_weights(h.run_dir(job_id)))
    assert_same_metrics(uninterrupted["metrics"], h.run_dir(job_id))


def test_daemon_stop_and_start_resumes_to_identical_weights_with_no_steps_lost(
    workload, uninterrupted, homes, tmp_path
):
    h = make_home(tmp_path / "b")
    homes.append(h)
    started = h.cli("daemon", "start")
    assert started.returncode == 0, started.stderr
    # Two DataLoader workers (the default on a real machine): they get the group's SIGTERM too, and
    # must neither fail the save nor keep a finished attempt alive.
    job_id = submit_builtin(h, workload, "b", workers=2)

    wait_for(lambda: progress_step(h, job_id) >= NOTICE_AFTER, 90, interval=0.02, what="step 3 of attempt 1")
    stopped = h.cli("daemon", "stop", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    job = h.job(job_id)
    assert job.state is JobState.QUEUED and job.failures == 0, (job.state, job.reason)
    assert h.cli("daemon", "start").returncode == 0
    wait_succeeded(h, job_id)

    data = show(h, job_id)
    first, second = data["attempts"]
    assert first["outcome"] == "preempted" and first["exit_code"] == 75, first
    notice_step = notice_checkpoint_step(h, job_id)
    assert first["step_reached"] == notice_step, data["attempts"]
    assert notice_step % EVERY and notice_step % STEPS_PER_EPOCH, f"notice at step {notice_step}: not mid-epoch"
    assert second["resumed_from_step"] == notice_step
    assert data["steps_lost"] == 0
    assert_same_weights(uninterrupted["weights"], exported_weights(h.run_dir(job_id)))
    assert_same_metrics(uninterrupted["metrics"], h.run_dir(job_id))


def test_sigkill_of_the_job_resumes_from_the_last_periodic_checkpoint_and_reports_lost_steps(
    workload, uninterrupted, homes, tmp_path
):
    h = make_home(tmp_path / "b")
    homes.append(h)
    h.start_daemon()
    job_id = submit_builtin(h, workload, "b")
    periodic = h.run_dir(job_id) / "checkpoints" / f"step-{EVERY:08d}.ckpt"

    wait_for(
        lambda: periodic.exists() and progress_step(h, job_id) >= EVERY + 3,
        90,
        interval=0.02,
        what=f"{periodic.name} and step {EVERY + 3}",
    )
    pids = h.attempt_pids(job_id, 1)
    os.killpg(pids["job_pid"], signal.SIGKILL)  # no chance to save
    wait_succeeded(h, job_id)

    data = show(h, job_id)
    first, second = data["attempts"]
    assert first["signal"] == signal.SIGKILL and first["outcome"] == "failed", first
    assert first["step_reached"] >= EVERY + 3
    assert second["resumed_from_step"] == EVERY
    assert data["steps_lost"] == first["step_reached"] - EVERY > 0
    assert data["waste_s"] > 0
    assert not any(p.name.startswith("notice-") for p in (h.run_dir(job_id) / "checkpoints").iterdir())
    assert_same_weights(uninterrupted["weights"], exported_weights(h.run_dir(job_id)))
    # step-25 was taken just before step 24's validation: the resume ran it again, from that state,
    # in place of the row attempt 1 wrote after the save
    assert_same_metrics(uninterrupted["metrics"], h.run_dir(job_id))
