"""OrchShardedLoop: OrchLoop for a plain PyTorch loop whose model is sharded with FSDP2
(`fully_shard`) over torch.distributed ranks (torchrun). Every rank calls it the same way:

    dist.init_process_group(...)  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR
    for block in model.encoder.layer: fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), ...)
    orch = OrchShardedLoop(model, optimizer, scheduler, total_steps=..., save_every=...)
    pos = orch.resume() or {"epoch": 0, "batch": 0}
    ...the same loop as OrchLoop's: orch.skip(loader, n), orch.step_done(data=...), orch.finish()

Its checkpoints are the built-in runner's sharded folders (training/resume/sharded.py): each rank
writes its shards of the model and the optimizer through torch.distributed.checkpoint into a temp
folder, then rank 0 writes `meta.pt` (the step, the scheduler, the scaler, every rank's RNG state,
the data position) and renames the folder into place, so the daemon picks the newest complete one
by name and a torn one is skipped. The ranks agree on the notice step (one all-reduce of a flag per
step): all save at the same step, then exit 75. Resumed on the same number of ranks it is exact;
on another, DCP reshards the model and the optimizer (the RNG streams are rank 0's and the data
position means what the script makes it mean)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from orchestrator.contract import TEMP_MARK, notice_name, periodic_name, step_checkpoints

from training.resume.rng import capture as capture_rng, restore as restore_rng
from training.resume.sharded import (
    commit_folder,
    folder_problem,
    load_meta,
    load_shards,
    prepare_folder,
    shard_state,
    temp_folder,
)
from training.scripts import job_side
from training.resume.ranks import all_ranks_here, any_rank
from training.scripts.job_side import say
from training.scripts.torch_loop import OrchLoop

FORMAT = "orch.sharded_loop/1"


class OrchShardedLoop(OrchLoop):
    def __init__(
        self, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None, **kw: Any
    ):
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world = dist.get_world_size() if distributed else 1
        super().__init__(model, optimizer, scheduler, scaler, **kw)
        # the flag's all-reduce runs on the default group: NCCL needs it on this rank's GPU
        nccl = distributed and dist.get_backend() == "nccl"
        self._flag_device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def _writes_run_files(self) -> bool:
        return self.rank == 0

    def _stop_now(self) -> bool:
        return any_rank(self.stop.requested, self._flag_device)

    def _optimizers(self) -> list[Any]:
        return [self.optimizer] if self.optimizer is not None else []

    # -- resume --------------------------------------------------------------------------------
    def resume(self) -> Optional[Any]:
        """Every rank: the newest complete folder (ORCH_RESUME_FROM first) into the model and
        optimizer, resharded onto this world; the scheduler, scaler, step and this rank's RNG state
        from its meta.pt; the data position saved with it (None on a fresh start)."""
        prefer = job_side.resume_env()
        candidates = [prefer] if prefer else []
        candidates += [p for p, _ in step_checkpoints(self.ckpt_dir) if p != prefer]
        for path in candidates:
            problem = folder_problem(path) if Path(path).is_dir() else "is not a sharded checkpoint folder"
            meta: dict[str, Any] = {}
            if problem is None:
                try:
                    meta = load_meta(path)
                except Exception as exc:  # a torn or foreign meta.pt
                    problem = f"has an unreadable meta.pt ({type(exc).__name__})"
                else:
                    problem = None if meta.get("format") == FORMAT else f"is not an {FORMAT} checkpoint"
            if problem is not None:
                if self.rank == 0:
                    say(f"skipping checkpoint {path}: it {problem}")
                continue
            load_shards(Path(path), self.model, self._optimizers(), trained_only=False)
            for obj, key in ((self.scheduler, "scheduler"), (self.scaler, "scaler")):
                if obj is not None and meta.get(key) is not None:
                    obj.load_state_dict(meta[key])
            self.step, self.epoch = int(meta["step"]), meta.get("epoch")
            rngs = meta["rng"]
            same = int(meta.get("world_size") or 0) == self.world
            self._pending_rng = rngs[self.rank] if same else rngs[0]
            restore_rng(self._pending_rng)
            self.resumed_from = Path(path)
            if self.rank == 0:
                written = "" if same else f" (written by {meta.get('world_size')} ranks: resharded onto {self.world})"
                say(f"resumed from {path} at step {self.step}{written}")
            self.progress.write(self.step, self.total_steps, self.epoch)
            return meta.get("data")
        return None

    # -- saving --------------------------------------------------------------------------------
    def save(self, *, data: Any = None, notice: bool = False) -> Path:
        """Every rank, at the same step: its shards, then rank 0's meta.pt and the rename."""
        import torch.distributed.checkpoint as dcp

        path = self.ckpt_dir / (notice_name(self.step) if notice else periodic_name(self.step))
        temp = temp_folder(path)
        if self.rank == 0:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            prepare_folder(path)
        all_ranks_here()
        dcp.save(shard_state(self.model, self._optimizers(), trained_only=False), checkpoint_id=str(temp))
        rngs: list[Any] = [None] * self.world
        if self.world > 1:
            dist.all_gather_object(rngs, capture_rng())
        else:
            rngs[0] = capture_rng()
        if self.rank == 0:
            meta = {
                "format": FORMAT,
                "step": self.step,
                "epoch": self.epoch,
                "world_size": self.world,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rngs,
                "data": data,
            }
            commit_folder(temp, path, meta)
            self._prune()
        all_ranks_here()  # no rank goes on (or exits 75) before the folder counts
        return path

    def finish(self, metrics: Any = None) -> None:
        all_ranks_here()
        super().finish(metrics)

    # -- housekeeping (rank 0) -----------------------------------------------------------------
    def _prune(self) -> None:
        found = step_checkpoints(self.ckpt_dir)
        periodic = [p for p, n in found if not n.notice]
        notices = [p for p, n in found if n.notice]
        for path in periodic[max(1, self.keep) :] + notices[1:]:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    def _remove_orphan_temps(self) -> None:
        """Temp folders of a save that a kill interrupted."""
        if not self.ckpt_dir.is_dir():
            return
        for entry in self.ckpt_dir.iterdir():
            if entry.name.startswith(TEMP_MARK):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
