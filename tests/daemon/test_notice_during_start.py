"""A preemption notice never waits behind a job start (issue 37, item 1): starting a job lists its
interpreter's packages (up to 15 s) and asks nvidia-smi (up to 10 s); the daemon learns both
before it takes its lock, so the notice handler, which needs the lock, SIGTERMs the running jobs
while the other job's start is still stuck in its probe. A real `orch daemon run`, a real file
notice, real jobs, and a job interpreter that really stalls when asked for its packages."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.model.states import JobState


def stalling_python(folder: Path) -> Path:
    """A `python3` that, asked for its packages (`-c ...`), says so in a file and waits for a
    release file (a minute at most) before it answers; otherwise it is the real Python."""
    bin_dir = folder / "slowenv" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "python3"
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then\n'
        f"  touch {folder}/probe-asked\n"
        "  i=0\n"
        f'  while [ ! -e {folder}/release-probe ] && [ "$i" -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def test_a_notice_reaches_the_running_job_while_another_job_is_starting(orch_home):
    h = orch_home(cpu_slots=2, grace_seconds=10, config={"preemption": {"sources": ["file"], "poll_seconds": 0.2}})
    h.start_daemon()
    steady = h.submit("steady", hold="never", on_term=75)
    h.wait_record("steady", "start", timeout=60)

    slow_python = stalling_python(h.tmp)
    behaviour = {"name": "slow", "dir": str(h.tmp), "hold": "never", "on_term": 75}
    slow = h.submit(h.job_file("slow", command=[str(slow_python), str(h.script), json.dumps(behaviour)]))
    wait_for(lambda: (h.tmp / "probe-asked").exists(), 60, what="the daemon to ask the slow job's Python")

    (h.root / "preempt-notice").touch()
    h.wait_record("steady", "sigterm", timeout=90)
    # The SIGTERM came while the slow job's start was still stuck in its probe: the job was not
    # recorded started, nothing of it ran (before the fix the notice waited for the start, so the
    # job was running by the time the SIGTERM went out).
    assert not (h.tmp / "release-probe").exists()
    slow_job = h.job(slow)
    assert (slow_job.state, slow_job.attempt) == (JobState.QUEUED, 0), slow_job
    assert h.records("slow", "start") == []

    # The probe answers: the notice still holds the queue. Once it clears, the slow job starts.
    h.release("probe")
    h.wait_state(steady, JobState.QUEUED, timeout=60)
    assert h.state(slow) is JobState.QUEUED
    (h.root / "preempt-notice").unlink()
    h.wait_record("slow", "start", timeout=90)


def test_stopping_the_daemon_reaches_the_running_job_while_another_job_is_starting(orch_home):
    """`orch daemon stop` (or the machine's shutdown sending the daemon SIGTERM) tells the running
    jobs at once, not after the scheduler's tick finishes a job start's probes."""
    h = orch_home(cpu_slots=2, grace_seconds=10)
    daemon = h.start_daemon()
    h.submit("steady", hold="never", on_term=75)
    h.wait_record("steady", "start", timeout=60)
    slow_python = stalling_python(h.tmp)
    behaviour = {"name": "slow", "dir": str(h.tmp), "hold": "never", "on_term": 75}
    slow = h.submit(h.job_file("slow", command=[str(slow_python), str(h.script), json.dumps(behaviour)]))
    wait_for(lambda: (h.tmp / "probe-asked").exists(), 60, what="the daemon to ask the slow job's Python")

    daemon.send_signal(signal.SIGTERM)
    h.wait_record("steady", "sigterm", timeout=90)
    # Told while the slow start was still in its probe (before, the stop waited for the tick: the
    # probe timed out, the slow job was started, and only then were the jobs told).
    slow_job = h.job(slow)
    assert (slow_job.state, slow_job.attempt) == (JobState.QUEUED, 0), slow_job
    h.release("probe")
    assert daemon.wait(90) == 0
    assert h.state(slow) is JobState.QUEUED and h.records("slow", "start") == []
