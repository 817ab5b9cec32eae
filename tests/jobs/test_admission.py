"""One admission check at submit (jobs/admission.py) for `orch submit`, `orch run` and a sweep's
base job: every instant problem of the file at once, exit 2, no traceback, nothing recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ORCH = [sys.executable, "-m", "orchestrator.cli"]

# A machine with no GPUs, a local executor: gpus = 3 and nodes = 2 cannot run here.
CONFIG = "[daemon]\ngpus = []\n"
BAD_JOB = (
    'name = "bad"\ngpus = 3\nnodes = 2\ndeadline = "2001-01-01T00:00:00+00:00"\n'
    'command = ["python", "fit.py", "--lr", "{lr}"]\n'
)
SWEEP = '[sweep]\njob = "job.toml"\ntrials = 2\nobjective = "score"\n[sweep.params]\nlr = { values = [0.1, 0.2] }\n'


def orch(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCH_HOME": str(home)}
    return subprocess.run([*ORCH, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(CONFIG)
    job = tmp_path / "job.toml"
    job.write_text(BAD_JOB)
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    return home, job, sweep


def refused_lines(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    return res.stderr


@pytest.mark.parametrize("verb", ["submit", "run"])
def test_submit_and_run_name_every_problem_of_the_file_at_once(files, verb):
    home, job, _ = files
    err = refused_lines(orch(home, verb, str(job)))
    assert "deadline: 2001-01-01" in err and "already past" in err
    assert "gpus: asks for 3 GPUs but this machine has 0" in err
    assert "nodes: asks for 2 nodes" in err
    assert "placeholder" in err or "{lr}" in err  # a sweep's base job submitted alone
    assert json.loads(orch(home, "status", "--all", "--json").stdout) == []  # nothing recorded


def test_a_sweep_s_base_job_is_admitted_by_the_same_check(files):
    home, _, sweep = files
    err = refused_lines(orch(home, "submit", str(sweep)))
    assert "gpus: asks for 3 GPUs but this machine has 0" in err
    assert "nodes: asks for 2 nodes" in err
    assert "deadline" not in err  # the trials start later: a sweep's base job has no deadline check
    assert json.loads(orch(home, "status", "--all", "--json").stdout) == []
