"""Losing the machine, end to end, with the built-in runner (a tiny BERT, shuffle and dropout on)
under a real daemon mirroring to the loopback S3 server: every orch process is SIGKILLed and the
whole ORCH_HOME deleted; a fresh home runs `orch adopt URL --all` and a daemon; the job must end
with weights torch.equal to an uninterrupted run's."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from daemon_harness import OrchHome, kill_leftover_attempts, wait_for
from mirror_harness import manifest, remote_for, storage_home, wait_manifest

from orchestrator.contract import read_json
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow

ROWS, BATCH, EPOCHS = 320, 16, 2
TOTAL_STEPS = ROWS // BATCH * EPOCHS  # 40
EVERY = 10
SLOW_STEP_S = 0.1


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    root = tmp_path_factory.mktemp("workload")
    texts = [r["text"] for r in sentiment_rows(1000, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11))
    return {"model": model, "train": train, "hf_cache": root / "hf-cache"}


def submit(h: OrchHome, workload: dict[str, Path], name: str, tracking: Any = None) -> int:
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
            "ORCH_FAULT_SLOW_STEP_S": str(SLOW_STEP_S),
        },
    }
    if tracking:
        spec["tracking"] = tracking
    path = h.jobs_dir / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


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


@pytest.fixture(scope="module")
def uninterrupted(workload, tmp_path_factory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("run-a") / "a"
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


def adopt_and_finish(tmp_path: Path, url: str, endpoint: str, homes: list, uid: str) -> tuple[OrchHome, int, dict]:
    b = storage_home(tmp_path / "b", url, endpoint)
    homes.append(b)
    started = time.monotonic()
    ran = wait_for(
        lambda: (lambda r: r if r.returncode == 0 else None)(b.cli("adopt", "--yes", url, "--all")),
        40,
        interval=0.5,
        what="adoption once the lost machine's lease is stale",
    )
    assert "sha256 verified" in ran.stdout, ran
    job = b.store.by_uid(uid)
    assert job is not None and job.state is JobState.QUEUED
    b.start_daemon()
    wait_succeeded(b, job.id)
    data = json.loads(b.cli("show", str(job.id), "--json").stdout)
    data["adopt_to_success_s"] = time.monotonic() - started
    return b, job.id, data


def test_lost_instance_after_a_notice_resumes_elsewhere_with_identical_weights_and_no_steps_lost(
    workload, uninterrupted, s3_server, s3_env, homes, tmp_path
):
    url, endpoint = f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    a = storage_home(tmp_path / "a", url, endpoint, keep=2)
    cfg = a.root / "config.toml"
    cfg.write_text(cfg.read_text() + '\n[preemption]\nsources = ["file"]\npoll_seconds = 0.2\n')
    from orchestrator.spec.config import load_config

    a.config = load_config(cfg, required=True)
    homes.append(a)
    a.start_daemon()
    mlruns = (tmp_path / "lab-mlflow").as_uri()  # a tracking server both machines reach
    job_id = submit(a, workload, "lost", tracking={"backends": ["mlflow"], "mlflow_uri": mlruns})
    uid = a.job(job_id).uid
    notice_at = random.Random().randint(3, 33)
    wait_for(lambda: progress_step(a, job_id) >= notice_at, 120, interval=0.02, what=f"step {notice_at}")
    (a.root / "preempt-notice").touch()
    remote = remote_for(a)
    m = wait_manifest(
        remote,
        uid,
        lambda m: m["checkpoints"] and m["checkpoints"][0]["notice"] and m["state"] == "queued",
        timeout=60,
        what="the notice checkpoint mirrored",
    )
    notice_step = m["checkpoints"][0]["step"]
    lose_the_machine(a)
    homes.remove(a)

    b, new_id, data = adopt_and_finish(tmp_path, url, endpoint, homes, uid)
    first, second = data["attempts"]
    assert first["outcome"] == "preempted" and first["step_reached"] == notice_step, data["attempts"]
    assert second["resumed_from_step"] == notice_step and second["outcome"] == "succeeded"
    assert data["steps_lost"] == 0
    assert "adopted" in [e["kind"] for e in data["events"]]
    assert_same(uninterrupted["weights"], weights(b.run_dir(new_id)))
    final = wait_manifest(remote, uid, lambda m: m["state"] == "succeeded", what="the final manifest")
    assert final["result"]["steps"] == TOTAL_STEPS and final["model"]
    # the adopted job continued the job's one MLflow run
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(mlruns)
    runs = client.search_runs([client.get_experiment_by_name("lost").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", runs
    assert runs[0].data.tags["orch.job_uid"] == uid
    assert runs[0].data.tags["orch.resume.attempt-2"].startswith(f"resumed at step {notice_step} from notice-step-")
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train_loss")]
    assert steps == sorted(set(steps)) and steps[-1] == TOTAL_STEPS - 1
    noted = json.loads((b.run_dir(new_id) / "tracking.json").read_text())
    assert noted["uid"] == uid and noted["backends"]["mlflow"]["run_id"] == runs[0].info.run_id


def test_lost_instance_without_a_notice_resumes_from_the_newest_mirrored_checkpoint_and_reports_lost_steps(
    workload, uninterrupted, s3_server, s3_env, homes, tmp_path
):
    url, endpoint = f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    a = storage_home(tmp_path / "a", url, endpoint, keep=2)
    homes.append(a)
    a.start_daemon()
    job_id = submit(a, workload, "killed")
    uid = a.job(job_id).uid
    remote = remote_for(a)
    wait_manifest(remote, uid, lambda m: m["checkpoints"], timeout=120, what="a first mirrored checkpoint")
    time.sleep(random.Random().uniform(0, 1.5))  # a random moment
    lose_the_machine(a)
    homes.remove(a)
    mirrored = manifest(remote, uid)["checkpoints"][0]["step"]

    b, new_id, data = adopt_and_finish(tmp_path, url, endpoint, homes, uid)
    first, second = data["attempts"]
    assert first["outcome"] == "lost" and first["step_reached"] >= mirrored, data["attempts"]
    assert second["resumed_from_step"] == mirrored
    assert data["steps_lost"] == first["step_reached"] - mirrored
    assert_same(uninterrupted["weights"], weights(b.run_dir(new_id)))
