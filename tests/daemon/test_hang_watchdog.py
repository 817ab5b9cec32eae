"""The hang watchdog through the real daemon: a command job that writes progress and then stops
advancing, a command job that never reports a first step, and a built-in job whose training step
blocks (ORCH_FAULT_HANG_AT_STEP, a test-only seam in training/builtin/module.py). Each gets its stacks
dumped into its log (built-in: faulthandler on SIGUSR1), a `hang` event and notification naming
the step, SIGTERM, the grace, SIGKILL, and a retry that finishes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.model.states import Intent

from orchestrator.spec.config import load_config
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow

PROGRESS_JOB = r"""
import json, os, sys, time
run, attempt = os.environ["ORCH_RUN_DIR"], int(os.environ["ORCH_ATTEMPT"])
mode = sys.argv[1]

def progress(step):
    tmp = os.path.join(run, "progress.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "total_steps": 5, "updated_at": time.time()}, f)
    os.replace(tmp, os.path.join(run, "progress.json"))

if attempt == 1 and mode == "silent":
    time.sleep(600)  # stuck before its first step: a download or a data loader that never returns
if attempt == 1 and mode == "silent75":  # the same, but SIGTERM exits 75 as the runner does before training
    import signal
    signal.signal(signal.SIGTERM, lambda *_: os._exit(75))
    time.sleep(600)
for step in range(1, 4):
    progress(step)
    time.sleep(0.1)
if attempt == 1:
    while True:  # alive and still writing, but the step no longer advances
        progress(3)
        time.sleep(0.2)
progress(5)
"""


def py_spy() -> bool:
    import shutil

    return bool(shutil.which("py-spy") or Path(sys.executable).with_name("py-spy").exists())


def with_hang_notifier(h) -> None:
    config = h.root / "config.toml"
    config.write_text(
        config.read_text() + '\n[[notifiers]]\ntype = "webhook"\nurl = "http://127.0.0.1:9/hang"\nevents = ["hang"]\n'
    )
    h.config = load_config(config, required=True)


def command_job(h, name: str, mode: str, retries: int = 1) -> int:
    script = h.tmp / "progress_job.py"
    script.write_text(PROGRESS_JOB)
    path = h.jobs_dir / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\ngpus = 0\nretries = {retries}\nwatchdog_minutes = 0.04\ngrace_seconds = 2\n'
        f"command = {json.dumps([sys.executable, str(script), mode])}\n"
    )
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


def test_command_jobs_that_stop_advancing_or_never_start_are_stopped_and_retried(orch_home):
    h = orch_home(cpu_slots=2, grace_seconds=2)
    with_hang_notifier(h)
    d = h.local_daemon()  # the watchdog is a step of the tick: an in-process daemon, ticked here
    stuck = command_job(h, "stuck", "advance")
    silent = command_job(h, "silent", "silent")
    for job_id in (stuck, silent):
        h.tick_state(d, job_id, JobState.SUCCEEDED, timeout=90)
    # A hung attempt that exits 75 on SIGTERM is charged all the same: with no retry left, failed.
    silent75 = command_job(h, "silent75", "silent75", retries=0)
    job = h.tick_state(d, silent75, JobState.FAILED, timeout=90)
    assert "hung and stopped by the watchdog (exit code 75)" in job.reason and job.failures == 1, job.reason
    assert [a.outcome for a in h.store.attempts(silent75)] == ["failed"]
    for job_id, where in ((stuck, "stuck at step 3"), (silent, "stuck before its first step")):
        job = h.job(job_id)
        attempts = h.store.attempts(job_id)
        assert [a.outcome for a in attempts] == ["failed", "succeeded"], attempts
        assert attempts[0].exit_signal == 15, attempts[0]  # SIGTERM ended it within the grace
        hangs = [e for e in h.store.events(job_id) if e.kind == "hang"]
        assert len(hangs) == 1 and where in hangs[0].detail, hangs
        log = (h.run_dir(job_id) / "attempt-1.log").read_text()
        assert "[orch] watchdog: hang" in log and where in log
        if py_spy():  # a command job's stacks come from py-spy (the test extra installs it)
            assert "Python stacks dumped into the log (py-spy)" in hangs[0].detail, hangs[0].detail
            assert "py-spy dump of pid" in log and ("in progress" in log or "progress (" in log or "<module>" in log), (
                log
            )
        else:
            assert "py-spy is not installed" in hangs[0].detail, hangs[0].detail
        rows = [r for r in h.store.outbox() if r.job_id == job_id]
        assert [r.channel for r in rows if r.payload.get("event") == "hang"] == ["webhook"], rows
        assert job.failures == 1
    payload = next(r.payload for r in h.store.outbox() if r.job_id == stuck and r.payload.get("event") == "hang")
    assert payload["step"] == 3 and "stuck at step 3" in payload["reason"]


def test_a_builtin_job_whose_step_blocks_gets_its_stacks_dumped_and_resumes(orch_home, tmp_path):
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    texts = [r["text"] for r in sentiment_rows(300, seed=1)]
    model = build_tiny_bert(
        tmp_path / "tiny-bert", texts, hidden=32, layers=1, heads=2, vocab_size=200, max_positions=64
    )
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(64, seed=3))
    h = orch_home(cpu_slots=1, grace_seconds=3)
    h.start_daemon()
    spec = {
        "name": "blocks",
        "gpus": 0,
        "retries": 1,
        "grace_seconds": 3,
        "model": {"name_or_path": str(model)},
        "data": {"train": str(train), "max_length": 32, "num_workers": 0},
        # 45 s: a start-up slower than that on a loaded machine would itself read as a hang before
        # the first step (which counts, by design)
        "train": {"max_steps": 8, "batch_size": 8, "precision": "32", "hang_minutes": 0.75},
        "checkpoint": {"every_n_steps": 2, "keep": 2},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.01",
            "ORCH_FAULT_HANG_AT_STEP": "3",
        },
    }
    path = h.jobs_dir / "blocks.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job_id = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0).id
    poke(h.home.wake_socket)
    h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=300)
    job = h.job(job_id)
    log1 = (h.run_dir(job_id) / "attempt-1.log").read_text(errors="replace")
    assert job.state is JobState.SUCCEEDED, (job.reason, log1[-3000:])
    hangs = [e for e in h.store.events(job_id) if e.kind == "hang"]
    assert len(hangs) == 1 and "stuck at step 3" in hangs[0].detail, hangs
    assert "faulthandler" in hangs[0].detail
    attempts = h.store.attempts(job_id)
    print(
        f"\nhang: {hangs[0].detail}\n  detected {hangs[0].at - attempts[0].started_at:.1f}s after attempt 1 began; "
        f"attempt 1 ended {attempts[0].ended_at - hangs[0].at:.1f}s after the hang event"
    )
    # faulthandler's dump: the blocked frame, in the runner's training step.
    assert "in training_step" in log1 and "training/builtin/module.py" in log1, log1[-3000:]
    attempts = h.store.attempts(job_id)
    assert attempts[0].outcome == "failed" and attempts[0].exit_signal == 9, attempts[0]  # the step ignored SIGTERM
    assert attempts[1].resumed_from_step == 2 and attempts[1].outcome == "succeeded", attempts
    assert json.loads((h.run_dir(job_id) / "result.json").read_text())["steps"] == 8


def test_a_hung_job_stopped_before_a_daemon_restart_is_still_charged_after_it(orch_home):
    """The watchdog stops a hung attempt; the daemon is replaced before the attempt's exit (75:
    it checkpointed) is read. The new daemon knows it was a hang from the store alone (the job's
    intent) and charges the retry: with none left, the job fails instead of running again."""
    h = orch_home(cpu_slots=1, grace_seconds=5)
    job_id = command_job(h, "hangs-across-restart", "silent75", retries=0)
    first = h.local_daemon()
    h.tick_until(first, lambda: "hang" in h.event_kinds(job_id), timeout=60, what="the hang")
    assert h.job(job_id).intent is Intent.HANG
    wait_for(lambda: h.exit_record(job_id, 1), 30, what="attempt 1 to answer the SIGTERM")
    assert h.exit_record(job_id, 1)["code"] == 75
    del first  # the daemon is gone; a new one starts (recover reads the exit written meanwhile)
    second = h.local_daemon()
    second.tick()
    job = h.job(job_id)
    assert job.state is JobState.FAILED, (job.state, job.reason)
    assert job.failures == 1 and "hung and stopped by the watchdog" in job.reason, job.reason
    assert [a.outcome for a in h.store.attempts(job_id)] == ["failed"]
