"""Make this example's data and tiny model (no download, deterministic, idempotent):
data/train.jsonl, data/dev.jsonl and tiny-bert/ next to this file, or in the folder given.

    python examples/hf-trainer/prepare.py && orch submit examples/hf-trainer/job.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout as well as from an installed orch

from training.toy import prepare_example  # noqa: E402


def prepare(folder: Path = HERE, *, train_rows: int = 640, dev_rows: int = 128) -> Path:
    return prepare_example(
        folder,
        train_rows=train_rows,
        dev_rows=dev_rows,
        train_seed=11,
        dev_seed=12,
        vocab_rows=1000,
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=300,
        max_positions=64,
    )


if __name__ == "__main__":
    print(prepare(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE))
