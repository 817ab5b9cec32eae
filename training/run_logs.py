"""The built-in runner's metric logs: metrics.csv and TensorBoard event files (tensorboardX) in
the run folder, both continued across attempts, plus the learning rate and samples/s logged
beside the loss. Off the step where it can be: metrics.csv is written at most every
FLUSH_EVERY_S (a validation row at once), TensorBoard events by tensorboardX's own thread, and both are flushed before
every checkpoint (so a resumed attempt finds every row from before its step) and at the end.

Lightning's CSVLogger deletes an existing metrics.csv when a new process starts, so a resumed
attempt used to wipe its predecessors' curve. Here each attempt keeps the rows logged before the
step it resumes from and drops the ones it will log again (steps a SIGKILL made it redo); the
TensorBoard file of the attempt starts with the same cut (SessionLog.START at that step), so
both hold the same values."""

from __future__ import annotations

import csv
import os
import queue
import sys
import threading
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

NOT_METRICS = frozenset({"epoch", "step"})  # columns Lightning adds to every row
FLUSH_EVERY_S = 5.0  # metrics.csv and TensorBoard lag training by at most this (and the log interval)


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
                if _step(r) is not None
                and _step(r) < purge_step  # type: ignore[operator]
                and not (_step(r) == validation_at and _is_validation(r))
            ]
    except FileNotFoundError:
        return []
    with atomic_file(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return header


def _is_validation(row: dict[str, Any]) -> bool:
    return any(k.startswith("val_") and v not in (None, "") for k, v in row.items() if k)


def _step(row: dict[str, Any]) -> Optional[int]:
    try:
        return int(float(row.get("step") or ""))
    except ValueError:
        return None


class _ContinuingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, purge_step: int, validation_at: Optional[int] = None):
        # read by _check_log_dir_exists, which the base __init__ calls
        self.purge_step, self.validation_at = purge_step, validation_at
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        # Lightning's version deletes metrics.csv; keep what earlier attempts logged before the cut.
        header = keep_rows_before(Path(self.metrics_file_path), self.purge_step, validation_at=self.validation_at)
        self.metrics_keys = sorted(k for k in header if k)


class StepExtras:
    """Values added to the next train-step row of each of the run's loggers (lr, samples/s), set by
    RateAndLR without LightningModule.log: a log call runs a torchmetrics update per value, and
    was the largest single cost orch added to a step (benchmarks/callbacks.py)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.generation = 0

    def set(self, values: dict[str, float]) -> None:
        self.values, self.generation = values, self.generation + 1

    def merge_into(self, metrics: dict[str, Any], seen: int) -> tuple[dict[str, Any], int]:
        """(metrics plus the values a logger has not had yet, the generation it has now seen)."""
        if self.generation == seen or not self.values:
            return metrics, self.generation
        return {**metrics, **self.values}, self.generation


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
        again (training/resume_state.py): drop the row an earlier attempt wrote after the save."""
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


class EventsThread:
    """tensorboardX's EventsWriter (the record framing, its CRC and the protobufs) fed by one
    thread, so building and writing events happens off the step; `flush` returns once every event
    handed in is in the file. (tensorboardX's SummaryWriter does this too, but its flush() skips
    its queue, and only close() drains it.)"""

    def __init__(self, folder: Path, *, purge_step: Optional[int], suffix: str, flush_every_s: float):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self._event = Event
        self._writer = EventsWriter(str(folder / "events"), suffix)  # writes its file_version event
        if purge_step is not None:  # TensorBoard drops what earlier files hold from this step on
            self._writer.write_event(
                Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START))
            )
        self._writer.flush()
        self.path = Path(self._writer._file_name)
        self.flush_every_s = flush_every_s
        self._queue: queue.Queue[Optional[tuple[float, int, Optional[dict[str, float]]]]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="orch-tensorboard", daemon=True)
        self._thread.start()

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        self._queue.put((time.time(), step, scalars))

    def restart_at(self, step: int) -> None:
        """A SessionLog START at `step`: TensorBoard drops what it read before with step >= `step`."""
        self._queue.put((time.time(), step, None))

    def _run(self) -> None:
        from tensorboardX.proto.event_pb2 import SessionLog
        from tensorboardX.proto.summary_pb2 import Summary

        last_flush = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=self.flush_every_s)
            except queue.Empty:
                item = ()
            try:
                if item is None:
                    self._writer.close()
                    return
                if item:
                    wall_time, step, scalars = item
                    if scalars is None:  # restart_at
                        start = SessionLog(status=SessionLog.START)
                        self._writer.write_event(self._event(wall_time=wall_time, step=step, session_log=start))
                    else:
                        values = [Summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
                        summary = Summary(value=values)
                        self._writer.write_event(self._event(wall_time=wall_time, step=step, summary=summary))
                if time.monotonic() - last_flush >= self.flush_every_s:
                    self._writer.flush()
                    last_flush = time.monotonic()
            except OSError as exc:  # a full disk must not kill training
                print(f"[orch] could not write {self.path.name}: {exc}", file=sys.stderr, flush=True)
            finally:
                if item != ():
                    self._queue.task_done()

    def flush(self) -> None:
        self._queue.join()
        self._writer.flush()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class TensorBoardEvents(Logger):
    """Every logged metric as a TensorBoard scalar, tag = the metrics.csv column name. One events
    file per attempt under RUN_DIR/tensorboard/, starting with a SessionLog START at the step the
    attempt resumes from (TensorBoard then drops what earlier attempts logged from that step on);
    `link_dir` also shows them under a folder named after the job (config [logging]
    tensorboard_dir, e.g. AutoDL's /root/tf-logs)."""

    def __init__(
        self,
        folder: str | Path,
        *,
        purge_step: int,
        attempt: str = "",
        link_dir: Optional[str] = None,
        link_name: str = "",
        flush_every_s: float = FLUSH_EVERY_S,
    ):
        super().__init__()
        self.folder = Path(folder)
        self.purge_step = purge_step
        self.attempt = attempt
        self.link_dir = link_dir
        self.link_name = link_name
        self.flush_every_s = flush_every_s
        self._writer: Optional[EventsThread] = None
        self.extras: Optional[StepExtras] = None  # RateAndLR hands its own in at train start
        self._extras_seen = 0

    @property
    def name(self) -> str:
        return "tensorboard"

    @property
    def version(self) -> str:
        return ""

    @property
    def writer(self) -> EventsThread:
        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = EventsThread(
                self.folder,
                purge_step=self.purge_step,
                flush_every_s=self.flush_every_s,
                suffix=f".attempt-{self.attempt}" if self.attempt else "",
            )
            if self.link_dir:
                link_tensorboard(self.folder, Path(self.link_dir), self.link_name)
        return self._writer

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @rank_zero_only
    def drop_validation_at(self, step: int) -> None:
        """As ContinuingCSVLogger's: the validation of `step` runs again. TensorBoard drops by step,
        all tags at once, so the cut moves to `step` and the step's other rows (its train row,
        which is not logged again) are written again from metrics.csv."""
        rows = []
        try:
            with open(self.folder.parent / METRICS_CSV, newline="", encoding="utf-8") as fh:
                rows = [r for r in csv.DictReader(fh) if _step(r) == step and not _is_validation(r)]
        except OSError:
            pass
        self.writer.restart_at(step)
        for row in rows:
            scalars = {}
            for key, value in row.items():
                if key and key not in NOT_METRICS and value not in (None, ""):
                    try:
                        scalars[key] = float(value)
                    except ValueError:
                        continue
            if scalars:
                self.writer.add_scalars(scalars, step)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        if self.extras is not None:
            metrics, self._extras_seen = self.extras.merge_into(metrics, self._extras_seen)
        scalars = {}
        for tag, value in metrics.items():
            if tag not in NOT_METRICS:
                try:
                    scalars[str(tag)] = float(value)
                except (TypeError, ValueError):
                    continue
        if scalars:
            self.writer.add_scalars(scalars, int(step or 0))

    @rank_zero_only
    def save(self) -> None:
        pass  # the writer thread flushes every flush_every_s

    @rank_zero_only
    def flush(self) -> None:
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
        from .callbacks import _count

        self._samples += _count(batch) * trainer.world_size
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
