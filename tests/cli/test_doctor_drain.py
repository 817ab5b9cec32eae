"""`orch doctor` and `orch daemon drain` through the real daemon and the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def findings(out: str) -> dict[str, list[dict[str, str]]]:
    by_area: dict[str, list[dict[str, str]]] = {}
    for f in json.loads(out):
        by_area.setdefault(f["area"], []).append(f)
    return by_area


def test_doctor_healthy_then_names_each_problem_with_its_fix(orch_home):
    h = orch_home(cpu_slots=1)
    daemon = h.start_daemon()
    job_id = h.submit("held", hold="held")
    h.wait_record("held")
    ok = h.cli("doctor")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "healthy" in ok.stdout.splitlines()[-1] and "Traceback" not in ok.stderr
    assert f"job {job_id} (held): supervisor and job alive" in ok.stdout
    assert len(ok.stdout.splitlines()) <= 24  # one screen

    # Break things: the daemon dies leaving its pid file, the supervisor dies, an orphan from an
    # old attempt, a world-readable store, a bad config, an unreachable notifier.
    pids = h.attempt_pids(job_id, 1)
    h.kill9(daemon)
    os.kill(pids["supervisor_pid"], signal.SIGKILL)
    wait_for(
        lambda: (
            not os.path.exists(f"/proc/{pids['supervisor_pid']}/stat")
            or open(f"/proc/{pids['supervisor_pid']}/stat").read().split(")")[1].split()[0] == "Z"
        ),
        10,
    )
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "ORCH_JOB_ID": str(job_id), "ORCH_ATTEMPT": "0", "ORCH_RUN_DIR": str(h.run_dir(job_id))},
    )
    try:
        os.chmod(h.home.db, 0o644)
        config = h.root / "config.toml"
        config.write_text(config.read_text() + '\n[[notifiers]]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\n')
        bad = h.cli("doctor", "--json")
        assert bad.returncode == 1, bad.stdout + bad.stderr
        got = findings(bad.stdout)
        problems = {f["area"]: f for f in json.loads(bad.stdout) if f["level"] == "problem"}
        assert "names pid" in got["daemon"][0]["text"] and "orch daemon start" in got["daemon"][0]["fix"]
        assert any("no daemon runs them" in f["text"] for f in got["daemon"])
        assert "supervisor is gone" in problems["jobs"]["text"] and problems["jobs"]["fix"] == "orch daemon start"
        assert f"pid {orphan.pid}" in problems["processes"]["text"] and str(orphan.pid) in problems["processes"]["fix"]
        assert "mode 644" in problems["store"]["text"] and problems["store"]["fix"] == f"chmod 600 {h.home.db}"
        assert "does not accept connections" in problems["notifiers"]["text"]
        assert all(f["fix"] for f in json.loads(bad.stdout) if f["level"] == "problem")
        config.write_text("[daemon]\ncpu_slots = 0\n")
        text = h.cli("doctor")
        assert text.returncode == 1 and "cpu_slots" in text.stdout and "fix: orch config check" in text.stdout
        assert "problems found" in text.stdout.splitlines()[-1]
    finally:
        orphan.kill()
        orphan.wait()


def test_drain_finishes_running_jobs_starts_nothing_new_then_exits(orch_home):
    h = orch_home(cpu_slots=1)
    none = h.cli("daemon", "drain")
    assert none.returncode == 1 and "no daemon is running" in none.stderr
    daemon = h.start_daemon()
    first = h.submit("first", hold="first")
    second = h.submit("second")
    h.wait_record("first")
    # --wait gives up after its timeout while the held job runs (the drain stays requested)
    drained = h.cli("daemon", "drain", "--wait", "--timeout", "1")
    assert drained.returncode != 0 and "draining" in drained.stdout, drained
    assert "is still draining after 1s" in drained.stderr and "Traceback" not in drained.stderr, drained.stderr
    status = h.cli("status")
    assert "the daemon is draining" in status.stderr, status
    wait_for(lambda: "drain requested" in h.log_tail(), 10, what="the daemon to see the drain")
    assert h.state(second) is JobState.QUEUED
    h.release("first")
    assert daemon.wait(30) == 0
    assert h.state(first) is JobState.SUCCEEDED and h.state(second) is JobState.QUEUED
    assert not (h.root / "drain").exists()
    assert "drained: no job is running; exiting" in h.log_tail()
    h.start_daemon()  # a new daemon runs the queue again
    h.wait_state(second, JobState.SUCCEEDED)
    waited = h.cli("daemon", "drain", "--wait")  # nothing runs: it drains, exits, and --wait sees it
    assert waited.returncode == 0 and "drained and exited" in waited.stdout, waited
