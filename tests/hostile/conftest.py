"""The hostile-input tests' sandbox: a temp folder holding ORCH_HOME and whatever an attack aims
at around it. Each test runs the real `orch` as a subprocess and then checks the three things
every refusal owes the user: the exit code, no traceback, and nothing written outside ORCH_HOME
(the sandbox is listed before and after)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

import pytest


class Ran(NamedTuple):
    rc: int
    out: str
    err: str

    def clean(self, rc: int) -> "Ran":
        assert self.rc == rc, self
        assert "Traceback" not in self.out + self.err, self
        return self


def listing(root: Path, skip: Iterable[Path] = ()) -> dict[str, tuple]:
    """Every path under root (not following links) with its kind, size and mtime; `skip`: folders left out."""
    skip = {str(p) for p in skip}
    out: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (
                st.st_mode,
                st.st_size if not os.path.isdir(path) else 0,
                st.st_mtime_ns,
            )
    return out


class Sandbox:
    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.before: Optional[dict[str, tuple]] = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env.update({"NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
        return env

    def orch(self, *args: object, stdin: Optional[int] = subprocess.DEVNULL, timeout: float = 90) -> Ran:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(self.home), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=stdin,
            env=self.env(),
            cwd=str(self.root),
        )
        return Ran(proc.returncode, proc.stdout, proc.stderr)

    def mark(self, *skip: Path) -> None:
        """Remember everything outside ORCH_HOME (and `skip`) now."""
        self._skip = (self.home, *skip)
        self.before = listing(self.root, self._skip)

    def assert_nothing_outside_home(self) -> None:
        assert self.before is not None, "call mark() before the attack"
        after = listing(self.root, self._skip)
        added = sorted(set(after) - set(self.before))
        changed = sorted(k for k in set(after) & set(self.before) if after[k] != self.before[k])
        assert not added and not changed, f"written outside ORCH_HOME: new {added}, changed {changed}"


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)
