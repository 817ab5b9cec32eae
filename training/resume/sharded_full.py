"""A sharded save that failed (strategy = "fsdp"), settled the way a single-file one is: its temp
folder removed, the previous complete folder left as it was, and on a full disk disk_full.json for
the daemon (checkpoints.disk_full_report: the job fails at once with the bytes needed and free, a
`disk_full` event) and DiskFull raised on every rank. Without it a full disk mid-save was a plain
error, retried into the same full disk.

DCP gathers every rank's write error and raises it on all of them, but rank 0's commit (meta.pt,
the rename) fails on rank 0 alone: inside a save, every rank learns whether any failed (one
all-reduce), so none goes on into the next collective while another has stopped."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from training.exits import RunError
from training.resume.checkpoints import disk_full_report
from training.resume.ranks import any_rank

OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(exc: Optional[BaseException]) -> bool:
    """Whether ENOSPC or EDQUOT is behind `exc`: its cause chain, or any rank's failure that DCP's
    CheckpointException carries (torch's writers also report ENOSPC as a RuntimeError without an
    errno: the free space decides those)."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in OUT_OF_SPACE:
            return True
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    return False


def local_bytes(state: Any) -> int:
    """The bytes this rank's part of a sharded state takes (a DTensor counts its local shard)."""
    if isinstance(state, dict):
        return sum(local_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(local_bytes(v) for v in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return int(local.numel() * local.element_size())
    return 0


def settle_save(
    error: Optional[BaseException],
    *,
    temp: Path,
    path: Path,
    needed: int,
    rank: int,
    device: Optional[Any],
) -> None:
    """After a sharded save of `path` (written to `temp`; `needed`: its bytes on all ranks): return
    when no rank failed, else raise on this one — DiskFull when the disk is full (rank 0 writes
    disk_full.json), else the error. `device`: where the flag's all-reduce runs; None outside a
    collective (the teardown's wait): this rank's own error decides."""
    failed = any_rank(error is not None, device) if device is not None else error is not None
    if not failed:
        return
    certain = out_of_space(error)
    if device is not None:
        certain = any_rank(certain, device)
    if rank == 0:
        shutil.rmtree(temp, ignore_errors=True)  # the previous complete folder is untouched
    full = disk_full_report(path, needed, certain=certain, write=rank == 0)
    if full is not None:
        raise full from None
    if isinstance(error, Exception):
        raise error
    if error is not None:  # DCP's CheckpointException is a BaseException: as a run error, with its text
        raise RunError(f"saving {path.name} failed: {str(error).strip().splitlines()[-1][:300]}")
    raise RunError(f"saving {path.name} failed on another rank (see its log)")
