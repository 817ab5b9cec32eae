"""What the check trains on, made locally and offline: BERT classifiers at three sizes (random
init, a WordPiece tokenizer trained on the toy sentences) and datasets of long or countable rows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional

from training.toy import LABEL_NAMES, build_tiny_bert, sentiment_rows, write_jsonl

# BertConfig's own defaults are BERT-base (12 x 768, 12 heads, FFN 3072, 512 positions).
SHAPES = {
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}
# Words of the toy tokenizer's vocabulary, used to make every row unique (digits are not in it).
TAG_WORDS = [
    "movie",
    "film",
    "plot",
    "acting",
    "script",
    "soundtrack",
    "ending",
    "cast",
    "story",
    "dialogue",
    "pacing",
    "visuals",
]


def build_model(folder: Path, shape: str, *, max_positions: int = 512, seed: int = 0) -> Path:
    """A tokenizer trained on the toy rows plus a random BertForSequenceClassification of `shape`
    (vocabulary 30522 like BERT for base/large, so the embedding is full size)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    if (folder / "config.json").exists():
        return folder
    texts = [r["text"] for r in sentiment_rows(2000, seed=1)]
    if shape == "tiny":
        return build_tiny_bert(
            folder,
            texts,
            hidden=32,
            layers=2,
            heads=2,
            vocab_size=400,
            max_positions=max_positions,
            seed=seed,
            label_names=LABEL_NAMES,
        )
    build_tiny_bert(
        folder,
        texts,
        hidden=32,
        layers=1,
        heads=1,
        vocab_size=400,
        max_positions=max_positions,
        label_names=LABEL_NAMES,
    )  # the tokenizer; the model is replaced below
    config = BertConfig(
        num_labels=2,
        max_position_embeddings=max_positions,
        **SHAPES[shape],
        id2label=dict(enumerate(LABEL_NAMES)),
        label2id={n: i for i, n in enumerate(LABEL_NAMES)},
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(str(folder))
    return folder


def tag(i: int, width: int = 5) -> str:
    return " ".join(TAG_WORDS[(i // 12**k) % 12] for k in range(width))


def long_rows(n: int, *, min_words: int, seed: int, start: int = 0, unique: bool = False) -> list[dict]:
    """n rows of at least `min_words` words: several toy sentences of one label joined (truncation
    then gives every row the full max_length). unique: a distinct 5-word tag first in each row
    (12**5 of them)."""
    rng = random.Random(seed)
    pool = sentiment_rows(4000, seed=seed)
    by_label = {0: [r["text"] for r in pool if r["label"] == 0], 1: [r["text"] for r in pool if r["label"] == 1]}
    rows = []
    for i in range(n):
        label = rng.randrange(2)
        words: list[str] = tag(start + i).split() if unique else []
        while len(words) < min_words:
            words += rng.choice(by_label[label]).split()
        rows.append({"text": " ".join(words), "label": label})
    return rows


def short_rows(n: int, *, seed: int, start: int = 0) -> list[dict]:
    """n one-sentence rows, each made unique by a tag (about 15 tokens)."""
    rows = sentiment_rows(n, seed=seed)
    for i, row in enumerate(rows):
        row["text"] = f"{tag(start + i)} {row['text']}"
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    return write_jsonl(path, rows)


def loss_curve(metrics_csv: Path) -> list[tuple[int, float]]:
    """(step, train_loss) from the runner's CSVLogger file."""
    import csv
    import math

    out: list[tuple[int, float]] = []
    if not metrics_csv.exists():
        return out
    with open(metrics_csv, newline="") as fh:
        for row in csv.DictReader(fh):
            value: Optional[str] = row.get("train_loss")
            if value in (None, ""):
                continue
            try:
                out.append((int(float(row.get("step") or 0)), float(value)))
            except ValueError:
                out.append((int(float(row.get("step") or 0)), math.nan))
    return out
