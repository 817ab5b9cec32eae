"""What the built-in runner hands Lightning's Trainer (its callbacks, the checkpoint IO, the Slurm
environment) and the process set-up around it (known warnings quieted, loader workers reaped)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import PERIODIC_FILENAME_TEMPLATE
from orchestrator.spec.jobspec import JobSpec

from training.exits import RunError
from training.builtin.job_plan import under_srun


def build_callbacks(spec: JobSpec, ckpt_dir: Path, *, has_val: bool, progress: bool):
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from training.scripts.lightning import OrchCallback

    from training.heartbeat.goodput import GoodputMeter

    orch = OrchCallback(
        ckpt_dir=ckpt_dir, log_every_s=None if progress else 30.0, handle_sigint=progress, script_trackers=False
    )
    meter = GoodputMeter()
    orch.progress_extras.append(meter.figures)
    callbacks: list[Any] = [meter, orch]
    common = dict(
        dirpath=str(ckpt_dir),
        filename=PERIODIC_FILENAME_TEMPLATE,
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_last=False,
        enable_version_counter=False,
        save_on_train_epoch_end=False,
    )
    ck = spec.checkpoint
    if ck.every == "auto":  # Young/Daly from the measured save cost (training/resume/autointerval.py)
        from training.resume.autointerval import auto_checkpoint

        callbacks.append(auto_checkpoint(spec, ckpt_dir))
    if ck.every_n_steps and ck.every != "auto":
        callbacks.append(ModelCheckpoint(every_n_train_steps=ck.every_n_steps, **common))
    if ck.every_minutes and ck.every != "auto":
        callbacks.append(ModelCheckpoint(train_time_interval=timedelta(minutes=ck.every_minutes), **common))
    early = None
    es = spec.early_stopping
    from training.builtin.tasks import DEFAULT_MONITOR

    monitor, mode = (es.monitor, es.resolved_mode) if es else DEFAULT_MONITOR[spec.model.task]
    if es:
        if es.monitor.startswith("val_") and not has_val:
            raise RunError(f"early_stopping.monitor = {es.monitor!r} needs data.validation")
        early = EarlyStopping(monitor=es.monitor, mode=es.resolved_mode, patience=es.patience, min_delta=es.min_delta)
        callbacks.append(early)
    best = None
    if has_val or monitor == "train_loss":
        best = ModelCheckpoint(
            dirpath=str(ckpt_dir),
            filename="best",
            monitor=monitor,
            mode=mode,
            save_top_k=1,
            auto_insert_metric_name=False,
            enable_version_counter=False,
            save_last=False,
        )
        callbacks.append(best)
    return orch, early, best, callbacks


def slurm_plugins() -> list:
    """Under srun: Lightning's SLURMEnvironment with its auto-requeue OFF (no SIGUSR1 handler, no
    `scontrol requeue` of its own): orch alone requeues, by submitting the next attempt after the
    job's exit 75, so ORCH_ATTEMPT stays orch's count. MASTER_ADDR in the environment, if set,
    names the rank-0 host (Lightning reads it before the node list)."""
    if not under_srun():
        return []
    from pytorch_lightning.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]


def checkpoint_io(spec: JobSpec, atomic: Any) -> Any:
    """[checkpoint] background (default): periodic saves written off the step (training/resume/snapshot.py)."""
    if spec.checkpoint.background:
        from training.resume.snapshot import BackgroundCheckpointIO

        return BackgroundCheckpointIO(keep=spec.checkpoint.keep)
    return atomic(keep=spec.checkpoint.keep)


def FinalCheckpoint(ckpt_dir: Path):
    """Saves step-<final>.ckpt when training ends (before Lightning shuts the loaders down), so a
    crash during export is retried from the end, not from the last periodic checkpoint."""
    import pytorch_lightning as pl

    from training.resume.checkpoints import periodic_name

    class _Final(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            path = ckpt_dir / periodic_name(trainer.global_step)
            # one decision for all ranks: save_checkpoint ends with a barrier
            if not trainer.strategy.broadcast(path.exists()):
                trainer.save_checkpoint(str(path), weights_only=False)

    return _Final()


def reap_loader_workers() -> None:
    """DataLoader workers ignore SIGTERM (see data.ignore_sigterm), so multiprocessing's exit
    hook, which terminates leftover daemonic children with SIGTERM and joins them, would wait
    forever for a worker Lightning did not shut down. Kill any left at exit."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def quiet_known_warnings() -> None:
    """Warnings that are expected in this runner and would only alarm a user reading the log, and
    Lightning's advertising: its "💡 Tip" lines and its hint to use `srun` on a machine that has
    Slurm (orch launches the job itself; under orch's Slurm executor it already runs under srun)."""
    import logging
    import warnings

    for pattern in (
        ".*set_vital.*",
        ".*LeafSpec.*",
        ".*Experiment logs directory.*",
        ".*exists and is not empty.*",
        ".*does not have many workers.*",
        ".*recommended to use `self.log.*sync_dist=True.*",
        ".*is smaller than the logging interval.*",
        ".*The `srun` command is available on your system but is not used.*",
    ):
        warnings.filterwarnings("ignore", message=pattern)

    def no_adverts(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")

    import lightning_fabric  # noqa: F401  (each adds its stderr handler on import: filter those)
    import pytorch_lightning  # noqa: F401

    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.addFilter(no_adverts)
        for handler in logger.handlers:
            handler.addFilter(no_adverts)


def last_epoch(trainer: Any) -> Optional[int]:
    """The index of the last epoch this fit runs (Lightning counts from 0): from max_epochs, or
    from max_steps and the steps per epoch, whichever ends first; None when neither bounds it."""
    import math

    bounds = []
    if trainer.max_epochs is not None and trainer.max_epochs >= 0:
        bounds.append(trainer.max_epochs - 1)
    batches = trainer.num_training_batches
    if trainer.max_steps is not None and trainer.max_steps > 0 and batches and math.isfinite(batches):
        per_epoch = math.ceil(batches / max(1, trainer.accumulate_grad_batches))
        bounds.append(math.ceil(trainer.max_steps / per_epoch) - 1)
    return max(0, min(bounds)) if bounds else None


def progress_bar() -> Any:
    """Lightning's own bar (Rich when installed), with the epoch count a job bounded by max_steps
    runs: Lightning's writes "Epoch 1/-2" when max_epochs is -1."""
    from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar
    from pytorch_lightning.callbacks.progress.rich_progress import _RICH_AVAILABLE

    if not _RICH_AVAILABLE:
        return TQDMProgressBar()  # ("Epoch N" only)

    class EpochsBar(RichProgressBar):
        def _get_train_description(self, current_epoch: int) -> str:
            last = last_epoch(self.trainer)
            text = f"Epoch {current_epoch}" + (f"/{last}" if last is not None else "")
            return f"{text:{len(self.validation_description)}}"  # (as Lightning pads it: no flicker)

    return EpochsBar()
