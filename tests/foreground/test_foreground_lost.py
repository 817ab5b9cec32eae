"""`orch run` killed with SIGKILL (kill -9, the OOM killer): its job hears a SIGTERM and stops
instead of running on with no one to record it, and `orch run --resume` settles the attempt it
left behind (no daemon needed) and continues the job; while the first `orch run` lives, the
second one refuses and says who has the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from daemon_harness import wait_for
from orchestrator.host.procs import is_alive

ORCH = [sys.executable, "-m", "orchestrator.cli"]

# Attempt 1 writes its pid, then runs until a signal; attempt 2 finishes at once.
JOB_SCRIPT = r"""
import os, signal, sys, time
run_dir, attempt = os.environ["ORCH_RUN_DIR"], os.environ["ORCH_ATTEMPT"]
if attempt != "1":
    print("attempt", attempt, "finishes", flush=True)
    sys.exit(0)
def on_term(signum, frame):
    if os.environ.get("SAVE_UNTIL"):  # a checkpoint whose save ends when the test says so
        open(os.path.join(run_dir, "saving"), "w").close()
        deadline = time.time() + 120
        while not os.path.exists(os.environ["SAVE_UNTIL"]) and time.time() < deadline:
            time.sleep(0.02)
    open(os.path.join(run_dir, "got-sigterm"), "w").close()
    sys.exit(75)
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("DEAF") else on_term)
with open(os.path.join(run_dir, "job.pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(run_dir, "job.pid.tmp"), os.path.join(run_dir, "job.pid"))
time.sleep(300)
"""


def orch(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCH_HOME": str(home)}
    return subprocess.run([*ORCH, *args], capture_output=True, text=True, timeout=timeout, env=env)


def start_then_kill_orch_run(tmp_path: Path, env_table: str = "", grace_s: int = 25) -> tuple[Path, int]:
    """`orch run` a job, check a second `orch run --resume` refuses while it lives, SIGKILL it;
    returns the home and the job's pid."""
    home = tmp_path / "home"
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    job = tmp_path / "job.toml"
    job.write_text(
        f'gpus = 0\nretries = 0\ngrace_seconds = {grace_s}\ncommand = ["{sys.executable}", "{script}"]\n'
        f"[env]\n{env_table}"
    )
    env = {**os.environ, "ORCH_HOME": str(home)}
    # not pipes: a job that outlives its orch run would hold them open
    proc = subprocess.Popen([*ORCH, "run", str(job)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    pid_file = home / "runs" / "1" / "job.pid"
    try:
        wait_for(pid_file.exists, 60, "the job to start")
        job_pid = int(pid_file.read_text())
        assert "nothing runs it" not in orch(home, "status").stderr  # its orch run is alive
        busy = orch(home, "run", "--resume", "1")
        assert busy.returncode == 1, busy.stderr
        assert f"job 1 is running under an `orch run` (pid {proc.pid})" in busy.stderr, busy.stderr
        assert "Traceback" not in busy.stderr
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return home, job_pid


def test_a_killed_orch_run_stops_its_job_and_resume_settles_and_continues_it(tmp_path):
    home, job_pid = start_then_kill_orch_run(tmp_path)
    # the job heard its parent die: it stopped (here: exit 75, as a checkpointing job does)
    wait_for(lambda: not is_alive(job_pid, None), 30, "the job to stop after its orch run died")
    assert (home / "runs" / "1" / "got-sigterm").exists()
    assert json.loads(orch(home, "show", "1", "--json").stdout)["state"] == "running"  # nobody recorded it
    status = orch(home, "status")
    assert "job 1 is recorded running but nothing runs it (its `orch run` is gone)" in status.stderr, status.stderr
    assert "orch run --resume 1" in status.stderr

    res = orch(home, "run", "--resume", "1")
    assert res.returncode == 0, res.stderr
    assert "attempt 1 lost its runner" in res.stderr, res.stderr
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "succeeded"
    assert [a["n"] for a in shown["attempts"]] == [1, 2]


def test_resume_stops_an_orphan_that_ignores_sigterm_before_the_next_attempt(tmp_path):
    home, job_pid = start_then_kill_orch_run(tmp_path, 'DEAF = "1"\n', grace_s=2)
    os.kill(job_pid, 0)  # it ignored the SIGTERM and runs on, unrecorded
    assert not (home / "runs" / "1" / "got-sigterm").exists()

    res = orch(home, "run", "--resume", "1")
    assert res.returncode == 0, res.stderr
    assert "giving it up to 2 s to save its checkpoint" in res.stderr, res.stderr  # its grace, then SIGKILL
    assert not is_alive(job_pid, None)  # stopped before attempt 2 began: never two at once
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "succeeded"
    assert [a["n"] for a in shown["attempts"]] == [1, 2]


def test_resume_right_after_the_kill_lets_the_job_finish_saving_its_checkpoint(tmp_path):
    """`orch run --resume` typed while the killed run's job is still saving: it waits for the save
    within the job's grace (25 s) instead of killing it halfway. The save lasts until the resume has
    said it waits (a file the test writes then), so a slow start of either process changes nothing."""
    saved = tmp_path / "save-done"
    home, job_pid = start_then_kill_orch_run(tmp_path, f'SAVE_UNTIL = "{saved}"\n')
    wait_for((home / "runs" / "1" / "saving").exists, 60, "the job to start saving on its SIGTERM")
    env = {**os.environ, "ORCH_HOME": str(home)}
    resume = subprocess.Popen(
        [*ORCH, "run", "--resume", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert resume.stderr is not None
        said = []
        for line in resume.stderr:
            said.append(line)
            if "attempt 1 still runs" in line:
                break
        assert any("attempt 1 still runs" in line for line in said), "".join(said)
        assert is_alive(job_pid, None)  # still saving: the resume waits for it
        saved.touch()
        out, err = resume.communicate(timeout=60)
    finally:
        if resume.poll() is None:
            resume.kill()
        resume.wait()
    assert resume.returncode == 0, "".join(said) + err
    assert (home / "runs" / "1" / "got-sigterm").exists()  # the save finished: it was not SIGKILLed
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "succeeded" and [a["n"] for a in shown["attempts"]] == [1, 2]
