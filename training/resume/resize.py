"""OOM recovery: RUN_DIR/batch.json records the micro-batch and accumulation the next attempt
uses; a checkpoint saved at the old micro-batch is re-expressed in the new one (loop counters and
loader position) so the resumed epoch neither skips nor repeats a sample."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import BATCH as BATCH_FILE, read_json, write_json_atomic


def smallest_factor(n: int) -> int:
    for p in range(2, int(n**0.5) + 1):
        if n % p == 0:
            return p
    return n


def shrink(batch_size: int, accumulate: int) -> Optional[tuple[int, int]]:
    """Half the micro-batch and twice the accumulation; for an odd batch, divide by its smallest
    prime factor so the effective batch (batch x accumulation) stays exactly the same.
    None when the batch is already 1."""
    if batch_size <= 1:
        return None
    p = smallest_factor(batch_size)
    return batch_size // p, accumulate * p


def read_sizes(run_dir: Path) -> Optional[dict[str, Any]]:
    return read_json(Path(run_dir) / BATCH_FILE)


def record_shrink(
    run_dir: Path,
    *,
    batch_size: int,
    accumulate: int,
    new_batch: int,
    new_accumulate: int,
    attempt: Optional[str],
    step: Optional[int],
    error: str,
) -> dict[str, Any]:
    data = read_sizes(run_dir) or {"history": []}
    data["history"].append(
        {
            "attempt": attempt,
            "at": time.time(),
            "step": step,
            "error": error[:300],
            "from": {"batch_size": batch_size, "accumulate_grad_batches": accumulate},
            "to": {"batch_size": new_batch, "accumulate_grad_batches": new_accumulate},
        }
    )
    data["batch_size"], data["accumulate_grad_batches"] = new_batch, new_accumulate
    write_json_atomic(Path(run_dir) / BATCH_FILE, data)
    return data


def _scale_progress(progress: dict[str, Any], factor: int) -> None:
    """Batch counters x factor. `completed` keeps its lag behind `processed` (a checkpoint taken in
    on_train_batch_end has completed == processed - 1, which is how Lightning recognises where it
    stopped)."""
    for part in ("total", "current"):
        counters = progress.get(part)
        if not isinstance(counters, dict):
            continue
        lag = counters.get("processed", 0) - counters.get("completed", 0)
        for key in ("ready", "started", "processed"):
            if isinstance(counters.get(key), int):
                counters[key] *= factor
        if isinstance(counters.get("completed"), int):
            counters["completed"] = counters.get("processed", 0) - lag


def _scale_loader_state(state: Any, factor: int) -> None:
    """StatefulDataLoader state: batch counters scale, sample counters (the sampler's) do not."""
    if not isinstance(state, dict):
        return
    for key in ("_num_yielded", "_sampler_iter_yielded", "_snapshot_step"):
        if isinstance(state.get(key), int):
            state[key] *= factor
    for key in ("_snapshot", "_main_snapshot"):
        _scale_loader_state(state.get(key), factor)


def rescale_checkpoint(checkpoint: dict[str, Any], old_batch: int, new_batch: int) -> None:
    """Mutate a Lightning checkpoint saved at micro-batch `old_batch` so it resumes at `new_batch`
    (old_batch must be a multiple of new_batch). Optimizer steps and the LR schedule are untouched:
    the effective batch is the same."""
    if old_batch % new_batch:
        raise ValueError(f"cannot resume a checkpoint taken at batch {old_batch} with batch {new_batch}")
    factor = old_batch // new_batch
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit.get("epoch_loop.batch_progress")
    if isinstance(progress, dict):
        _scale_progress(progress, factor)
    for loader_state in fit.get("state_dict", {}).get("combined_loader", []) or []:
        _scale_loader_state(loader_state, factor)
    # epoch_loop._batches_that_stepped counts optimizer steps (logging x-axis): unchanged.
    checkpoint.setdefault("orch", {})["batch_size"] = new_batch
    checkpoint["orch"]["rescaled_from"] = old_batch


# -- another number of ranks (`orch retry --gpus N`) ---------------------------------------------
# The sampler deals the epoch's global order round-robin to the ranks, and a rank's position is
# counted in its own samples: G samples consumed in all = yielded x world. On W' ranks the same G
# is yielded' = G / W' per rank, and rank r goes on at order[G + r], the sample it would have had
# next on the old world too. Per-rank batch counters scale the same way; optimizer steps do not
# (the accumulation takes the factor: the effective batch is kept).


def rescaled_accumulation(accumulate: int, old_world: int, new_world: int) -> Optional[int]:
    """The accumulation that keeps batch x accumulate x world on `new_world` ranks; None when it
    cannot (the per-rank micro-batch stays)."""
    total = accumulate * old_world
    return total // new_world if total % new_world == 0 else None


def _scale(value: int, old_world: int, new_world: int) -> int:
    scaled, rest = divmod(value * old_world, new_world)
    if rest:
        raise ValueError(f"a position of {value} per rank on {old_world} ranks is not whole on {new_world}")
    return scaled


def _scale_world_loader(state: Any, old: int, new: int) -> None:
    if not isinstance(state, dict):
        return
    for key in ("_num_yielded", "_sampler_iter_yielded", "_snapshot_step", "samples_yielded", "yielded"):
        if isinstance(state.get(key), int):
            state[key] = _scale(state[key], old, new)
    for key in ("_snapshot", "_main_snapshot", "_sampler_iter_state", "sampler_iter_state"):
        _scale_world_loader(state.get(key), old, new)


def rescale_world(checkpoint: dict[str, Any], old_world: int, new_world: int) -> None:
    """Mutate a Lightning checkpoint taken on `old_world` ranks so it resumes on `new_world`: the
    per-rank batch counters and the loader's per-rank sample position re-expressed (ValueError when
    the position is not whole on the new world)."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit.get("epoch_loop.batch_progress")
    if isinstance(progress, dict):
        for part in ("total", "current"):
            counters = progress.get(part)
            if isinstance(counters, dict):
                lag = counters.get("processed", 0) - counters.get("completed", 0)
                for key in ("ready", "started", "processed"):
                    if isinstance(counters.get(key), int):
                        counters[key] = _scale(counters[key], old_world, new_world)
                counters["completed"] = counters.get("processed", 0) - lag
    for loader_state in fit.get("state_dict", {}).get("combined_loader", []) or []:
        _scale_world_loader(loader_state, old_world, new_world)
    checkpoint.setdefault("orch", {})["world_size"] = new_world
    checkpoint["orch"]["rescaled_from_world"] = old_world
