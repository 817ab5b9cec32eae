"""`orch run`: the job runs in the foreground through the same runner and run folder; Ctrl-C
checkpoints and prints the resume command; `orch run --resume ID` continues from that step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_harness import wait_for
from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

ORCH = [sys.executable, "-m", "orchestrator.cli"]


def orch(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCH_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*ORCH, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tiny_job_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fg-job")
    rows = sentiment_rows(800, seed=3)
    write_jsonl(folder / "train.jsonl", rows[:640])
    write_jsonl(folder / "dev.jsonl", rows[640:])
    build_tiny_bert(
        folder / "bert", [r["text"] for r in rows], hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64
    )
    return folder


def write_job(folder: Path, name: str, max_steps: int, every: int) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
gpus = 0
[model]
name_or_path = "./bert"
[data]
train = "./train.jsonl"
validation = "./dev.jsonl"
max_length = 32
num_workers = 0
[train]
max_epochs = 50
max_steps = {max_steps}
batch_size = 16
precision = "32"
learning_rate = 1e-3
[checkpoint]
every_n_steps = {every}
keep = 2
""")
    return path


@pytest.mark.slow
def test_ctrl_c_checkpoints_then_resume_continues_from_that_step_to_success(tmp_path, tiny_job_dir):
    """One built-in job, two training processes (their imports are most of the time): Ctrl-C
    checkpoints attempt 1, and `orch run --resume` trains attempt 2 from that step to success,
    exporting the model and recording provenance as any successful `orch run` does."""
    home = tmp_path / "home"
    # one epoch of 60 steps; Ctrl-C at step 5 is acted on a few steps later, well before the end.
    # progress.json on every step: at the default 3 s a fast machine trains all the steps between two
    # writes, and the Ctrl-C would come after the end (seen in CI).
    job = write_job(tiny_job_dir, "fg-int", max_steps=60, every=1000)
    env = {**os.environ, "ORCH_HOME": str(home), "HF_HUB_OFFLINE": "1", "ORCH_PROGRESS_EVERY_S": "0.001"}
    proc = subprocess.Popen(
        [*ORCH, "run", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    progress = home / "runs" / "1" / "progress.json"

    def step() -> int:
        try:
            return json.loads(progress.read_text()).get("step", 0)
        except (OSError, ValueError):
            return 0

    try:
        wait_for(lambda: step() >= 5, 600, "training to reach step 5")
        proc.send_signal(signal.SIGINT)  # what the terminal sends on Ctrl-C
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-2000:]
    assert "orch run --resume 1" in err
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "cancelled"
    notice = [c for c in shown["checkpoints"] if Path(c["path"]).name.startswith("notice-step-")]
    assert notice, shown["checkpoints"]
    saved_step = notice[-1]["step"]
    assert 5 <= saved_step < 60

    res = orch(home, "run", "--resume", "1", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "succeeded"
    assert [a["n"] for a in shown["attempts"]] == [1, 2]
    assert [a["outcome"] for a in shown["attempts"]] == ["cancelled", "succeeded"]
    assert shown["attempts"][1]["resumed_from_step"] == saved_step
    assert shown["result"]["steps"] == 60
    assert shown["attempt"] == 2
    assert (home / "runs" / "1" / "model" / "config.json").exists()
    # provenance: orch listed the runner's interpreter; the runner added what torch itself says
    # (attempt 1's: the first attempt's environment is the baseline the later ones are compared with)
    import torch

    system = json.loads((home / "runs" / "1" / "provenance" / "system.json").read_text())
    assert system["attempt"] == 1 and system["python"]["executable"]
    assert system["runtime"]["torch"] == torch.__version__ and system["runtime"]["cuda"] == torch.version.cuda
    assert "torch==" in (home / "runs" / "1" / "provenance" / "packages.txt").read_text()
    assert shown["provenance"]["torch"] == torch.__version__


def test_orch_run_command_job_passes_on_its_exit_code(tmp_path):
    home = tmp_path / "home"
    job = tmp_path / "bad.toml"
    job.write_text('gpus = 0\nretries = 0\ncommand = ["python", "-c", "import sys; print(\'x\'); sys.exit(3)"]\n')
    res = orch(home, "run", str(job))
    assert res.returncode == 3
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "failed"
    assert "exit code 3" in shown["reason"]
    assert "orch run --resume 1" in res.stderr


def test_orch_run_needs_a_file_or_resume(tmp_path):
    res = orch(tmp_path / "home", "run")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


TRAPS_SIGTERM = r"""
import os, signal, sys, time
def on_term(signum, frame):
    open(os.path.join(os.environ["ORCH_RUN_DIR"], "got-sigterm"), "w").close()
    sys.exit(75)
signal.signal(signal.SIGTERM, on_term)
print("running", flush=True)
time.sleep(120)
"""


def test_orch_cancel_reaches_a_foreground_job_through_the_daemon(tmp_path):
    home = tmp_path / "home"
    script = tmp_path / "traps.py"
    script.write_text(TRAPS_SIGTERM)
    job = tmp_path / "fg.toml"
    job.write_text(f'gpus = 0\nretries = 0\ncommand = ["{sys.executable}", "{script}"]\n')
    home.mkdir()
    (home / "config.toml").write_text("[daemon]\ntick_seconds = 0.5\ngrace_seconds = 5\nwarm_preflight = false\n")
    assert orch(home, "daemon", "start").returncode == 0
    env = {**os.environ, "ORCH_HOME": str(home)}
    proc = subprocess.Popen(
        [*ORCH, "run", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        wait_for(
            lambda: (
                json.loads(orch(home, "status", "--json").stdout or "[]")
                and json.loads(orch(home, "status", "--json").stdout)[0]["state"] == "running"
            ),
            30,
            "the job to run",
        )
        res = orch(home, "cancel", "1")
        assert res.returncode == 0, res.stderr
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 75, err
        assert (home / "runs" / "1" / "got-sigterm").exists()
        shown = json.loads(orch(home, "show", "1", "--json").stdout)
        assert shown["state"] == "cancelled"
        assert [a["n"] for a in shown["attempts"]] == [1]  # the daemon did not start it a second time
    finally:
        if proc.poll() is None:
            proc.kill()
        orch(home, "daemon", "stop")
