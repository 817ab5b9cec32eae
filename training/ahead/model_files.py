"""What a local model folder must hold before a built-in job may train on it, read from the file
names alone (no torch, nothing loaded): the weights, a tokenizer's files, and not a LoRA adapter in
place of its base model. Then, once the tokenizer is loaded, whether it is the model's: a
vocabulary far smaller than the model's `vocab_size`, or first rows that tokenize to unknown
tokens only, train on nothing (transformers builds a 5-token BERT tokenizer from an empty folder,
and such a run "succeeds")."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

# The files transformers reads a tokenizer from: one of them is enough.
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "tokenizer.tiktoken",
)
# The weights from_pretrained looks for, whole or sharded (the index names the shards).
WEIGHTS_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)
VOCAB_RATIO = 4  # a tokenizer under a quarter of the model's vocab_size is not the model's
UNK_ROWS = 8  # the first rows tokenized to see whether any token is known


def folder_problems(folder: Path) -> list[str]:
    """What a local model folder lacks, each line naming model.name_or_path and the file."""
    where = f"model.name_or_path: {folder}"
    if not folder.is_dir():
        return [f"{where} is not a folder"]
    names = {p.name for p in folder.iterdir()}
    if "adapter_config.json" in names and "config.json" not in names:
        return [
            f"{where}: this is a PEFT adapter (adapter_config.json): give its base model in "
            "model.name_or_path (and the adapter's settings in [lora])"
        ]
    problems = []
    if not names & set(WEIGHTS_FILES):
        problems.append(f"{where} has no weights file (one of: {', '.join(WEIGHTS_FILES)})")
    if not names & set(TOKENIZER_FILES):
        problems.append(
            f"{where} has no tokenizer files (one of: {', '.join(TOKENIZER_FILES)}): "
            "copy the tokenizer the model was trained with into it"
        )
    return problems


def vocabulary_problem(tokenizer: Any, vocab_size: Optional[int], folder: str) -> Optional[str]:
    """A tokenizer far smaller than the model's embedding table is some other tokenizer."""
    size = len(tokenizer)
    if vocab_size and size * VOCAB_RATIO < vocab_size:
        return (
            f"model.name_or_path: the tokenizer in {folder} has {size} tokens and the model's vocab_size is "
            f"{vocab_size}: it is not the model's tokenizer (copy the one it was trained with)"
        )
    return None


def unknown_only_problem(tokenizer: Any, texts: Sequence[str], source: str) -> Optional[str]:
    """The first rows' text tokenized: every token the unknown token means the model reads nothing."""
    unk = getattr(tokenizer, "unk_token_id", None)
    texts = [t for t in texts if isinstance(t, str) and t.strip()][:UNK_ROWS]
    if unk is None or not texts:
        return None
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if any(i != unk and i not in special for i in ids):
            return None
    return (
        f"data.train: the first {len(texts)} rows of {source} tokenize to the unknown token only "
        f"({getattr(tokenizer, 'unk_token', 'unk')}): the tokenizer does not fit this model or this text"
    )
