"""Out of memory under the daemon: exit 76 runs the job again at once in a fresh process with half
the micro-batch and twice the accumulation, not charged to retries, each halving an `oom` event;
and an OOM that the exit code hides (DDP: Lightning kills rank 0 with SIGKILL) is recognised
from the runner's batch.json."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from orchestrator.host.gpus import managed_gpus
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke
from daemon_harness import orch_home  # noqa: F401  (fixture)
from training.toy import build_tiny_bert, sentiment_rows, write_jsonl


def _submit(h, path: Path) -> int:
    job = submit_job(
        h.store, h.config, h.home, path, now=time.time(), machine_gpus=len(managed_gpus(h.config.daemon.gpus))
    )
    poke(h.home.wake_socket)
    return job.id


@pytest.mark.slow
def test_builtin_job_out_of_memory_goes_on_with_half_the_batch_uncharged(orch_home, tmp_path):
    h = orch_home()
    rows = sentiment_rows(400, seed=5)
    write_jsonl(tmp_path / "train.jsonl", rows[:320])
    write_jsonl(tmp_path / "dev.jsonl", rows[320:])
    build_tiny_bert(
        tmp_path / "bert", [r["text"] for r in rows], hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64
    )
    job_toml = tmp_path / "oom.toml"
    job_toml.write_text(f"""
name = "oom"
gpus = 0
retries = 0
[model]
name_or_path = "{tmp_path / "bert"}"
[data]
train = "{tmp_path / "train.jsonl"}"
validation = "{tmp_path / "dev.jsonl"}"
max_length = 32
num_workers = 0
[train]
max_epochs = 2
batch_size = 16
precision = "32"
learning_rate = 1e-3
[checkpoint]
every_n_steps = 10
keep = 2
[env]
ORCH_FAULT_OOM_ABOVE_BATCH = "8"
ORCH_FAULT_OOM_AT_STEP = "15"
""")
    h.start_daemon()
    job_id = _submit(h, job_toml)
    job = h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    assert job.state is JobState.SUCCEEDED, h.log_tail(40)
    assert job.failures == 0  # an OOM is not a retry, and retries = 0 here
    attempts = h.store.attempts(job_id)
    assert [a.outcome for a in attempts] == ["oom", "succeeded"]
    assert attempts[0].exit_code == 76
    assert attempts[1].resumed_from_step == 10  # the last periodic checkpoint, not one taken at the OOM
    oom = [e for e in h.store.events(job_id) if e.kind == "oom"]
    assert len(oom) == 1 and "batch 16 -> 8" in oom[0].detail and "accumulation 1 -> 2" in oom[0].detail
    result = json.loads((h.run_dir(job_id) / "result.json").read_text())
    assert result["batch_size"] == 8 and result["accumulate_grad_batches"] == 2
    assert result["steps"] == 40  # 2 epochs x 320 rows / 16: the effective batch and step count kept


HIDDEN_OOM_JOB = r"""
import json, os, signal, sys, time
run = os.environ["ORCH_RUN_DIR"]
if os.environ["ORCH_ATTEMPT"] == "1":
    entry = {"attempt": "1", "at": time.time(), "step": 3, "error": "CUDA out of memory (on rank 1)",
             "from": {"batch_size": 32, "accumulate_grad_batches": 1},
             "to": {"batch_size": 16, "accumulate_grad_batches": 2}}
    with open(os.path.join(run, "batch.json"), "w") as f:
        json.dump({"batch_size": 16, "accumulate_grad_batches": 2, "history": [entry]}, f)
    os.kill(os.getpid(), signal.SIGKILL)  # what Lightning's DDP child watcher does to rank 0
print("attempt", os.environ["ORCH_ATTEMPT"], "fine")
"""


@pytest.mark.slow
def test_an_oom_hidden_behind_sigkill_is_read_from_batch_json(orch_home, tmp_path):
    h = orch_home()
    script = tmp_path / "hidden_oom.py"
    script.write_text(HIDDEN_OOM_JOB)
    h.start_daemon()
    job_id = h.submit("hidden-oom", retries=0, command=[sys.executable, str(script)])
    job = h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=30)
    assert job.state is JobState.SUCCEEDED, h.log_tail(30)
    attempts = h.store.attempts(job_id)
    assert [a.outcome for a in attempts] == ["oom", "succeeded"]
    assert attempts[0].exit_signal == 9
    assert job.failures == 0
    assert any(e.kind == "oom" and "batch 32 -> 16" in e.detail for e in h.store.events(job_id))
