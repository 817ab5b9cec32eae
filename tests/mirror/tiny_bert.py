"""The tiny-BERT job the lost-machine tests train (shuffle and dropout on, a checkpoint every 10 of
its 40 steps, slowed so a test can act mid-run), and its uninterrupted reference run (made once per
session in conftest.py: the lost-instance and the recovery tests compare against the same weights)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import tomli_w
from daemon_harness import OrchHome, kill_leftover_attempts, wait_for

from orchestrator.contract import read_json
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

ROWS, BATCH, EPOCHS = 320, 16, 2
TOTAL_STEPS = ROWS // BATCH * EPOCHS  # 40
EVERY = 10
SLOW_STEP_S = 0.1


def make_workload(root: Path) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    texts = [r["text"] for r in sentiment_rows(1000, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11))
    return {"model": model, "train": train, "hf_cache": root / "hf-cache"}


def submit(h: OrchHome, workload: dict[str, Path], name: str, tracking: Any = None) -> int:
    path = h.jobs_dir / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(job_spec(workload, name, tracking=tracking)).encode())
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


def job_spec(
    workload: dict[str, Path], name: str, *, tracking: Any = None, slow_step_s: float = SLOW_STEP_S
) -> dict[str, Any]:
    """The job file's contents (`slow_step_s`: how long each step sleeps, so a test can act mid-run)."""
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "retries": 2,
        "grace_seconds": 30,
        "model": {"name_or_path": str(workload["model"]), "num_labels": 2},
        "data": {"train": str(workload["train"]), "max_length": 32, "num_workers": 0, "shuffle": True},
        "train": {"max_epochs": EPOCHS, "batch_size": BATCH, "precision": "32", "learning_rate": 1e-3, "seed": 7},
        "checkpoint": {"every_n_steps": EVERY, "keep": 2},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(workload["hf_cache"]),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.3",
            "ORCH_FAULT_SLOW_STEP_S": str(slow_step_s),
        },
    }
    if tracking:
        spec["tracking"] = tracking
    return spec


def progress_step(h: OrchHome, job_id: int) -> int:
    return (read_json(h.run_dir(job_id) / "progress.json") or {}).get("step") or 0


def wait_succeeded(h: OrchHome, job_id: int, timeout: float = 150) -> None:
    def done() -> bool:
        state = h.state(job_id)
        if state in (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED):
            raise AssertionError(f"job {job_id} ended {state.value}: {h.job(job_id).reason}\n{h.log_tail()}")
        return state is JobState.SUCCEEDED

    wait_for(done, timeout, interval=0.2, what=f"job {job_id} to succeed ({h.log_tail()})")


def weights(run_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(run_dir / "model"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(expected: dict[str, Any], got: dict[str, Any]) -> None:
    import torch

    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"{len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"


def run_uninterrupted(workload: dict[str, Path], folder: Path) -> dict[str, Any]:
    folder.mkdir()
    h = OrchHome(folder, cpu_slots=1, grace_seconds=30)
    try:
        h.start_daemon()
        job_id = submit(h, workload, "a")
        wait_succeeded(h, job_id)
        return {"weights": weights(h.run_dir(job_id))}
    finally:
        h.cleanup()


def lose_the_machine(h: OrchHome) -> None:
    """SIGKILL every orch process of the home, then delete the whole ORCH_HOME."""
    for proc in h.daemons:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    kill_leftover_attempts(h.home)
    h.store.close()
    shutil.rmtree(h.root)
