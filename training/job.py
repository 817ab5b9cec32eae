"""One attempt of a built-in job: spec -> data, model, Trainer -> fit -> result.json + model/.
Maps the ways an attempt ends onto the contract's exit codes (see training.exits)."""

from __future__ import annotations

import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import (
    ENV_ATTEMPT,
    ENV_CKPT_DIR,
    ENV_JOB_ID,
    ENV_RESUME_CHECKED,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    JOB_TOML,
    PERIODIC_FILENAME_TEMPLATE,
    RESULT,
    checkpoint_dir,
    model_dir,
)
from orchestrator.jobspec import TASK_CLASSIFY, JobSpec, load_resolved

from .exits import EX_CHECKPOINTED, EX_OK, EX_OOM, RunError, install_early_sigterm

RESUME_CHECKED_ENV = ENV_RESUME_CHECKED


def say(msg: str) -> None:
    print(f"[orch] {msg}", file=sys.stderr, flush=True)


def _is_rank_zero() -> bool:
    if under_srun():
        return int(os.environ["SLURM_PROCID"]) == 0
    return int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def under_srun() -> bool:
    """A task of an `srun` step (orch's Slurm executor runs one rank per GPU per node this way)."""
    return "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ


def srun_geometry() -> tuple[int, int]:
    """(tasks per node, nodes) of the srun step: Lightning's devices and num_nodes."""
    nodes = int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    return (int(per_node) if per_node.isdigit() else max(1, int(os.environ["SLURM_NTASKS"]) // nodes)), nodes


def load_spec(run_dir: Path) -> JobSpec:
    spec = load_resolved(run_dir / JOB_TOML)
    if spec.is_command:
        raise RunError(f"{run_dir / JOB_TOML} is a command job; run its command, not the built-in fine-tune")
    return spec


def ddp_needs_subprocess(run_dir: Path) -> bool:
    """DDP re-launches sys.argv for the other ranks, so a multi-process job cannot run inside a
    foreign program (the `orch` CLI): it has to be `python -m training.run`."""
    import __main__

    main_name = getattr(getattr(__main__, "__spec__", None), "name", None)
    if main_name == "training.run":
        return False
    return load_spec(run_dir).gpus > 1


def plan_devices(spec: JobSpec) -> dict[str, Any]:
    """accelerator/devices/strategy/precision for this machine, plus one-line warnings."""
    import torch

    notes: list[str] = []
    train = spec.train
    assert train is not None
    cuda = torch.cuda.is_available()
    precision = train.precision
    if cuda and spec.gpus > 0:
        plan = {"accelerator": "gpu", "devices": spec.gpus}
    else:
        # gpus > 1 without CUDA runs that many CPU processes (gloo): how DDP is tested on CPU.
        plan = {"accelerator": "cpu", "devices": max(1, spec.gpus)}
        if spec.gpus > 0 and not cuda:
            notes.append(f"no CUDA GPU visible: running on the CPU ({plan['devices']} process(es))")
        if precision == "16-mixed":
            notes.append('precision "16-mixed" needs CUDA; running in "32" on the CPU')
            precision = "32"
    plan["precision"] = "32-true" if precision == "32" else precision
    plan["num_nodes"] = 1
    if under_srun():
        # Slurm started every rank (orch's Slurm executor: nodes x gpus tasks); Lightning joins them
        # through its SLURMEnvironment, with the geometry it validates against.
        plan["devices"], plan["num_nodes"] = srun_geometry()
    plan["world"] = plan["devices"] * plan["num_nodes"]
    plan["strategy"] = "ddp" if plan["world"] > 1 else "auto"
    plan["notes"] = notes
    return plan


def resolve_sizes(spec: JobSpec, run_dir: Path) -> tuple[int, int]:
    from .resize import read_sizes

    train = spec.train
    assert train is not None
    sizes = read_sizes(run_dir)
    if sizes:
        return int(sizes["batch_size"]), int(sizes["accumulate_grad_batches"])
    return train.batch_size, train.accumulate_grad_batches


def choose_resume(ckpt_dir: Path) -> Optional[Path]:
    """ORCH_RESUME_FROM if it loads, else the newest valid checkpoint by the step in its name.
    The other DDP ranks inherit the choice through the environment."""
    from .checkpoints import latest_valid_checkpoint, remove_orphan_temps

    if os.environ.get(RESUME_CHECKED_ENV) == "1" and not _is_rank_zero():
        value = os.environ.get(ENV_RESUME_FROM, "")
        return Path(value) if value else None
    for orphan in remove_orphan_temps(ckpt_dir):
        say(f"removed {orphan.name}, left by a save that was interrupted")
    chosen = latest_valid_checkpoint(
        ckpt_dir, prefer=os.environ.get(ENV_RESUME_FROM) or None, warn=lambda msg: say("warning: " + msg)
    )
    os.environ[ENV_RESUME_FROM] = str(chosen) if chosen else ""
    os.environ[RESUME_CHECKED_ENV] = "1"
    return chosen


def total_steps(rows: int, world: int, batch_size: int, accumulate: int, train) -> int:
    """Lightning's estimated_stepping_batches, computed without touching the trainer's loader.
    Unchanged by an OOM shrink: ceil(ceil(n/(b/p)) / (a*p)) == ceil(n/(a*b))."""
    batches = math.ceil(math.ceil(rows / world) / batch_size)
    per_epoch = math.ceil(batches / accumulate)
    total = per_epoch * train.max_epochs if train.max_epochs else None
    if train.max_steps:
        total = min(total, train.max_steps) if total else train.max_steps
    return max(1, int(total or 1))


def build_callbacks(spec: JobSpec, ckpt_dir: Path, *, has_val: bool, progress: bool):
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from .callbacks import OrchCallback

    from .goodput import GoodputMeter

    orch = OrchCallback(ckpt_dir=ckpt_dir, log_every_s=None if progress else 30.0, handle_sigint=progress)
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
    if ck.every == "auto":  # Young/Daly from the measured save cost (training/autointerval.py)
        from .autointerval import auto_checkpoint

        callbacks.append(auto_checkpoint(spec, ckpt_dir))
    if ck.every_n_steps and ck.every != "auto":
        callbacks.append(ModelCheckpoint(every_n_train_steps=ck.every_n_steps, **common))
    if ck.every_minutes and ck.every != "auto":
        callbacks.append(ModelCheckpoint(train_time_interval=timedelta(minutes=ck.every_minutes), **common))
    early = None
    es = spec.early_stopping
    from .tasks import DEFAULT_MONITOR

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


def run_job(run_dir: Path, *, progress: bool = False) -> int:
    started = time.monotonic()
    spec = load_spec(run_dir)
    for key, value in spec.env.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault(ENV_RUN_DIR, str(run_dir))
    ckpt_dir = Path(os.environ.get(ENV_CKPT_DIR) or checkpoint_dir(run_dir))
    os.environ.setdefault(ENV_CKPT_DIR, str(ckpt_dir))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    assert spec.model is not None and spec.data is not None and spec.train is not None
    train = spec.train

    _quiet_known_warnings()
    import atexit
    import multiprocessing.util  # noqa: F401  (registers its exit hook now, so ours runs before it)

    atexit.register(reap_loader_workers)
    import pytorch_lightning as pl
    import torch
    from transformers import AutoTokenizer

    from orchestrator.contract import parse_checkpoint_name

    from .callbacks import Preempted
    from .health import Diverged, HealthCallback
    from .run_logs import RateAndLR, run_loggers
    from .checkpoints import AtomicCheckpointIO
    from .data import DataError
    from .tasks import export, make_data, make_module
    from .resize import record_shrink, shrink

    rank0 = _is_rank_zero()
    plan = plan_devices(spec)
    if rank0:
        for note in plan["notes"]:
            say("warning: " + note)
    batch_size, accumulate = resolve_sizes(spec, run_dir)
    factor = max(1, train.batch_size // batch_size)
    resume = choose_resume(ckpt_dir)
    if rank0:
        say(
            f"job {os.environ.get(ENV_JOB_ID, '?')} attempt {os.environ.get(ENV_ATTEMPT, '?')}: "
            f"batch {batch_size} x accumulate {accumulate}; "
            + (f"resuming from {resume.name}" if resume else "starting from scratch")
        )

    pl.seed_everything(train.seed, workers=True, verbose=False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.model.name_or_path)
    except OSError as exc:
        raise RunError(
            f"cannot load the tokenizer of {spec.model.name_or_path!r}: {str(exc).splitlines()[0]}"
        ) from None
    data = make_data(spec, tokenizer, batch_size)
    try:
        data.prepare()
    except DataError as exc:
        raise RunError(str(exc)) from None
    num_labels = data.resolved_num_labels or spec.model.num_labels
    if rank0 and num_labels != spec.model.num_labels and spec.model.task == TASK_CLASSIFY:
        say(
            f"warning: the training data has {num_labels} distinct labels; using num_labels = {num_labels} "
            f"(job.toml says {spec.model.num_labels})"
        )
    try:
        model = make_module(
            spec,
            data,
            num_labels,
            learning_rate=train.learning_rate,
            weight_decay=train.weight_decay,
            warmup_ratio=train.warmup_ratio,
            batch_size=batch_size,
            total_steps=total_steps(len(data.splits["train"]), plan["world"], batch_size, accumulate, train),
        )
    except OSError as exc:
        raise RunError(f"cannot load the model {spec.model.name_or_path!r}: {str(exc).splitlines()[0]}") from None

    has_val = "validation" in data.splits
    orch_cb, early, best, callbacks = build_callbacks(spec, ckpt_dir, has_val=has_val, progress=progress)
    callbacks.append(FinalCheckpoint(ckpt_dir))
    callbacks += [
        HealthCallback(
            run_dir,
            ckpt_dir,
            flat_after_steps=train.flat_after_steps,
            flat_min_improvement=train.flat_min_improvement,
            attempt=os.environ.get(ENV_ATTEMPT, ""),
        ),
        RateAndLR(),
    ]
    resume_name = parse_checkpoint_name(resume) if resume else None
    val_interval = train.val_check_interval
    if isinstance(val_interval, int):
        val_interval *= factor  # counted in micro-batches, which shrank after an OOM
    trainer = pl.Trainer(
        default_root_dir=str(run_dir),
        accelerator=plan["accelerator"],
        devices=plan["devices"],
        num_nodes=plan["num_nodes"],
        strategy=plan["strategy"],
        precision=plan["precision"],
        accumulate_grad_batches=accumulate,
        max_epochs=train.max_epochs if train.max_epochs is not None else -1,
        max_steps=train.max_steps if train.max_steps is not None else -1,
        val_check_interval=val_interval if has_val else None,
        # a whole number of batches counts across epochs (so it may exceed one epoch, as with
        # max_steps); Lightning's default counts within each epoch and refuses a longer interval
        check_val_every_n_epoch=None if isinstance(val_interval, int) else 1,
        limit_val_batches=None if has_val else 0,
        gradient_clip_val=train.gradient_clip_val or None,
        deterministic=train.deterministic,
        callbacks=callbacks,
        plugins=[checkpoint_io(spec, AtomicCheckpointIO), *slurm_plugins()],
        logger=run_loggers(run_dir, resume_step=resume_name.step if resume_name else None, job_name=spec.name or "job"),
        log_every_n_steps=10,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_progress_bar=progress,
        enable_model_summary=progress,
    )
    try:
        trainer.fit(model, datamodule=data, ckpt_path=str(resume) if resume else None)
    except Preempted:
        _wait_for_other_ranks(trainer)
        return EX_CHECKPOINTED if rank0 else EX_OK
    except torch.cuda.OutOfMemoryError as exc:
        return _out_of_memory(trainer, run_dir, batch_size, accumulate, exc, record_shrink, shrink)
    except Diverged as exc:  # health.json tells the daemon; the exit is a plain failure
        raise RunError(str(exc)) from None
    install_early_sigterm()  # Lightning restored its pre-fit handlers; keep "SIGTERM = exit 75" after fit

    if not rank0:
        return EX_OK
    export(spec, model, tokenizer, model_dir(run_dir))
    result = _result(trainer, early, best, batch_size, accumulate, time.monotonic() - started)
    from orchestrator.contract import write_json_atomic

    write_json_atomic(run_dir / RESULT, result)
    say(f"done: {result['steps']} steps, {result['epochs']} epochs, metrics {result['metrics']}")
    return EX_OK


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
    """[checkpoint] background (default): periodic saves written off the step (training/snapshot.py)."""
    if spec.checkpoint.background:
        from .snapshot import BackgroundCheckpointIO

        return BackgroundCheckpointIO(keep=spec.checkpoint.keep)
    return atomic(keep=spec.checkpoint.keep)


def FinalCheckpoint(ckpt_dir: Path):
    """Saves step-<final>.ckpt when training ends (before Lightning shuts the loaders down), so a
    crash during export is retried from the end, not from the last periodic checkpoint."""
    import pytorch_lightning as pl

    from .checkpoints import periodic_name

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


def _quiet_known_warnings() -> None:
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


def _wait_for_other_ranks(trainer, timeout: float = 20.0) -> None:
    """Rank 0 waits for the ranks it launched so nothing outlives the attempt."""
    procs = getattr(getattr(trainer.strategy, "launcher", None), "procs", None) or []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            proc.kill()


def _out_of_memory(
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


def _result(trainer, early, best, batch_size: int, accumulate: int, seconds: float) -> dict[str, Any]:
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
