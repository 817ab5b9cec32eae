"""`bash scripts/build-dist.sh` as the README writes it (issue 38, item 13): without an activated
virtualenv it builds with the project's own .venv, and where there is none it says what to run
first instead of "No module named build". Runs the real script on a copy of the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)  # the virtualenv running the tests: it has build and setuptools


def _checkout_copy(dest: Path) -> Path:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True)
    for rel in tracked.stdout.split("\n"):
        src = REPO / rel
        if rel and src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _plain_env(path_first: Path | None = None) -> dict[str, str]:
    """A shell with no virtualenv active: the system's PATH only (optionally a folder before it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHON", "ORCH_VENV")}
    env["PATH"] = ":".join(([str(path_first)] if path_first else []) + ["/usr/local/bin", "/usr/bin", "/bin"])
    return env


@pytest.mark.slow
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs the tests to run in a virtualenv")
def test_build_dist_uses_the_projects_venv_when_none_is_activated(tmp_path: Path):
    repo = _checkout_copy(tmp_path / "orch")
    (repo / ".venv").symlink_to(VENV, target_is_directory=True)  # the project's .venv (setup.sh's)
    ran = subprocess.run(
        ["bash", "scripts/build-dist.sh", str(tmp_path / "dist")],
        cwd=repo,
        env=_plain_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "built " in ran.stdout and len(list((tmp_path / "dist").glob("orch_gpu-*.whl"))) == 1


def test_build_dist_without_a_venv_says_what_to_run_first(tmp_path: Path):
    repo = _checkout_copy(tmp_path / "orch")
    # A Python with neither build nor setuptools first on PATH: a fresh bare virtualenv's.
    bare = tmp_path / "bare"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    ran = subprocess.run(
        ["bash", "scripts/build-dist.sh", str(tmp_path / "dist")],
        cwd=repo,
        env=_plain_env(bare / "bin"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr and "No module named" not in ran.stderr
    assert "bash scripts/setup.sh" in ran.stderr and "PYTHON=" in ran.stderr
