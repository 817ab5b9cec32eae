"""orch: a cost-aware training-job orchestrator. This package is the daemon and CLI side;
it never imports torch, lightning, transformers or datasets."""

__version__ = "0.1.0"
