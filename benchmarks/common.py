"""What several benchmarks share: where the repository is and which `orch` to run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class BadTraces(ValueError):
    """A market benchmark's traces or prices cannot be replayed (the message names the file and the
    problem): one line, exit 2."""


def orch_exe() -> str:
    """The `orch` command of the running venv (the benchmarks time it as users run it)."""
    found = shutil.which("orch") or str(Path(sys.executable).with_name("orch"))
    if not Path(found).exists():
        sys.exit("orch is not on PATH: activate the venv (. .venv/bin/activate)")
    return found
