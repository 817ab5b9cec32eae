"""[train] strategy = "fsdp": FSDP2 (`fully_shard`) over the job's ranks through Lightning's
ModelParallelStrategy, with orch's own sharded checkpoints (training/resume/sharded.py): written
to a temp folder and renamed into place once complete, read back onto any number of ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.api import CheckpointException

from orchestrator.contract import parse_checkpoint_name

from training.resume.checkpoints import is_sharded, prune_checkpoints, step_of
from training.resume.sharded import commit_folder, load_meta, load_shards, prepare_folder, shard_state
from training.resume.sharded_full import local_bytes, settle_save


def _then(future: Any, action: Any) -> Any:
    """A future that completes once `future` has and `action` (rank 0's commit) has run after it,
    in the save's thread: a periodic checkpoint counts as soon as it is whole."""
    from concurrent.futures import Future

    done: Future = Future()

    def finish(inner: Any) -> None:
        try:
            inner.result()
            action()
            done.set_result(None)
        except BaseException as exc:  # the next save (or the teardown) raises it
            done.set_exception(exc)

    future.add_done_callback(finish)
    return done


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks sharded one by one (each gathers its parameters just before it runs and frees
    them after): the transformer layers, named by the model's own `_no_split_modules` (what
    transformers' device maps never split), found through a peft wrapper too."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def fsdp_policy(on_gpu: bool, precision: str, cpu_offload: bool) -> dict[str, Any]:
    """fully_shard's keyword arguments: bf16 parameters with fp32 gradient reduction when a GPU
    runs mixed precision; the shards in host memory with cpu_offload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {}
    if on_gpu and precision in ("bf16-mixed", "16-mixed"):
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def sharding(plan: dict[str, Any], cpu_offload: bool) -> tuple[Any, str]:
    """The module's `shard` hook and the Trainer's precision: FSDP's mixed precision policy
    casts the parameters, so Lightning runs in "32-true" and does not autocast on top."""
    import functools

    policy = fsdp_policy(plan["accelerator"] == "gpu", plan["precision"], cpu_offload)
    precision = "32-true" if "mp_policy" in policy else plan["precision"]
    return functools.partial(apply_fsdp, policy=policy), precision


def gather_full_state(module: Any) -> dict[str, Any]:
    """The whole model's state dict, on the CPU of rank 0 (empty on the others): a collective,
    every rank calls it once, for the export."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(module.model, options=options)


def apply_fsdp(module: Any, mesh: Any, policy: dict[str, Any]) -> None:
    """Shard the LightningModule's model: each block, then the whole (what is left: embeddings,
    head). Called from the module's configure_model, once the mesh exists."""
    from torch.distributed.fsdp import fully_shard

    model = module.model
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)


class ShardedStrategy(ModelParallelStrategy):
    """Data parallel over every rank (one mesh dimension), FSDP2 applied by the module, and
    checkpoints as folders that count only once complete. `trained_only`: LoRA, whose frozen base
    is reloaded from model.name_or_path, keeps only the adapters in its checkpoints. `background`:
    periodic saves through DCP's async save (the state copied to host memory on the step, written
    by a thread; rank 0 commits the folder when every rank's shards are written); notice and best
    checkpoints are always written synchronously, after any save still in flight."""

    def __init__(self, world: int, *, keep: Optional[int], trained_only: bool, background: bool = False) -> None:
        super().__init__(data_parallel_size=world, tensor_parallel_size=1, save_distributed_checkpoint=True)
        self.keep = keep
        self.trained_only = trained_only
        self.background = background
        self.last_save: dict[str, float] = {}
        self._pending: Optional[Any] = None  # a periodic save in flight: (its future, temp, path, bytes)
        self._save_group: Optional[Any] = None  # a gloo group of its own: the save's collectives run off the step
        self._stager: Optional[Any] = None

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.background:
            import torch.distributed as dist
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self._save_group = dist.new_group(backend="gloo")  # every rank, in the same order
            # One stager for the whole run: it keeps its host buffers, so a save after the first
            # is a copy into them, not an allocation (a 200 MB state on 2 CPU cores: 0.12-0.15 s
            # instead of 0.5-0.6 s; a synchronous save 2.0-2.3 s).
            cuda = torch.cuda.is_available() and self.root_device.type == "cuda"
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )

    def wait_for_saves(self, *, collective: bool = True) -> None:
        """Until the periodic save in flight (if any) is written and, on rank 0, committed; a failed
        one is settled (sharded_full.py: a full disk reported). `collective`: every rank calls this
        at the same point (a save), so they agree on a failure; the teardown's call is not."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, temp, path, needed = pending
        error: Optional[BaseException] = None
        try:
            future.result()
        except (OSError, RuntimeError, CheckpointException) as exc:
            error = exc
        settle_save(
            error,
            temp=temp,
            path=path,
            needed=needed,
            rank=self.global_rank,
            device=self.root_device if collective else None,
        )

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        import time

        import torch.distributed.checkpoint as dcp

        start = time.perf_counter()
        self.wait_for_saves()  # one save at a time; a notice waits for the periodic one before it
        path = Path(self.broadcast(str(filepath)))
        checkpoint.pop("state_dict", None)
        checkpoint.pop("optimizer_states", None)
        assert self.model is not None
        state = shard_state(self.model, [o for o in self.optimizers], trained_only=self.trained_only)
        needed = local_bytes(state) * self.world_size  # for a full disk's report: about what the folder takes
        temp = prepare_folder(path) if self.global_rank == 0 else None
        self.barrier()
        temp = Path(self.broadcast(str(temp)))
        parsed = parse_checkpoint_name(path)
        if self.background and parsed is not None and not parsed.notice:
            saving = dcp.async_save(
                state, checkpoint_id=str(temp), process_group=self._save_group, async_stager=self._stager
            )
            future = getattr(saving, "upload_completion", saving)  # an AsyncSaveResponse with a stager
            if self.global_rank == 0:  # DCP's .metadata is written once every rank's shards are: commit then
                future = _then(future, lambda: self._commit(temp, path, checkpoint))
            self._pending = (future, temp, path, needed)
            self.last_save = {"stall_s": time.perf_counter() - start}
            return
        error: Optional[BaseException] = None
        try:
            dcp.save(state, checkpoint_id=str(temp))  # collective: returns once DCP's .metadata is written
            written = time.perf_counter()
            if self.global_rank == 0:
                self._commit(temp, path, checkpoint)
        except (OSError, RuntimeError, CheckpointException) as exc:  # a full disk, most likely
            error, written = exc, time.perf_counter()
        settle_save(error, temp=temp, path=path, needed=needed, rank=self.global_rank, device=self.root_device)
        self.barrier()  # every rank returns with the folder in place
        self.last_save = {"write_s": written - start, "commit_s": time.perf_counter() - written}

    def _commit(self, temp: Path, path: Path, meta: dict[str, Any]) -> None:
        commit_folder(temp, path, meta)
        if self.keep is not None and step_of(path) is not None:
            prune_checkpoints(path.parent, self.keep)

    def teardown(self) -> None:
        self.wait_for_saves(collective=False)  # the final periodic save is on disk before the process ends
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        super().teardown()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        if not is_sharded(path):  # a single file (a job that ran in one process before): Lightning's path
            return super().load_checkpoint(path, weights_only=True)
        assert self.model is not None
        load_shards(path, self.model, [o for o in self.optimizers], trained_only=self.trained_only)
        return load_meta(path)

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.global_rank == 0:
            import shutil

            path = Path(filepath)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()
