"""Checkpoint files: atomic writes survive SIGKILL, broken files are skipped by name, retention."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from training.resume.checkpoints import (
    TEMP_MARK,
    AtomicCheckpointIO,
    checkpoint_problem,
    latest_valid_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    remove_orphan_temps,
    step_of,
)

from conftest import REPO


def fake_checkpoint(step: int, size: int = 1000) -> dict:
    return {
        "state_dict": {"w": torch.full((size,), float(step))},
        "global_step": step,
        "epoch": 0,
        "loops": {},
        "optimizer_states": [],
    }


WRITER = """
import sys, torch
from training.resume.checkpoints import atomic_torch_save
path = sys.argv[1]
step = 0
while True:
    step += 1
    atomic_torch_save({"state_dict": {"w": torch.full((2_000_000,), float(step))}, "global_step": step,
                       "epoch": 0, "loops": {}, "optimizer_states": []}, path)
    if step == 1:
        print("ready", flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    target = tmp_path / "ckpts" / "step-00000001.ckpt"
    rng = random.Random(3)
    for trial in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target)],
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.4))  # somewhere inside an 8 MB write most of the time
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert checkpoint_problem(target) is None, f"trial {trial}: {checkpoint_problem(target)}"
        loaded = torch.load(target, weights_only=True)
        assert torch.all(loaded["state_dict"]["w"] == loaded["global_step"])
        remove_orphan_temps(target.parent)
        assert not [p for p in target.parent.iterdir() if p.name.startswith(TEMP_MARK)]


def test_truncated_newest_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (10, 20, 30):
        torch.save(fake_checkpoint(step), folder / f"step-{step:08d}.ckpt")
    newest = folder / "step-00000030.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    (folder / "step-00000025.ckpt").write_bytes(b"not a checkpoint")
    # mtimes must not matter: make the oldest file the most recently modified
    os.utime(folder / "step-00000010.ckpt", (time.time() + 100, time.time() + 100))
    warnings: list[str] = []
    chosen = latest_valid_checkpoint(folder, warn=warnings.append)
    assert chosen == folder / "step-00000020.ckpt"
    assert any("step-00000030.ckpt" in w for w in warnings)
    assert any("step-00000025.ckpt" in w for w in warnings)


def test_resume_from_env_is_validated_and_falls_back(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save(fake_checkpoint(10), folder / "step-00000010.ckpt")
    torch.save({"state_dict": {}}, folder / "notice-step-00000015.ckpt")  # loads, but lacks keys
    warnings: list[str] = []
    chosen = latest_valid_checkpoint(folder, prefer=folder / "notice-step-00000015.ckpt", warn=warnings.append)
    assert chosen == folder / "step-00000010.ckpt"
    assert "missing" in warnings[0] and "notice-step-00000015.ckpt" in warnings[0]


def test_retention_keeps_periodic_newest_notice_and_best(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    names = [
        "step-00000010.ckpt",
        "step-00000020.ckpt",
        "step-00000030.ckpt",
        "notice-step-00000015.ckpt",
        "notice-step-00000025.ckpt",
        "best.ckpt",
        "step-00000005.ckpt",
    ]
    for name in names:
        (folder / name).write_bytes(b"x")
    prune_checkpoints(folder, keep=2)
    assert {p.name for p in folder.iterdir()} == {
        "step-00000020.ckpt",
        "step-00000030.ckpt",
        "notice-step-00000025.ckpt",
        "best.ckpt",
    }
    assert [step_of(p) for p in list_checkpoints(folder)] == [30, 25, 20]


def test_a_notice_save_is_durable_before_retention_runs(tmp_path):
    """The notice path: AtomicCheckpointIO writes, reports where the time went, and leaves deleting
    the previous notice file to prune(), which OrchCallback calls after reporting the save."""
    folder = tmp_path / "checkpoints"
    io = AtomicCheckpointIO(keep=1)
    io.save_checkpoint(fake_checkpoint(10), folder / "step-00000010.ckpt")
    io.save_checkpoint(fake_checkpoint(15), folder / "notice-step-00000015.ckpt")
    io.save_checkpoint(fake_checkpoint(20), folder / "notice-step-00000020.ckpt")
    assert set(io.last_save) == {"write_s", "fsync_s", "rename_s", "bytes"}
    assert io.last_save["bytes"] == (folder / "notice-step-00000020.ckpt").stat().st_size
    assert (folder / "notice-step-00000015.ckpt").exists()  # not yet: retention waits for prune()
    assert io.prune() == [folder / "notice-step-00000015.ckpt"]
    assert [p.name for p in list_checkpoints(folder)] == ["notice-step-00000020.ckpt", "step-00000010.ckpt"]
    assert io.prune() == []
    assert checkpoint_problem(folder / "notice-step-00000020.ckpt") is None
