"""GPUs that do not exist are not handed out (issue 44): `[daemon] gpus = [0, 1]` on a machine whose
nvidia-smi shows one GPU fails a command job asking for two at once — exit 78, the reason in one
line, not charged, its command never run — from the daemon and from `orch run` alike, while a job
that fits what nvidia-smi shows runs, and `ORCH_GPUS_ON_CPU=1` still rehearses a GPU job on the CPU.
nvidia-smi here is a stand-in on PATH that answers as the real one does for one GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_harness import OrchHome, orch_home  # noqa: F401  (fixture)
from orchestrator.contract import EX_CONFIG
from orchestrator.model.states import JobState


@pytest.fixture
def one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH whose nvidia-smi shows one GPU (index 0), for this process and its children."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *index,name,memory.total*) echo "0, Tesla T4, 15360" ;;\n'
        '  *) echo "Tesla T4, 535.104.05" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_the_daemon_fails_a_job_asking_for_a_gpu_nvidia_smi_does_not_show(orch_home, one_gpu):
    h: OrchHome = orch_home(gpus=[0, 1], cpu_slots=1)
    d = h.local_daemon()
    two = h.submit("two", gpus=2)
    job = h.tick_state(d, two, JobState.FAILED)
    assert "asks for GPU 1, which this machine does not have (nvidia-smi shows only 1)" in job.reason, job.reason
    assert h.exit_record(two, 1)["code"] == EX_CONFIG
    assert h.records("two", "start") == []  # its command never ran
    assert job.cost == 0.0 and job.retries == 0 and len(h.store.attempts(two)) == 1
    log = (h.run_dir(two) / "attempt-1.log").read_text().splitlines()
    assert len(log) == 1 and log[0].startswith("[orch] attempt 1 not started: asks for GPU 1"), log

    fits = h.submit("one", gpus=1)  # GPU 0 is there: it runs
    h.tick_state(d, fits, JobState.SUCCEEDED)
    rehearsed = h.submit("rehearsed", gpus=2, env={"ORCH_GPUS_ON_CPU": "1"})
    h.tick_state(d, rehearsed, JobState.SUCCEEDED)


def test_orch_run_fails_a_command_job_asking_for_a_gpu_nvidia_smi_does_not_show(orch_home, one_gpu):
    h: OrchHome = orch_home(gpus=[0, 1])
    path = h.job_file("two", gpus=2)
    env = {**h.env(), "PATH": os.environ["PATH"]}
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "run", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert out.returncode == EX_CONFIG, out.stderr
    said = [line for line in out.stderr.splitlines() if "GPU" in line]  # after "recorded job 1 (two)"
    assert len(said) == 1 and "job 1 failed: asks for GPU 1, which this machine does not have" in said[0], out.stderr
    assert "Traceback" not in out.stderr and h.records("two", "start") == []
    assert h.store.jobs()[0].state is JobState.FAILED
