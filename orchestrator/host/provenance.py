"""Where a job's code came from: the git commit of its folder and whether the tree was dirty,
recorded at submit so a queued job's provenance is never a guess."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional


def git_state(folder: Path, timeout_s: float = 5.0) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the checkout containing `folder`, or (None, None) outside git."""

    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit.strip(), (bool(status.strip()) if status is not None else None)
