"""token-classification data: a list of words and a list of tags per row; tags (strings, or a
datasets ClassLabel sequence) mapped to ids; each word's tag on its first sub-token, -100 on
the other sub-tokens and the special tokens."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from ..data import DataError, TextClassificationData, load_split
from ..rows import IGNORE, align_tokenize

TOKEN_COLUMNS = ("input_ids", "labels")


def tag_names(train, tags_field: str) -> list[str]:
    """The tag set: a ClassLabel sequence's names in their order, else the sorted distinct strings
    (sorted so every attempt maps them the same way)."""
    feature = train.features[tags_field]
    inner = getattr(feature, "feature", None)
    names = getattr(inner, "names", None)
    if names:
        return list(names)
    dtype = getattr(inner, "dtype", None)
    if dtype not in ("string", "large_string"):
        raise DataError(
            f'the training data\'s {tags_field!r} must be lists of tag names such as "B-PER" (found {feature})'
        )
    return sorted({str(t) for tags in train[tags_field] for t in tags})


class TokenClassificationData(TextClassificationData):
    def __init__(self, *, tokens_field: str = "tokens", tags_field: str = "tags", **kwargs: Any):
        super().__init__(**kwargs)
        self.tokens_field, self.tags_field = tokens_field, tags_field
        self.tag2id: Optional[dict[str, int]] = None

    def prepare(self) -> None:
        import time

        if not getattr(self.tokenizer, "is_fast", False):
            raise DataError("token-classification needs a fast tokenizer (word ids for each sub-token)")
        raw = {name: load_split(src, name) for name, src in self.sources.items() if src}
        for name, ds in raw.items():
            for field in (self.tokens_field, self.tags_field):
                if field not in ds.column_names:
                    raise DataError(f"{name} data has no column {field!r} (columns: {', '.join(ds.column_names)})")
        self.label_names = tag_names(raw["train"], self.tags_field)
        class_label = bool(getattr(raw["train"].features[self.tags_field].feature, "names", None))
        self.tag2id = None if class_label else {name: i for i, name in enumerate(self.label_names)}
        for name, ds in raw.items():
            if self.tag2id is not None and name != "train":
                unknown = sorted({str(t) for tags in ds[self.tags_field] for t in tags} - set(self.tag2id))
                if unknown:
                    raise DataError(f"{name} data has tags the training data lacks: {', '.join(unknown[:5])}")
            for n, (words, tags) in enumerate(zip(ds[self.tokens_field], ds[self.tags_field])):
                if len(words) != len(tags):
                    raise DataError(f"{name} data row {n}: {len(words)} tokens but {len(tags)} tags")
        start = time.perf_counter()
        for name, ds in raw.items():
            kwargs = dict(
                tokenizer=self.tokenizer,
                tokens_field=self.tokens_field,
                tags_field=self.tags_field,
                max_length=self.max_length,
                tag2id=self.tag2id,
            )
            self.splits[name] = self._map(
                ds,
                align_tokenize,
                kwargs,
                ["token-classification", self.tokens_field, self.tags_field, self.max_length, self.label_names],
                TOKEN_COLUMNS,
            )
        self.tokenize_seconds = time.perf_counter() - start

    def collator(self):
        return TokenCollator(self.tokenizer.pad_token_id or 0)


class TokenCollator:
    """Pads input_ids with the pad id, labels with -100, and builds the attention mask."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        n, width = len(rows), max(len(r["input_ids"]) for r in rows)
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        labels = np.full((n, width), IGNORE, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        for i, row in enumerate(rows):
            k = len(row["input_ids"])
            ids[i, :k], labels[i, :k], mask[i, :k] = row["input_ids"], row["labels"], 1
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(labels),
        }
