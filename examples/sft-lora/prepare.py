"""Make the SFT + LoRA example's data and tiny model (no download, deterministic, idempotent):
data/train.jsonl and data/dev.jsonl (prompt, response, messages and text fields) and tiny-llama/
(a Llama-architecture model, hidden 32, 2 layers, with a BPE tokenizer and a chat template).

    python examples/sft-lora/prepare.py && orch run examples/sft-lora/job.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from anywhere inside the repository

from training.toy import write_jsonl  # noqa: E402
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows  # noqa: E402

TRAIN_ROWS, DEV_ROWS = 800, 100


def prepare(folder: Path = HERE) -> None:
    train, dev = folder / "data" / "train.jsonl", folder / "data" / "dev.jsonl"
    if not (train.is_file() and dev.is_file()):
        write_jsonl(train, instruction_rows(TRAIN_ROWS, seed=1))
        write_jsonl(dev, instruction_rows(DEV_ROWS, seed=2))
        print(f"wrote {train} and {dev}")
    model = folder / "tiny-llama"
    if not (model / "config.json").is_file():
        rows = instruction_rows(TRAIN_ROWS, seed=1)
        build_tiny_llama(model, [f"{r['prompt']}{r['response']} {r['text']}" for r in rows], vocab_size=400)
        print(f"wrote {model}")


if __name__ == "__main__":
    prepare()
