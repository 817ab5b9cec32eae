"""TensorBoard event files for the built-in runner (tensorboardX's record writer), continued across
attempts: each attempt's file starts with SessionLog.START at the step it resumes from, so
TensorBoard drops what a SIGKILL made the job redo, as metrics.csv does (training/logs/run_logs.py).
Written by one thread, off the step; flushed before every checkpoint and at the end."""

from __future__ import annotations

import csv
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from orchestrator.contract import METRICS_CSV

from training.logs.metric_rows import FLUSH_EVERY_S, NOT_METRICS, StepExtras, is_validation, row_step


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
                rows = [r for r in csv.DictReader(fh) if row_step(r) == step and not is_validation(r)]
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
