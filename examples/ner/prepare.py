"""Make the NER example's data and tiny model (no download, deterministic, idempotent):
data/train.jsonl and data/dev.jsonl ({"tokens": [...], "tags": ["B-PER", ...]}) and tiny-bert/.

    python examples/ner/prepare.py && orch run examples/ner/job.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from anywhere inside the repository

from training.toy import build_tiny_bert, write_jsonl  # noqa: E402
from training.toys.lm_and_ner import ner_rows  # noqa: E402

TRAIN_ROWS, DEV_ROWS = 1000, 200


def prepare(folder: Path = HERE) -> None:
    train, dev = folder / "data" / "train.jsonl", folder / "data" / "dev.jsonl"
    if not (train.is_file() and dev.is_file()):
        write_jsonl(train, ner_rows(TRAIN_ROWS, seed=1))
        write_jsonl(dev, ner_rows(DEV_ROWS, seed=2))
        print(f"wrote {train} and {dev}")
    model = folder / "tiny-bert"
    if not (model / "config.json").is_file():
        texts = [" ".join(r["tokens"]) for r in ner_rows(TRAIN_ROWS, seed=1)]
        build_tiny_bert(model, texts, hidden=32, layers=2, heads=2, vocab_size=120, max_positions=64)
        print(f"wrote {model}")


if __name__ == "__main__":
    prepare()
