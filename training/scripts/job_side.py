"""The job side of the contract for scripts that are not Lightning (HF Trainer, plain PyTorch):
where the run folder and checkpoints are, a SIGTERM that only raises a flag, progress.json every
few seconds, and result.json at the end. Standard library only; used by training.scripts.hf_trainer and
training.scripts.torch_loop."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from orchestrator.contract import (
    ENV_ATTEMPT,
    ENV_CKPT_DIR,
    ENV_FAULT_SLOW_STEP_S,
    ENV_PROGRESS_EVERY_S,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    EX_CHECKPOINTED,
    PROGRESS,
    RESULT,
    write_json_atomic,
)

PROGRESS_EVERY_S = ENV_PROGRESS_EVERY_S  # tests poll faster than the default 3 s
FAULT_SLOW_STEP_S = ENV_FAULT_SLOW_STEP_S  # same knob as the built-in runner: a sleep per step for signal tests


class Preempted(SystemExit):
    """Raised after the notice checkpoint is durable: a SystemExit, so a plain script exits 75
    with no handling of its own."""

    def __init__(self, checkpoint: Optional[str]):
        self.checkpoint = checkpoint
        super().__init__(EX_CHECKPOINTED)


def env_path(name: str) -> Optional[Path]:
    value = os.environ.get(name)
    return Path(value) if value else None


def run_dir() -> Optional[Path]:
    return env_path(ENV_RUN_DIR)


def ckpt_dir() -> Optional[Path]:
    return env_path(ENV_CKPT_DIR)


def resume_env() -> Optional[Path]:
    return env_path(ENV_RESUME_FROM)


def later_attempt() -> bool:
    """True from the second attempt on (ORCH_ATTEMPT > 1): a resume is expected."""
    attempt = os.environ.get(ENV_ATTEMPT, "")
    return attempt.isdigit() and int(attempt) > 1


def say(message: str) -> None:
    print(f"[orch] {message}", file=sys.stderr, flush=True)


def slow_step() -> None:
    delay = float(os.environ.get(FAULT_SLOW_STEP_S) or 0)
    if delay > 0:
        time.sleep(delay)


class StopFlag:
    """SIGTERM (and SIGINT when asked) sets `requested`; the loop acts on it at the next
    optimizer-step boundary. A signal handler that raised instead could fire inside a library's
    bare `except` or halfway through an optimizer step."""

    def __init__(self, *, handle_sigint: bool = False):
        self.requested = False
        self.handle_sigint = handle_sigint
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if self._previous:
            return
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        if self.handle_sigint:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # a second Ctrl-C: stop without waiting for the checkpoint
        self.requested = True


def _number(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class Progress:
    """progress.json for `orch status` (step, total_steps, epoch, metrics, samples_per_s,
    updated_at), written atomically at most every `every_s` seconds unless forced."""

    def __init__(self, folder: Optional[Path], *, every_s: Optional[float] = None):
        self.folder = folder
        self.every_s = every_s or float(os.environ.get(PROGRESS_EVERY_S) or 3.0)
        self.metrics: dict[str, float] = {}
        self.samples_per_s: Optional[float] = None
        self.train_started_at = time.time()
        self.first_step_at: Optional[float] = None
        self._last_write = 0.0
        self._window_start = time.monotonic()
        self._window_samples = 0

    def update_metrics(self, metrics: Optional[Mapping[str, Any]]) -> None:
        for key, value in (metrics or {}).items():
            number = _number(value)
            if number is not None:
                self.metrics[str(key)] = number

    def step_done(self, samples: int = 0) -> bool:
        """Count one optimizer step's samples; True when a heartbeat is due."""
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self._window_samples += max(0, int(samples))
        now = time.monotonic()
        if now - self._last_write < self.every_s:
            return False
        elapsed = now - self._window_start
        if elapsed > 0 and self._window_samples:
            self.samples_per_s = self._window_samples / elapsed
        self._window_start, self._window_samples = now, 0
        return True

    def write(self, step: int, total_steps: Optional[int], epoch: Optional[float], **extra: Any) -> None:
        self._last_write = time.monotonic()
        if self.folder is None:
            return
        data = {
            "step": int(step),
            "total_steps": int(total_steps) if total_steps else None,
            "epoch": int(epoch) if epoch is not None else None,
            "metrics": dict(self.metrics),
            "samples_per_s": round(self.samples_per_s, 2) if self.samples_per_s else None,
            "updated_at": time.time(),
            "train_started_at": self.train_started_at,
            "first_step_at": self.first_step_at,
            **extra,
        }
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.folder / PROGRESS, data)
        except OSError as exc:  # a full disk must not kill training
            say(f"could not write {PROGRESS}: {exc}")

    def write_result(
        self,
        *,
        steps: int,
        epochs: Optional[float],
        metrics: Optional[Mapping[str, Any]] = None,
        best_metric: Optional[float] = None,
        best_checkpoint: Optional[str] = None,
    ) -> None:
        """result.json on success: with it, an exit 0 after the daemon's SIGTERM counts as done."""
        if self.folder is None:
            return
        self.update_metrics(metrics)
        data = {
            "metrics": dict(self.metrics),
            "best_metric": best_metric,
            "best_checkpoint": best_checkpoint,
            "steps": int(steps),
            "epochs": epochs,
            "early_stopped": False,
        }
        try:
            write_json_atomic(self.folder / RESULT, data)
        except OSError as exc:
            say(f"could not write {RESULT}: {exc}")
