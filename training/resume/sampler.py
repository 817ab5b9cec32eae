"""The training sampler: a per-epoch permutation from (seed, epoch), sharded across DDP ranks,
whose resumable state counts SAMPLES. StatefulDataLoader's batch sampler also counts samples,
so a resume with a different micro-batch (after an OOM) continues at the exact next sample."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    def __init__(self, num_rows: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1):
        if num_rows <= 0:
            raise ValueError("the training set is empty")
        self.num_rows = num_rows
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        # Every rank sees the same number of samples (wrap-around padding, like DistributedSampler),
        # so the ranks' step counts match.
        self.per_rank = math.ceil(num_rows / world_size)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = epoch

    def indices(self, epoch: int) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(self.num_rows, generator=g).tolist()
        else:
            order = list(range(self.num_rows))
        total = self.per_rank * self.world_size
        if total > len(order):
            order += order[: total - len(order)]
        return order[self.rank : total : self.world_size]

    def __iter__(self) -> Iterator[int]:
        return _ResumableIterator(self, self.epoch)

    def __len__(self) -> int:
        return self.per_rank

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state.get("epoch", self.epoch))


class _ResumableIterator(Iterator[int]):
    def __init__(self, sampler: ResumableSampler, epoch: int):
        self.sampler = sampler
        self.epoch = epoch
        self.order = sampler.indices(epoch)
        self.yielded = 0

    def __iter__(self) -> "_ResumableIterator":
        return self

    def __next__(self) -> int:
        if self.yielded >= len(self.order):
            raise StopIteration
        value = self.order[self.yielded]
        self.yielded += 1
        return value

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.order = self.sampler.indices(self.epoch)
        self.yielded = int(state["yielded"])
