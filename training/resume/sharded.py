"""Sharded checkpoints (strategy = "fsdp"): one folder per checkpoint, under the name a
single-file checkpoint has (`step-<8 digits>.ckpt/`, so the daemon, which has no torch, chooses
among them by the same rule), written through torch.distributed.checkpoint (DCP): each rank its
own shards, DCP's `.metadata` written by rank 0 once every rank's shards are, then `meta.pt` (the
loops, callbacks, LR schedulers, scaler, every rank's RNG state: what is not a shard), and only
then the folder renamed from its temp name into place. A folder under its final name is complete;
one missing a shard or a file is skipped for the previous good one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.contract import TEMP_MARK, fsync_dir

# What is not a shard, from rank 0 (Lightning's name for it in a distributed checkpoint).
META_NAME = "meta.pt"
# DCP's own metadata: which file holds which bytes of which tensor.
DCP_METADATA = ".metadata"


def temp_folder(path: Path) -> Path:
    """Where a checkpoint folder is written before it is renamed into place."""
    return path.parent / (TEMP_MARK + path.name)


def folder_problem(path: str | Path) -> Optional[str]:
    """Why a checkpoint folder cannot resume a run, or None: both metadata files present and
    every byte range DCP's metadata names present in its shard file."""
    folder = Path(path)
    for name in (DCP_METADATA, META_NAME):
        if not (folder / name).is_file():
            return f"is missing {name} (an incomplete save)"
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # a torn or foreign .metadata
        return f"has an unreadable {DCP_METADATA} ({type(exc).__name__})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        shard = folder / name
        if not shard.is_file():
            return f"is missing its shard {name}"
        if shard.stat().st_size < size:
            return f"has a truncated shard {name}"
    return None


def _fsync_tree(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(folder)


def prepare_folder(path: Path) -> Path:
    """Rank 0, before every rank writes: an empty temp folder beside the target."""
    temp = temp_folder(path)
    if temp.exists():
        shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    return temp


def commit_folder(temp: Path, path: Path, meta: dict[str, Any]) -> None:
    """Rank 0, after every rank's shards and DCP's metadata are written: meta.pt last, everything
    fsynced, then the rename that makes the checkpoint count."""
    with open(temp / META_NAME, "wb") as fh:
        torch.save(meta, fh)
    _fsync_tree(temp)
    if path.exists():  # the same step saved again (a notice after a periodic save of that step)
        old = path.parent / (TEMP_MARK + "old-" + path.name)
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(temp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(temp, path)
    fsync_dir(path.parent)


def shard_state(module: Any, optimizers: list[Any], *, trained_only: bool) -> dict[str, Any]:
    """The sharded part of a checkpoint: the module's parameters (with LoRA only those that train:
    the frozen base is reloaded from its own files) and each optimizer's state, as DTensors."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = get_model_state_dict(module)
    if trained_only:
        trained = {name for name, p in module.named_parameters() if p.requires_grad}
        model = {k: v for k, v in model.items() if k in trained}
    state: dict[str, Any] = {"state_dict": model}
    for i, optimizer in enumerate(optimizers):
        state[f"optimizer_{i}"] = get_optimizer_state_dict(module, optimizer)
    return state


def load_shards(path: Path, module: Any, optimizers: list[Any], *, trained_only: bool) -> None:
    """Every rank: the shards of `path` into this world's sharding (DCP reshards: a folder written
    by 2 ranks loads on 1 or 4), then into the module and its optimizers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    state = shard_state(module, optimizers, trained_only=trained_only)
    dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=False))
    set_model_state_dict(module, state["state_dict"], options=StateDictOptions(strict=not trained_only))
    for i, optimizer in enumerate(optimizers):
        set_optimizer_state_dict(module, optimizer, optim_state_dict=state[f"optimizer_{i}"])


def load_meta(path: Path) -> dict[str, Any]:
    return torch.load(Path(path) / META_NAME, map_location="cpu", weights_only=True)
