"""The built-in runner's experiment trackers ([tracking] in job.toml): W&B and MLflow through
Lightning's own WandbLogger and MLFlowLogger, SwanLab through its own API (its Lightning logger
subclasses the `lightning` package's Logger, which this runner's `pytorch_lightning` Trainer does
not take). One run per job: W&B and SwanLab by the run id the job's uid gives
(contract.tracker_run_id), MLflow by the run id recorded in tracking.json, else its tag
`orch.job_uid`. Every attempt resumes that run; the run ends with the attempt's outcome only
when it is the job's (finished, failed) and is paused otherwise (exit 75, 76).

A tracker never fails or slows the job: each one runs on its own thread behind a bounded queue
(the step only enqueues; a full queue drops rows), its errors end its logging with one warning in
the log and in tracking.json, and closing waits a bounded time. Closing is never a queue slot a
full queue could drop: the worker sends what is queued until half the wait is spent, then ends
the run with the attempt's outcome. The libraries are imported on those threads, only when a job
asks for them.

A resumed attempt sends what metrics.csv keeps: a row is skipped only when an earlier attempt
sent a row of its kind at that step or later (the train rows a SIGKILL made it redo); the
validation due at a notice's step, run after the resume, is sent."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from orchestrator.contract import EX_CHECKPOINTED, EX_OK, EX_OOM, ENV_JOB_UID

from training.tracking.backends import BACKENDS, Backend, JobInfo, plain
from training.tracking.notes import TrackingNotes

QUEUE_ROWS = 10_000  # rows waiting for a slow tracker before new ones are dropped
NOTE_EVERY_S = 5.0  # how often a worker records the last step it sent
CLOSE_WAIT_S = {"finished": 60.0, "failed": 15.0, "paused": 8.0}  # a notice's grace is short


class TrackerWorker:
    """One backend on its own thread: calls are queued and run in order; the first error (or an
    `open` that fails) stops the tracker with one warning; the step never waits for it."""

    def __init__(self, backend: Backend, notes: TrackingNotes, floor: int, validation_floor: Optional[int] = None):
        self.backend, self.notes = backend, notes
        self.floor = floor  # rows at or below this step were sent by an earlier attempt (a SIGKILL redid them)
        self.validation_floor = floor if validation_floor is None else validation_floor  # the same, validation rows
        seen = validation_floor if validation_floor is not None and validation_floor >= 0 else None
        self.last_validation_step: Optional[int] = seen
        self.closing: Optional[str] = None  # the outcome close() asked for
        self.drain_until = float("inf")  # past this, rows still queued are dropped and the run is closed
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_ROWS)
        self.dropped = 0
        self.failed = False
        self.last_step: Optional[int] = None
        self._noted_at = 0.0
        self._noted_step: Optional[int] = None
        self.ready = threading.Event()  # set once open() returned or failed (benchmarks, tests)
        self.thread = threading.Thread(target=self._run, name=f"orch-tracker-{backend.name}", daemon=True)
        self.thread.start()

    def finish(self, outcome: str, drain_until: float) -> None:
        """End the run with `outcome` once the queue is sent, or at `drain_until` with what is left
        dropped. Never dropped itself: a flag, and a wake-up that only matters on an empty queue."""
        self.drain_until, self.closing = drain_until, outcome
        try:
            self.queue.put_nowait(("wake", ()))
        except queue.Full:
            pass  # the worker is not waiting: it reads `closing` after the row in hand

    def submit(self, method: str, *args: Any) -> None:
        if self.failed:
            return
        try:
            self.queue.put_nowait((method, args))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        try:
            self.notes.update(self.backend.name, warning=None, **self.backend.open())
        except BaseException as exc:  # noqa: BLE001 (ImportError, a dead server, a bad key)
            self._fail("could not start", exc)
            return
        finally:
            self.ready.set()
        while True:
            if self.closing is not None and (self.queue.empty() or time.monotonic() >= self.drain_until):
                self._close(self.closing)
                return
            method, args = self.queue.get()
            if method == "wake":
                continue
            try:
                if method == "metrics" and args[1] is not None and not self._new_row(args[0], args[1]):
                    continue  # sent before a SIGKILL; the redone step's values are the same
                getattr(self.backend, method)(*args)
            except BaseException as exc:  # noqa: BLE001
                self._fail(f"{method} failed", exc)
                return  # this tracker is done for the attempt; the step's calls are dropped
            self._note_step()

    def _new_row(self, row: Mapping[str, Any], step: int) -> bool:
        """Whether no earlier attempt sent a row of this kind at `step`; if so, it is recorded as sent."""
        validation = any(str(k).startswith("val_") for k in row)
        if step <= (self.validation_floor if validation else self.floor):
            return False
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        if validation:
            seen = self.last_validation_step
            self.last_validation_step = step if seen is None else max(seen, step)
        return True

    def _close(self, outcome: str) -> None:
        left = 0
        while True:  # past the drain deadline: what is still queued is dropped, the run still ends
            try:
                left += self.queue.get_nowait()[0] != "wake"
            except queue.Empty:
                break
        self.dropped += left
        try:
            self.backend.close(outcome)
        except BaseException as exc:  # noqa: BLE001
            self._fail("close failed", exc)
            return
        self._note_step(force=True)

    def _note_step(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.last_step != self._noted_step and (force or now - self._noted_at >= NOTE_EVERY_S):
            self._noted_at, self._noted_step = now, self.last_step
            self.notes.update(
                self.backend.name,
                last_step=self.last_step,
                last_validation_step=self.last_validation_step,
                dropped=self.dropped or None,
            )

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed = True
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.notes.warn(self.backend.name, f"{what}: {type(exc).__name__}: {first}")
        while True:  # nothing queued will run now
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return


class TrackerLogger(Logger):
    """A Lightning logger in front of a TrackerWorker: Lightning's calls only enqueue. Closed by
    Trackers.close with the attempt's outcome, not by Lightning's finalize (which cannot tell a
    preemption from the end)."""

    def __init__(self, worker: TrackerWorker):
        super().__init__()
        self.worker = worker
        self.extras: Any = None  # RateAndLR's StepExtras (lr, samples/s), handed in at train start
        self._extras_seen = 0

    @property
    def name(self) -> str:
        return f"orch-{self.worker.backend.name}"

    @property
    def version(self) -> str:
        return self.worker.backend.job.run_id or ""

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        params = vars(params) if not isinstance(params, Mapping) and hasattr(params, "__dict__") else params
        self.worker.submit("hyperparams", {k: plain(v) for k, v in dict(params).items()})

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        row = dict(metrics)
        if self.extras is not None:
            row, self._extras_seen = self.extras.merge_into(row, self._extras_seen)
        self.worker.submit("metrics", row, step)

    def finalize(self, status: str) -> None:
        pass


class Trackers:
    """The job's trackers for one attempt (rank 0 only)."""

    def __init__(self, workers: list[TrackerWorker]):
        self.workers = workers
        self.loggers: list[Logger] = [TrackerLogger(w) for w in workers]
        self.closed = False

    def resumed(self, step: int, checkpoint: Path) -> None:
        text = f"resumed at step {step} from {checkpoint.name}, machine {socket.gethostname()}"
        for w in self.workers:
            w.submit("resumed", step, text)

    def summary(self, values: dict[str, Any]) -> None:
        for w in self.workers:
            w.submit("summary", values)

    def hyperparams(self, values: dict[str, Any]) -> None:
        for w in self.workers:
            w.submit("hyperparams", {k: plain(v) for k, v in values.items()})

    def close(self, outcome: str) -> None:
        """outcome: "finished" (the job succeeded), "failed" (it ended with an error), "paused"
        (exit 75 or 76: it will resume). Waits at most CLOSE_WAIT_S[outcome] in all."""
        if self.closed:
            return
        self.closed = True
        now = time.monotonic()
        deadline = now + CLOSE_WAIT_S[outcome]
        for w in self.workers:
            if not w.failed:
                w.finish(outcome, now + CLOSE_WAIT_S[outcome] / 2)  # half to send what is queued, half to close
        for w in self.workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
            if w.thread.is_alive() and not w.failed:
                w.failed = True
                w.notes.warn(w.backend.name, f"did not finish within {CLOSE_WAIT_S[outcome]:.0f} s; left behind")


def open_trackers(
    tracking: Any,
    run_dir: Path,
    job_name: str,
    *,
    resume_step: Optional[int],
    make: Optional[Callable[[str, JobInfo], Backend]] = None,
) -> Optional[Trackers]:
    """The trackers [tracking] names, each started on its own thread (its library imported
    there). None without a [tracking] table."""
    if tracking is None or not tracking.backends:
        return None
    uid = os.environ.get(ENV_JOB_UID, "")
    notes = TrackingNotes(run_dir, uid)
    if "mlflow" in tracking.backends:  # a dead server must not keep a thread busy for minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    workers = []
    for name in tracking.backends:
        job = JobInfo(
            uid=uid,
            name=job_name,
            project=tracking.project or job_name,
            mode=tracking.mode,
            mlflow_uri=tracking.mlflow_uri,
            run_dir=run_dir,
        )
        job.recorded = notes.backend(name)
        job.resuming = resume_step is not None
        backend = (make or (lambda n, j: BACKENDS[n](j)))(name, job)
        last, last_validation = job.recorded.get("last_step"), job.recorded.get("last_validation_step")
        floor = last if resume_step is not None and isinstance(last, int) else -1
        # tracking.json before this was recorded: a validation row at the last step was not sent
        validation_floor = last_validation if isinstance(last_validation, int) and floor >= 0 else floor - 1
        if not uid:
            notes.warn(name, f"{ENV_JOB_UID} is not set (not started by orch): a new run each attempt")
        workers.append(TrackerWorker(backend, notes, floor, max(validation_floor, -1)))
    return Trackers(workers)


def exit_outcome(code: int) -> str:
    """The tracker outcome of an attempt's exit code: 0 finished; 75 and 76 (resumed next) paused."""
    return "finished" if code == EX_OK else ("paused" if code in (EX_CHECKPOINTED, EX_OOM) else "failed")


__all__ = ["Backend", "JobInfo", "Trackers", "TrackerLogger", "TrackerWorker", "open_trackers", "exit_outcome"]
