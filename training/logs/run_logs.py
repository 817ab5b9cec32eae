"""The built-in runner's metric logs: metrics.csv and TensorBoard event files (tensorboardX) in
the run folder, both continued across attempts, plus the learning rate and samples/s logged
beside the loss. Off the step where it can be: metrics.csv is written at most every
FLUSH_EVERY_S (a validation row at once), TensorBoard events by their own thread
(training/logs/tensorboard_log.py), and both are flushed before every checkpoint (so a resumed attempt finds every row from before its step) and at the end.

Lightning's CSVLogger deletes an existing metrics.csv when a new process starts, so a resumed
attempt used to wipe its predecessors' curve. Here each attempt keeps the rows logged before the
step it resumes from and drops the ones it will log again (steps a SIGKILL made it redo); the
TensorBoard file of the attempt starts with the same cut (SessionLog.START at that step), so
both hold the same values."""

from __future__ import annotations

import csv
import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from orchestrator.contract import ENV_ATTEMPT, ENV_JOB_ID, ENV_TENSORBOARD_DIR, METRICS_CSV, TENSORBOARD, atomic_file

from training.logs.metric_rows import FLUSH_EVERY_S, StepExtras, is_validation, row_step
from training.logs.tensorboard_log import TensorBoardEvents, link_tensorboard


def keep_rows_before(path: Path, purge_step: int, *, validation_at: Optional[int] = None) -> list[str]:
    """Drop the rows of metrics.csv at steps >= purge_step, and the validation rows at step
    `validation_at` (atomically); return its header."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = [
                r
                for r in reader
                if row_step(r) is not None
                and row_step(r) < purge_step  # type: ignore[operator]
                and not (row_step(r) == validation_at and is_validation(r))
            ]
    except FileNotFoundError:
        return []
    with atomic_file(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return header


class _ContinuingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, purge_step: int, validation_at: Optional[int] = None):
        # read by _check_log_dir_exists, which the base __init__ calls
        self.purge_step, self.validation_at = purge_step, validation_at
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        # Lightning's version deletes metrics.csv; keep what earlier attempts logged before the cut.
        header = keep_rows_before(Path(self.metrics_file_path), self.purge_step, validation_at=self.validation_at)
        self.metrics_keys = sorted(k for k in header if k)


class ContinuingCSVLogger(CSVLogger):
    """CSVLogger(save_dir=run_dir, name="", version="") that continues metrics.csv and writes it at
    most every `flush_every_s` (Lightning asks for a write at every logged step)."""

    def __init__(self, run_dir: str | Path, *, purge_step: int, flush_every_s: float = FLUSH_EVERY_S):
        super().__init__(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=1)
        self.purge_step = purge_step
        self.flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._validation_logged = False
        self.extras: Optional[StepExtras] = None  # RateAndLR hands its own in at train start
        self._extras_seen = 0
        self.validation_at: Optional[int] = None

    @property
    @rank_zero_only
    def experiment(self) -> ExperimentWriter:  # type: ignore[override]
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(self.log_dir, self.purge_step, self.validation_at)
        return self._experiment

    @rank_zero_only
    def drop_validation_at(self, step: int) -> None:
        """The attempt resumes from a checkpoint taken before the validation of `step` and runs it
        again (training/resume/exact.py): drop the row an earlier attempt wrote after the save."""
        self.validation_at = step
        if self._experiment is not None:  # (already cut at the resume step: cut this row too)
            self.flush()
            keep_rows_before(Path(self._experiment.metrics_file_path), 1 << 62, validation_at=step)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        if self.extras is not None:
            metrics, self._extras_seen = self.extras.merge_into(metrics, self._extras_seen)
        super().log_metrics(metrics, step)
        # A validation row is written at once: a sweep's pruner judges the trial by it.
        self._validation_logged = self._validation_logged or any(k.startswith("val_") for k in metrics)

    @rank_zero_only
    def save(self) -> None:
        if self._validation_logged or time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        self._last_flush, self._validation_logged = time.monotonic(), False
        if self._experiment is not None:
            super().save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.flush()


class RateAndLR(pl.Callback):
    """`lr` (the first parameter group's) and `samples_per_s` (over the last `window` batches, all
    ranks) in the run's loggers' train-step rows, computed only on the steps the loggers write
    (every log_every_n_steps) and handed to them through StepExtras, not LightningModule.log (so
    they are in metrics.csv and TensorBoard, not in trainer.callback_metrics). Also flushes the
    run's loggers before every checkpoint."""

    def __init__(self, window: int = 10):
        self.window = max(2, window)
        self._times: deque[tuple[float, int]] = deque(maxlen=self.window + 1)
        self._samples = 0
        self.extras = StepExtras()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._times.clear()
        self._samples = 0
        self._times.append((time.monotonic(), 0))
        for logger in trainer.loggers:
            if hasattr(logger, "extras"):
                logger.extras = self.extras

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._times.clear()  # validation time is not training throughput
        self._times.append((time.monotonic(), self._samples))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        from training.heartbeat.lightning_progress import count_rows

        self._samples += count_rows(batch) * trainer.world_size
        now = time.monotonic()
        self._times.append((now, self._samples))
        if not _loggers_write_now(trainer):
            return
        values: dict[str, float] = {}
        (t0, s0) = self._times[0]
        if now > t0 and self._samples > s0:
            values["samples_per_s"] = (self._samples - s0) / (now - t0)
        if trainer.optimizers:
            values["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        self.extras.set(values)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for logger in trainer.loggers:
            flush = getattr(logger, "flush", None)
            if callable(flush):
                flush()


def _loggers_write_now(trainer: pl.Trainer) -> bool:
    """Whether Lightning hands this batch's step metrics to the loggers (its own test, read at
    on_train_batch_end, before it counts the step); True if that test is not where it was."""
    connector = getattr(trainer, "_logger_connector", None)
    try:
        return bool(connector.should_update_logs) if trainer.loggers else False
    except AttributeError:
        return True


def run_loggers(run_dir: Path, *, resume_step: Optional[int], job_name: str) -> list[Logger]:
    """metrics.csv and TensorBoard, both cut at the step of the checkpoint this attempt resumes
    from: Lightning numbers a row by the steps finished before its batch, so the rows before
    step S were logged by batches the checkpoint of step S includes, and the rows from S on
    come from batches this attempt runs (again)."""
    purge = resume_step or 0
    job_id = os.environ.get(ENV_JOB_ID, "")
    return [
        ContinuingCSVLogger(run_dir, purge_step=purge),
        TensorBoardEvents(
            run_dir / TENSORBOARD,
            purge_step=purge,
            attempt=os.environ.get(ENV_ATTEMPT, ""),
            link_dir=os.environ.get(ENV_TENSORBOARD_DIR) or None,
            link_name=f"{job_name}-{job_id}" if job_id else job_name,
        ),
    ]


__all__ = [
    "ContinuingCSVLogger",
    "TensorBoardEvents",
    "RateAndLR",
    "StepExtras",
    "run_loggers",
    "link_tensorboard",
    "METRICS_CSV",
]
