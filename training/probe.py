"""`python -m training.probe JOB_TOML [--warmup W] [--steps N]`: the measurement behind `orch estimate`.
The door only: the body is training/ahead/probe.py."""

from __future__ import annotations

import sys

from training.ahead.probe import cli

__all__ = ["cli"]


if __name__ == "__main__":
    sys.exit(cli())
