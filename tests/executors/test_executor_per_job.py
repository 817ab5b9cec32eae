"""Each attempt is watched and reaped by the executor that started it (the `executor` column,
written when the attempt begins), whatever executor config.toml names now:
- beside a daemon configured for Slurm, an `orch run` job (its own kind, "foreground") is a local
  process the daemon leaves alone: never reaped as lost and submitted again with sbatch (two copies
  training into one run folder);
- with no daemon, `orch status` does not offer `orch run --resume` for a job Slurm still runs.
No Slurm is needed: the daemon's sbatch is a stand-in that answers as `sbatch --parsable` does."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (fixture)
from orchestrator.daemon.tick import Daemon
from orchestrator.model.records import FOREGROUND
from orchestrator.model.states import JobState
from orchestrator.spec.config import load_config


def slurm_config(h: OrchHome) -> None:
    text = (h.root / "config.toml").read_text()
    text += f'\n[executor]\nkind = "slurm"\n\n[slurm]\nshared_dirs = ["{h.tmp}"]\npoll_seconds = 0.1\n'
    (h.root / "config.toml").write_text(text)
    h.config = load_config(h.root / "config.toml", required=True)


def test_an_orch_run_job_beside_a_slurm_daemon_is_left_to_its_own_process(orch_home):
    h = orch_home()
    slurm_config(h)
    path = h.job_file("fg", hold="go")
    fg = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "run", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=h.env(),
        start_new_session=True,
    )
    try:
        h.wait_record("fg", "start", timeout=60)
        job = wait_for(lambda: (j := h.store.jobs([JobState.RUNNING])) and j[0], 10, what="the job running")
        d = Daemon(h.home, h.config, h.store, environ=h.env())
        d.recover(time.time())
        for _ in range(5):
            d.tick()
        now = h.job(job.id)
        assert now.state is JobState.RUNNING and now.attempt == 1, (now.state, now.attempt, now.reason)
        assert d.executor.configured.queries.get("sbatch", 0) == 0  # never submitted to Slurm
        assert len(h.records("fg", "start")) == 1
        assert now.executor == FOREGROUND  # recorded when `orch run` began the attempt
        h.release("go")
        assert fg.wait(60) == 0
        for _ in range(3):
            d.tick()
        assert h.state(job.id) is JobState.SUCCEEDED and h.store.attempts(job.id)[0].outcome.value == "succeeded"
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait(10)


@pytest.mark.parametrize("verb", ["status", "run --resume"])
def test_with_no_daemon_a_job_slurm_runs_is_not_offered_to_orch_run(orch_home, verb):
    h = orch_home()
    slurm_config(h)
    bin_dir = h.tmp / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 4242\n")  # `sbatch --parsable`'s answer: the job id
    sbatch.chmod(0o755)
    job = h.submit("on-slurm", hold="never")
    env = {**h.env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    d = Daemon(h.home, h.config, h.store, environ=env)
    h.tick_until(d, lambda: h.job(job).executor_ref.get("slurm_job_id") == "4242", what="the sbatch")
    del d  # no daemon from here on: the CLI alone
    out = h.cli(*verb.split(), *([str(job)] if verb != "status" else []))
    assert "orch run --resume" not in out.stderr, out.stderr
    if verb == "status":
        assert out.returncode == 0 and "no daemon is running" in out.stderr, out.stderr
    else:
        assert out.returncode == 1 and f"job {job} runs on slurm" in out.stderr, out.stderr
    assert h.state(job) is JobState.RUNNING and h.job(job).attempt == 1
    assert h.job(job).executor == "slurm"  # recorded when the daemon began the attempt
