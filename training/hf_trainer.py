"""The door for a `transformers.Trainer` script: `from training.hf_trainer import OrchTrainerCallback,
resume_from`. The body is training/scripts/hf_trainer.py."""

from __future__ import annotations

from training.scripts.hf_trainer import OrchTrainerCallback, resume_from

__all__ = ["OrchTrainerCallback", "resume_from"]
