"""The ranks of a several-process job agreeing: on whether to stop (a notice seen by any rank
stops all of them at the same step) and on a point none passes before the others. Torch only, so
a plain PyTorch script's helper needs no transformers."""

from __future__ import annotations

from typing import Any


def any_rank(flag: bool, device: Any) -> bool:
    """True on every rank when it is True on any (one all-reduce; a single process: `flag`)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def all_ranks_here() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
