"""Losing the machine, end to end, with the built-in runner (a tiny BERT, shuffle and dropout on)
under a real daemon mirroring to the loopback S3 server: every orch process is SIGKILLed and the
whole ORCH_HOME deleted; a fresh home runs `orch adopt URL --all` and a daemon; the job must end
with weights torch.equal to an uninterrupted run's."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from daemon_harness import OrchHome, wait_for
from mirror_harness import manifest, remote_for, storage_home, wait_manifest
from tiny_bert import TOTAL_STEPS, assert_same, lose_the_machine, progress_step, submit, wait_succeeded, weights

from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


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
