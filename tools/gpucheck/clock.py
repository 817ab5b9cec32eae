"""A passive Lightning callback that both throughput arms carry, so they are timed the same way:
the clock starts at the end of the first optimizer step (after a CUDA synchronize, so queued GPU
work is counted where it runs) and stops at the end of the last one. Samples are counted between
the two."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _rows(batch: Any) -> int:
    if isinstance(batch, dict) and "labels" in batch:
        return int(batch["labels"].shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return _rows(batch[0])
    return int(getattr(batch, "shape", [0])[0])


class Clock(pl.Callback):
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.first: Optional[tuple[int, float]] = None
        self.last: Optional[tuple[int, float]] = None
        self.samples = 0
        self._seen_step = -1

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if self.first is not None:
            self.samples += _rows(batch)
        if step == self._seen_step:
            return  # inside a gradient accumulation
        self._seen_step = step
        if self.first is None:
            _sync()
            self.first = (step, time.time())
        elif trainer.max_steps and step >= trainer.max_steps:
            _sync()
            self.last = (step, time.time())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.last is None:
            _sync()
            self.last = (int(trainer.global_step), time.time())
        out = {
            "first_step": None,
            "last_step": None,
            "seconds": None,
            "samples": self.samples,
            "samples_per_s": None,
            "steps_per_s": None,
        }
        if self.first and self.last and self.last[1] > self.first[1]:
            seconds = self.last[1] - self.first[1]
            out.update(
                first_step=self.first[0],
                last_step=self.last[0],
                seconds=seconds,
                samples_per_s=self.samples / seconds,
                steps_per_s=(self.last[0] - self.first[0]) / seconds,
            )
        if trainer.global_rank == 0:
            self.path.write_text(json.dumps(out))
