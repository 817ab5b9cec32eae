"""Where an attempt's time goes, measured in the runner for the goodput ledger: the time the step
waited on the DataLoader, on checkpoint saves and on evaluation, and when the first step began.
Counters live in memory (time.perf_counter, no device sync); they reach the daemon inside the
throttled progress.json under "goodput", keyed by attempt, so a SIGKILLed attempt keeps the figures
of its last heartbeat and the next attempt carries them forward."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl

from orchestrator.contract import ENV_ATTEMPT, ENV_PROBE_WARMUP, ENV_RUN_DIR, PROGRESS, read_json, write_json_atomic

# The estimate's probe: the step at which its steady-state clock starts (after the warm-up), and
# the file in its temporary run folder where the meter leaves its figures.
PROBE = "probe.json"


class GoodputMeter(pl.Callback):
    """Data wait = the gap between one batch's end and the next one's start (the loader's fetch
    lives there), less the checkpoint saves and evaluation that also run in that gap."""

    def __init__(self, run_dir: Optional[Path] = None, attempt: Optional[str] = None):
        self.attempt = attempt or os.environ.get(ENV_ATTEMPT) or "1"
        self.previous = _earlier_attempts(run_dir, self.attempt)
        self.data_wait_s = self.checkpoint_s = self.eval_s = self.step_s = 0.0
        self.steps = self.checkpoints = self.evals = 0
        self.first_step_at: Optional[float] = None  # Unix time this attempt's first batch began
        self._batch_start = 0.0
        self._batch_end: Optional[float] = None
        self._marks = (0.0, 0.0)  # checkpoint_s and eval_s at the last batch end
        self._eval_start: Optional[float] = None
        self.warmup = int(os.environ.get(ENV_PROBE_WARMUP) or 0)
        # (step, perf_counter, checkpoint_s, eval_s) at the end of warm-up and at the latest step
        self.steady: Optional[tuple[int, float, float, float]] = None
        self.last_step: Optional[tuple[int, float, float, float]] = None
        self.run_dir = run_dir
        self.batches_per_epoch: Optional[float] = None
        self.last_step_at: Optional[float] = None
        # The probe: this process's CPU time at the steady mark and the latest step (all its
        # threads), and the machine's runnable tasks sampled at each steady step end: what load
        # does not move (CPU per step) and the load the probe ran under.
        self._cpu_marks = (0.0, 0.0)
        self._runnable: list[int] = []
        # each steady batch's wall time, batch end to batch end (saves and evaluation left out):
        # how far a few slow batches (page faults, a cold cache, a neighbour's burst) pulled the
        # rate down from the probe's typical batch
        self._steady_batch_s: list[float] = []

    # -- the step and the gap before it ----------------------------------------------------------
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at = time.time()
        elif self._batch_end is not None:
            gap = now - self._batch_end - (self.checkpoint_s - self._marks[0]) - (self.eval_s - self._marks[1])
            self.data_wait_s += max(0.0, gap)
        self._batch_start = now

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        self.step_s += now - self._batch_start
        self.steps += 1
        self._batch_end = now
        self._marks = (self.checkpoint_s, self.eval_s)
        if self.warmup:
            mark = (trainer.global_step, now, self.checkpoint_s, self.eval_s)
            if self.steady is None and mark[0] >= self.warmup:
                self.steady = mark
                self._cpu_marks = (time.process_time(), time.process_time())
            elif self.steady is not None:
                self._cpu_marks = (self._cpu_marks[0], time.process_time())
                if self.last_step is not None:
                    prev = self.last_step
                    self._steady_batch_s.append((now - prev[1]) - (mark[2] - prev[2]) - (mark[3] - prev[3]))
                runnable = _runnable_now()
                if runnable is not None:
                    self._runnable.append(runnable)
            self.last_step = mark
            self.last_step_at = time.time()

    # -- evaluation -------------------------------------------------------------------------------
    def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._eval_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._eval_start is not None:
            self.eval_s += time.perf_counter() - self._eval_start
            self.evals += 1
            self._eval_start = None

    # -- checkpoint saves: every caller goes through trainer.save_checkpoint ----------------------
    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if getattr(trainer.save_checkpoint, "_goodput_timed", False):
            return
        original = trainer.save_checkpoint

        def timed_save(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.checkpoint_s += time.perf_counter() - t0
                self.checkpoints += 1

        timed_save._goodput_timed = True  # type: ignore[attr-defined]
        trainer.save_checkpoint = timed_save  # type: ignore[method-assign]

    # -- what progress.json carries ----------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        own = {
            "first_step_at": self.first_step_at,
            "data_wait_s": round(self.data_wait_s, 4),
            "checkpoint_s": round(self.checkpoint_s, 4),
            "eval_s": round(self.eval_s, 4),
            "step_s": round(self.step_s, 4),
            "steps": self.steps,
            "checkpoints": self.checkpoints,
            "evals": self.evals,
        }
        return {"goodput": {**self.previous, self.attempt: own}}

    def steady_rate(self) -> Optional[float]:
        """Optimizer steps per second after the warm-up, saves and evaluation left out (the
        estimate adds those from their own measurements)."""
        if self.steady is None or self.last_step is None:
            return None
        (s0, t0, c0, e0), (s1, t1, c1, e1) = self.steady, self.last_step
        steps, seconds = s1 - s0, (t1 - t0) - (c1 - c0) - (e1 - e0)
        return steps / seconds if steps > 0 and seconds > 0 else None

    def cpu_per_wall(self) -> Optional[float]:
        """Cores this process kept busy over the steady window (CPU seconds per wall second)."""
        if self.steady is None or self.last_step is None:
            return None
        wall = self.last_step[1] - self.steady[1]
        return (self._cpu_marks[1] - self._cpu_marks[0]) / wall if wall > 0 else None

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.batches_per_epoch = trainer.num_training_batches

    def teardown(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        """The probe's figures, once training is over (the final save included)."""
        folder = self.run_dir or (Path(os.environ[ENV_RUN_DIR]) if os.environ.get(ENV_RUN_DIR) else None)
        if not self.warmup or folder is None or trainer.global_rank != 0:
            return
        own = self.figures()["goodput"][self.attempt]
        write_json_atomic(
            folder / PROBE,
            {
                **own,
                "steady_steps_per_s": self.steady_rate(),
                "steady_steps": (self.last_step[0] - self.steady[0]) if self.steady and self.last_step else 0,
                "steady_cpu_per_wall": self.cpu_per_wall(),
                "steady_typical_share": typical_share(self._steady_batch_s),
                "others_runnable": (sum(self._runnable) / len(self._runnable)) if self._runnable else None,
                "batches_per_epoch": self.batches_per_epoch,
                "last_step_at": self.last_step_at,
                # saves and evaluation after the last step (not the end's own time)
                "after_last_step_s": (self.checkpoint_s - self.last_step[2] + self.eval_s - self.last_step[3])
                if self.last_step
                else 0.0,
            },
        )


def typical_share(batch_s: list[float]) -> Optional[float]:
    """The median batch's time ÷ the mean batch's: 1 when every batch took as long, less when a few
    slow ones pulled the mean up. None under five batches (too few to tell)."""
    times = [t for t in batch_s if t > 0]
    if len(times) < 5:
        return None
    return min(1.0, statistics.median(times) / statistics.fmean(times))


def _earlier_attempts(run_dir: Optional[Path], attempt: str) -> dict[str, Any]:
    """The figures earlier attempts left in progress.json (this attempt overwrites the file)."""
    folder = run_dir or (Path(os.environ[ENV_RUN_DIR]) if os.environ.get(ENV_RUN_DIR) else None)
    if folder is None:
        return {}
    earlier = (read_json(folder / PROGRESS) or {}).get("goodput")
    if not isinstance(earlier, dict):
        return {}
    return {k: v for k, v in earlier.items() if k != attempt and isinstance(v, dict)}


def _runnable_now() -> Optional[int]:
    """Runnable tasks on the machine now that are not this process's own threads (procs_running
    in /proc/stat less our threads in state R; Linux); None elsewhere."""
    try:
        with open("/proc/stat", "rb") as fh:
            total = next((int(line.split()[1]) for line in fh if line.startswith(b"procs_running ")), None)
        if total is None:
            return None
        ours = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
                    ours += fh.read().rsplit(b")", 1)[1].split()[0] == b"R"
            except OSError:  # the thread ended meanwhile
                pass
        return max(0, total - ours)
    except (OSError, ValueError, IndexError):
        return None
