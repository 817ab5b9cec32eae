"""Shared fixtures for the foundation tests: a private ORCH_HOME per test, the real `orch`
run as a subprocess, the same app through typer's CliRunner, job files, and a store view."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import pytest

ORCH_EXE = shutil.which("orch") or str(Path(sys.executable).with_name("orch"))

# A command job that runs anywhere: no GPU asked (tests must not depend on the machine).
GOOD_JOB = """\
name = "tiny"
gpus = 0
command = ["python", "-c", "print('hi')"]
"""


class Ran(NamedTuple):
    rc: int
    out: str
    err: str

    def assert_failed(self, rc: int) -> "Ran":
        """The exit code orch promises, a message on stderr, and never a Python traceback."""
        assert self.rc == rc, self
        assert "Traceback" not in self.err and "Traceback" not in self.out, self.err
        assert self.err.strip(), "a failure must say why on stderr"
        return self

    def assert_ok(self) -> "Ran":
        assert self.rc == 0, self
        assert "Traceback" not in self.err, self.err
        return self


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(home)
    env["NO_COLOR"] = "1"
    return env


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, not yet created ORCH_HOME, also set in this process (for CliRunner and Store)."""
    root = tmp_path / "orch-home"
    for key in [k for k in os.environ if k.startswith("ORCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ORCH_HOME", str(root))
    return root


@pytest.fixture
def orch(home: Path) -> Callable[..., Ran]:
    """Run the real `orch` console script: orch("status", "--json") -> Ran(rc, out, err)."""

    def run(
        *args: object, cwd: Optional[Path] = None, env: Optional[dict[str, str]] = None, timeout: float = 60
    ) -> Ran:
        full_env = _clean_env(home)
        full_env.update(env or {})
        proc = subprocess.run(
            [ORCH_EXE, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or home.parent,
            env=full_env,
        )
        return Ran(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def cli(home: Path) -> Callable[..., Ran]:
    """The same app in-process through typer's CliRunner. An exception the CLI did not turn into
    an exit code is re-raised, so a would-be traceback fails the test."""
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    runner = CliRunner()

    def invoke(*args: object, env: Optional[dict[str, str]] = None) -> Ran:
        result = runner.invoke(
            app, [str(a) for a in args], env={"ORCH_HOME": str(home), "NO_COLOR": "1", **(env or {})}
        )
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return Ran(result.exit_code, result.stdout, result.stderr)

    return invoke


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[..., Path]:
    """write_file("job.toml", text) -> path, in a per-test folder (dedented)."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / "work" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def good_job(write_file: Callable[..., Path]) -> Path:
    return write_file("job.toml", GOOD_JOB)


@pytest.fixture
def job_count(home: Path) -> Callable[[], int]:
    """Jobs in the store, read with plain sqlite (0 when no database was ever created)."""

    def count() -> int:
        db = home / "orch.db"
        if not db.exists():
            return 0
        conn = sqlite3.connect(db)
        try:
            if conn.execute("SELECT name FROM sqlite_master WHERE name='jobs'").fetchone() is None:
                return 0
            return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        finally:
            conn.close()

    return count


@pytest.fixture
def store(home: Path):
    """The real Store of this test's ORCH_HOME (what `orch` itself opens)."""
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    s = Store(Home(home).ensure().db)
    yield s
    s.close()


# ---- pytest-xdist: which tests share a worker, and which start first -------------------------------
# scripts/test.sh runs the suite as `-n 2 --dist loadgroup`. A group runs whole on one worker: each
# file is a group (its module-scoped reference runs are made once), and files that share a per-host
# resource or a costly session fixture form one group between them. (xdist's own `xdist_group` mark
# does nothing under pytest 9, which no longer reads the node id xdist rewrites: the scheduler
# below groups by the node id's file instead.)
HOST_WIDE_FOLDERS = {
    "tests/slurm/": "slurm",  # one private Slurm cluster per session (munged, slurmctld, two slurmd)
    "tests/ray_executor/": "ray",  # one local Ray cluster (head + two workers, fixed ports) per session
    "tests/look/": "look",  # one dashboard scenario: four jobs trained, notified and screenshotted
}
# the session fixture `uninterrupted` (tests/mirror/conftest.py): the lost-machine reference run
SHARED_REFERENCE_FILES = {
    "tests/mirror/test_market_e2e.py": "mirror-uninterrupted",
    "tests/mirror/test_lost_instance_e2e.py": "mirror-uninterrupted",
    "tests/mirror/test_recovery_e2e.py": "mirror-uninterrupted",
}
# The longest groups start first, so that no long one is left for last with the other worker idle.
# Rough order from `--durations` (only the order matters: a stale entry costs balance, nothing else).
LONG_FIRST = [
    "ray",
    "slurm",
    "tests/training/test_training_sweeps.py",
    "tests/instrument/test_instrument_resume.py",
    "tests/foreground/test_foreground.py",
    "tests/cli/test_estimate_cli.py",
    "tests/chaos/test_chaos.py",
    "mirror-uninterrupted",
    "tests/repo/test_gpu_check.py",
    "tests/daemon/test_daemon_oom.py",
    "tests/daemon/test_tasks_e2e.py",
    "tests/cost/test_budget.py",
    "look",
    "tests/foreground/test_foreground_signals.py",
    "tests/daemon/test_preemption_e2e.py",
    "tests/daemon/test_hang_watchdog.py",
    "tests/training/test_training_runner.py",
    "tests/training/test_training_preemption.py",
    "tests/foreground/test_foreground_accounting.py",
    "tests/tracking/test_tracking_e2e.py",
    "tests/daemon/test_daemon_recovery.py",
]


def xdist_group_of(nodeid: str) -> str:
    """The group of a test by its node id (`tests/x/test_y.py::test_z[...]`)."""
    path = nodeid.split("::", 1)[0]
    for folder, group in HOST_WIDE_FOLDERS.items():
        if path.startswith(folder):
            return group
    return SHARED_REFERENCE_FILES.get(path, path)


def _grouping(config: pytest.Config) -> bool:
    # the controller sees `--dist loadgroup` as `dist`, xdist's workers as the option `loadgroup`
    return bool(getattr(config.option, "loadgroup", False)) or getattr(config.option, "dist", "no") == "loadgroup"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if not _grouping(config):
        return None  # xdist's own scheduler for the other --dist modes
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    config.option.loadscopereorder = False  # the order below, not the groups' test counts
    return ByGroup(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _grouping(config):
        return
    # every worker sorts its collection alike: the scheduler hands out groups in this order
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group_of(item.nodeid), len(rank)))  # stable
