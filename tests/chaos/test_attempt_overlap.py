"""No two attempts of one job alive at once, watched in /proc: a requeued attempt starts only once
every process of the previous one is gone — after its supervisor was SIGKILLed (the daemon's
clear_lost kills the job's group and waits), and after the job's leader exited while its children
lived on (the supervisor kills the group and waits before it writes the exit record), and after a
supervisor died before naming its job in attempt-<n>.pid (found by their environment)."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from chaos_harness import AttemptWatcher, ChaosHome
from daemon_harness import wait_for

from orchestrator.host.procs import is_alive, start_time
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow

FAMILY = r"""
import json, os, signal, subprocess, sys, time
folder, mode = sys.argv[1], sys.argv[2]
attempt = os.environ["ORCH_ATTEMPT"]
if attempt != "1":
    sys.exit(0)
kids = [subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]) for _ in range(3)]
with open(os.path.join(folder, f"kids-{mode}.json"), "w") as f:
    json.dump([k.pid for k in kids], f)
if mode == "leader_exits":
    os._exit(1)  # the children stay behind in the job's process group
time.sleep(600)
"""


def test_the_next_attempt_waits_for_every_process_of_the_last(tmp_path):
    h = ChaosHome(tmp_path, cpu_slots=3, retry_backoff_seconds=0.0)
    script = h.tmp / "family.py"
    script.write_text(FAMILY)
    watcher = AttemptWatcher(h.home.runs, interval=0.005, tree=h.root)
    watcher.start()
    try:
        h.start_daemon()
        ids = {
            mode: h.submit(mode, retries=1, command=[sys.executable, str(script), str(h.tmp), mode])
            for mode in ("supervisor_killed", "leader_exits", "no_pid_file")
        }

        # 1. The leader exits, its children linger: the exit record only once they are gone.
        exit_file = h.run_dir(ids["leader_exits"]) / "attempt-1.exit"
        kids_file = h.tmp / "kids-leader_exits.json"
        wait_for(kids_file.exists, 20, what="the children of leader_exits")
        kids = json.loads(kids_file.read_text())
        starts = {pid: start_time(pid) for pid in kids}
        wait_for(exit_file.exists, 20, interval=0.001, what="attempt 1's exit record")
        assert not [p for p in kids if starts[p] and is_alive(p, starts[p])], "children outlived the exit record"

        # 2. The supervisor is SIGKILLed: the daemon clears the job's group before the requeue.
        job_id = ids["supervisor_killed"]
        kids_file = h.tmp / "kids-supervisor_killed.json"
        wait_for(kids_file.exists, 20, what="the children of supervisor_killed")
        pids = h.attempt_pids(job_id, 1)
        os.kill(pids["supervisor_pid"], signal.SIGKILL)
        for job_id in (ids["supervisor_killed"], ids["leader_exits"]):
            h.wait_state(job_id, JobState.SUCCEEDED, timeout=30)
        assert [a.outcome for a in h.store.attempts(ids["supervisor_killed"])] == ["lost", "succeeded"]

        # 3. The supervisor died before it wrote attempt-1.pid (simulated: the file is removed): the
        # daemon finds the attempt's processes by their environment.
        job_id = ids["no_pid_file"]
        kids = json.loads(
            wait_for(
                lambda: (h.tmp / "kids-no_pid_file.json").exists() and (h.tmp / "kids-no_pid_file.json").read_text(), 20
            )
        )
        pids = h.attempt_pids(job_id, 1)
        (h.run_dir(job_id) / "attempt-1.pid").unlink()
        os.kill(pids["supervisor_pid"], signal.SIGKILL)
        h.wait_state(job_id, JobState.SUCCEEDED, timeout=30)
        assert [a.outcome for a in h.store.attempts(job_id)] == ["lost", "succeeded"]
        assert not [p for p in [pids["job_pid"], *kids] if start_time(p)], "attempt 1's processes survived"
        assert "found by their environment" in h.log_tail(40)
        assert [a.outcome for a in h.store.attempts(ids["leader_exits"])] == ["failed", "succeeded"]
    finally:
        watcher.stop()
        h.cleanup()
    assert watcher.seen, "the watcher saw no job process"
    assert not watcher.overlaps, watcher.overlaps[:3]
