"""OrchTrainerCallback: the job-process contract for a `transformers.Trainer` script — progress
for `orch status`, "SIGTERM = save a checkpoint at the next optimizer step, then exit 75", and
resume from ORCH_RESUME_FROM. In your script:

    from training.scripts.hf_trainer import OrchTrainerCallback, resume_from
    trainer = Trainer(..., callbacks=[OrchTrainerCallback()])
    trainer.train(resume_from_checkpoint=resume_from())

The Trainer keeps its own layout (`output_dir/checkpoint-N/`, its rotation, its best model).
Once a save is durable (every file fsynced), ORCH_CKPT_DIR gets a link with the contract's name,
`step-0000000N.ckpt` (or `notice-step-…` for the SIGTERM save) -> that folder, written with an
atomic rename: the daemon picks the newest by name without importing anything, and a folder
torn by a kill mid-save never gets a link."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from orchestrator.contract import TEMP_MARK, fsync_dir, notice_name, periodic_name, step_checkpoints

from training.resume.ranks import all_ranks_here, any_rank
from training.scripts import job_side
from training.scripts.job_side import Preempted, Progress, StopFlag, say
from training.tracking.notes import ScriptRuns
from training.scripts.torch_loop import protect_dataloader_workers

TRAINER_STATE = "trainer_state.json"
CHECKPOINT_PREFIX = "checkpoint-"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def checkpoint_problem(folder: str | Path) -> Optional[str]:
    """Why `folder` cannot resume a Trainer, or None when it looks whole."""
    folder = Path(folder)
    if not folder.is_dir():
        return "is not a folder (a dangling link, or the Trainer's rotation removed it)"
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"has no readable {TRAINER_STATE} ({type(exc).__name__})"
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"has a {TRAINER_STATE} without global_step"
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return "has no model weights"
    return None


def resume_from(ckpt_dir: Optional[str | Path] = None) -> Optional[str]:
    """The checkpoint for `trainer.train(resume_from_checkpoint=...)`: ORCH_RESUME_FROM when it is
    whole, else the newest whole one in ORCH_CKPT_DIR, else None (a fresh start). A broken one is
    skipped with a line in the log naming it."""
    folder = Path(ckpt_dir) if ckpt_dir else job_side.ckpt_dir()
    prefer = job_side.resume_env()
    candidates = [prefer] if prefer else []
    if folder is not None:
        candidates += [path for path, _ in step_checkpoints(folder) if path != prefer]
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            say(f"resuming from {path}")
            return str(path)
        say(f"skipping checkpoint {path}: it {problem}; looking for an older one")
    return None


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def _replace_link(link: Path, target: Path) -> None:
    """`link` -> `target` (relative, so the run folder can move), by an atomic rename."""
    tmp = link.with_name(f"{TEMP_MARK}{os.getpid()}-{link.name}")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    os.symlink(os.path.relpath(target.resolve(), link.parent.resolve()), tmp)
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)  # a real folder under that name (copied in by hand): the link wins
    os.replace(tmp, link)
    fsync_dir(link.parent)


def prune_dangling_links(ckpt_dir: Path) -> list[Path]:
    """Contract links whose Trainer folder is gone (its save_total_limit rotation removed it)."""
    removed = []
    for path, _ in step_checkpoints(ckpt_dir):
        if path.is_symlink() and not path.exists():
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def _ends_epoch(state: TrainerState) -> bool:
    """True on an epoch's last optimizer step (the Trainer sets epoch = e + (batch+1)/batches)."""
    return state.epoch is not None and float(state.epoch).is_integer() and state.global_step > 0


class OrchTrainerCallback(TrainerCallback):
    def __init__(
        self,
        run_dir: Optional[str | Path] = None,
        ckpt_dir: Optional[str | Path] = None,
        *,
        progress_every_s: Optional[float] = None,
        handle_sigint: bool = False,
    ):
        self.run_dir = Path(run_dir) if run_dir else job_side.run_dir()
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir else job_side.ckpt_dir()
        self.stop = StopFlag(handle_sigint=handle_sigint)
        self.progress = Progress(self.run_dir, every_s=progress_every_s)
        self.notice_checkpoint: Optional[str] = None
        self._notice_step: Optional[int] = None
        self._save_at_epoch_end = False
        self.tracker_runs = ScriptRuns(self.run_dir)  # report_to's runs: noted, paused before exit 75

    @property
    def stop_requested(self) -> bool:
        return self.stop.requested

    # -- start and end -------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.stop.install()
        protect_dataloader_workers()
        if args.save_only_model:
            say("save_only_model=True: checkpoints hold no optimizer, scheduler or RNG state, so a resume is not exact")
        if self.ckpt_dir is not None and state.is_world_process_zero:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            prune_dangling_links(self.ckpt_dir)
        self._write(args, state)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.stop.restore()
        if not state.is_world_process_zero:
            return
        self._write(args, state)
        if state.max_steps and state.global_step >= state.max_steps:
            self.progress.write_result(
                steps=state.global_step,
                epochs=state.epoch,
                best_metric=state.best_metric,
                best_checkpoint=state.best_model_checkpoint,
            )

    # -- every optimizer step ------------------------------------------------------------------
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        job_side.slow_step()
        if state.is_world_process_zero:
            self.tracker_runs.step()
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        if self.progress.step_done(samples):
            self._write(args, state)
        if args.world_size > 1:
            # every rank saves at the same step (the save is collective), whichever rank saw SIGTERM
            self.stop.requested = any_rank(self.stop.requested, args.device)
        if self.stop.requested:
            control.should_save = True  # the Trainer saves right after this hook, in its own layout
            if self._notice_step is None:
                self._notice_step = state.global_step
                say(f"SIGTERM: saving a checkpoint at step {state.global_step}")
        if control.should_save and _ends_epoch(state):
            # The Trainer's end-of-epoch work (evaluation: a DataLoader iterator draws from the
            # global RNG) runs after this save point, and a resume at an epoch start replays
            # none of it: saved here, the resumed run is one RNG draw off. Saved after it, exact.
            control.should_save = False
            self._save_at_epoch_end = True
        if control.should_save:
            self._unlink_step(state)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._save_at_epoch_end or self.stop.requested:
            self._save_at_epoch_end = False
            control.should_save = True
            self._unlink_step(state)

    def _unlink_step(self, state: TrainerState) -> None:
        """A step saved again (after a resume from an older checkpoint) is rewritten in place: no
        link may point at it while it is half written."""
        if self.ckpt_dir is None or not state.is_world_process_zero:
            return
        for name in (periodic_name(state.global_step), notice_name(state.global_step)):
            path = self.ckpt_dir / name
            if path.is_symlink():
                path.unlink()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{state.global_step}"
        notice = self.stop.requested
        link: Optional[Path] = None
        if state.is_world_process_zero and folder.is_dir():
            _fsync_tree(folder)
            if self.ckpt_dir is not None:
                name = notice_name(state.global_step) if notice else periodic_name(state.global_step)
                link = self.ckpt_dir / name
                _replace_link(link, folder)
                prune_dangling_links(self.ckpt_dir)
        elif state.is_world_process_zero:
            say(f"the Trainer saved, but {folder} is not there: no checkpoint link written")
        if notice:
            self.notice_checkpoint = str(link or folder)
            self._write(args, state)
            say(f"saved {self.notice_checkpoint} at step {state.global_step}; exiting 75 to be resumed")
            if state.is_world_process_zero:
                self.tracker_runs.preempted()
            if args.world_size > 1:
                all_ranks_here()  # no rank exits (and makes its launcher stop the rest) before the link
            raise Preempted(self.notice_checkpoint)

    # -- metrics -------------------------------------------------------------------------------
    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.progress.update_metrics(logs)

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.progress.update_metrics(metrics)
        self._write(args, state)

    def _write(self, args: TrainingArguments, state: TrainerState) -> None:
        if state.is_world_process_zero:
            self.progress.write(
                state.global_step,
                state.max_steps or None,
                state.epoch,
                epoch_progress=round(state.epoch, 4) if state.epoch is not None else None,
            )
