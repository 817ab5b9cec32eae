"""examples/sft-lora and examples/ner as a user runs them: prepare.py, then `orch run job.toml`
(the real CLI, in the foreground), on the CPU; each ends with its export and its metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator.cli"]

pytestmark = pytest.mark.slow


def run_example(name: str, tmp_path: Path) -> tuple[dict, Path, float]:
    example = tmp_path / name
    shutil.copytree(REPO / "examples" / name, example, ignore=shutil.ignore_patterns("data", "tiny-*", "__pycache__"))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ORCH_HOME": str(tmp_path / "home"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
    }
    subprocess.run([sys.executable, str(example / "prepare.py")], check=True, capture_output=True, env=env)
    started = time.monotonic()
    ran = subprocess.run(
        [*ORCH, "run", str(example / "job.toml")], capture_output=True, text=True, timeout=600, env=env
    )
    elapsed = time.monotonic() - started
    assert ran.returncode == 0, ran.stderr[-3000:]
    runs = sorted((tmp_path / "home" / "runs").iterdir())
    run_dir = runs[-1]
    print(f"{name}: orch run took {elapsed:.0f} s")
    return json.loads((run_dir / "result.json").read_text()), run_dir, elapsed


def test_sft_lora_example_runs_and_exports_the_adapter_and_merged_model(tmp_path):
    result, run_dir, _ = run_example("sft-lora", tmp_path)
    print("sft-lora metrics:", result["metrics"])
    assert (run_dir / "model" / "adapter_model.safetensors").is_file()
    assert (run_dir / "model" / "merged" / "model.safetensors").is_file()
    assert result["metrics"]["val_perplexity"] < 10, result  # hundreds untrained: it learned the answers


def test_ner_example_runs_and_reports_entity_f1(tmp_path):
    result, run_dir, _ = run_example("ner", tmp_path)
    print("ner metrics:", result["metrics"])
    assert result["best_monitor"] == "val_f1"
    assert result["metrics"]["val_f1"] >= 0.8, result
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert "B-PER" in config["label2id"]
