"""The built-in fine-tune (a tiny BERT, on the CPU of a node with a fake GPU) through a real orch
daemon on a real Ray cluster: a worker lost outright (its raylet `kill -9`ed) at a random step ->
Ray ends the job FAILED -> orch reads a lost attempt (not charged: retries = 0 would fail the job)
-> the next attempt resumes on the other worker from the newest checkpoint and ends torch.equal to
an uninterrupted run. A preemption notice instead: Ray's stop is orch's "checkpoint now", 0 steps
lost, identical weights."""

from __future__ import annotations

import os
import random
import subprocess
import sys

from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w

from conftest import submit, wait_ray_state
from daemon_harness import OrchHome, wait_for
from orchestrator.contract import read_json
from orchestrator.model.states import AttemptOutcome, JobState
from orchestrator.spec.jobspec import JobSpec

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    folder = tmp_path_factory.mktemp("ray-bert")
    model = build_tiny_bert(
        folder / "model",
        [r["text"] for r in sentiment_rows(500, seed=1)],
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=300,
        max_positions=64,
    )
    train = write_jsonl(folder / "train.jsonl", sentiment_rows(640, seed=11))  # 40 steps an epoch
    return {"model": model, "train": train}


def spec_dict(bert: dict[str, Path], name: str) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": 1,
        "retries": 0,  # a lost machine must not be charged: a charged failure would end the job
        "model": {"name_or_path": str(bert["model"]), "num_labels": 2},
        "data": {"train": str(bert["train"]), "max_length": 32, "num_workers": 0},
        "train": {"max_epochs": 1, "batch_size": 16, "precision": "32", "learning_rate": 1e-3, "seed": 7},
        "checkpoint": {"every_n_steps": 5, "keep": 2},
        "env": {
            "OMP_NUM_THREADS": "1",
            # the workers' GPUs are Ray's fake ones: without this the runner refuses (exit 78)
            # to train a gpus = 1 job on the CPU
            "ORCH_GPUS_ON_CPU": "1",
            "ORCH_PROGRESS_EVERY_S": "0.3",
            "ORCH_FAULT_SLOW_STEP_S": "0.2",  # a window to act in (a sleep: the weights do not change)
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        },
    }


def submit_builtin(h: OrchHome, spec: dict[str, Any]) -> int:
    path = h.jobs_dir / f"{spec['name']}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return submit(h, path)


@pytest.fixture(scope="module")
def reference(bert, tmp_path_factory) -> Iterator[Any]:
    """The same job uninterrupted, outside Ray (a plain `python -m training.run`), computed beside
    the first test that needs it; `reference()` waits for it and returns its run folder."""
    folder = tmp_path_factory.mktemp("ray-reference") / "run"
    folder.mkdir()
    spec = spec_dict(bert, "reference")
    spec["env"].pop("ORCH_FAULT_SLOW_STEP_S")
    (folder / "job.toml").write_bytes(tomli_w.dumps(JobSpec.model_validate(spec).to_toml_dict()).encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_"))}
    env.update(spec["env"], ORCH_RUN_DIR=str(folder), ORCH_CKPT_DIR=str(folder / "checkpoints"))
    env.update(ORCH_JOB_ID="0", ORCH_ATTEMPT="1", PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.run", str(folder)],
        cwd=str(REPO),
        env=env,
        stdout=open(folder / "run.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def wait() -> Path:
        assert proc.wait(400) == 0, (folder / "run.log").read_text()[-2000:]
        return folder

    yield wait
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def assert_same_weights(a: Path, b: Path) -> None:
    import torch
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model" / "model.safetensors")), load_file(str(b / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def step(h: OrchHome, job: int) -> int:
    return int((read_json(h.run_dir(job) / "progress.json") or {}).get("step") or 0)


def test_a_worker_lost_at_a_random_step_resumes_on_the_other_to_identical_weights(ray_home, bert, reference):
    h = ray_home()
    h.start_daemon()
    job = submit_builtin(h, spec_dict(bert, "bert-node-loss"))
    ref = wait_ray_state(h, job, "RUNNING", timeout=120)
    at = random.Random().randint(8, 28)
    wait_for(lambda: step(h, job) >= at, 240, what=lambda: f"step {at} (at {step(h, job)}); {h.diagnostics(job)}")
    worker = wait_for(lambda: h.ray.node_of(ref["node_id"]), 10, what="the worker the job runs on")
    h.ray.lose_worker(worker)  # the next test that needs two workers starts it again
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=300)
    attempts = h.store.attempts(job)
    assert [a.outcome for a in attempts] == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED], attempts
    assert done.failures == 0  # not charged to retries
    assert attempts[1].resumed_from_step is not None and 5 <= attempts[1].resumed_from_step < 40, attempts
    second = read_json(h.run_dir(job) / "attempt-2.exit") or {}
    assert second.get("code") == 0 and h.exit_record(job, 1) is None  # the lost step wrote no exit
    assert_same_weights(h.run_dir(job), reference())
    print(f"lost at step >= {at}; resumed from {attempts[1].resumed_from_step}")


def test_a_preemption_notice_stops_through_ray_with_a_checkpoint_and_loses_no_step(ray_home, bert, reference):
    h = ray_home(daemon={"grace_seconds": 30}, workers=1)
    cfg = (h.root / "config.toml").read_text()
    (h.root / "config.toml").write_text(
        cfg + '\n[preemption]\nsources = ["file"]\npoll_seconds = 0.5\nfile = "preempt-notice"\n'
    )
    h.start_daemon()
    job = submit_builtin(h, spec_dict(bert, "bert-notice"))
    at = random.Random().randint(8, 28)
    wait_for(lambda: step(h, job) >= at, 240, what=lambda: f"step {at} (at {step(h, job)}); {h.diagnostics(job)}")
    notice = h.root / "preempt-notice"
    notice.touch()
    wait_for(lambda: h.exit_record(job, 1) is not None, 120, what=lambda: h.diagnostics(job))
    assert h.exit_record(job, 1)["code"] == 75, h.exit_record(job, 1)
    assert "SIGTERM: saved" in (h.run_dir(job) / "attempt-1.log").read_text()
    wait_for(lambda: h.state(job) is JobState.QUEUED, 30, what="the job queued to resume")
    notice.unlink()
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=300)
    attempts = h.store.attempts(job)
    assert [a.outcome for a in attempts][-1] is AttemptOutcome.SUCCEEDED and len(attempts) == 2, attempts
    assert done.steps_lost == 0 and done.failures == 0, (done.steps_lost, done.failures)
    assert_same_weights(h.run_dir(job), reference())
