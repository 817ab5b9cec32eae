"""`python -m training.preflight < REQUEST.json`: what `orch submit` asks of a built-in job before it is
queued. The door only: the body is training/ahead/preflight.py."""

from __future__ import annotations

import sys

from training.ahead.preflight import main

__all__ = ["main"]


if __name__ == "__main__":
    sys.exit(main())
