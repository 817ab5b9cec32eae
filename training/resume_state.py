"""What makes a Lightning resume exact beyond Lightning's own restore: the train loader's saved
position (applied, and moved past an epoch's end), every DDP rank's RNG stream, weights-only loads."""

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
    """In a StatefulDataLoader state built on training.sampler.ResumableSampler, move the position
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
