"""A built-in job that asks for GPUs and finds fewer (here: none, CUDA_VISIBLE_DEVICES="") fails
at once with exit 78 and one line, through the real runner (`python -m training.run`): it used to
train on the CPU (two gloo processes for gpus = 2), "succeed", and be billed as GPU hours (issue 38,
item 5; test_job_errors.py's copy of the gpus = 2 case was folded in here)."""

from __future__ import annotations

import json

import pytest

from orchestrator.contract import JOB_ERROR


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_job_asking_for_gpus_it_does_not_find_exits_78_with_one_line(make_run_dir, run_job, gpus):
    run = make_run_dir(f"gpus{gpus}", gpus=gpus)
    code, out = run_job(run, timeout=180, CUDA_VISIBLE_DEVICES="")
    assert code == 78, out
    line = (
        f"gpus = {gpus}, but no CUDA GPU is visible to this job (CUDA_VISIBLE_DEVICES=): refusing to train on the CPU"
    )
    assert [x for x in out.splitlines() if "job failed" in x] == [
        f"orch: job failed: {line} (set gpus = 0 to run there)"
    ]
    assert "Traceback" not in out and "starting from scratch" not in out, out
    assert json.loads((run / JOB_ERROR).read_text())["message"].startswith(line)
    assert not list((run / "checkpoints").glob("*.ckpt")) and not (run / "result.json").exists()
