"""TransformerClassifier: a LightningModule around AutoModelForSequenceClassification with AdamW
(no weight decay on biases and norm weights), linear warmup/decay, and val loss/acc/F1."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

from orchestrator.contract import (
    ENV_ATTEMPT,
    ENV_FAULT_HANG_AT_STEP,
    ENV_FAULT_OOM_ABOVE_BATCH,
    ENV_FAULT_OOM_AT_STEP,
    ENV_FAULT_SLOW_STEP_S,
    ENV_TRACE_SAMPLES,
)
from orchestrator.spec.jobspec import TASK_CLASSIFY, logged_metrics

from training.resume.resize import rescale_checkpoint, rescale_world

# Fault-injection seams (tests and drills; no effect unless set): their names are in the contract.
FAULT_OOM_ABOVE_BATCH = ENV_FAULT_OOM_ABOVE_BATCH
FAULT_OOM_AT_STEP = ENV_FAULT_OOM_AT_STEP
FAULT_SLOW_STEP = ENV_FAULT_SLOW_STEP_S
FAULT_HANG_AT_STEP = ENV_FAULT_HANG_AT_STEP
TRACE_SAMPLES = ENV_TRACE_SAMPLES


def load_classifier(name_or_path: str, num_labels: int, label_names: Optional[list[str]] = None):
    from transformers import AutoModelForSequenceClassification

    kwargs: dict[str, Any] = {"num_labels": num_labels}
    if label_names:
        kwargs["id2label"] = {i: name for i, name in enumerate(label_names)}
        kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
    return AutoModelForSequenceClassification.from_pretrained(name_or_path, **kwargs)


class TransformerClassifier(pl.LightningModule):
    def __init__(
        self,
        model_name_or_path: str,
        num_labels: int = 2,
        *,
        learning_rate: float = 2e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        gradient_checkpointing: bool = False,
        label_names: Optional[list[str]] = None,
        batch_size: int = 32,
        total_steps: Optional[int] = None,
        model: Any = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["model"])
        self.model = model if model is not None else load_classifier(model_name_or_path, num_labels, label_names)
        self.model.train()  # from_pretrained returns eval mode, and Lightning keeps a module's mode: no dropout
        if gradient_checkpointing:
            enable = (
                getattr(self.model, "activation_checkpointing_enable", None) or self.model.gradient_checkpointing_enable
            )
            enable()
        self.num_labels = num_labels
        self.batch_size = batch_size
        self._val_preds: list[torch.Tensor] = []
        self._val_labels: list[torch.Tensor] = []
        self._val_loss_sum = 0.0
        self._oom_above = int(os.environ.get(FAULT_OOM_ABOVE_BATCH, "0") or 0)
        self._oom_at_step = int(os.environ.get(FAULT_OOM_AT_STEP, "0") or 0)
        self._slow_step = float(os.environ.get(FAULT_SLOW_STEP, "0") or 0)
        self._hang_at = (os.environ.get(FAULT_HANG_AT_STEP) or "") if os.environ.get(ENV_ATTEMPT, "1") == "1" else ""
        self._trace = os.environ.get(TRACE_SAMPLES)
        self._prog_bar = True
        # strategy = "fsdp": the runner sets this to shard the model (training/builtin/fsdp.py)
        self.shard: Optional[Callable[[Any, Any], None]] = None
        self._sharded = False

    def configure_model(self) -> None:
        """Where Lightning's ModelParallelStrategy wants the model sharded: once its device mesh
        exists, before the optimizer is built over the shards. Nothing to do under DDP."""
        if self.shard is not None and not self._sharded:
            self.shard(self, self.device_mesh)
            self._sharded = True

    def on_train_start(self) -> None:
        self._prog_bar = self.trainer.progress_bar_callback is not None

    def forward(self, **batch: torch.Tensor):
        return self.model(**batch)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        n = batch["labels"].shape[0]
        if self._oom_above and n > self._oom_above and self.global_step >= self._oom_at_step:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (injected by {FAULT_OOM_ABOVE_BATCH}={self._oom_above}: micro-batch {n})"
            )
        if self._slow_step:
            time.sleep(self._slow_step)
        if self._hang_at and self.global_step >= int(self._hang_at):
            while True:  # a stuck collective or data loader, as the hang watchdog sees it
                time.sleep(3600)
        loss = self(**batch).loss
        if self._trace:
            self._trace_batch(batch)
        # On the progress bar only when there is one: Lightning reads a progress-bar value back as a
        # number after every batch, which on a GPU is a device sync per step.
        self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=self._prog_bar, batch_size=n)
        return loss

    def _trace_batch(self, batch: dict[str, torch.Tensor]) -> None:
        import hashlib
        import json

        rows = [
            hashlib.md5(str(ids[mask.bool()].tolist()).encode()).hexdigest()[:12]
            for ids, mask in zip(batch["input_ids"].cpu(), batch["attention_mask"].cpu())
        ]
        line = {"rank": self.global_rank, "epoch": self.current_epoch, "step": self.global_step, "rows": rows}
        with open(self._trace, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self(**batch)
        n = batch["labels"].shape[0]
        self._val_loss_sum += float(out.loss) * n
        self._val_preds.append(out.logits.argmax(dim=-1).cpu())
        self._val_labels.append(batch["labels"].cpu())

    def on_validation_epoch_start(self) -> None:
        self._val_preds, self._val_labels, self._val_loss_sum = [], [], 0.0

    def on_validation_epoch_end(self) -> None:
        if not self._val_labels:
            return
        preds, labels = torch.cat(self._val_preds), torch.cat(self._val_labels)
        metrics = {"val_loss": self._val_loss_sum / len(labels), "val_acc": (preds == labels).float().mean().item()}
        if "val_f1" in logged_metrics(TASK_CLASSIFY, self.num_labels):  # the pre-flight reads the same rule
            metrics["val_f1"] = macro_f1(preds, labels, self.num_labels)
        # Every rank validated the full set, so no cross-rank reduction is needed.
        self.log_dict(metrics, prog_bar=True, sync_dist=False)
        self._val_preds, self._val_labels = [], []

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            # biases and LayerNorm weights are 1-D
            (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
        groups = [
            {"params": decay, "weight_decay": self.hparams.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=self.hparams.learning_rate)
        # The runner passes total_steps: asking the trainer (estimated_stepping_batches) sets up the
        # train loader before the checkpoint restore, and Lightning then never restores its position.
        total = self.hparams.total_steps or int(self.trainer.estimated_stepping_batches)
        warmup = int(self.hparams.warmup_ratio * total)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, max(total, 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["orch"] = {
            "batch_size": int(self.batch_size),
            "accumulate_grad_batches": int(self.trainer.accumulate_grad_batches),
            "world_size": int(self.trainer.world_size),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        world = checkpoint.get("orch", {}).get("world_size")
        if world and world != self.trainer.world_size:
            # `orch retry --gpus N`: the loop and loader positions in this world's per-rank counts
            rescale_world(checkpoint, int(world), int(self.trainer.world_size))
        saved = checkpoint.get("orch", {}).get("batch_size")
        if saved and saved != self.batch_size:
            # The micro-batch shrank after an OOM: re-express the loop and loader positions in
            # the new batch size before Lightning restores them (the dict is mutated in place).
            rescale_checkpoint(checkpoint, saved, self.batch_size)


def macro_f1(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> float:
    scores = []
    for c in range(num_classes):
        tp = ((preds == c) & (labels == c)).sum().item()
        fp = ((preds == c) & (labels != c)).sum().item()
        fn = ((preds != c) & (labels == c)).sum().item()
        if tp + fp + fn == 0:
            continue
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores) if scores else 0.0
