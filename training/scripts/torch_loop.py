"""OrchLoop: the job-process contract for a plain PyTorch training loop, standard library plus
torch. It reads the contract's environment, writes progress.json for `orch status`, turns SIGTERM
into a flag, and saves/loads checkpoints atomically — model, optimizer, scheduler, AMP scaler,
RNG states (python, numpy when installed, torch, CUDA) and the data position you pass — and
exits 75 once the notice checkpoint is durable:

    orch = OrchLoop(model, optimizer, scheduler, total_steps=epochs * len(loader), save_every=200)
    pos = orch.resume() or {"epoch": 0, "batch": 0}
    for epoch in range(pos["epoch"], epochs):
        gen.manual_seed(seed + epoch)            # the epoch's order depends on (seed, epoch) only
        skip = pos["batch"] if epoch == pos["epoch"] else 0
        for i, batch in enumerate(orch.skip(loader, skip), start=skip):
            ...forward, backward, optimizer.step(), scheduler.step()...
            orch.step_done(data={"epoch": epoch, "batch": i + 1}, epoch=epoch, metrics={"loss": loss.item()})
    orch.finish()

Checkpoints are `ORCH_CKPT_DIR/step-XXXXXXXX.ckpt` (every `save_every` steps; the `keep` newest
are kept) and `notice-step-XXXXXXXX.ckpt` (on SIGTERM), so the daemon picks the newest by name."""

from __future__ import annotations

import atexit
import signal
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

import torch

from orchestrator.contract import (
    CHECKPOINTS,
    TEMP_MARK,
    atomic_file,
    notice_name,
    parse_checkpoint_name,
    periodic_name,
    step_checkpoints,
)

from training.scripts import job_side
from training.scripts.job_side import Preempted, Progress, StopFlag, say
from training.resume.rng import capture as capture_rng, restore as restore_rng
from training.tracking.notes import ScriptRuns

FORMAT = "orch.torch_loop/1"


# -- RNG states as plain data (torch.load(weights_only=True) reads them back) ------------------------

# -- DataLoader workers -------------------------------------------------------------------------------


class WorkerIgnoresSigterm:
    """A DataLoader `worker_init_fn` (wrapping yours) that makes the worker ignore SIGTERM. orch
    signals the job's whole process group; a worker killed by it makes the main process raise
    "DataLoader worker is killed by signal" from a signal handler, anywhere, before it can save.
    A class, not a closure, so a spawn/forkserver worker can unpickle it."""

    def __init__(self, inner: Any = None):
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.inner is not None:
            self.inner(worker_id)


def protect_dataloader_workers() -> None:
    """From now on, in this process, every DataLoader's workers ignore SIGTERM (the main process
    decides when to stop: after the checkpoint), and are killed at exit (multiprocessing's own
    exit hook would SIGTERM them and wait forever)."""
    from torch.utils.data import DataLoader

    if getattr(DataLoader.__iter__, "_orch_protected", False):
        return
    original = DataLoader.__iter__

    def __iter__(self: DataLoader) -> Any:
        if self.num_workers > 0 and not isinstance(self.worker_init_fn, WorkerIgnoresSigterm):
            self.worker_init_fn = WorkerIgnoresSigterm(self.worker_init_fn)
        return original(self)

    __iter__._orch_protected = True  # type: ignore[attr-defined]
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    atexit.register(_kill_loader_workers)


def _kill_loader_workers() -> None:
    import multiprocessing

    children = multiprocessing.active_children()
    if not children:
        return
    # torch's SIGCHLD handler raises for a worker it still tracks; at exit that is only noise
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()
        child.join(timeout=5)


# -- checkpoint files --------------------------------------------------------------------------------


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save, all or nothing (contract.atomic_file): a kill at any instant leaves the old
    file or the new one, never a torn one."""
    with atomic_file(path) as fh:
        torch.save(obj, fh)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "model" not in ckpt:
        raise ValueError(f"not an {FORMAT} checkpoint")
    return ckpt


def _state(obj: Any) -> Any:
    return obj.state_dict() if obj is not None else None


class OrchLoop:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Any = None,
        scaler: Any = None,
        *,
        total_steps: Optional[int] = None,
        save_every: Optional[int] = None,
        keep: int = 2,
        samples_per_step: int = 0,
        run_dir: Optional[str | Path] = None,
        ckpt_dir: Optional[str | Path] = None,
        progress_every_s: Optional[float] = None,
        handle_sigint: bool = False,
    ):
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.total_steps = total_steps
        self.save_every = save_every
        self.keep = keep
        self.samples_per_step = samples_per_step
        self.run_dir = Path(run_dir) if run_dir else job_side.run_dir()
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir else (job_side.ckpt_dir() or Path(CHECKPOINTS))
        self.step = 0
        self.epoch: Optional[int] = None
        self.resumed_from: Optional[Path] = None
        self._pending_rng: Optional[dict[str, Any]] = None
        self.stop = StopFlag(handle_sigint=handle_sigint)
        self.stop.install()
        protect_dataloader_workers()
        writer = self._writes_run_files()  # several ranks: rank 0 alone (sharded_loop.py)
        self.progress = Progress(self.run_dir if writer else None, every_s=progress_every_s)
        if writer:
            self._remove_orphan_temps()
        self.progress.write(self.step, self.total_steps, self.epoch)
        self.tracker_runs = ScriptRuns(self.run_dir if writer else None)

    def _writes_run_files(self) -> bool:
        return True

    def _stop_now(self) -> bool:
        """Whether to save a notice checkpoint and exit at this step (several ranks: agreed)."""
        return self.stop.requested

    @property
    def stop_requested(self) -> bool:
        return self.stop.requested

    # -- resume --------------------------------------------------------------------------------
    def resume(self) -> Optional[Any]:
        """Load ORCH_RESUME_FROM (or, when it does not load, the newest checkpoint that does) into
        the model, optimizer, scheduler and scaler, restore the RNG states, set `self.step`, and
        return the data position saved with it; None on a fresh start."""
        prefer = job_side.resume_env()
        candidates = [prefer] if prefer else []
        candidates += [p for p, _ in step_checkpoints(self.ckpt_dir) if p != prefer]
        for path in candidates:
            try:
                ckpt = load_checkpoint(path)
            except Exception as exc:  # truncated file, pickle error, wrong format: all mean unusable
                say(
                    f"skipping checkpoint {path}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                )
                continue
            self.model.load_state_dict(ckpt["model"])
            for obj, key in ((self.optimizer, "optimizer"), (self.scheduler, "scheduler"), (self.scaler, "scaler")):
                if obj is not None and ckpt.get(key) is not None:
                    obj.load_state_dict(ckpt[key])
            self.step, self.epoch = int(ckpt["step"]), ckpt.get("epoch")
            self._pending_rng = ckpt["rng"]
            restore_rng(self._pending_rng)
            self.resumed_from = Path(path)
            say(f"resumed from {path} at step {self.step}")
            self.progress.write(self.step, self.total_steps, self.epoch)
            return ckpt.get("data")
        return None

    def skip(self, batches: Iterable[Any], n: int) -> Iterator[Any]:
        """`batches` without its first `n` items. After a resume the saved RNG states are put back
        right before the first item it yields (n > 0: whatever the skipped items drew no longer
        counts) or before `iter(batches)` (n == 0: an uninterrupted run also built this iterator
        after the save point), so the next batch and its dropout see what they saw in an
        uninterrupted run. Skipping fetches the skipped items: cheap for a map-style dataset
        without heavy transforms; the data position you save can be anything you can use better."""
        if n == 0:
            self._restore_pending_rng()  # before iter(): a loader without a generator draws from the global RNG there
        it = iter(batches)
        for _ in range(n):
            try:
                next(it)
            except StopIteration:
                return
        self._restore_pending_rng()
        yield from it

    def _restore_pending_rng(self) -> None:
        if self._pending_rng is not None:
            restore_rng(self._pending_rng)
            self._pending_rng = None

    # -- every optimizer step ------------------------------------------------------------------
    def step_done(
        self,
        *,
        data: Any = None,
        epoch: Optional[int] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        samples: Optional[int] = None,
    ) -> int:
        """Call once after every optimizer step, with the data position to continue from. Writes
        progress every few seconds, a periodic checkpoint every `save_every` steps, and on SIGTERM
        a notice checkpoint, then exits 75 (raises Preempted, a SystemExit)."""
        job_side.slow_step()
        self._pending_rng = None
        self.step += 1
        if epoch is not None:
            self.epoch = epoch
        self.progress.update_metrics(metrics)
        if self.progress.step_done(self.samples_per_step if samples is None else samples):
            self.progress.write(self.step, self.total_steps, self.epoch)
        if self._stop_now():
            path = self.save(data=data, notice=True)
            self.progress.write(self.step, self.total_steps, self.epoch)
            if self._writes_run_files():
                say(f"SIGTERM: saved {path} at step {self.step}; exiting 75 to be resumed")
            self.tracker_runs.preempted()
            raise Preempted(str(path))
        self.tracker_runs.step()
        if self.save_every and self.step % self.save_every == 0:
            self.save(data=data)
        return self.step

    def save(self, *, data: Any = None, notice: bool = False) -> Path:
        ckpt = {
            "format": FORMAT,
            "step": self.step,
            "epoch": self.epoch,
            "model": _state(self.model),
            "optimizer": _state(self.optimizer),
            "scheduler": _state(self.scheduler),
            "scaler": _state(self.scaler),
            "rng": capture_rng(),
            "data": data,
        }
        path = self.ckpt_dir / (notice_name(self.step) if notice else periodic_name(self.step))
        atomic_save(ckpt, path)
        self._prune()
        return path

    def finish(self, metrics: Optional[Mapping[str, Any]] = None) -> None:
        """After the last step: final progress.json and result.json; SIGTERM is default again."""
        self.stop.restore()
        self.progress.update_metrics(metrics)
        self.progress.write(self.step, self.total_steps, self.epoch)
        self.progress.write_result(steps=self.step, epochs=self.epoch + 1 if self.epoch is not None else None)

    # -- housekeeping --------------------------------------------------------------------------
    def _prune(self) -> None:
        """Keep the `keep` newest periodic checkpoints and the newest notice one."""
        found = step_checkpoints(self.ckpt_dir)
        periodic = [p for p, n in found if not n.notice]
        notices = [p for p, n in found if n.notice]
        for path in periodic[max(1, self.keep) :] + notices[1:]:
            try:
                path.unlink()
            except OSError:
                pass

    def _remove_orphan_temps(self) -> None:
        """Temp files of a writer killed mid-save."""
        if not self.ckpt_dir.is_dir():
            return
        for entry in self.ckpt_dir.iterdir():
            if entry.name.startswith(TEMP_MARK) and parse_checkpoint_name(
                entry.name[len(TEMP_MARK) :].split("-", 1)[-1]
            ):
                try:
                    entry.unlink()
                except OSError:
                    pass
