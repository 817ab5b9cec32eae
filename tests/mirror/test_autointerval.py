"""[checkpoint] every = "auto": Young/Daly from the measured save cost and the MTBF (job.toml, else
the daemon's figure for this machine, else 6 h), and `orch show` says what it chose and why."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import tomli_w
from daemon_harness import OrchHome

from orchestrator.contract import CHECKPOINT_INTERVAL, ENV_MTBF_S, read_json
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import EventKind, JobState
from orchestrator.home.wake import poke
from training.resume.autointerval import DEFAULT_MTBF_S, mtbf_for, young_daly


def test_young_daly_and_where_the_mtbf_comes_from():
    assert young_daly(0.5, 3600) == pytest.approx(math.sqrt(3600))
    assert mtbf_for(2.0, {ENV_MTBF_S: "100"}) == (7200.0, "job.toml [checkpoint] mtbf_hours")
    assert mtbf_for(None, {ENV_MTBF_S: "100"})[0] == 100.0
    assert mtbf_for(None, {})[0] == DEFAULT_MTBF_S


def test_the_daemon_hands_jobs_this_machines_mtbf(tmp_path: Path):
    from types import SimpleNamespace

    from orchestrator.daemon.mtbf import update_mtbf
    from orchestrator.store import Store

    store = Store(tmp_path / "orch.db")
    rt = SimpleNamespace(store=store, daemon=SimpleNamespace(environ={}))
    update_mtbf(rt)
    assert ENV_MTBF_S not in rt.daemon.environ  # nothing seen: the runner's default applies
    store.accrue(time.time(), 3600.0, {}, 0.0)
    store.record_event(None, EventKind.NOTICE, time.time(), detail="aws: preempt: termination")
    store.record_event(None, EventKind.NOTICE, time.time(), detail="aws: preempt: termination")
    store.record_event(None, EventKind.NOTICE, time.time(), detail="aws: rebalance: stops nothing")
    update_mtbf(rt)
    assert rt.daemon.environ[ENV_MTBF_S] == "1800"


@pytest.mark.slow
def test_auto_interval_checkpoints_at_the_young_daly_interval_and_show_says_why(tmp_path: Path):
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    texts = [r["text"] for r in sentiment_rows(500, seed=1)]
    model = build_tiny_bert(tmp_path / "tiny", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(320, seed=11))
    (tmp_path / "h").mkdir()
    h = OrchHome(tmp_path / "h", cpu_slots=1, grace_seconds=30)
    try:
        h.start_daemon()
        spec = {
            "name": "auto",
            "gpus": 0,
            "model": {"name_or_path": str(model), "num_labels": 2},
            "data": {"train": str(train), "max_length": 32, "num_workers": 0},
            "train": {"max_epochs": 2, "batch_size": 16, "precision": "32", "seed": 7},
            "checkpoint": {"every": "auto", "every_minutes": 0.01, "mtbf_hours": 0.002, "keep": 10},
            "env": {
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_CACHE": str(tmp_path / "hf"),
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
                "ORCH_FAULT_SLOW_STEP_S": "0.1",
            },
        }
        path = tmp_path / "auto.toml"
        path.write_bytes(tomli_w.dumps(spec).encode())
        job_id = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0).id
        poke(h.home.wake_socket)
        h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=150)
        assert h.state(job_id) is JobState.SUCCEEDED, h.job(job_id).reason
        chosen = read_json(h.run_dir(job_id) / CHECKPOINT_INTERVAL)
        assert chosen["cost_s"] > 0 and chosen["mtbf_s"] == pytest.approx(7.2)
        assert chosen["interval_s"] == pytest.approx(math.sqrt(2 * chosen["cost_s"] * 7.2), rel=1e-2)
        periodic = sorted((h.run_dir(job_id) / "checkpoints").glob("step-*.ckpt"))
        assert len(periodic) >= 3, periodic  # first after 0.6 s, then about every interval
        text = h.cli("show", str(job_id)).stdout
        assert "checkpoint: every" in text and "auto: sqrt(2 x" in text and "mtbf_hours" in text, text
        assert json.loads(h.cli("show", str(job_id), "--json").stdout)["checkpoint_interval"]["interval_s"] > 0
    finally:
        h.cleanup()
