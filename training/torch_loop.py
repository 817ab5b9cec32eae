"""The door for a plain PyTorch loop: `from training.torch_loop import OrchLoop` (one process, or
DDP), or `OrchShardedLoop` (a model sharded with FSDP2 over torchrun's ranks). The bodies are
training/scripts/torch_loop.py and training/scripts/sharded_loop.py."""

from __future__ import annotations

from training.scripts.sharded_loop import OrchShardedLoop
from training.scripts.torch_loop import OrchLoop

__all__ = ["OrchLoop", "OrchShardedLoop"]
