"""How an attempt of a built-in job ends other than by an exception: waiting for the other ranks
after a preemption, the OOM path (shrink the batch, exit EX_OOM), and the figures for result.json."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import ENV_ATTEMPT

from training.exits import EX_OOM, RunError
from training.builtin.job_plan import say


def wait_for_other_ranks(trainer, timeout: float = 20.0) -> None:
    """Rank 0 waits for the ranks it launched so nothing outlives the attempt."""
    procs = getattr(getattr(trainer.strategy, "launcher", None), "procs", None) or []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            proc.kill()


def out_of_memory(
    trainer, run_dir: Path, batch_size: int, accumulate: int, exc: BaseException, record_shrink, shrink
) -> int:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
    smaller = shrink(batch_size, accumulate)
    procs = getattr(getattr(trainer.strategy, "launcher", None), "procs", None) or []
    for proc in procs:  # the other ranks are stuck in a collective
        proc.kill()
    if smaller is None:
        raise RunError(
            f"out of GPU memory even at batch size 1 ({message}); use a smaller model, a shorter "
            "max_length, gradient_checkpointing = true, or a bigger GPU"
        )
    new_batch, new_accumulate = smaller
    record_shrink(
        run_dir,
        batch_size=batch_size,
        accumulate=accumulate,
        new_batch=new_batch,
        new_accumulate=new_accumulate,
        attempt=os.environ.get(ENV_ATTEMPT),
        step=int(trainer.global_step),
        error=message,
    )
    say(
        f"out of GPU memory at step {trainer.global_step} with batch {batch_size}: the next attempt uses batch "
        f"{new_batch} x accumulate {new_accumulate} (same effective batch) from the last periodic checkpoint; "
        f"exiting {EX_OOM}"
    )
    return EX_OOM


def _stopped_early(trainer, early) -> bool:
    """EarlyStopping fired *and* cut training short: patience running out in the last epoch, when
    training was ending anyway, is not an early stop."""
    if early is None or early.stopping_reason.value == 0:
        return False
    epochs_left = trainer.max_epochs is None or trainer.max_epochs < 0 or trainer.current_epoch < trainer.max_epochs
    steps_left = trainer.max_steps is None or trainer.max_steps < 0 or trainer.global_step < trainer.max_steps
    return bool(epochs_left and steps_left)


def result_figures(trainer, early, best, batch_size: int, accumulate: int, seconds: float) -> dict[str, Any]:
    metrics = {}
    for key, value in trainer.callback_metrics.items():
        try:
            metrics[key] = float(value)
        except (TypeError, ValueError):
            pass
    best_score = getattr(best, "best_model_score", None) if best else None
    return {
        "metrics": metrics,
        "best_metric": float(best_score) if best_score is not None else None,
        "best_monitor": best.monitor if best else None,
        "best_checkpoint": best.best_model_path or None if best else None,
        "steps": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "early_stopped": _stopped_early(trainer, early),
        "batch_size": batch_size,
        "accumulate_grad_batches": accumulate,
        "seconds": round(seconds, 2),
    }
