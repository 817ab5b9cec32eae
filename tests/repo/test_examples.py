"""The shipped examples validate as users will submit them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator.cli"]


def orch(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ORCH, "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ORCH_CONFIG": str(home / "config.toml")},
    )


def test_the_seed_bert_base_job_is_accepted_on_a_two_gpu_machine(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[daemon]\ngpus = [0, 1]\n")
    res = orch(home, "submit", "--json", str(REPO / "examples" / "bert-base.toml"))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["id"]
    spec = json.loads(orch(home, "show", str(job_id), "--json").stdout)["spec"]
    assert spec["gpus"] == 2 and spec["model"]["name_or_path"] == "bert-base-uncased"  # a hub id, not a path
    train = spec["train"]
    assert (train["batch_size"], train["accumulate_grad_batches"], train["precision"], train["max_epochs"]) == (
        32,
        4,
        "16-mixed",
        3,
    )
    assert spec["early_stopping"]["monitor"] == "val_acc"
    assert Path(spec["data"]["train"]).is_absolute() and Path(spec["data"]["train"]).exists()


def test_the_seed_bert_base_job_is_refused_on_a_machine_without_gpus(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[daemon]\ngpus = []\n")
    res = orch(home, "submit", str(REPO / "examples" / "bert-base.toml"))
    assert res.returncode == 2
    assert "gpus: asks for 2 GPUs but this machine has 0" in res.stderr
    assert "Traceback" not in res.stderr
