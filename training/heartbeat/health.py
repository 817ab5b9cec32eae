"""Training health, watched from inside the runner: a loss that becomes NaN or infinite stops the
job at the end of that very step, before any checkpoint of it, and no checkpoint with non-finite
weights is ever written (so the newest checkpoint is the last good one); a training loss that has
not improved by `flat_min_improvement` after `flat_after_steps` steps is reported once and
training goes on.

The loss is checked at the end of each batch without a host-device synchronisation of its own:
on the CPU it is read as a number (free) and a NaN stops the job at the end of that very step;
on a GPU, and under DDP (where the ranks must agree), the step of the first non-finite loss is
kept on the device and read back every LOSS_CHECK_EVERY steps and before every checkpoint, so
the job stops within that many steps, still before any checkpoint of a bad step, and reports the
exact step the loss went bad.

Both land in RUN_DIR/health.json (contract.HEALTH), which the daemon reads: it marks a diverged
attempt `failed` (no retry: resuming would diverge again) and records a `loss_flat` event."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from orchestrator.contract import HEALTH, newest_checkpoint, read_json, write_json_atomic


class Diverged(Exception):
    """Raised out of `fit` when the loss (or, at a checkpoint, a weight) is not finite."""

    def __init__(self, step: int, what: str, checkpoint: Optional[str]):
        self.step, self.what, self.checkpoint = step, what, checkpoint
        kept = (
            f"the newest checkpoint from before it, {checkpoint}, is kept"
            if checkpoint
            else "no checkpoint was written before it"
        )
        super().__init__(
            f"training diverged: {what} at step {step}; stopped at once, {kept}. "
            "Lower [train] learning_rate (or set gradient_clip_val) and submit again."
        )


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """No inf/NaN in any tensor. One fused L2 norm per tensor (no tensor-sized temporaries: BERT-base
    0.1 s instead of 1-6 s for isfinite().all() on 2 CPU cores, in the notice save's window); a
    non-finite norm is either an inf/NaN element or an overflow of the sum of squares, so only
    those tensors get the exact check."""
    if not tensors:
        return True
    norms = torch.stack([n.float().to(tensors[0].device) for n in torch._foreach_norm(tensors)])
    suspects = (~torch.isfinite(norms)).nonzero().flatten().tolist()
    return all(bool(torch.isfinite(tensors[i]).all()) for i in suspects)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2's parameters); any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


LOSS_CHECK_EVERY = 10  # optimizer steps between reads of a device-side loss flag (one sync each)


class LossWatch:
    """The first batch step whose loss was not finite, kept without a device sync: a number on
    the CPU, a device scalar elsewhere (torch.where, no read-back) until `first_bad()` asks."""

    def __init__(self, defer: Optional[bool] = None) -> None:
        self.defer = defer  # None: kept on the device off the CPU (True forces it, for tests)
        self._step: Optional[int] = None
        self._value: Optional[float] = None
        self._dev_step: Optional[torch.Tensor] = None  # -1 while every loss was finite
        self._dev_value: Optional[torch.Tensor] = None

    def deferred(self, loss: torch.Tensor) -> bool:
        if self.defer is None:  # decided once, at the first loss: the device does not change
            self.defer = loss.device.type != "cpu"
        return self.defer

    def add(self, step: int, loss: torch.Tensor) -> bool:
        """Record one batch's loss; True when it is known at once (CPU) to be non-finite."""
        if not self.deferred(loss):
            value = float(loss)
            if not math.isfinite(value) and self._step is None:
                self._step, self._value = step, value
            return self._step is not None
        if self._dev_step is None:
            self._dev_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._dev_value = torch.zeros((), dtype=torch.float32, device=loss.device)
        new = ~torch.isfinite(loss) & (self._dev_step < 0)
        self._dev_step = torch.where(new, step, self._dev_step)
        self._dev_value = torch.where(new, loss.float(), self._dev_value)
        return False

    def first_bad(self) -> Optional[tuple[int, float]]:
        """(step, loss) of the first non-finite loss seen, or None. A device sync on a GPU."""
        if self._step is None and self._dev_step is not None:
            step = int(self._dev_step)
            if step >= 0:
                self._step, self._value = step, float(self._dev_value)  # type: ignore[arg-type]
        return None if self._step is None else (self._step, float(self._value))  # type: ignore[arg-type]


def _say(msg: str) -> None:
    print(f"[orch] {msg}", file=sys.stderr, flush=True)


class HealthCallback(pl.Callback):
    def __init__(
        self,
        run_dir: str | Path,
        ckpt_dir: str | Path,
        *,
        flat_after_steps: Optional[int] = None,
        flat_min_improvement: float = 0.02,
        attempt: str = "",
        check_every: int = LOSS_CHECK_EVERY,
        defer_loss_check: Optional[bool] = None,
    ):
        self.run_dir = Path(run_dir)
        self.ckpt_dir = Path(ckpt_dir)
        self.flat_after_steps = flat_after_steps
        self.flat_min_improvement = flat_min_improvement
        self.attempt = attempt
        self.window = max(1, min(50, (flat_after_steps or 0) // 10))
        self.diverged = False
        self.check_every = max(1, check_every)
        self._batch_step = 0  # the optimizer step the current batch belongs to (1-based)
        self._watch = LossWatch(defer_loss_check)
        self._checked_step = 0
        # (optimizer step it belongs to, loss tensor), this attempt; kept only to judge a flat loss
        self._losses: deque[tuple[int, torch.Tensor]] = deque(maxlen=10 * self.window)
        self._state: dict[str, Any] = {}

    # -- health.json -------------------------------------------------------------------------
    def _save(self, trainer: pl.Trainer) -> None:
        if trainer.global_rank != 0:
            return
        try:
            write_json_atomic(self.run_dir / HEALTH, self._state)
        except OSError as exc:  # a full disk must not kill training
            _say(f"could not write {HEALTH}: {exc}")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._state = read_json(self.run_dir / HEALTH) or {}
        if self._state.pop("diverged", None) is not None:
            self._save(trainer)  # an older attempt's divergence; this one starts healthy

    # -- divergence ----------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_step = trainer.global_step + 1

    def _check_loss(self, trainer: pl.Trainer, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        if loss.requires_grad:  # (Lightning hands batch-end hooks a detached copy already)
            loss = loss.detach()
        if self.flat_after_steps:
            self._losses.append((self._batch_step, loss))
        known_bad = self._watch.add(self._batch_step, loss)
        if trainer.world_size == 1 and not self._watch.deferred(loss):
            if known_bad:
                self._stop_if_diverged(trainer)
        elif self._batch_step % self.check_every == 0 and self._checked_step != self._batch_step:
            self._checked_step = self._batch_step  # once per step, on every rank at the same batch
            self._stop_if_diverged(trainer)

    def _stop_if_diverged(self, trainer: pl.Trainer) -> None:
        """Read the loss flag (a sync on a GPU) and stop every rank if any rank saw a bad loss.
        Every rank decides together: a rank that stopped alone would hang the others' all-reduce."""
        bad = self._watch.first_bad()
        if not trainer.strategy.reduce_boolean_decision(bad is not None, all=False):
            return
        if bad is None:
            self._diverge(trainer, trainer.global_step, "the training loss became non-finite on another rank")
        step, value = bad
        # Lightning divided the loss by the accumulation; nan and inf stay what they are
        self._diverge(trainer, step, f"the training loss became {value * trainer.accumulate_grad_batches}")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_if_diverged(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # A loss flag not yet read, then weights: a step with a finite loss can still leave inf/NaN
        # weights; such a file must never replace the last good one. A sync or two per checkpoint.
        self._stop_if_diverged(trainer)
        # A sharded model (strategy = "fsdp"): each rank checks its own shards, and all ranks
        # agree (a rank alone stopping would leave the others in the save's collective).
        params = [_local(p.detach()) for p in pl_module.parameters()]
        finite = _all_finite([p for p in params if p.numel()])
        if any(_local(p) is not p for p in pl_module.parameters()):
            finite = bool(trainer.strategy.reduce_boolean_decision(finite, all=True))
        if self.diverged or not finite:
            self._diverge(trainer, trainer.global_step, "a model weight became inf or NaN")

    def _diverge(self, trainer: pl.Trainer, step: int, what: str) -> None:
        self.diverged = True
        path, ckpt_step = newest_checkpoint(self.ckpt_dir)
        self._state["diverged"] = {
            "step": step,
            "what": what,
            "attempt": self.attempt,
            "at": time.time(),
            "checkpoint": path.name if path else None,
            "checkpoint_step": ckpt_step,
        }
        self._save(trainer)
        raise Diverged(step, what, path.name if path else None)

    # -- a flat loss -----------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Runs before the checkpoint callbacks' own on_train_batch_end (Lightning orders those
        # last), so a NaN step raises before a periodic save of it is even attempted.
        self._check_loss(trainer, outputs)
        n = self.flat_after_steps
        if not n or trainer.global_rank != 0 or "flat_checked_at" in self._state:
            return
        step = trainer.global_step
        if "baseline" not in self._state and step >= self.window:
            first = [v for s, v in self._losses if s <= self.window]
            if first:  # this attempt saw the first steps (not a resume past them)
                self._state["baseline"] = {"mean": _mean(first, trainer), "steps": self.window}
                self._save(trainer)
        if step < n:
            return
        recent = [v for s, v in self._losses if s > step - self.window]
        baseline = (self._state.get("baseline") or {}).get("mean")
        self._state["flat_checked_at"] = step
        if recent and isinstance(baseline, (int, float)) and baseline:
            mean = _mean(recent, trainer)
            improvement = (baseline - mean) / abs(baseline)
            if improvement < self.flat_min_improvement:
                self._state["loss_flat"] = {
                    "step": step,
                    "baseline": baseline,
                    "recent": mean,
                    "improvement": improvement,
                    "min_improvement": self.flat_min_improvement,
                    "window": self.window,
                    "attempt": self.attempt,
                    "at": time.time(),
                }
                _say(
                    f"warning: the training loss is flat: {mean:.4g} over the last {self.window} steps at step "
                    f"{step}, against {baseline:.4g} at the start ({improvement:+.1%}; "
                    f"flat_min_improvement = {self.flat_min_improvement:g}); training goes on"
                )
        self._save(trainer)


def _mean(losses: list[torch.Tensor], trainer: pl.Trainer) -> float:
    """The mean of logged losses as Lightning reported them (it divided by the accumulation);
    one read-back for all of them."""
    return float(torch.stack([t.float() for t in losses]).mean()) * trainer.accumulate_grad_batches
