"""A SIGTERM that arrives while the runner is still importing, loading the model or tokenizing
must end in exit 75 wherever it lands: an exception raised from a signal handler can be swallowed
by library code with a bare `except:` (it was, inside `import datasets`), so the runner's early
handler exits at once instead. (test_training_preemption.py's copy of the delay-0 case was folded in here.)"""

from __future__ import annotations

import signal
import time

import pytest

from conftest import wait_for


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.0, 0.2, 0.5, 0.8])
def test_sigterm_at_any_moment_before_training_exits_75(make_run_dir, start_job, delay_s):
    run = make_run_dir(f"early-{delay_s}")
    job = start_job(run)
    wait_for(lambda: "starting from scratch" in job.output(), 60, "the runner to start")
    time.sleep(delay_s)  # land the signal in a different phase of start-up each time
    job.signal_group(signal.SIGTERM)
    code = job.wait(timeout=25)
    out = job.output()
    if "[orch] step " in out and "SIGTERM before training started" not in out:
        pytest.skip("training had already started on this machine; the in-training path is tested elsewhere")
    assert code == 75, out[-3000:]
    assert "SIGTERM before training started" in out
    assert "Traceback" not in out
