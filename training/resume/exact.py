"""What makes a Lightning resume exact beyond Lightning's own restore: the train loader's saved
position (applied, and moved past an epoch's end), the loader's own generator, every DDP rank's RNG
stream, weights-only loads."""

from __future__ import annotations

from typing import Any, Optional

import pytorch_lightning as pl
import torch


def apply_pending_loader_state(trainer: pl.Trainer) -> None:
    """Lightning 2.6 drops a resumed train loader's position when the loader was set up before the
    restore (anything that reads `trainer.estimated_stepping_batches` in configure_optimizers does
    that): the saved state waits in the fit loop and is never applied, and the epoch restarts from
    a fresh iterator. Apply it and rebuild the iterator."""
    fit_loop = trainer.fit_loop
    pending = getattr(fit_loop, "_combined_loader_states_to_load", None)
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    if not pending or fit_loop._combined_loader is None or fetcher is None:
        return
    fit_loop._combined_loader._load_state_dicts(pending)
    fit_loop._combined_loader_states_to_load = []
    iter(fetcher)


def _rewind_to_next_epoch(state: Any) -> bool:
    """In a StatefulDataLoader state built on training.resume.sampler.ResumableSampler, move the position
    to the start of the next epoch. False when the state is not of that shape."""
    if not isinstance(state, dict):
        return False
    found = False
    inner = state.get("_sampler_iter_state")
    if isinstance(inner, dict) and {"epoch", "yielded"} <= set(inner.get("sampler_iter_state") or {}):
        nxt = int(inner["sampler_iter_state"]["epoch"]) + 1
        state["_sampler_iter_state"] = {
            "samples_yielded": 0,
            "sampler_state": {"epoch": nxt},
            "sampler_iter_state": {"epoch": nxt, "yielded": 0},
        }
        found = True
    for key in ("_num_yielded", "_sampler_iter_yielded", "_snapshot_step", "_steps_since_snapshot"):
        if key in state:
            state[key] = 0
    if "_iterator_finished" in state:
        state["_iterator_finished"] = False
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, dict):
        main = snapshot.get("_main_snapshot") or {}
        found = _rewind_to_next_epoch(main) or found
        snapshot["_snapshot_step"] = 0
        # the next batch goes to worker 0, as in a fresh iterator
        snapshot["_last_yielded_worker_id"] = int(main.get("_num_workers", 1)) - 1
    return found


def fix_epoch_end_loader_state(checkpoint: dict[str, Any]) -> None:
    """A checkpoint taken on the last batch of an epoch holds an exhausted loader position;
    restored as is, the next epoch ends at once (Lightning does not start a new iterator when
    resuming). With orch's sampler the position is moved to the start of the next epoch (exact
    resume); any other loader state is dropped (the next epoch runs whole, in a fresh order)."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit.get("epoch_loop.batch_progress", {})
    loader_states = fit.get("state_dict", {}).get("combined_loader")
    if not (progress.get("is_last_batch") and loader_states):
        return
    fit["state_dict"]["combined_loader"] = [st if _rewind_to_next_epoch(st) else {} for st in loader_states]


def gather_rank_rng(trainer: Optional[pl.Trainer]) -> Optional[dict[str, Any]]:
    """Under DDP every rank's torch (and CUDA) generator, gathered into the checkpoint rank 0
    writes: the ranks' dropout streams differ, and restoring rank 0's on all of them made a
    resumed DDP run drift from an uninterrupted one. Every rank saves a checkpoint together
    (save_checkpoint is collective), so this gather runs on all of them at once."""
    if trainer is None or trainer.world_size <= 1:
        return None
    strategy = trainer.strategy
    device = strategy.root_device
    out: dict[str, Any] = {"world_size": trainer.world_size}
    # clone: each rank's own storage (a view into the gathered tensor would be saved with offsets)
    out["torch"] = [t.cpu().clone() for t in strategy.all_gather(torch.get_rng_state().to(device)).unbind(0)]
    if device.type == "cuda":
        out["cuda"] = [
            t.cpu().clone() for t in strategy.all_gather(torch.cuda.get_rng_state(device).to(device)).unbind(0)
        ]
    return out


def restore_rank_rng(state: Optional[dict[str, Any]], trainer: pl.Trainer) -> None:
    if not state or state.get("world_size") != trainer.world_size:
        return  # another world size: every rank keeps rank 0's stream (the old behaviour)
    rank = trainer.global_rank
    torch.set_rng_state(state["torch"][rank].to(torch.uint8).contiguous().clone())
    device = trainer.strategy.root_device
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"][rank].to(torch.uint8).contiguous().clone(), device)


def _train_loader_generators(trainer: Optional[pl.Trainer]) -> list[torch.Generator]:
    """The `generator=` of each train loader (None-free; [] before the loaders exist)."""
    combined = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
    if combined is None:
        return []
    loaders = combined.flattened
    return [g for g in (getattr(loader, "generator", None) for loader in loaders) if isinstance(g, torch.Generator)]


def capture_loader_generators(trainer: Optional[pl.Trainer]) -> Optional[list[torch.Tensor]]:
    """A train loader's own generator, as the checkpoint is taken. A resume builds the loader's
    iterator more than once (each draws a seed from that generator) before the saved position is
    applied: with the generator put back, the epochs after the resumed one draw the same order."""
    generators = _train_loader_generators(trainer)
    return [g.get_state() for g in generators] or None


def restore_loader_generators(states: Optional[list[Any]], trainer: pl.Trainer) -> None:
    generators = _train_loader_generators(trainer)
    if states and len(states) == len(generators):
        for generator, state in zip(generators, states):
            generator.set_state(state.to(torch.uint8).contiguous().clone())


def safe_loads(trainer: pl.Trainer) -> None:
    """Every checkpoint Lightning restores goes through torch.load(weights_only=True), whatever the
    caller passed and whatever the installed torch's default: a checkpoint is data, and one whose
    pickle would run code (a tampered file in the checkpoint folder) is refused, not run."""
    io = getattr(trainer.strategy, "checkpoint_io", None)
    if io is None or getattr(io, "_orch_weights_only", False):
        return
    load = io.load_checkpoint

    def load_weights_only(path: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return load(path, *args[:1], **kwargs)

    io.load_checkpoint = load_weights_only
    io._orch_weights_only = True


# -- a checkpoint between a step and its validation ----------------------------------------------
# Lightning ends a training step in two parts: the batch-end hooks and the step's logged row, then
# `on_advance_end` (the validation due at this step, ReduceLROnPlateau, the logging step count).
# It restores a checkpoint taken in between (a periodic one in on_train_batch_end, orch's notice)
# as "validation already run" and skips it, so a notice lost that step's validation row, and any
# such resume lost its effect on EarlyStopping, best.ckpt and a pruner. OrchCallback marks these
# checkpoints `validation_pending`; a resume from one runs that validation once, before its first
# step, and the run's loggers drop the row an earlier attempt may have written after the save.


def validation_due(trainer: pl.Trainer, data_fetcher: Any) -> bool:
    """Whether Lightning's `on_advance_end` is about to run a validation (its own test). The same
    answer on every rank: a time-based interval reads each rank's clock, so rank 0 decides."""
    loop = trainer.fit_loop.epoch_loop
    due = bool(loop._should_check_val_fx(data_fetcher)) and not loop._skip_next_val
    if trainer.world_size > 1:
        due = bool(trainer.strategy.broadcast(due))
    return due


def validation_follows(trainer: Optional[pl.Trainer]) -> bool:
    """For a checkpoint being written: taken in on_train_batch_end (the batch not yet counted
    complete) of a step whose end runs a validation. Rank 0's answer is the one saved."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if trainer is None or loop is None or not trainer.training or trainer.sanity_checking:
        return False
    try:
        total = loop.batch_progress.total
        if total.completed != total.processed - 1:
            return False
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)) and not loop._skip_next_val
    except (AttributeError, AssertionError):  # another Lightning: as before, no validation is redone
        return False


def as_taken_in_batch_end(checkpoint: dict[str, Any]) -> None:
    """Make a checkpoint taken after Lightning counted the batch complete (and before it counted the
    logging step) read as one taken in on_train_batch_end: the state Lightning resumes from by
    counting the step and going on with the next batch, also at an epoch's end."""
    _shift_completed(checkpoint, -1)


def redo_validation(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
    """Resuming from a checkpoint marked `validation_pending`: make Lightning restart by ending the
    checkpoint's step (as after a save in on_validation_end), where OrchCallback lets the
    validation run, and have the run's loggers drop that validation's row if an earlier attempt
    wrote one after the save (the rerun writes it again, from the state the checkpoint holds)."""
    _shift_completed(checkpoint, +1)
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    step = fit.get("epoch_loop.state_dict", {}).get("_batches_that_stepped")
    if not isinstance(step, int):
        return
    for logger in trainer.loggers:
        drop = getattr(logger, "drop_validation_at", None)
        if callable(drop):
            drop(step)


def _shift_completed(checkpoint: dict[str, Any], by: int) -> None:
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
    lag = 0 if by < 0 else 1  # -1: from completed == processed; +1: from completed == processed - 1
    for part in ("total", "current"):
        counters = progress.get(part)
        if isinstance(counters, dict) and counters.get("processed", 0) - counters.get("completed", 0) == lag:
            counters["completed"] += by


def step_end_hookable(trainer: pl.Trainer) -> bool:
    """Whether this Lightning has the epoch loop internals the deferred notice relies on."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return loop is not None and all(
        hasattr(loop, name)
        for name in ("on_advance_end", "_should_check_val_fx", "_skip_next_val", "val_loop", "update_lr_schedulers")
    )


def restore_callback_metrics(trainer: pl.Trainer, values: dict[str, float]) -> None:
    """The metrics a checkpoint's run had last logged, as `trainer.callback_metrics` (where
    ReduceLROnPlateau, EarlyStopping and ModelCheckpoint read them), for the keys this attempt has
    not logged yet."""
    connector = getattr(trainer, "_logger_connector", None)
    current = getattr(connector, "_callback_metrics", None)
    if not isinstance(current, dict):
        return
    for key, value in values.items():
        current.setdefault(key, torch.tensor(float(value)))
