"""A poison job never stops the queue: a job whose start raises (a command holding a NUL byte,
stored by an older orch that accepted it; exec refuses it with ValueError, not OSError) ends
failed after a bounded number of events, with the reason, and the job queued behind it runs."""

from __future__ import annotations

import sys
import time

import pytest

from daemon_harness import orch_home  # noqa: F401  (fixture)
from orchestrator.model.states import JobState


@pytest.mark.slow
def test_a_job_whose_start_raises_fails_alone_and_the_queue_goes_on(orch_home):
    h = orch_home(cpu_slots=1)
    # Stored as it was before job.toml refused NUL: straight into the store, as an old row would be.
    poison = h.store.submit(
        name="poison",
        kind="command",
        gpus=0,
        priority=10,
        retries=2,
        spec={
            "name": "poison",
            "gpus": 0,
            "retries": 2,
            "command": [sys.executable, "-c", "pass\x00"],
            "workdir": str(h.tmp),
        },
        spec_path="",
        now=time.time(),
    ).id
    good = h.submit("behind", priority=0)
    h.configure(retry_backoff_seconds=0.2, max_retry_backoff_seconds=0.5)
    daemon = h.start_daemon()
    done = h.wait_state(good, JobState.SUCCEEDED, timeout=90)
    failed = h.wait_state(poison, JobState.FAILED, timeout=60)
    assert done.state is JobState.SUCCEEDED
    assert failed.attempt == 3, failed  # 1 + its 2 retries, each after the backoff: no tight loop
    kinds = h.event_kinds(poison)
    assert len(kinds) <= 10, kinds
    assert kinds[-1] == "failed"
    log = (h.run_dir(poison) / "attempt-1.log").read_text()
    assert "cannot start attempt 1" in log and "ValueError" in log, log
    shown = h.cli("show", str(poison))
    assert shown.returncode == 0 and "Traceback" not in shown.stdout + shown.stderr
    h.stop_daemon(daemon)
    assert "Traceback" not in h.daemon_output(daemon)
