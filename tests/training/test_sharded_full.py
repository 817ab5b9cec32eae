"""A failed sharded save settled (training/resume/sharded_full.py), in one process on a real folder:
ENOSPC found behind DCP's CheckpointException or an exception's cause, the temp folder removed, the
previous complete folder untouched, and disk_full.json written for the daemon; another error is
raised as it is."""

from __future__ import annotations

import errno
import json
import traceback

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from orchestrator.reports.disk_full import disk_full
from training.resume.checkpoints import DiskFull
from training.resume.sharded_full import local_bytes, out_of_space, settle_save


def enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def test_enospc_is_found_behind_dcp_and_chained_exceptions():
    wrapped = CheckpointException("write", {1: (enospc(), traceback.StackSummary())})
    assert out_of_space(wrapped)
    try:
        try:
            raise enospc()
        except OSError as exc:
            raise RuntimeError("unexpected pos 128 vs 64") from exc
    except RuntimeError as chained:
        assert out_of_space(chained)
    assert not out_of_space(RuntimeError("CUDA error")) and not out_of_space(None)
    assert not out_of_space(CheckpointException("write", {0: (ValueError("bad"), traceback.StackSummary())}))


def test_local_bytes_counts_every_tensor_of_the_state():
    state = {"state_dict": {"w": torch.zeros(10, 4)}, "optimizer_0": {"state": {"w": {"exp_avg": torch.zeros(40)}}}}
    assert local_bytes(state) == 2 * 40 * 4


def test_a_full_disk_removes_the_temp_folder_keeps_the_previous_one_and_reports(tmp_path, monkeypatch):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    previous = ckpts / "step-00000004.ckpt"
    previous.mkdir(parents=True)
    (previous / "meta.pt").write_bytes(b"x")
    temp = ckpts / ".tmp-step-00000008.ckpt"
    temp.mkdir()
    (temp / "__0_0.distcp").write_bytes(b"half")
    monkeypatch.setenv("ORCH_RUN_DIR", str(run))
    monkeypatch.setenv("ORCH_ATTEMPT", "3")
    error = CheckpointException("write", {0: (enospc(), traceback.StackSummary())})
    with pytest.raises(DiskFull) as raised:
        settle_save(error, temp=temp, path=ckpts / "step-00000008.ckpt", needed=900_000, rank=0, device=None)
    assert "saving step-00000008.ckpt needed 0.9 MB" in str(raised.value)
    assert "step-00000004.ckpt is intact" in str(raised.value)
    assert not temp.exists() and (previous / "meta.pt").read_bytes() == b"x"
    info = disk_full(run, 3)
    assert info is not None and info["name"] == "step-00000008.ckpt" and info["needed_bytes"] == 900_000
    assert info["previous"] == "step-00000004.ckpt", json.dumps(info)


def test_another_error_is_raised_as_it_is_and_no_report_is_written(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("ORCH_RUN_DIR", str(run))
    path = run / "checkpoints" / "step-00000002.ckpt"
    settle_save(None, temp=path.with_name(".tmp-x"), path=path, needed=10, rank=0, device=None)  # no failure: returns
    with pytest.raises(ValueError, match="bad shard"):
        settle_save(ValueError("bad shard"), temp=path.with_name(".tmp-x"), path=path, needed=10, rank=0, device=None)
    assert not (run / "disk_full.json").exists()
