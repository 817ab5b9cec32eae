"""Make the quickstart's data and tiny model (no download, deterministic, idempotent):
data/train.jsonl, data/dev.jsonl and tiny-bert/ next to this file.

    python examples/quickstart/prepare.py && orch submit examples/quickstart/job.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from anywhere inside the repository

from training.toy import prepare_example  # noqa: E402

TRAIN_ROWS, DEV_ROWS = 2000, 400


def prepare(folder: Path = HERE) -> None:
    prepare_example(
        folder,
        train_rows=TRAIN_ROWS,
        dev_rows=DEV_ROWS,
        train_seed=1,
        dev_seed=2,
        vocab_rows=TRAIN_ROWS,
        vocab_seed=1,
        say=True,
    )


if __name__ == "__main__":
    prepare()
