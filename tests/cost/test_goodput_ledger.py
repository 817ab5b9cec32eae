"""The goodput ledger end to end: a real daemon with prices, a real tiny-BERT fine-tune with a
validation split, a SIGKILL of the job mid-run and the resume. The ledger `orch show` prints must
have each part where it belongs — redone steps after the kill, a start-up for each attempt (the
second one's includes the restore), checkpoint stall, data wait, evaluation, useful training — and
its parts must add up to the billed cost; `orch cost --breakdown` sums the same parts."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from daemon_harness import OrchHome, wait_for

from orchestrator.contract import read_json
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow

ROWS, BATCH, EPOCHS, EVERY = 320, 16, 2, 25  # 20 steps an epoch, 40 in all; a save at 25


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    root = tmp_path_factory.mktemp("workload")
    texts = [r["text"] for r in sentiment_rows(1000, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    return {
        "model": model,
        "train": write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11)),
        "dev": write_jsonl(root / "dev.jsonl", sentiment_rows(64, seed=12)),
        "hf_cache": root / "hf-cache",
    }


@pytest.fixture
def home(tmp_path: Path) -> Iterator[OrchHome]:
    h = OrchHome(
        tmp_path / "h", config={"pricing": {"currency": "CNY", "instance_hour": 36.0}}, cpu_slots=1, grace_seconds=30
    )
    yield h
    h.cleanup()


def submit(h: OrchHome, workload: dict[str, Path]) -> int:
    spec: dict[str, Any] = {
        "name": "ledger",
        "gpus": 0,
        "retries": 2,
        "grace_seconds": 30,
        "model": {"name_or_path": str(workload["model"]), "num_labels": 2},
        "data": {
            "train": str(workload["train"]),
            "validation": str(workload["dev"]),
            "max_length": 32,
            "num_workers": 0,
        },
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
            "ORCH_FAULT_SLOW_STEP_S": "0.1",
        },
    }
    path = h.jobs_dir / "ledger.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


def test_sigkill_and_resume_put_redone_steps_and_restore_in_the_ledger_and_its_parts_add_up(workload, home):
    h = home
    h.start_daemon()
    job_id = submit(h, workload)
    periodic = h.run_dir(job_id) / "checkpoints" / f"step-{EVERY:08d}.ckpt"
    step = lambda: (read_json(h.run_dir(job_id) / "progress.json") or {}).get("step") or 0  # noqa: E731
    wait_for(lambda: periodic.exists() and step() >= EVERY + 4, 120, interval=0.02, what="the save at 25 and step 29")
    os.killpg(h.attempt_pids(job_id, 1)["job_pid"], signal.SIGKILL)  # no chance to save
    wait_for(
        lambda: h.state(job_id) is JobState.SUCCEEDED,
        180,
        interval=0.2,
        what=f"the job to succeed after the resume ({h.log_tail()})",
    )
    h.stop_daemon(h.daemons[0])  # the bill is final: no accrual while the test reads it

    job = h.job(job_id)
    assert job.steps_lost > 0 and job.cost > 0
    data = json.loads(h.cli("show", str(job_id), "--json").stdout)
    bill = data["bill"]
    seconds, money = bill["seconds"], bill["money"]
    assert bill["measured"] and bill["attempts"] == 2 and not bill["scaled"], bill
    for part in ("useful", "redone", "checkpoint", "startup", "data_wait", "eval"):
        assert seconds[part] > 0 and money[part] > 0, (part, bill)
    # each attempt's start (process start, imports, data, the model; the second one's restore) is in
    progress = read_json(h.run_dir(job_id) / "progress.json")
    attempts = {a["n"]: a for a in data["attempts"]}
    starts = [progress["goodput"][str(n)]["first_step_at"] - attempts[n]["started_at"] for n in (1, 2)]
    assert all(s > 0 for s in starts) and math.isclose(
        seconds["startup"], sum(starts), abs_tol=0.002
    )  # shown to 1 ms, (starts, seconds)
    # redone steps at the measured time of a step, not the attempt's mean with its start-up in it
    figures = progress["goodput"].values()
    step_s = sum(f["step_s"] for f in figures) / sum(f["steps"] for f in figures)
    assert math.isclose(seconds["redone"], job.steps_lost * step_s, abs_tol=0.002)
    # the parts add up to what was billed
    assert abs(sum(money.values()) - job.cost) <= 0.01 * job.cost, (money, job.cost)
    assert math.isclose(bill["billed"], job.cost, abs_tol=1e-5)  # shown to 6 places
    assert abs(sum(seconds.values()) - job.run_seconds) <= 0.01 * job.run_seconds

    text = h.cli("show", str(job_id)).stdout
    assert "redone steps" in text and "start-up and restore" in text and "useful training" in text, text

    breakdown = json.loads(h.cli("cost", "--breakdown", "--json").stdout)
    assert math.isclose(breakdown["parts"]["money"]["redone"], money["redone"], rel_tol=1e-3)
    assert abs(breakdown["jobs_cost"] + breakdown["idle_cost"] - breakdown["total"]) <= 2e-6  # each shown to 6 places
    assert "where the money went" in h.cli("cost", "--breakdown").stdout
