"""The LightningModules of causal-lm and token-classification: the classifier's module (AdamW,
schedule, fault seams, OOM rescale on resume) with each task's validation metrics, and for LoRA
checkpoints that hold only the trained tensors."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..module import TransformerClassifier
from .lora import trained_only
from .spans import span_scores

IGNORE = -100


class CausalLMModule(TransformerClassifier):
    """val_loss is the mean over every predicted (non -100) token of the validation set;
    val_perplexity = exp(val_loss)."""

    def __init__(self, *args: Any, adapters_only: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.adapters_only = adapters_only
        # The frozen base is not in the checkpoint (it comes from model.name_or_path).
        self.strict_loading = not adapters_only
        self._val_tokens = 0

    def forward(self, **batch: torch.Tensor):
        # No KV cache in training: transformers builds the packed-rows mask (attention within each
        # example) only when there is none, and nothing here generates.
        return self.model(**batch, use_cache=False)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self(**batch)
        tokens = int((batch["labels"][:, 1:] != IGNORE).sum())
        self._val_loss_sum += float(out.loss) * tokens
        self._val_tokens += tokens

    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum, self._val_tokens = 0.0, 0

    def on_validation_epoch_end(self) -> None:
        if not self._val_tokens:
            return
        loss = self._val_loss_sum / self._val_tokens
        self.log_dict({"val_loss": loss, "val_perplexity": math.exp(min(loss, 80.0))}, prog_bar=True, sync_dist=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.adapters_only:
            checkpoint["state_dict"] = trained_only(checkpoint["state_dict"], self)


class TokenClassifierModule(TransformerClassifier):
    """val_loss over labelled tokens; val_precision/recall/f1 over entity spans of the words'
    first sub-tokens (seqeval's rules, training/builtin/tasks/spans.py)."""

    def __init__(self, *args: Any, tag_names: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tag_names = list(tag_names)
        self._gold: list[list[str]] = []
        self._pred: list[list[str]] = []
        self._val_tokens = 0

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self(**batch)
        labels = batch["labels"]
        keep = labels != IGNORE
        self._val_loss_sum += float(out.loss) * int(keep.sum())
        self._val_tokens += int(keep.sum())
        preds = out.logits.argmax(dim=-1)
        for row_labels, row_preds, row_keep in zip(labels.cpu(), preds.cpu(), keep.cpu()):
            self._gold.append([self.tag_names[i] for i in row_labels[row_keep].tolist()])
            self._pred.append([self.tag_names[i] for i in row_preds[row_keep].tolist()])

    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum, self._val_tokens, self._gold, self._pred = 0.0, 0, [], []

    def on_validation_epoch_end(self) -> None:
        if not self._val_tokens:
            return
        scores = span_scores(self._gold, self._pred)
        self.log_dict(
            {
                "val_loss": self._val_loss_sum / self._val_tokens,
                "val_precision": scores["precision"],
                "val_recall": scores["recall"],
                "val_f1": scores["f1"],
            },
            prog_bar=True,
            sync_dist=False,
        )
        self._gold, self._pred = [], []
