"""OrchCallback: what any Lightning job needs to follow orch's job-process contract — a
progress.json heartbeat, exact RNG resume, and "SIGTERM = save a checkpoint now, then exit 75".

In your own script (an orch command job):

    trainer = pl.Trainer(..., callbacks=[OrchCallback()])
    trainer.fit(model, ckpt_path=os.environ.get("ORCH_RESUME_FROM") or None)

On SIGTERM every rank saves `notice-step-XXXXXXXX.ckpt` at the next optimizer-step boundary and
the process exits 75 (rank 0; other DDP ranks exit 0 so Lightning's child watcher does not kill
rank 0 first). The notice changes no metric: the step's logged row is written before the save,
and a validation due at that step runs once, in the resumed attempt, before its first step."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from training.resume import rng
from orchestrator.contract import (
    CHECKPOINTS,
    ENV_CKPT_DIR,
    ENV_PROGRESS_EVERY_S,
    ENV_RUN_DIR,
    EX_CHECKPOINTED,
)

from training.resume.checkpoints import notice_name
from training.heartbeat.lightning_progress import LightningProgress
from training.tracking.notes import ScriptRuns
from training.resume.exact import (
    apply_pending_loader_state,
    as_taken_in_batch_end,
    capture_loader_generators,
    fix_epoch_end_loader_state,
    gather_rank_rng,
    redo_validation,
    restore_callback_metrics,
    restore_loader_generators,
    restore_rank_rng,
    safe_loads,
    step_end_hookable,
    validation_due,
    validation_follows,
)


class Preempted(SystemExit):
    """Raised out of `fit` after the notice checkpoint is durable. A SystemExit, so a plain script
    exits with its code without any handling; the built-in runner catches it."""

    def __init__(self, checkpoint: Optional[str], rank: int = 0):
        self.checkpoint = checkpoint
        super().__init__(EX_CHECKPOINTED if rank == 0 else 0)


def _env_path(name: str) -> Optional[Path]:
    value = os.environ.get(name)
    return Path(value) if value else None


class OrchCallback(pl.Callback):
    def __init__(
        self,
        run_dir: Optional[str | Path] = None,
        ckpt_dir: Optional[str | Path] = None,
        *,
        progress_every_s: Optional[float] = None,
        log_every_s: Optional[float] = None,
        handle_sigint: bool = False,
        script_trackers: bool = True,
    ):
        self.run_dir = Path(run_dir) if run_dir else _env_path(ENV_RUN_DIR)
        # A command job's own trackers (its script opened them): noted, and paused before exit 75.
        # The built-in runner closes its trackers itself (training/tracking/trackers.py): False there.
        self.tracker_runs = ScriptRuns(self.run_dir, enabled=script_trackers)
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir else _env_path(ENV_CKPT_DIR)
        # ORCH_PROGRESS_EVERY_S overrides the default 3 s (tests poll faster)
        every_s = progress_every_s or float(os.environ.get(ENV_PROGRESS_EVERY_S) or 3.0)
        self.heartbeat = LightningProgress(self.run_dir, every_s=every_s, log_every_s=log_every_s)
        self.progress_extras = (
            self.heartbeat.extras
        )  # callables adding fields to progress.json (training/heartbeat/goodput.py)
        self.sigterm_received = False
        self.notice_checkpoint: Optional[str] = None
        self.handle_sigint = handle_sigint  # foreground runs: Ctrl-C checkpoints like SIGTERM
        self._prev_handler: Any = None
        self._prev_sigint: Any = None
        self._pending_rng: Optional[dict[str, Any]] = None
        self._pending_rank_rng: Optional[dict[str, Any]] = None
        self._pending_loader_generators: Optional[list[Any]] = None
        self._trainer: Optional[pl.Trainer] = None  # for the per-rank RNG gather in state_dict
        # The notice waits for the end of the step (training/resume/exact.py: "a checkpoint between
        # a step and its validation"): the step's end time while it waits, the hooked epoch loop,
        # what the notice checkpoint being written says, a resumed validation still to run, and
        # the checkpoint's callback_metrics until train start.
        self._notice_step_end: Optional[float] = None
        self._hooked_loop: Any = None
        self._saving: Optional[dict[str, bool]] = None
        self._validation_pending = False
        self._pending_metrics: Optional[dict[str, float]] = None

    # -- SIGTERM: flag only; acted on at a batch boundary on every rank --------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.sigterm_received = True

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.sigterm_received:
            raise KeyboardInterrupt  # a second Ctrl-C: stop without waiting for the checkpoint
        self.sigterm_received = True
        print(
            "\n[orch] Ctrl-C: saving a checkpoint at the next step (Ctrl-C again to abort without one)",
            file=sys.stderr,
            flush=True,
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Replaces Lightning's handler (installed just before this hook): Lightning's exits 0
        # without a checkpoint, and under DDP it runs a collective inside the handler.
        if getattr(trainer, "received_sigterm", False):
            self.sigterm_received = True
        apply_pending_loader_state(trainer)
        if self._pending_metrics:
            restore_callback_metrics(trainer, self._pending_metrics)
            self._pending_metrics = None
        self._hook_step_end(trainer)
        self._prev_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.handle_sigint:
            self._prev_sigint = signal.signal(signal.SIGINT, self._on_sigint)
        self.heartbeat.started(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Restored here, not in load_state_dict: rebuilding the loaders after the checkpoint load
        # would otherwise consume the restored stream.
        self._restore_rng(trainer)
        if self._validation_pending:
            # The checkpoint's validation is not due under this attempt's settings (Lightning trains
            # on without ending the checkpoint's step): count its logging step as that end would have.
            self._validation_pending = False
            trainer.fit_loop.epoch_loop._batches_that_stepped += 1

    def _restore_rng(self, trainer: pl.Trainer) -> None:
        if self._pending_rng is not None:
            rng.restore(self._pending_rng)
            self._pending_rng = None
            restore_rank_rng(self._pending_rank_rng, trainer)
            self._pending_rank_rng = None
            restore_loader_generators(self._pending_loader_generators, trainer)
            self._pending_loader_generators = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step_end = time.perf_counter()  # the optimizer step and the LR scheduler step are done
        self.heartbeat.batch_done(trainer, batch)
        # One collective per batch, at the same point on every rank (none in a single process).
        world = trainer.world_size
        stop = (
            trainer.strategy.reduce_boolean_decision(self.sigterm_received, all=False)
            if world > 1
            else self.sigterm_received
        )
        at_step_boundary = stop and (
            (batch_idx + 1) % trainer.accumulate_grad_batches == 0
            or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        )
        if not at_step_boundary:
            self.heartbeat.beat(trainer)  # (mid-accumulation: finish the gradient accumulation first)
            if trainer.global_rank == 0:
                self.tracker_runs.step()
            return
        if self._hooked_loop is not None:
            # The rest of the step first (the other callbacks' batch end, the step's logged row),
            # then the checkpoint, at the start of Lightning's on_advance_end (_end_of_step).
            self._notice_step_end = step_end
            return
        self._stop_now(trainer, step_end)

    def _stop_now(self, trainer: pl.Trainer, step_end: float) -> None:
        # The notice checkpoint first: nothing else (progress.json and its fsync, retention) sits
        # between the end of the step and the durable file.
        self.save_notice(trainer, step_end=step_end)
        self.heartbeat.write(trainer, force=True)
        trainer.should_stop = True
        if trainer.global_rank == 0:
            self.tracker_runs.preempted()
        raise Preempted(self.notice_checkpoint, trainer.global_rank)

    # -- the end of a step: where a notice is taken and a resumed validation runs ----------------
    def _hook_step_end(self, trainer: pl.Trainer) -> None:
        if self._hooked_loop is not None or not step_end_hookable(trainer):
            return  # (another Lightning: the notice is taken in on_train_batch_end, as before)
        loop = trainer.fit_loop.epoch_loop
        original = loop.on_advance_end

        def on_advance_end(data_fetcher: Any) -> None:
            self._end_of_step(trainer, original, data_fetcher)

        loop.on_advance_end = on_advance_end
        self._hooked_loop = loop

    def _end_of_step(self, trainer: pl.Trainer, original: Any, data_fetcher: Any) -> None:
        loop = trainer.fit_loop.epoch_loop
        if self._validation_pending:
            # Resumed from a checkpoint taken before this step's validation: Lightning restarts by
            # ending that step and would skip the validation as run; it was not (or not for the
            # state this attempt holds).
            self._validation_pending = False
            if loop._skip_next_val:
                loop._skip_next_val = False
                loop.val_loop.restarting = False
                self._restore_rng(trainer)  # the validation draws from the stream training goes on with
        if self._notice_step_end is None:
            original(data_fetcher)
            return
        step_end, self._notice_step_end = self._notice_step_end, None
        due = validation_due(trainer, data_fetcher)
        if not due:
            # The rest of the step's end before the next batch (its logging step is counted on resume).
            loop.update_lr_schedulers("step", update_plateau_schedulers=True)
        self._saving = {"validation_pending": due}
        try:
            self._stop_now(trainer, step_end)
        finally:
            self._saving = None

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._saving is not None:
            # A notice, taken after Lightning counted the batch complete: it reads as taken in
            # on_train_batch_end, like a periodic checkpoint of the same step.
            as_taken_in_batch_end(checkpoint)

    def save_notice(self, trainer: pl.Trainer, step_end: Optional[float] = None) -> str:
        start = time.perf_counter()
        folder = self.ckpt_dir or Path(trainer.default_root_dir) / CHECKPOINTS
        path = str(folder / notice_name(trainer.global_step))
        trainer.save_checkpoint(path, weights_only=False)  # every rank calls it: it ends with a barrier
        took = time.perf_counter() - (step_end if step_end is not None else start)
        self.notice_checkpoint = path
        checkpoint_io = getattr(trainer.strategy, "checkpoint_io", None)
        if trainer.global_rank == 0:
            parts = dict(getattr(checkpoint_io, "last_save", None) or {})
            detail = ""
            if parts:
                detail = (
                    f" ({parts['bytes'] / 1e6:.0f} MB; write {parts['write_s']:.2f} s, fsync {parts['fsync_s']:.2f} s,"
                    f" rename {parts['rename_s']:.2f} s)"
                )
            print(
                f"[orch] SIGTERM: saved {path} at step {trainer.global_step} in {took:.2f} s{detail}; "
                f"exiting {EX_CHECKPOINTED} to be resumed",
                file=sys.stderr,
                flush=True,
            )
            prune = getattr(checkpoint_io, "prune", None)
            if callable(prune):
                prune()  # retention after the file is durable and reported
        return path

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.heartbeat.write(trainer, force=True)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.heartbeat.validation_ended(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._hooked_loop is not None:
            vars(self._hooked_loop).pop("on_advance_end", None)
            self._hooked_loop = None
        if self._prev_handler is not None:
            signal.signal(signal.SIGTERM, self._prev_handler)
            self._prev_handler = None
        if self._prev_sigint is not None:
            signal.signal(signal.SIGINT, self._prev_sigint)
            self._prev_sigint = None

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fix_epoch_end_loader_state(checkpoint)
        state = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        if state.get("validation_pending") and step_end_hookable(trainer):
            redo_validation(trainer, checkpoint)
        else:
            state.pop("validation_pending", None)

    # -- RNG state in every checkpoint -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng.capture()}
        if self._saving["validation_pending"] if self._saving is not None else validation_follows(self._trainer):
            state["validation_pending"] = True
        if self._trainer is not None:
            # What a ReduceLROnPlateau or a monitor reads between two validations (Lightning keeps
            # it in memory only): a resumed attempt sees the values the uninterrupted run had.
            state["callback_metrics"] = {
                str(k): float(v)
                for k, v in self._trainer.callback_metrics.items()
                if isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.numel() == 1)
            }
        generators = capture_loader_generators(self._trainer)
        if generators is not None:
            state["loader_generators"] = generators
        per_rank = gather_rank_rng(self._trainer)
        if per_rank is not None:
            state["rank_rng"] = per_rank
        return state

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        safe_loads(trainer)  # before Lightning restores ckpt_path

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_rng = state_dict.get("rng")
        self._pending_rank_rng = state_dict.get("rank_rng")
        self._pending_loader_generators = state_dict.get("loader_generators")
        self._validation_pending = bool(state_dict.get("validation_pending"))
        self._pending_metrics = state_dict.get("callback_metrics")
