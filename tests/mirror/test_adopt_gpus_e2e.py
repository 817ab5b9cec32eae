"""A 2-rank DDP job (a tiny BERT, two GPU slots rehearsed on this CPU machine) stopped on one
machine, its notice checkpoint mirrored to a file:// bucket, adopted on a 1-GPU machine with
`orch adopt --gpus 1`: the runner there reshards the checkpoint onto one rank with the accumulation
doubled, and the job finishes the same number of optimizer steps."""

from __future__ import annotations

import json
import time

import pytest
import tomli_w
from daemon_harness import wait_for
from mirror_harness import remote_for, storage_home, wait_manifest
from tiny_bert import job_spec, progress_step, wait_succeeded

from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow

STEPS = 20  # 320 rows / (16 x 2 ranks) = 10 optimizer steps an epoch, 2 epochs


def test_a_two_rank_checkpoint_adopted_with_gpus_1_finishes_on_one_rank(workload, homes, tmp_path):
    url = f"file://{tmp_path}/mirror"
    a = storage_home(tmp_path / "a", url, gpus=[0, 1])
    homes.append(a)
    a.start_daemon()
    spec = dict(job_spec(workload, "ddp2", slow_step_s=0.2), gpus=2)
    path = a.jobs_dir / "ddp2.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job_id = submit_job(a.store, a.config, a.home, path, now=time.time(), machine_gpus=2).id
    poke(a.home.wake_socket)
    uid = a.job(job_id).uid
    wait_for(lambda: progress_step(a, job_id) >= 3, 240, interval=0.1, what="step 3 on two ranks")
    a.cli("daemon", "stop")  # the job checkpoints (a notice checkpoint, sharded by nothing: DDP) and requeues
    for proc in a.daemons:
        proc.wait(60)
    m = wait_manifest(
        remote_for(a),
        uid,
        lambda m: m["owner"]["released"] and m["checkpoints"] and m["checkpoints"][0]["notice"],
        timeout=60,
        what="the notice checkpoint mirrored and the lease released",
    )
    notice_step = m["checkpoints"][0]["step"]
    assert 3 <= notice_step < STEPS

    b = storage_home(tmp_path / "b", url, gpus=[0])
    homes.append(b)
    ran = b.cli("adopt", "--yes", url, "--job", uid, "--gpus", "1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "on 1 GPU(s) (was 2)" in ran.stdout and f"resuming from step {notice_step}" in ran.stdout
    job = b.store.by_uid(uid)
    assert job is not None and job.state is JobState.QUEUED and job.gpus == 1
    b.start_daemon()
    wait_succeeded(b, job.id, timeout=300)
    log = (b.run_dir(job.id) / f"attempt-{job.attempt + 1}.log").read_text()
    assert "was written by 2 rank(s): resuming on 1 with batch 16 x accumulate 2" in log, log[-3000:]
    shown = json.loads(b.cli("show", str(job.id), "--json").stdout)
    assert shown["attempts"][-1]["resumed_from_step"] == notice_step
    result = json.loads((b.run_dir(job.id) / "result.json").read_text())
    assert result["steps"] == STEPS
