"""causal-lm data: plain text, prompt + response (loss on the response only) or chat messages
(the tokenizer's chat template; loss on the assistant's turns), truncated to max_length and
optionally packed several examples to a row with positions restarting per example, which is
how transformers keeps attention within each example (a packed-sequence mask)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from ..data import DataError, TextClassificationData, load_split
from ..job_plan import is_rank_zero, say
from ..rows import IGNORE, chat_segments, sft_tokenize  # noqa: F401 (chat_segments: importable from here as before)

LM_COLUMNS = ("input_ids", "labels", "position_ids")


def pack_rows(batch: dict[str, list], max_length: int) -> dict[str, list]:
    """Consecutive examples greedily into rows of at most max_length tokens; position_ids restart
    at 0 for each example (the boundary transformers' packed-sequence mask reads)."""
    out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    row: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        if row["input_ids"] and len(row["input_ids"]) + len(ids) > max_length:
            for k in out:
                out[k].append(row[k])
            row = {"input_ids": [], "labels": [], "position_ids": []}
        row["input_ids"] += ids
        row["labels"] += labels
        row["position_ids"] += list(range(len(ids)))
    if row["input_ids"]:
        for k in out:
            out[k].append(row[k])
    return out


def without_assistant(conversations: list, field: str) -> tuple[int, str]:
    """Conversations with no token to train on whatever max_length is (the loss is on the
    assistant's turns, and these have none): how many, and in words."""
    empty = sum(1 for c in conversations if not c)
    without = sum(
        1 for c in conversations if c and not any(isinstance(m, dict) and m.get("role") == "assistant" for m in c)
    )
    parts = ([f"{without} without an assistant turn"] if without else []) + (
        [f"{empty} with an empty {field!r}"] if empty else []
    )
    return empty + without, " and ".join(parts)


class CausalLMData(TextClassificationData):
    def __init__(
        self,
        *,
        prompt_field: Optional[str] = None,
        response_field: Optional[str] = None,
        messages_field: Optional[str] = None,
        packing: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.mode = "messages" if messages_field else "prompt" if prompt_field else "text"
        self.fields = {
            "text": self.text_field,
            "prompt": prompt_field,
            "response": response_field,
            "messages": messages_field,
        }
        self.packing = packing
        self.dropped: dict[str, int] = {}

    def prepare(self) -> None:
        import time

        if self.packing:
            try:
                from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
            except ImportError:
                raise DataError(
                    "data.packing needs transformers >= 4.56 (its packed-sequence attention mask); "
                    "upgrade transformers or set packing = false"
                ) from None
        raw = {name: load_split(src, name) for name, src in self.sources.items() if src}
        wanted = [self.fields[k] for k in (("prompt", "response") if self.mode == "prompt" else (self.mode,))]
        for name, ds in raw.items():
            missing = [f for f in wanted if f not in ds.column_names]
            if missing:
                raise DataError(f"{name} data has no column {missing[0]!r} (columns: {', '.join(ds.column_names)})")
        if self.mode == "messages" and not getattr(self.tokenizer, "chat_template", None) and is_rank_zero():
            say(
                f"warning: the tokenizer of {getattr(self.tokenizer, 'name_or_path', '') or 'this model'!r} has no chat "
                "template: each conversation is written as 'role: content' lines, the format the model learns"
            )
        start = time.perf_counter()
        for name, ds in raw.items():
            kwargs = dict(tokenizer=self.tokenizer, mode=self.mode, fields=self.fields, max_length=self.max_length)
            out = self._map(
                ds,
                sft_tokenize,
                kwargs,
                ["causal-lm", self.mode, self.fields, self.max_length, getattr(self.tokenizer, "chat_template", None)],
                LM_COLUMNS,
            )
            self.dropped[name] = len(ds) - len(out)
            untrainable, why = 0, ""
            if self.mode == "messages" and self.dropped[name]:
                field = str(self.fields["messages"])
                untrainable, why = without_assistant(ds[field], field)
            if len(out) == 0:
                if untrainable == len(ds):  # the true reason, not max_length
                    raise DataError(
                        f"{name} data: no conversation has an assistant turn to train on (the loss is on the "
                        f"assistant's turns): {why}"
                    )
                raise DataError(
                    f"{name} data: no example has a token to train on within max_length = {self.max_length}"
                )
            if untrainable and is_rank_zero():
                say(
                    f"warning: {name} data: {untrainable} of {len(ds)} conversations skipped ({why}): nothing to train on"
                )
            if self.packing:
                out = self._pack(out)
            self.splits[name] = out
        self.tokenize_seconds = time.perf_counter() - start

    def _pack(self, ds):
        key = ["packed", ds._fingerprint, self.max_length]
        import hashlib
        import json

        fingerprint = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
        return ds.map(
            pack_rows,
            batched=True,
            batch_size=1000,
            fn_kwargs={"max_length": self.max_length},
            remove_columns=ds.column_names,
            new_fingerprint=fingerprint,
            desc="packing",
        )

    def collator(self):
        return LMCollator(
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else (self.tokenizer.eos_token_id or 0)
        )


class LMCollator:
    """Pads to the longest row: input_ids with the pad id, labels with -100. Unpacked rows get an
    attention mask; packed rows get position_ids instead (no mask: transformers then derives the
    per-example mask from the restarts, and padding, which comes last, is seen by nothing real)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        n, width = len(rows), max(len(r["input_ids"]) for r in rows)
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        labels = np.full((n, width), IGNORE, dtype=np.int64)
        packed = "position_ids" in rows[0]
        extra = np.zeros((n, width), dtype=np.int64)
        for i, row in enumerate(rows):
            k = len(row["input_ids"])
            ids[i, :k], labels[i, :k] = row["input_ids"], row["labels"]
            if packed:
                extra[i, :k] = row["position_ids"]
                extra[i, k:] = np.arange(width - k)  # the padding is one more "example"
            else:
                extra[i, :k] = 1
        batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        batch["position_ids" if packed else "attention_mask"] = torch.from_numpy(extra)
        return batch
