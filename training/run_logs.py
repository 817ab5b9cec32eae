"""The built-in runner's metric logs: metrics.csv and TensorBoard event files in the run folder,
both continued across attempts, plus the learning rate and samples/s logged beside the loss.

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

from . import tb

NOT_METRICS = frozenset({"epoch", "step"})  # columns Lightning adds to every row


def keep_rows_before(path: Path, purge_step: int) -> list[str]:
    """Drop the rows of metrics.csv at steps >= purge_step (atomically); return its header."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = [r for r in reader if _step(r) is not None and _step(r) < purge_step]
    except FileNotFoundError:
        return []
    with atomic_file(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return header


def _step(row: dict[str, Any]) -> Optional[int]:
    try:
        return int(float(row.get("step") or ""))
    except ValueError:
        return None


class _ContinuingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, purge_step: int):
        self.purge_step = purge_step  # read by _check_log_dir_exists, which the base __init__ calls
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        # Lightning's version deletes metrics.csv; keep what earlier attempts logged before the cut.
        header = keep_rows_before(Path(self.metrics_file_path), self.purge_step)
        self.metrics_keys = sorted(k for k in header if k)


class ContinuingCSVLogger(CSVLogger):
    """CSVLogger(save_dir=run_dir, name="", version="") that continues metrics.csv."""

    def __init__(self, run_dir: str | Path, *, purge_step: int, flush_logs_every_n_steps: int = 1):
        super().__init__(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=flush_logs_every_n_steps)
        self.purge_step = purge_step

    @property
    @rank_zero_only
    def experiment(self) -> ExperimentWriter:  # type: ignore[override]
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(self.log_dir, self.purge_step)
        return self._experiment


class TensorBoardEvents(Logger):
    """Every logged metric as a TensorBoard scalar, tag = the metrics.csv column name. One events
    file per attempt under RUN_DIR/tensorboard/; `link_dir` also shows them under a folder named
    after the job (config [logging] tensorboard_dir, e.g. AutoDL's /root/tf-logs)."""

    def __init__(self, folder: str | Path, *, purge_step: int, attempt: str = "", link_dir: Optional[str] = None,
                 link_name: str = ""):
        super().__init__()
        self.folder = Path(folder)
        self.purge_step = purge_step
        self.attempt = attempt
        self.link_dir = link_dir
        self.link_name = link_name
        self._writer: Optional[tb.EventFileWriter] = None

    @property
    def name(self) -> str:
        return "tensorboard"

    @property
    def version(self) -> str:
        return ""

    @property
    def writer(self) -> tb.EventFileWriter:
        if self._writer is None:
            # Flushed at every write, like metrics.csv (a row every log_every_n_steps steps): after
            # a SIGKILL both hold the same rows.
            self._writer = tb.EventFileWriter(self.folder, purge_step=self.purge_step, flush_every_s=0.0,
                                              suffix=f"attempt-{self.attempt}" if self.attempt else "")
            if self.link_dir:
                link_tensorboard(self.folder, Path(self.link_dir), self.link_name)
        return self._writer

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        scalars = {k: v for k, v in metrics.items() if k not in NOT_METRICS}
        self.writer.add_scalars(scalars, int(step or 0))

    @rank_zero_only
    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def link_tensorboard(folder: Path, link_dir: Path, name: str) -> Optional[Path]:
    """<link_dir>/<name> -> the run's TensorBoard folder (a symlink; TensorBoard follows it).
    A failure is a warning, never the job's end."""
    link = link_dir / name
    try:
        link_dir.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and Path(os.readlink(link)) == folder.resolve():
            return link
        if link.is_symlink():
            link.unlink()
        link.symlink_to(folder.resolve(), target_is_directory=True)
        return link
    except OSError as exc:
        import sys

        print(f"[orch] warning: could not link {link} -> {folder}: {exc}", file=sys.stderr, flush=True)
        return None


class RateAndLR(pl.Callback):
    """Logs `lr` (the first parameter group's) and `samples_per_s` (over the last
    `window` batches, all ranks) at every step; the loggers keep every log_every_n_steps-th."""

    def __init__(self, window: int = 10):
        self.window = max(2, window)
        self._times: deque[tuple[float, int]] = deque(maxlen=self.window + 1)
        self._samples = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._times.clear()
        self._samples = 0
        self._times.append((time.monotonic(), 0))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._times.clear()  # validation time is not training throughput
        self._times.append((time.monotonic(), self._samples))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        from .callbacks import _count

        self._samples += _count(batch) * trainer.world_size
        now = time.monotonic()
        self._times.append((now, self._samples))
        values: dict[str, float] = {}
        (t0, s0) = self._times[0]
        if now > t0 and self._samples > s0:
            values["samples_per_s"] = (self._samples - s0) / (now - t0)
        if trainer.optimizers:
            values["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        if values:
            pl_module.log_dict(values, on_step=True, on_epoch=False, prog_bar=False, logger=True, batch_size=1)


def run_loggers(run_dir: Path, *, resume_step: Optional[int], job_name: str) -> list[Logger]:
    """metrics.csv and TensorBoard, both cut at the step of the checkpoint this attempt resumes
    from: Lightning numbers a row by the steps finished before its batch, so the rows before
    step S were logged by batches the checkpoint of step S includes, and the rows from S on
    come from batches this attempt runs (again)."""
    purge = resume_step or 0
    job_id = os.environ.get(ENV_JOB_ID, "")
    return [
        ContinuingCSVLogger(run_dir, purge_step=purge),
        TensorBoardEvents(run_dir / TENSORBOARD, purge_step=purge, attempt=os.environ.get(ENV_ATTEMPT, ""),
                          link_dir=os.environ.get(ENV_TENSORBOARD_DIR) or None,
                          link_name=f"{job_name}-{job_id}" if job_id else job_name),
    ]


__all__ = ["ContinuingCSVLogger", "TensorBoardEvents", "RateAndLR", "run_loggers", "link_tensorboard", "METRICS_CSV"]
