"""Make the quickstart's data and tiny model (no download, deterministic, idempotent):
data/train.jsonl, data/dev.jsonl and tiny-bert/ next to this file.

    python examples/quickstart/prepare.py && orch submit examples/quickstart/job.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from anywhere inside the repository

from training.toy import build_tiny_bert, sentiment_rows, write_jsonl  # noqa: E402

TRAIN_ROWS, DEV_ROWS = 2000, 400


def prepare(folder: Path = HERE) -> None:
    data = folder / "data"
    train, dev = data / "train.jsonl", data / "dev.jsonl"
    if not (train.is_file() and dev.is_file()):
        rows = sentiment_rows(TRAIN_ROWS, seed=1)
        write_jsonl(train, rows)
        write_jsonl(dev, sentiment_rows(DEV_ROWS, seed=2))
        print(f"wrote {train} and {dev}")
    model = folder / "tiny-bert"
    if not (model / "config.json").is_file():
        texts = [r["text"] for r in sentiment_rows(TRAIN_ROWS, seed=1)]
        build_tiny_bert(model, texts)
        print(f"wrote {model}")


if __name__ == "__main__":
    prepare()
