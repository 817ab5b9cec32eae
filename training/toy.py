"""The door to the tiny offline things to train (a templated sentiment dataset, a tiny BERT, an
example's data): `from training.toy import ...` in examples/ and the tests. The bodies are in training/toys/."""

from __future__ import annotations

from training.toys.sentiment import LABEL_NAMES, build_tiny_bert, prepare_example, sentiment_rows, write_jsonl

__all__ = ["LABEL_NAMES", "build_tiny_bert", "prepare_example", "sentiment_rows", "write_jsonl"]
