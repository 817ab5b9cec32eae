"""A Lightning job's heartbeat: progress.json every few seconds (and at once at the start, the
end, a validation and a notice) for `orch status`, samples/s over the window since the last write,
and an optional "[orch] step 120/400 | ... | ETA 1m05s" line for a foreground run. OrchCallback
(training/scripts/lightning.py) drives it from its hooks; rank 0 writes."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

from orchestrator.contract import PROGRESS

from training.heartbeat.progress import ProgressWriter, as_numbers


def count_rows(batch: Any) -> int:
    """Rows in a batch of any common shape (tensor, dict, tuple/list)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        for value in batch.values():
            n = count_rows(value)
            if n:
                return n
    if isinstance(batch, (list, tuple)) and batch:
        return count_rows(batch[0])
    return 0


def short_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class LightningProgress:
    def __init__(self, run_dir: Optional[Path], *, every_s: float, log_every_s: Optional[float]):
        self.run_dir = run_dir
        self.every_s = every_s
        self.log_every_s = log_every_s
        self.extras: list[Callable[[], dict[str, Any]]] = []  # fields other parts add (training/heartbeat/goodput.py)
        self.samples_per_s: Optional[float] = None
        self.train_started_at: Optional[float] = None
        self.first_step_at: Optional[float] = None  # end of this attempt's first batch (Unix s)
        self._writer: Optional[ProgressWriter] = None
        self._last_write = 0.0
        self._last_log = 0.0
        self._window_start = time.monotonic()
        self._window_samples = 0
        self._train_start = time.monotonic()
        self._start_step = 0

    def started(self, trainer: pl.Trainer) -> None:
        self._train_start = self._window_start = time.monotonic()
        self._start_step = trainer.global_step
        self.train_started_at = time.time()
        self.write(trainer, force=True)

    def batch_done(self, trainer: pl.Trainer, batch: Any) -> None:
        """Count a batch's rows (all ranks' worth) toward samples/s."""
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self._window_samples += count_rows(batch) * trainer.world_size

    def beat(self, trainer: pl.Trainer) -> None:
        """progress.json when `every_s` has passed, the log line when `log_every_s` has."""
        now = time.monotonic()
        if now - self._last_write >= self.every_s:
            elapsed = now - self._window_start
            if elapsed > 0 and self._window_samples:
                self.samples_per_s = self._window_samples / elapsed
            self._window_start, self._window_samples = now, 0
            self.write(trainer)
        if self.log_every_s and now - self._last_log >= self.log_every_s:
            self._last_log = now
            self.log_line(trainer)

    def validation_ended(self, trainer: pl.Trainer) -> None:
        self.write(trainer, force=True)
        self._window_start, self._window_samples = time.monotonic(), 0  # validation time is not throughput

    def snapshot(self, trainer: pl.Trainer) -> dict[str, Any]:
        """The progress.json snapshot; metric values stay as logged (tensors) until written."""
        total = trainer.estimated_stepping_batches
        extras: dict[str, Any] = {}
        for extra in self.extras:
            extras.update(extra())
        return {
            **extras,
            "step": int(trainer.global_step),
            "total_steps": int(total) if total is not None and math.isfinite(total) else None,
            "epoch": int(trainer.current_epoch),
            "metrics": dict(trainer.callback_metrics),
            "samples_per_s": round(self.samples_per_s, 2) if self.samples_per_s else None,
            "updated_at": time.time(),
            "train_started_at": self.train_started_at,
            "first_step_at": self.first_step_at,
        }

    def write(self, trainer: pl.Trainer, force: bool = False) -> None:
        """A heartbeat goes to the writer thread; `force` (start, end, validation, a notice) is on
        disk when this returns."""
        self._last_write = time.monotonic()
        if self.run_dir is None or trainer.global_rank != 0:
            return
        if self._writer is None:
            self._writer = ProgressWriter(self.run_dir / PROGRESS)
        snapshot = self.snapshot(trainer)
        if force:
            self._writer.write_now(snapshot)
        else:
            self._writer.submit(snapshot)

    def log_line(self, trainer: pl.Trainer) -> None:
        if trainer.global_rank != 0:
            return
        p = self.snapshot(trainer)
        p["metrics"] = as_numbers(p["metrics"])
        parts = [f"step {p['step']}" + (f"/{p['total_steps']}" if p["total_steps"] else ""), f"epoch {p['epoch']}"]
        parts += [f"{k} {v:.4g}" for k, v in sorted(p["metrics"].items())]
        if p["samples_per_s"]:
            parts.append(f"{p['samples_per_s']:.1f} samples/s")
        done = p["step"] - self._start_step
        if p["total_steps"] and done > 0:
            rate = done / (time.monotonic() - self._train_start)
            parts.append("ETA " + short_duration((p["total_steps"] - p["step"]) / rate))
        print("[orch] " + " | ".join(parts), flush=True)
