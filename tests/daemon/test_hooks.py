"""Hooks and the shutdown command, with real subprocesses: what they see, and that nothing a
hook does (fail, hang, not exist) reaches the daemon as an exception or a block."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.daemon.hooks import HookResult, HookRunner, hook_env, run_hook, run_shutdown_command

PY = sys.executable
LOG = logging.getLogger("orch.test.hooks")
JOB = {"id": 7, "name": "sst2-bert", "state": "succeeded", "cost": 2.25, "attempt": 2}

DUMP_ENV = "import json, os, sys; json.dump({k: v for k, v in os.environ.items() if k.startswith('ORCH_')}, open(sys.argv[1], 'w'))"


def _dump_env_hook(out: Path) -> list[str]:
    return [PY, "-c", DUMP_ENV, str(out)]


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_hook_sees_the_event_and_job_in_its_environment(tmp_path: Path):
    out = tmp_path / "env.json"
    base = {"PATH": os.environ.get("PATH", ""), "ORCH_HOME": "/data/orch", "ORCH_JOB_ID": "stale-from-daemon"}
    result = run_hook(_dump_env_hook(out), "succeeded", JOB, log=LOG, env_base=base, detail="val_acc 0.91")
    assert result.ok, result.describe()
    assert json.loads(out.read_text()) == {
        "ORCH_HOME": "/data/orch",
        "ORCH_EVENT": "succeeded",
        "ORCH_EVENT_DETAIL": "val_acc 0.91",
        "ORCH_JOB_ID": "7",
        "ORCH_JOB_NAME": "sst2-bert",
        "ORCH_JOB_STATE": "succeeded",
        "ORCH_JOB_COST": "2.25",
        "ORCH_JOB_ATTEMPT": "2",
        "ORCH_RUN_DIR": "",
    }


def test_queue_drained_hook_has_empty_job_fields():
    env = hook_env("queue_drained", None, {"ORCH_JOB_NAME": "stale"})
    assert env["ORCH_EVENT"] == "queue_drained"
    assert env["ORCH_JOB_ID"] == env["ORCH_JOB_NAME"] == env["ORCH_JOB_COST"] == ""


def test_hook_output_goes_to_the_daemon_log(caplog):
    with caplog.at_level(logging.INFO, logger=LOG.name):
        result = run_hook([PY, "-c", "print('uploaded model to s3')"], "succeeded", JOB, log=LOG)
    assert result.ok and result.output.strip() == "uploaded model to s3"
    assert any("uploaded model to s3" in r.getMessage() and "job 7" in r.getMessage() for r in caplog.records)


def test_a_failing_hook_is_logged_and_reported_not_raised(caplog):
    with caplog.at_level(logging.INFO, logger=LOG.name):
        result = run_hook([PY, "-c", "import sys; print('boom'); sys.exit(3)"], "failed", JOB, log=LOG)
    assert not result.ok and result.returncode == 3 and not result.timed_out
    assert result.describe().startswith("exit 3")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("boom" in m for m in warnings) and any("exit 3" in m for m in warnings)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["/nonexistent/orch-hook"], "No such file"),
        ("notify-send done", "not shell strings"),
        ([], "non-empty argv"),
        ([PY, 3], "must be a string"),
    ],
)
def test_a_hook_that_cannot_start_is_a_failed_result(argv, fragment, caplog):
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        result = run_hook(argv, "succeeded", JOB, log=LOG)
    assert not result.ok and result.returncode is None and fragment in result.error
    assert any(fragment in r.getMessage() for r in caplog.records)


def test_a_file_that_is_not_executable_is_a_failed_result(tmp_path: Path):
    script = tmp_path / "hook.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    result = run_hook([str(script)], "succeeded", JOB, log=LOG)
    assert not result.ok and "Permission denied" in result.error


# The grandchild leaves a mark if it lives to its natural end (120 s): a run_hook that waited for
# it (its inherited pipes) instead of killing it would return only then, with the mark written.
GRANDCHILD_THEN_HANG = """
import subprocess, sys, time
mark = "import sys, time; time.sleep(120); open(sys.argv[1], 'w').write('lived')"
child = subprocess.Popen([sys.executable, '-c', mark, sys.argv[2]])
open(sys.argv[1], 'w').write(str(child.pid))
time.sleep(120)
"""


def test_a_hanging_hook_is_killed_with_its_whole_process_group(tmp_path: Path):
    pid_file, lived = tmp_path / "grandchild.pid", tmp_path / "lived"
    argv = [PY, "-c", GRANDCHILD_THEN_HANG, str(pid_file), str(lived)]
    result = run_hook(argv, "succeeded", JOB, log=LOG, timeout_s=3.0)  # time for two Pythons to start
    assert result.timed_out and not result.ok
    grandchild = int(pid_file.read_text())
    assert _wait_until(lambda: not _alive(grandchild), timeout=30)
    assert not lived.exists()  # killed, not waited for


def test_a_hook_that_ignores_sigterm_is_killed(tmp_path: Path):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    result = run_hook([PY, "-c", code], "succeeded", JOB, log=LOG, timeout_s=0.5, kill_grace_s=0.3)
    assert result.timed_out and result.returncode == -9
    assert "ready" in result.output


def test_shell_syntax_in_a_job_name_is_data_not_code(tmp_path: Path):
    out = tmp_path / "env.json"
    name = f"x; rm -rf / ; touch {tmp_path}/pwned $(touch {tmp_path}/pwned2) `touch {tmp_path}/pwned3`"
    result = run_hook(_dump_env_hook(out), "failed", {**JOB, "name": name}, log=LOG, cwd=tmp_path)
    assert result.ok
    assert json.loads(out.read_text())["ORCH_JOB_NAME"] == name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json"]


def test_shell_syntax_in_argv_is_passed_verbatim(tmp_path: Path):
    argv = [PY, "-c", "import sys; print(sys.argv[1])", "done; touch pwned"]
    result = run_hook(argv, "succeeded", JOB, log=LOG, cwd=tmp_path)
    assert result.output.strip() == "done; touch pwned"
    assert not (tmp_path / "pwned").exists()


# --- the background runner --------------------------------------------------------------------


def test_runner_submit_does_not_wait_for_the_hook(tmp_path: Path):
    runner = HookRunner(log=LOG)
    go = tmp_path / "go"  # the hook runs until the test creates this: a submit that waited never returns
    hook = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"
    box: list = []
    submitted = threading.Thread(target=lambda: box.append(runner.submit([PY, "-c", hook], "succeeded", JOB)))
    submitted.start()
    submitted.join(30)
    assert not submitted.is_alive(), "submit waited for the hook"
    future = box[0]
    assert not future.done()
    assert not runner.wait_idle(0.05)
    go.touch()
    assert runner.wait_idle(30)
    assert future.result().ok
    assert runner.close(5)


def test_runner_runs_configured_hooks_in_order(tmp_path: Path):
    log_file = tmp_path / "order.txt"
    append = f"import os; open({str(log_file)!r}, 'a').write(os.environ['ORCH_EVENT'] + ' ' + os.environ['ORCH_JOB_ID'] + '\\n')"
    hooks = {"on_succeeded": [PY, "-c", append], "on_queue_drained": [PY, "-c", append], "on_failed": []}
    runner = HookRunner(hooks, log=LOG)
    assert runner.submit_event("succeeded", {"id": 1})
    assert runner.submit_event("succeeded", {"id": 2})
    assert runner.submit_event("failed", {"id": 3}) is None  # configured empty: nothing to run
    assert runner.submit_event("preempted", {"id": 4}) is None  # not configured
    assert runner.submit_event("queue_drained")
    assert runner.wait_idle(20)
    assert log_file.read_text().splitlines() == ["succeeded 1", "succeeded 2", "queue_drained "]
    runner.close(5)


def test_runner_survives_bad_hooks_and_keeps_going(tmp_path: Path):
    runner = HookRunner(log=LOG, timeout_s=5)
    bad = runner.submit(["/nonexistent/orch-hook"], "failed", JOB)
    good = runner.submit([PY, "-c", "pass"], "failed", JOB)
    assert runner.wait_idle(20)
    assert not bad.result().ok and good.result().ok
    runner.close(5)


def test_runner_after_close_refuses_politely():
    runner = HookRunner(log=LOG)
    assert runner.close(1)
    result = runner.submit([PY, "-c", "pass"], "succeeded", JOB).result(1)
    assert isinstance(result, HookResult) and not result.ok and "shutting down" in result.error


# --- idle shutdown ----------------------------------------------------------------------------


def test_shutdown_command_runs_with_idle_shutdown_event(tmp_path: Path):
    out = tmp_path / "env.json"
    result = run_shutdown_command(_dump_env_hook(out), LOG)
    assert result.ok
    assert json.loads(out.read_text())["ORCH_EVENT"] == "idle_shutdown"


@pytest.mark.parametrize(
    "argv", [["/nonexistent/shutdown", "-h", "now"], [PY, "-c", "raise SystemExit(1)"], "shutdown -h now"]
)
def test_a_failed_shutdown_is_loud_and_does_not_raise(argv, caplog):
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        result = run_shutdown_command(argv, LOG)
    assert not result.ok
    assert any(r.levelno == logging.ERROR and "still up and billing" in r.getMessage() for r in caplog.records)
