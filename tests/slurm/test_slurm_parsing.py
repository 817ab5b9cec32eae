"""Parsing Slurm's answers (canned text: edge cases only; the executor's evidence is the real
cluster in the other tests here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.executors.slurm.query import (
    SlurmJob,
    accounting_disabled,
    expand_nodelist,
    parse_duration,
    parse_exit_code,
    parse_sacct,
    parse_sbatch,
    parse_squeue,
)
from orchestrator.executors.slurm.step import split_returncode


def test_squeue_lines_and_noise():
    text = (
        "12|PENDING|Resources|(null)|0:00|orch-3.1\n"
        "slurm_load_jobs error: Socket timed out\n"  # noise is never a job
        "13|RUNNING|None|n[1-2]|1-02:03:04|orch-4.2\n"
        "14_7|COMPLETED|None|gpu01|00:05|x\n\n"
    )
    jobs = parse_squeue(text)
    assert set(jobs) == {"12", "13", "14_7"}
    assert jobs["12"].describe() == "PENDING (Resources)"
    assert jobs["13"].describe() == "RUNNING on n1,n2"
    assert jobs["13"].elapsed_s == 93784 and jobs["13"].active and not jobs["13"].ended
    assert jobs["14_7"].ended
    assert parse_squeue("") == {}


def test_sacct_states_exit_codes_and_last_record_wins():
    text = "21|CANCELLED by 0|0:15|12|n1|a\n21|COMPLETED|0:0|30|n2|a\n22|NODE_FAIL|1:0|5|None assigned|b\n22.batch|FAILED|1:0|5|n1|batch\n"
    jobs = parse_sacct(text)
    assert jobs["21"].state == "COMPLETED" and jobs["21"].exit_code == 0 and jobs["21"].elapsed_s == 30
    assert jobs["22"].state == "NODE_FAIL" and jobs["22"].nodes == ""
    assert parse_sacct("21|CANCELLED by 0|0:15|12|n1|a")["21"].exit_signal == 15
    assert accounting_disabled("sacct: error: Slurm accounting storage is disabled\n")
    assert not accounting_disabled("")


def test_small_formats():
    assert (
        parse_exit_code("75:0") == (75, None)
        and parse_exit_code("0:9") == (None, 9)
        and parse_exit_code("") == (None, None)
    )
    assert (
        parse_duration("05:07") == 307 and parse_duration("2-00:00:01") == 172801 and parse_duration("INVALID") is None
    )
    assert expand_nodelist("gpu[01-03,07],cpu5") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]
    assert expand_nodelist("(null)") == [] and expand_nodelist("n1") == ["n1"]
    assert parse_sbatch("4711\n") == "4711" and parse_sbatch("4711;cluster2") == "4711"
    assert parse_sbatch("sbatch: error: Batch job submission failed") is None
    assert (
        split_returncode(75) == (75, None) and split_returncode(143) == (None, 15) and split_returncode(-9) == (None, 9)
    )
    assert SlurmJob("1", "RUNNING", nodes="n[1-20]").describe().endswith("(+12)")


def test_sbatch_geometry_overrides_and_shared_folder_check(tmp_path):
    import pytest

    from orchestrator.spec.config import SlurmSection
    from orchestrator.model.records import AttemptLaunch
    from orchestrator.executors.slurm.script import SlurmError, check_shared, sbatch_args

    cfg = SlurmSection(
        partition="gpu",
        account="lab",
        time="4:00:00",
        warn_before=120,
        cpus_per_gpu=8,
        mem_per_gpu="32G",
        extra_args=["--constraint=ib"],
    )
    spec = {
        "gpus": 4,
        "nodes": 2,
        "model": {},
        "slurm": {"partition": "long", "time": "12:00:00", "extra_args": ["--exclusive"]},
    }
    launch = AttemptLaunch(job_id=7, attempt=3, run_dir=tmp_path, argv=["x"], cwd=None, env={}, grace_s=25, spec=spec)
    args = sbatch_args(cfg, launch, "orch-abc-7.3")
    for want in (
        "--job-name=orch-abc-7.3",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gres=gpu:4",
        "--cpus-per-task=8",
        "--mem-per-gpu=32G",
        "--partition=long",
        "--time=12:00:00",
        "--account=lab",
        "--signal=TERM@120",
        "--no-requeue",
        "--open-mode=append",
        "--constraint=ib",
        "--exclusive",
    ):
        assert want in args, (want, args)
    command_job = AttemptLaunch(
        job_id=7,
        attempt=1,
        run_dir=tmp_path,
        argv=["x"],
        cwd=None,
        env={},
        grace_s=25,
        spec={"gpus": 2, "command": ["x"]},
    )
    assert "--ntasks-per-node=1" in sbatch_args(cfg, command_job, "n")  # a command runs once per node
    with pytest.raises(SlurmError, match=r"shared_dirs"):
        check_shared(SlurmSection(), tmp_path)  # a local filesystem, not listed
    check_shared(SlurmSection(shared_dirs=[str(tmp_path.parent)]), tmp_path)


FAKE_SRUN = """#!/bin/sh
# srun stand-in: ranks that saved (or not) a notice checkpoint, then srun reports a rank killed
# by SIGTERM the way srun does (128 + 15) after --kill-on-bad-exit stopped it
[ -n "$SAVE_NOTICE" ] && mkdir -p "$RUN_DIR/checkpoints" && : > "$RUN_DIR/checkpoints/notice-step-00000017.ckpt"
exit 143
"""


@pytest.mark.parametrize("saved", [True, False], ids=["notice-saved", "no-notice"])
def test_a_rank_killed_after_the_notice_checkpoint_is_a_checkpointed_attempt(tmp_path, saved):
    """Seen on a loaded machine: rank 0 saved the notice and exited 75, srun's --kill-on-bad-exit
    SIGTERMed rank 1 while it shut down, srun said 143, and the job was failed instead of
    resumed. A kill after a notice of this attempt is exit 75; without one it stays a signal."""
    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = run_dir / "checkpoints"
    old.mkdir()
    (old / "notice-step-00000005.ckpt").touch()
    os.utime(old / "notice-step-00000005.ckpt", (1, 1))  # an earlier attempt's notice does not count
    env = {**os.environ, "ORCH_SRUN": str(srun), "RUN_DIR": str(run_dir), "SAVE_NOTICE": "1" if saved else ""}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.executors.slurm.step", "batch", "--run-dir", str(run_dir)]
        + ["--attempt", "1", "--nodes", "2", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run_dir / "attempt-1.exit").read_text())
    if saved:
        assert (record["code"], record["signal"]) == (75, None), record
        assert "after notice-step-00000017.ckpt was saved: the attempt checkpointed" in proc.stdout, proc.stdout
    else:
        assert (record["code"], record["signal"]) == (None, 15), record
