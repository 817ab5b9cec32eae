"""SIGTERM = save a checkpoint now, exit 75; the next attempt resumes exactly."""

from __future__ import annotations

import signal

import pytest

from benchmarks.preemption import SAVED_RE
from training.resume.checkpoints import list_checkpoints, step_of

from conftest import assert_same_weights, final_weights, read_progress, read_result, wait_for
from metrics_rows import assert_same_metrics, metric_rows, validation_rows

pytestmark = pytest.mark.slow

# 640 rows / batch 16 = 40 steps per epoch, 2 epochs; dropout on (BERT default), shuffle on, 2 workers.
# A validation after every step (on 16 rows: one batch), so whatever step the notice lands on has a
# validation due at its end, which the notice used to drop (issue 31).
RESUME_JOB = dict(
    data={"num_workers": 2},
    train={"max_epochs": 2, "val_check_interval": 1},
    checkpoint={"every_n_steps": 15, "keep": 2},
)
STEPS_PER_EPOCH = 40


@pytest.fixture(scope="module")
def small_dev(tmp_path_factory):
    from training.toy import sentiment_rows, write_jsonl

    return write_jsonl(tmp_path_factory.mktemp("dev16") / "dev16.jsonl", sentiment_rows(16, seed=12))


def test_sigterm_mid_epoch_resumes_to_identical_weights_and_metrics(
    make_run_dir, start_job, run_job, run_here, small_dev
):
    job = dict(RESUME_JOB, data={**RESUME_JOB["data"], "validation": str(small_dev)})
    straight = make_run_dir("straight", **job)
    code, out = run_here(straight)  # the reference: what it trains is the point, not its process
    assert code == 0, out

    run = make_run_dir("interrupted", **job)
    job = start_job(run, attempt=1, ORCH_PROGRESS_EVERY_S="0.1", ORCH_FAULT_SLOW_STEP_S="0.05")
    wait_for(lambda: (read_progress(run) or {}).get("step", 0) >= STEPS_PER_EPOCH + 7, 90, "step 47")
    job.signal_group(signal.SIGTERM)  # like the supervisor: the whole group, DataLoader workers included
    code = job.wait(timeout=25)
    assert code == 75, job.output()
    notices = [p for p in list_checkpoints(run / "checkpoints") if p.name.startswith("notice-")]
    assert len(notices) == 1, job.output()
    step = step_of(notices[0])
    assert step % STEPS_PER_EPOCH != 0, "the notice should be mid-epoch"
    saved = SAVED_RE.search(job.output())  # the line benchmarks/preemption.py reads its timings from
    assert saved and saved["write"] and int(saved["step"]) == step, job.output()
    assert read_progress(run)["step"] == step  # progress.json is written after the notice save: 0 steps lost
    assert not (run / "result.json").exists()

    code, out = run_job(run, attempt=2)
    assert code == 0, out
    assert f"resuming from {notices[0].name}" in out
    result = read_result(run)
    assert result["steps"] == 2 * STEPS_PER_EPOCH
    assert_same_weights(final_weights(straight), final_weights(run))
    # The metrics too, row for row: the validation due at the notice's step ran once, on resume.
    assert len(validation_rows(metric_rows(straight))) == 2 * STEPS_PER_EPOCH
    assert_same_metrics(straight, run)


def test_ddp_two_cpu_processes_sigterm_checkpoints_exits_75_and_resumes(make_run_dir, start_job, run_job):
    # gpus = 2 on a machine without CUDA runs two CPU processes under DDP (gloo) when asked to
    # (ORCH_GPUS_ON_CPU=1; without it the job is refused: test_missing_gpus.py).
    run = make_run_dir("ddp", gpus=2, train={"max_epochs": 2}, checkpoint={"every_n_steps": 50})
    cpu = {"ORCH_GPUS_ON_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
    job = start_job(run, attempt=1, ORCH_PROGRESS_EVERY_S="0.1", ORCH_FAULT_SLOW_STEP_S="0.1", **cpu)
    # two ranks start slowly on a busy machine: a generous wait
    wait_for(lambda: (read_progress(run) or {}).get("step", 0) >= 12, 300, "step 12")
    job.signal_group(signal.SIGTERM)
    code = job.wait(timeout=25)  # the grace: a hang fails the test
    assert code == 75, job.output()
    notices = [p for p in list_checkpoints(run / "checkpoints") if p.name.startswith("notice-")]
    assert len(notices) == 1, job.output()
    # nothing of the attempt outlives it (the other rank, loader workers)
    wait_for(lambda: not _group_alive(job.proc.pid), 10, "the process group to be gone")

    code, out = run_job(run, attempt=2, timeout=600, **cpu)  # two CPU ranks on a busy machine: minutes
    assert code == 0, out
    assert f"resuming from {notices[0].name}" in out
    assert read_result(run)["steps"] == 40  # 640 rows / 2 ranks / batch 16 = 20 steps per epoch


def _group_alive(pgid: int) -> bool:
    import os

    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
