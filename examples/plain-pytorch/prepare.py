"""Make this example's data and tiny model (no download, deterministic, idempotent):
data/train.jsonl, data/dev.jsonl and tiny-bert/ next to this file, or in the folder given.

    python examples/plain-pytorch/prepare.py && orch submit examples/plain-pytorch/job.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout as well as from an installed orch

from training.toy import build_tiny_bert, sentiment_rows, write_jsonl  # noqa: E402


def prepare(folder: Path = HERE, *, train_rows: int = 640, dev_rows: int = 128) -> Path:
    data = folder / "data"
    if not (data / "train.jsonl").is_file() or not (data / "dev.jsonl").is_file():
        write_jsonl(data / "train.jsonl", sentiment_rows(train_rows, seed=11))
        write_jsonl(data / "dev.jsonl", sentiment_rows(dev_rows, seed=12))
    model = folder / "tiny-bert"
    if not (model / "config.json").is_file():
        texts = [r["text"] for r in sentiment_rows(1000, seed=1)]
        build_tiny_bert(model, texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    return folder


if __name__ == "__main__":
    print(prepare(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE))
