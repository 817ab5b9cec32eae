"""The distribution's metadata: a name that is ours on PyPI, the `orch` command, and every example
file carried in the wheel and reachable through `orch example` (pure checks of pyproject.toml and
the example table; tests/repo/test_wheel.py installs the real wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.cli.example_commands import EXAMPLES, SHARE, write_example
from orchestrator.spec.tomlfile import tomllib

REPO = Path(__file__).resolve().parents[2]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_distribution_is_orch_gpu_and_installs_the_orch_command():
    project = pyproject()["project"]
    assert project["name"] == "orch-gpu"  # `orch` on PyPI is an unrelated project
    assert project["scripts"] == {"orch": "orchestrator.cli:main"}
    assert any(dep.startswith("build") for dep in project["optional-dependencies"]["test"])


def test_the_wheel_carries_orchestrator_training_and_notifiers_never_benchmarks_or_tools():
    from setuptools import find_packages

    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {name.split(".")[0] for name in find_packages(where=str(REPO), include=include)}
    assert tops == {"orchestrator", "training", "notifiers"}, tops  # benchmarks/ and tools/ are packages too


def test_every_tracked_example_file_travels_in_the_wheel_and_belongs_to_an_example():
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "examples"], capture_output=True, text=True).stdout
    files = set(tracked.split())
    data_files = pyproject()["tool"]["setuptools"]["data-files"]
    listed = {f for group in data_files.values() for f in group}
    assert listed == files, f"missing from data-files: {files - listed}; listed but not tracked: {listed - files}"
    for folder, group in data_files.items():
        assert all(folder == f"share/orch-gpu/{Path(f).parent.as_posix()}" for f in group), folder
        assert folder.startswith(SHARE)
    used = {rel for _, paths, _ in EXAMPLES.values() for rel in paths}
    tops = {f.split("/")[1] for f in files}  # examples/<this>/...
    assert tops <= {p.split("/")[0] for p in used}, tops


def test_orch_example_writes_an_example_with_what_it_uses_beside_it_and_never_overwrites(tmp_path: Path):
    written = write_example("plain-pytorch", tmp_path, REPO / "examples")
    names = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    assert "hf-trainer/prepare.py" in names and "plain-pytorch/train.py" in names
    assert not any(n.startswith("hf-trainer/data") or "tiny-bert" in n for n in names)  # only shipped files
    again = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "example", "plain-pytorch", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "exists already" in again.stderr


def test_orch_example_help_and_output_say_the_example_lands_in_its_own_folder_inside_dir(tmp_path: Path):
    orch = [sys.executable, "-m", "orchestrator.cli", "example"]
    shown = subprocess.run([*orch, "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0 and "DIR/quickstart/" in " ".join(shown.stdout.split()), shown.stdout
    ran = subprocess.run([*orch, "quickstart", str(tmp_path / "mine")], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "mine" / "quickstart" / "job.toml").is_file()  # where --help said
    assert f"{tmp_path / 'mine' / 'quickstart'}/" in ran.stdout  # and the output names that folder
