"""The door for your own Lightning script: `from training.callbacks import OrchCallback`. The body is
training/scripts/lightning.py (what a user's script imports lives in training/scripts/)."""

from __future__ import annotations

from training.scripts.lightning import OrchCallback, Preempted

__all__ = ["OrchCallback", "Preempted"]
