"""`orch run` hears the supervisor's signals (issue 37, item 3): a Ctrl-C at any instant, the
per-tick cost write included, leaves a consistent store and a resumable job; SIGUSR1 (the
daemon's kill after the grace) kills the job, not `orch run`; `orch daemon stop` leaves a
foreground run alone. Real processes, real signals, real SQLite throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_harness import wait_for
from orchestrator.model.states import Intent
from orchestrator.store import Store

ORCH = [sys.executable, "-m", "orchestrator.cli"]

# The job: checkpoints-and-exits 75 on SIGTERM (or ignores it when asked), succeeds once the test
# creates `finish` in its run folder's parent, and otherwise waits.
JOB_SCRIPT = r"""
import os, signal, sys, time
run_dir = os.environ["ORCH_RUN_DIR"]
finish = os.path.join(os.path.dirname(os.path.dirname(run_dir)), "finish")
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
open(os.path.join(run_dir, "started-%s" % os.environ["ORCH_ATTEMPT"]), "w").close()
for _ in range(2400):
    if os.path.exists(finish):
        sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
"""

# `orch run`, with a SIGINT sent to itself right after its K-th SQLite statement returns: a real
# signal at a chosen instant. `sys.setprofile` sees each C call return in the main thread, so the
# signal lands in the Python code that called `execute` — inside its store transaction when
# there is one (the per-tick cost write: `charge_job`). Nothing of orch is replaced.
SIGINT_AT_STATEMENT = r"""
import os, signal, sqlite3, sys
target, where = int(os.environ["SIGINT_AT"]), os.environ.get("SIGINT_IN", "")
seen = [0]
def profile(frame, event, arg):
    if event != "c_return" or getattr(arg, "__name__", "") != "execute":
        return
    if not isinstance(getattr(arg, "__self__", None), (sqlite3.Connection, sqlite3.Cursor)):
        return
    if where and frame.f_code.co_name != where:
        return
    seen[0] += 1
    if seen[0] == target:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGINT)
sys.setprofile(profile)
sys.argv = ["orch"] + sys.argv[1:]
from orchestrator.cli import main
main()
"""


def orch(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCH_HOME": str(home)}
    return subprocess.run([*ORCH, *args], capture_output=True, text=True, timeout=timeout, env=env)


def job_file(tmp: Path, **env: str) -> Path:
    script = tmp / "job.py"
    script.write_text(JOB_SCRIPT)
    table = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    path = tmp / "job.toml"
    path.write_text(
        f'name = "sig"\ngpus = 0\nretries = 0\ncommand = ["{sys.executable}", "{script}"]\n'
        + (f"[env]\n{table}" if table else "")
    )
    return path


def shown(home: Path) -> dict:
    """`orch show 1 --json` through the same app in-process: a read of the store the `orch run`
    processes wrote, without one more CLI process start per look."""
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    res = CliRunner().invoke(app, ["show", "1", "--json"], env={"ORCH_HOME": str(home), "NO_COLOR": "1"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def assert_consistent_and_resumable(home: Path, stderr: str) -> None:
    """The store after the interrupted `orch run`: no job left running with no runner, every
    attempt ended, then `orch run --resume 1` finishes it."""
    assert "Traceback" not in stderr and "transaction" not in stderr, stderr[-3000:]
    data = shown(home)
    assert data["state"] in ("cancelled", "queued"), (data["state"], data["reason"], stderr[-2000:])
    assert all(a["ended_at"] is not None for a in data["attempts"]), data["attempts"]
    assert "orch run --resume 1" in stderr, stderr[-2000:]
    (home / "finish").touch()
    res = orch(home, "run", "--resume", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert shown(home)["state"] == "succeeded"


@pytest.mark.parametrize(
    "where, k",
    [
        ("submit", 1),  # inside the transaction that records the job
        ("update", 1),  # ... that claims it for this process
        ("transition", 1),  # ... that begins its attempt
        ("charge_job", 1),  # inside the per-tick cost write's transaction, first tick
        ("charge_job", 2),  # ... and the second
        ("jobs", 4),  # a read of the running jobs (the slot choice, a tick's share)
    ],
)
def test_ctrl_c_at_any_store_statement_leaves_a_resumable_job(tmp_path, where, k):
    home = tmp_path / "home"
    env = {**os.environ, "ORCH_HOME": str(home), "SIGINT_AT": str(k), "SIGINT_IN": where}
    res = subprocess.run(
        [sys.executable, "-c", SIGINT_AT_STATEMENT, "run", str(job_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    # 75: checkpointed; 130: stopped before its attempt; 143: SIGTERM before the job set its handler
    assert res.returncode in (75, 130, 143), (res.returncode, res.stderr[-3000:])
    assert_consistent_and_resumable(home, res.stderr)


def test_sigusr1_kills_the_job_not_orch_run_which_records_it(tmp_path):
    """The daemon's backstop (LocalExecutor.kill) sends SIGUSR1 to the process it knows for the
    attempt; for a foreground job that is `orch run`, which must kill the job and record it, as
    the supervisor does, instead of dying with the job left recorded running."""
    home = tmp_path / "home"
    env = {**os.environ, "ORCH_HOME": str(home)}
    proc = subprocess.Popen(
        [*ORCH, "run", str(job_file(tmp_path, IGNORE_TERM="1"))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for(lambda: (home / "runs" / "1" / "started-1").exists(), 60, "the job to start")
        proc.send_signal(signal.SIGINT)  # a cancel the job ignores (SIGTERM ignored) ...
        wait_for(lambda: Store(home / "orch.db").get(1).intent is Intent.CANCEL, 30, "the cancel to be recorded")
        proc.send_signal(signal.SIGUSR1)  # ... then the backstop
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, (proc.returncode, err[-3000:])
    data = shown(home)
    assert data["state"] == "cancelled", (data["state"], err[-2000:])
    assert data["attempts"][0]["signal"] == signal.SIGKILL
    assert_consistent_and_resumable(home, err)


def test_daemon_stop_leaves_a_foreground_run_alone(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[daemon]\ntick_seconds = 0.5\ngrace_seconds = 5\nwarm_preflight = false\n")
    assert orch(home, "daemon", "start").returncode == 0
    env = {**os.environ, "ORCH_HOME": str(home)}
    proc = subprocess.Popen(
        [*ORCH, "run", str(job_file(tmp_path))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        wait_for(lambda: (home / "runs" / "1" / "started-1").exists(), 60, "the job to start")
        stopped = orch(home, "daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert shown(home)["state"] == "running"
        (home / "finish").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        orch(home, "daemon", "stop")
    assert proc.returncode == 0, err[-3000:]
    data = shown(home)
    assert data["state"] == "succeeded"
    assert [a["n"] for a in data["attempts"]] == [1]
