"""The door for a plain PyTorch loop: `from training.torch_loop import OrchLoop`. The body is
training/scripts/torch_loop.py."""

from __future__ import annotations

from training.scripts.torch_loop import OrchLoop

__all__ = ["OrchLoop"]
