"""Periodic checkpoints written in the background: the file holds the state at the moment of the
save even though training changes the tensors right after; notice saves stay synchronous."""

from __future__ import annotations

from pathlib import Path

import torch

from training.resume.checkpoints import AtomicCheckpointIO, load_checkpoint_file
from training.resume.snapshot import BackgroundCheckpointIO, snapshot


def _state() -> dict:
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    return {
        "state_dict": {"w": w, "tied": w, "b": torch.randn(256)},
        "optimizer_states": [
            {
                "state": {0: {"exp_avg": torch.randn(256, 256), "step": torch.tensor(3.0)}},
                "param_groups": [{"lr": 1e-3, "params": [0]}],
            }
        ],
        "global_step": 10,
        "epoch": 0,
        "loops": {"fit_loop": {"x": [1, 2, (3, 4)]}},
    }


def test_snapshot_is_independent_and_keeps_shared_tensors_shared():
    state = _state()
    frozen = snapshot(state)
    assert frozen["state_dict"]["tied"] is frozen["state_dict"]["w"]
    state["state_dict"]["w"].add_(1.0)
    state["loops"]["fit_loop"]["x"].append(5)
    assert not torch.equal(frozen["state_dict"]["w"], state["state_dict"]["w"])
    assert frozen["loops"]["fit_loop"]["x"] == [1, 2, (3, 4)]


def test_background_save_writes_the_state_of_the_moment_of_the_save(tmp_path: Path):
    expected = snapshot(_state())
    sync_io, bg_io = AtomicCheckpointIO(keep=3), BackgroundCheckpointIO(keep=3)
    sync_io.save_checkpoint(expected, tmp_path / "sync" / "step-00000010.ckpt")
    live = _state()
    bg_io.save_checkpoint(live, tmp_path / "bg" / "step-00000010.ckpt")
    for t in (live["state_dict"]["w"], live["optimizer_states"][0]["state"][0]["exp_avg"]):
        t.mul_(-3.0)  # the next optimizer step, while the write is in flight
    bg_io.teardown()  # the end of training waits for the last write
    assert bg_io.last_snapshot["blocked_s"] >= 0 and bg_io.last_background["bytes"] > 0
    a = load_checkpoint_file(tmp_path / "sync" / "step-00000010.ckpt")
    b = load_checkpoint_file(tmp_path / "bg" / "step-00000010.ckpt")
    assert torch.equal(a["state_dict"]["w"], b["state_dict"]["w"])
    assert torch.equal(a["optimizer_states"][0]["state"][0]["exp_avg"], b["optimizer_states"][0]["state"][0]["exp_avg"])
    assert a["loops"] == b["loops"] and a["global_step"] == b["global_step"]


def test_notice_saves_are_synchronous_and_retention_still_applies(tmp_path: Path):
    io = BackgroundCheckpointIO(keep=1)
    for step in (10, 20):
        io.save_checkpoint(_state(), tmp_path / f"step-{step:08d}.ckpt")
    io.save_checkpoint(_state(), tmp_path / "notice-step-00000025.ckpt")
    assert (tmp_path / "notice-step-00000025.ckpt").exists()  # durable when save_checkpoint returns
    assert io.last_save["bytes"] > 0
    io.wait()
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["notice-step-00000025.ckpt", "step-00000020.ckpt"]


def test_the_next_snapshot_reuses_the_host_buffers_and_each_file_holds_its_own_state(tmp_path: Path):
    io = BackgroundCheckpointIO(keep=3)
    live = _state()
    io.save_checkpoint(live, tmp_path / "step-00000010.ckpt")
    first = dict(io._buffers)
    live["state_dict"]["w"].add_(1.0)
    io.save_checkpoint(live, tmp_path / "step-00000020.ckpt")  # waits for the first write, then reuses
    assert all(io._buffers[k] is first[k] for k in first)
    io.teardown()
    a = load_checkpoint_file(tmp_path / "step-00000010.ckpt")
    b = load_checkpoint_file(tmp_path / "step-00000020.ckpt")
    assert torch.equal(b["state_dict"]["w"], a["state_dict"]["w"] + 1.0)
