"""One attempt of a built-in job: spec -> data, model, Trainer -> fit -> result.json + model/.
Maps the ways an attempt ends onto the contract's exit codes (see training.exits)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import (
    ENV_ATTEMPT,
    ENV_CKPT_DIR,
    ENV_JOB_ID,
    ENV_RUN_DIR,
    JOB_TOML,
    RESULT,
    checkpoint_dir,
    model_dir,
)
from orchestrator.spec.jobspec import TASK_CLASSIFY, JobSpec, load_resolved, metric_problem

from training.exits import EX_CHECKPOINTED, EX_FAIL, EX_OK, ConfigError, EarlyStop, RunError, install_early_sigterm
from training.builtin.job_end import out_of_memory, result_figures, wait_for_other_ranks
from training.builtin.job_plan import (
    choose_resume,
    is_rank_zero,
    plan_devices,
    resolve_sizes,
    say,
    sharded_run,
    total_steps,
)
from training.builtin.job_trainer import (
    FinalCheckpoint,
    build_callbacks,
    checkpoint_io,
    progress_bar,
    quiet_known_warnings,
    reap_loader_workers,
    slurm_plugins,
)


def load_spec(run_dir: Path) -> JobSpec:
    spec = load_resolved(run_dir / JOB_TOML)
    if spec.is_command:
        raise RunError(f"{run_dir / JOB_TOML} is a command job; run its command, not the built-in fine-tune")
    return spec


def load_error(what: str, name_or_path: str, exc: OSError) -> RunError:
    """A tokenizer or model that cannot be loaded: from a local folder that is the folder's fault
    every time (exit 78); from the hub it may be the network (a plain failure, retried)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    local = os.path.isabs(name_or_path) and not isinstance(exc, (PermissionError, TimeoutError))
    return (ConfigError if local else RunError)(f"cannot load {what} {name_or_path!r}: {first}")


def ddp_needs_subprocess(run_dir: Path) -> bool:
    """DDP re-launches sys.argv for the other ranks, so a multi-process job cannot run inside a
    foreign program (the `orch` CLI): it has to be `python -m training.run`."""
    import __main__

    main_name = getattr(getattr(__main__, "__spec__", None), "name", None)
    if main_name == "training.run":
        return False
    return load_spec(run_dir).gpus > 1


def run_job(run_dir: Path, *, progress: bool = False) -> int:
    """One attempt; its trackers' runs ([tracking]) end with its outcome: finished on success,
    paused when it exits 75 or 76 to be resumed, failed otherwise."""
    opened: dict[str, Any] = {}
    code = EX_FAIL
    try:
        code = _run_job(run_dir, progress=progress, opened=opened)
        return code
    except EarlyStop:
        code = EX_CHECKPOINTED
        raise
    finally:
        trackers = opened.get("trackers")
        if trackers is not None:
            from training.tracking.trackers import exit_outcome

            trackers.close(exit_outcome(code))


def other_world(resume: Optional[Path], world: int, batch_size: int, accumulate: int) -> tuple[int, int]:
    """A checkpoint written on another number of ranks (`orch retry --gpus N`): its micro-batch,
    and the accumulation that keeps its effective batch on this many (exit 78 when none can)."""
    from training.resume.checkpoints import saved_geometry
    from training.resume.resize import rescaled_accumulation

    saved = saved_geometry(resume)
    old = int(saved.get("world_size") or 0)
    if not old or old == world or resume is None:
        return batch_size, accumulate
    batch, acc = int(saved["batch_size"]), int(saved["accumulate_grad_batches"])
    new_acc = rescaled_accumulation(acc, old, world)
    if new_acc is None:
        raise ConfigError(
            f"{resume.name} was written by {old} ranks at batch {batch} x accumulate {acc}: its effective batch "
            f"({batch * acc * old}) cannot be kept on {world} rank(s); retry with a number of GPUs that divides {acc * old}"
        )
    if is_rank_zero():
        say(
            f"{resume.name} was written by {old} rank(s): resuming on {world} with batch {batch} x accumulate {new_acc}"
        )
    return batch, new_acc


def _tracker_hyperparams(spec: JobSpec, batch_size: int, accumulate: int) -> dict[str, Any]:
    assert spec.model is not None and spec.train is not None and spec.data is not None
    values: dict[str, Any] = {f"train.{k}": v for k, v in spec.train.model_dump().items() if v is not None}
    values.update(
        {
            "model.name_or_path": spec.model.name_or_path,
            "model.task": spec.model.task,
            "data.train": spec.data.train,
            "data.max_length": spec.data.max_length,
            "batch_size": batch_size,
            "accumulate_grad_batches": accumulate,
        }
    )
    if spec.lora is not None:
        values.update({f"lora.{k}": v for k, v in spec.lora.model_dump().items() if v is not None})
    return values


def _run_job(run_dir: Path, *, progress: bool, opened: dict[str, Any]) -> int:
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

    quiet_known_warnings()
    import atexit
    import multiprocessing.util  # noqa: F401  (registers its exit hook now, so ours runs before it)

    atexit.register(reap_loader_workers)
    import pytorch_lightning as pl
    import torch
    from transformers import AutoTokenizer

    from orchestrator.contract import parse_checkpoint_name

    from training.scripts.lightning import Preempted
    from training.heartbeat.health import Diverged, HealthCallback
    from training.logs.run_logs import RateAndLR, run_loggers
    from training.resume.checkpoints import AtomicCheckpointIO
    from training.builtin.data import DataError
    from training.builtin.rows import max_length_note
    from training.builtin.tasks import export, make_data, make_module
    from training.resume.resize import record_shrink, shrink

    rank0 = is_rank_zero()
    plan = plan_devices(spec)
    if rank0:
        for note in plan["notes"]:
            say("warning: " + note)
    batch_size, accumulate = resolve_sizes(spec, run_dir)
    resume = choose_resume(ckpt_dir)
    batch_size, accumulate = other_world(resume, plan["world"], batch_size, accumulate)
    factor = max(1, train.batch_size // batch_size)
    if rank0:
        say(
            f"job {os.environ.get(ENV_JOB_ID, '?')} attempt {os.environ.get(ENV_ATTEMPT, '?')}: "
            f"batch {batch_size} x accumulate {accumulate}; "
            + (f"resuming from {resume.name}" if resume else "starting from scratch")
        )
        from training.heartbeat.system_info import record_runtime

        say("environment: " + record_runtime(run_dir))

    pl.seed_everything(train.seed, workers=True, verbose=False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.model.name_or_path)
    except OSError as exc:
        raise load_error("the tokenizer of", spec.model.name_or_path, exc) from None
    cut = max_length_note(spec.data.max_length, tokenizer)
    if rank0 and cut:
        say(f"warning: {cut}")
    data = make_data(spec, tokenizer, batch_size)
    try:
        data.prepare()
    except DataError as exc:
        raise ConfigError(str(exc)) from None
    num_labels = data.resolved_num_labels or spec.model.num_labels
    monitored = spec.early_stopping.monitor if spec.early_stopping else None
    problem = metric_problem(monitored, spec.model.task, num_labels) if monitored else None
    if problem:  # string labels are counted only now: early stopping would wait for a metric never logged
        raise ConfigError(f"early_stopping.monitor: {problem}")
    if rank0 and num_labels != spec.model.num_labels and spec.model.task == TASK_CLASSIFY:
        say(
            f"warning: the training data has {num_labels} distinct labels; using num_labels = {num_labels} "
            f"(job.toml says {spec.model.num_labels})"
        )
    sharded = sharded_run(spec, plan["world"], resume)
    try:
        model = make_module(
            spec,
            data,
            num_labels,
            sharded=sharded,
            learning_rate=train.learning_rate,
            weight_decay=train.weight_decay,
            warmup_ratio=train.warmup_ratio,
            batch_size=batch_size,
            total_steps=total_steps(len(data.splits["train"]), plan["world"], batch_size, accumulate, train),
        )
    except OSError as exc:
        raise load_error("the model", spec.model.name_or_path, exc) from None

    strategy, precision, plugins = plan["strategy"], plan["precision"], [checkpoint_io(spec, AtomicCheckpointIO)]
    if sharded:
        from training.builtin.fsdp import ShardedStrategy, sharding

        strategy = ShardedStrategy(
            plan["world"],
            keep=spec.checkpoint.keep,
            trained_only=spec.lora is not None,
            background=spec.checkpoint.background,
        )
        model.shard, precision = sharding(plan, train.cpu_offload)
        plugins = []  # the sharded strategy writes its own checkpoints (no CheckpointIO)
        if rank0:
            say(
                f"fsdp: {plan['world']} rank(s), each holding 1/{plan['world']} of the parameters, gradients and optimizer state"
            )

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
    if progress:
        callbacks.append(progress_bar())
    resume_name = parse_checkpoint_name(resume) if resume else None
    val_interval = train.val_check_interval
    if isinstance(val_interval, int):
        val_interval *= factor  # counted in micro-batches, which shrank after an OOM
    loggers = run_loggers(run_dir, resume_step=resume_name.step if resume_name else None, job_name=spec.name or "job")
    if rank0 and spec.tracking is not None:
        from training.tracking.trackers import open_trackers

        trackers = open_trackers(
            spec.tracking, run_dir, spec.name or "job", resume_step=resume_name.step if resume_name else None
        )
        if trackers is not None:
            opened["trackers"] = trackers
            loggers += trackers.loggers
            trackers.hyperparams(_tracker_hyperparams(spec, batch_size, accumulate))
            if resume is not None and resume_name is not None:
                trackers.resumed(resume_name.step, resume)
    trainer = pl.Trainer(
        default_root_dir=str(run_dir),
        accelerator=plan["accelerator"],
        devices=plan["devices"],
        num_nodes=plan["num_nodes"],
        strategy=strategy,
        precision=precision,
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
        plugins=[*plugins, *slurm_plugins()],
        logger=loggers,
        log_every_n_steps=10,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_progress_bar=progress,
        enable_model_summary=progress,
    )
    try:
        trainer.fit(model, datamodule=data, ckpt_path=str(resume) if resume else None)
    except Preempted:
        wait_for_other_ranks(trainer)
        return EX_CHECKPOINTED if rank0 else EX_OK
    except torch.cuda.OutOfMemoryError as exc:
        return out_of_memory(trainer, run_dir, batch_size, accumulate, exc, record_shrink, shrink)
    except Diverged as exc:  # health.json tells the daemon; the exit is a plain failure
        raise RunError(str(exc)) from None
    install_early_sigterm()  # Lightning restored its pre-fit handlers; keep "SIGTERM = exit 75" after fit

    full_state = None
    if sharded:  # every rank takes part in the gather; rank 0 alone ends up with the whole model
        from training.builtin.fsdp import gather_full_state

        full_state = gather_full_state(model)
    if not rank0:
        return EX_OK
    export(spec, model, tokenizer, model_dir(run_dir), full_state=full_state)
    result = result_figures(trainer, early, best, batch_size, accumulate, time.monotonic() - started)
    from orchestrator.contract import write_json_atomic

    write_json_atomic(run_dir / RESULT, result)
    if opened.get("trackers") is not None:
        final = dict(result.get("metrics") or {})
        opened["trackers"].summary({**final, "steps": result.get("steps"), "model_path": str(model_dir(run_dir))})
    say(f"done: {result['steps']} steps, {result['epochs']} epochs, metrics {result['metrics']}")
    return EX_OK
