"""The built-in fine-tune (a tiny BERT, CPU) through a real orch daemon on a real private Slurm:
Slurm-native preemption at a random step -> notice checkpoint, exit 75 -> orch submits the next
attempt -> it resumes -> the final weights are torch.equal to an uninterrupted run, 0 steps lost.
The walltime warning (`--signal=TERM@warn_before`) and a two-node DDP job (gloo, one rank per
node) end the same way."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from conftest import orch_cli, slurm_id
from daemon_harness import OrchHome, wait_for
from orchestrator.contract import read_json
from orchestrator.spec.jobspec import JobSpec
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bert(tmp_path_factory) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    folder = tmp_path_factory.mktemp("slurm-bert")
    os.chmod(folder, 0o755)
    model = build_tiny_bert(
        folder / "model",
        [r["text"] for r in sentiment_rows(500, seed=1)],
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=300,
        max_positions=64,
    )
    train = write_jsonl(folder / "train.jsonl", sentiment_rows(1600, seed=11))  # 100 steps an epoch
    return {"model": model, "train": train, "root": folder}


def spec_dict(bert: dict[str, Path], name: str, **over: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "gpus": 0,
        "retries": 0,
        "model": {"name_or_path": str(bert["model"]), "num_labels": 2},
        "data": {"train": str(bert["train"]), "max_length": 32, "num_workers": 0},
        "train": {"max_epochs": 2, "batch_size": 16, "precision": "32", "learning_rate": 1e-3, "seed": 7},
        "checkpoint": {"every_n_steps": 10, "keep": 2},
        "env": {
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.3",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "MASTER_ADDR": "127.0.0.1",
        },
    }
    spec.update(over)
    return spec


def submit_builtin(h: OrchHome, spec: dict[str, Any]) -> int:
    path = h.jobs_dir / f"{spec['name']}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=64)
    poke(h.home.wake_socket)
    return job.id


def reference_run(folder: Path, spec: dict[str, Any]) -> subprocess.Popen:
    """The same job, uninterrupted, outside Slurm (a plain `python -m training.run`)."""
    folder.mkdir(parents=True)
    clean = JobSpec.model_validate(spec).to_toml_dict()
    (folder / "job.toml").write_bytes(tomli_w.dumps(clean).encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ORCH_"))}
    env.update(
        spec["env"],
        ORCH_RUN_DIR=str(folder),
        ORCH_CKPT_DIR=str(folder / "checkpoints"),
        ORCH_JOB_ID="0",
        ORCH_ATTEMPT="1",
        PYTHONPATH=str(REPO),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "training.run", str(folder)],
        cwd=str(REPO),
        env=env,
        stdout=open(folder / "run.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture(scope="session")
def single_reference(bert, tmp_path_factory):
    """The single-node job's uninterrupted weights, computed once (outside Slurm) beside the first
    test that needs them; `single_reference()` waits for it and returns its run folder."""
    folder = tmp_path_factory.mktemp("reference") / "run"
    proc = reference_run(folder, spec_dict(bert, "reference"))

    def wait() -> Path:
        assert proc.wait(300) == 0, (folder / "run.log").read_text()[-2000:]
        return folder

    yield wait
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    import torch

    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def progress_step(h: OrchHome, job: int) -> int:
    p = read_json(h.run_dir(job) / "progress.json") or {}
    return int(p.get("step") or 0)


def test_builtin_job_preempted_by_slurm_resumes_to_identical_weights(slurm_home, bert, single_reference):
    h = slurm_home()
    h.start_daemon()
    spec = spec_dict(bert, "bert-preempt")
    spec["env"]["ORCH_FAULT_SLOW_STEP_S"] = "0.02"  # a margin for Slurm's scheduling of the preemptor
    job = submit_builtin(h, spec)
    sid = slurm_id(h, job)
    at = random.Random().randint(5, 100)
    wait_for(lambda: progress_step(h, job) >= at, 120, what=f"step {at}")
    node = (h.job(job).executor_ref.get("nodes") or ["n1"])[0]
    # a job in the high partition wants exactly that node: Slurm preempts ours (GraceTime 15 s)
    high = h.slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-w", node, "--wrap", "sleep 1"
    ).stdout.strip()
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=240)
    attempts = h.store.attempts(job)
    assert len(attempts) == 2, [(a.n, a.exit_code, a.outcome) for a in attempts]
    first = h.exit_record(job, 1)
    assert first["code"] == 75 and first["slurm_job_id"] == sid, first
    assert attempts[1].resumed_from_step is not None and attempts[1].resumed_from_step >= at
    assert done.steps_lost == 0, done.steps_lost
    notices = [p.name for p in (h.run_dir(job) / "checkpoints").glob("notice-step-*.ckpt")]
    log1 = (h.run_dir(job) / "attempt-1.log").read_text()
    assert "SIGTERM: saved" in log1, log1[-3000:]
    assert h.exit_record(job, 2)["slurm_job_id"] != sid  # the next attempt is a new submission
    assert h.slurm.run("squeue", "-h", "-t", "all", "-j", high, "-o", "%T").stdout.strip() == "COMPLETED"
    assert_same_weights(h.run_dir(job), single_reference())
    data = json.loads(orch_cli(h, "show", str(job), "--json").stdout)
    assert data["state"] == "succeeded" and data["steps_lost"] == 0 and data["result"]["steps"] == 200, data["result"]
    print(f"preempted at step >= {at}; resumed from {attempts[1].resumed_from_step}; notices {notices}")


def test_two_node_ddp_job_preempted_resumes_to_the_uninterrupted_two_node_weights(slurm_home, bert):
    """nodes = 2, gpus = 0: one gloo rank per node (n1, n2) under srun. The uninterrupted
    reference is the same job through orch and Slurm, run first (higher priority)."""
    h = slurm_home()
    h.start_daemon()
    ref = submit_builtin(h, spec_dict(bert, "ddp-reference", nodes=2, priority=10))
    spec = spec_dict(bert, "ddp-preempt", nodes=2)
    # A sleep per step (weights unchanged): on a quiet machine 100 steps take ~10 s, less than
    # Slurm needs to schedule the preemptor and signal; this keeps training going for ~30 s.
    spec["env"]["ORCH_FAULT_SLOW_STEP_S"] = "0.3"
    job = submit_builtin(h, spec)
    h.wait_state(ref, JobState.SUCCEEDED, timeout=180)
    sid = slurm_id(h, job)
    at = random.Random().randint(5, 40)
    wait_for(lambda: progress_step(h, job) >= at, 180, what=f"step {at}")
    assert sorted(h.job(job).executor_ref.get("nodes") or []) == ["n1", "n2"], h.job(job).executor_ref
    h.slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-N2", "--wrap", "sleep 1")
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=240)
    attempts = h.store.attempts(job)
    assert len(attempts) == 2, [(a.n, a.exit_code, a.outcome) for a in attempts]
    assert h.exit_record(job, 1)["code"] == 75 and h.exit_record(job, 1)["slurm_job_id"] == sid
    assert attempts[1].resumed_from_step is not None and attempts[1].resumed_from_step >= at
    assert done.steps_lost == 0
    run = h.run_dir(job)
    assert (run / "attempt-1.rank-1.log").exists() and (run / "attempt-2.rank-1.log").exists()
    assert "SIGTERM: saved" in (run / "attempt-1.log").read_text()
    assert_same_weights(run, h.run_dir(ref))
    result = read_json(run / "result.json")
    assert result["steps"] == 100, result


def test_walltime_warning_checkpoints_and_the_next_submission_finishes(slurm_home, bert, single_reference):
    """job.toml [slurm] time = "1" (minute), [slurm] warn_before = 30: Slurm sends the tasks SIGTERM
    before the walltime (`--signal=TERM@30`), the job saves and exits 75, orch submits the next
    attempt with a fresh walltime; no attempt reaches TIMEOUT, and the weights are exact."""
    h = slurm_home(warn_before=30)
    h.start_daemon()
    spec = spec_dict(bert, "bert-walltime", slurm={"time": "1"})
    # 200 steps x 0.3 s: a minute of training, longer than one walltime however fast the machine
    # (Slurm checks the warning about every 30 s), so at least one attempt is warned.
    spec["env"]["ORCH_FAULT_SLOW_STEP_S"] = "0.3"
    job = submit_builtin(h, spec)
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=400)
    attempts = h.store.attempts(job)
    codes = [h.exit_record(job, a.n)["code"] for a in attempts]
    assert len(attempts) >= 2 and codes[-1] == 0 and all(c == 75 for c in codes[:-1]), codes
    sbatch = (h.run_dir(job) / "attempt-1.sbatch").read_text()
    assert "--time=1" in sbatch and "--signal=TERM@30" in sbatch
    logs = "".join((h.run_dir(job) / f"attempt-{a.n}.log").read_text() for a in attempts)
    assert "SIGTERM: saved" in logs
    sids = [h.exit_record(job, a.n)["slurm_job_id"] for a in attempts]
    states = h.slurm.run("squeue", "-h", "-t", "all", "-j", ",".join(sids), "-o", "%T").stdout.split()
    assert "TIMEOUT" not in states, states
    assert done.steps_lost == 0
    assert_same_weights(h.run_dir(job), single_reference())
    print(f"walltime: {len(attempts)} attempts, resumed from {[a.resumed_from_step for a in attempts]}")
