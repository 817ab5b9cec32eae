"""Bring your own trainer, end to end: examples/hf-trainer (transformers.Trainer + OrchTrainerCallback)
and examples/plain-pytorch (a plain loop + OrchLoop) as command jobs under a real daemon, on a tiny
BERT with dropout and a shuffled order. A preemption notice (the sentinel file) at a random step
must cost 0 steps and end with the weights of an uninterrupted run; a SIGKILL of the job must
resume from the newest periodic checkpoint, report the steps it lost, and still end exactly there
(one job takes both, one after the other: each costs a process start and a model load);
`orch status --json` must show step, total and ETA while the job runs."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from daemon_harness import OrchHome, wait_for

from orchestrator.contract import newest_checkpoint, read_json
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ["hf-trainer", "plain-pytorch"]
ROWS, BATCH, EPOCHS, SAVE_EVERY = 640, 16, 2, 25
TOTAL_STEPS = ROWS // BATCH * EPOCHS  # 80; an epoch ends at 40; periodic saves at 25, 50, 75
SLOW_STEP_S = 0.05  # a sleep per step (ORCH_FAULT_SLOW_STEP_S): the window to act in


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    sys.path.insert(0, str(REPO / "examples" / "hf-trainer"))
    try:
        from prepare import prepare
    finally:
        sys.path.pop(0)
    return prepare(tmp_path_factory.mktemp("byo-workload"), train_rows=ROWS)


def job_toml(folder: Path, workload: Path, framework: str, name: str) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "retries": 2,
        "grace_seconds": 30,
        "command": [
            sys.executable,
            str(REPO / "examples" / framework / "train.py"),
            "--model",
            str(workload / "tiny-bert"),
            "--data",
            str(workload / "data"),
            "--batch-size",
            str(BATCH),
            "--epochs",
            str(EPOCHS),
            "--max-length",
            "32",
        ]
        # the Trainer job with two DataLoader workers: the group's SIGTERM reaches them too
        + (
            ["--save-steps", str(SAVE_EVERY), "--workers", "2", "--report-to", "wandb"]
            if framework == "hf-trainer"
            else ["--save-every", str(SAVE_EVERY)]
        ),
        "env": {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.05",
            "ORCH_FAULT_SLOW_STEP_S": str(SLOW_STEP_S),
        },
    }
    if framework == "hf-trainer":  # report_to="wandb", offline: one W&B run across all attempts
        spec["env"].update(WANDB_DIR=str(folder / name), WANDB_SILENT="true")
        (folder / name).mkdir(parents=True, exist_ok=True)
        spec["tracking"] = {"backends": ["wandb"], "mode": "offline"}
    path = folder / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return path


def make_home(folder: Path) -> OrchHome:
    folder.mkdir(parents=True)
    return OrchHome(
        folder,
        {"preemption": {"sources": ["file"], "poll_seconds": 0.2, "on_notice": "wait"}},
        cpu_slots=1,
        grace_seconds=30,
    )


def attempt_log(h: OrchHome, job_id: int) -> str:
    logs = sorted(h.run_dir(job_id).glob("attempt-*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in logs)


def wait_succeeded(h: OrchHome, job_id: int, timeout: float = 150) -> dict[str, Any]:
    def done() -> bool:
        state = h.state(job_id)
        if state in (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED):
            raise AssertionError(f"job {job_id} ended {state.value}: {h.job(job_id).reason}\n{attempt_log(h, job_id)}")
        return state is JobState.SUCCEEDED

    wait_for(done, timeout, interval=0.2, what=f"job {job_id} to succeed: {h.log_tail()}\n{attempt_log(h, job_id)}")
    return h.cli_json("show", str(job_id))


def progress_step(h: OrchHome, job_id: int) -> int:
    return (read_json(h.run_dir(job_id) / "progress.json") or {}).get("step") or 0


def final_weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def assert_same_weights(expected: dict[str, Any], got: dict[str, Any]) -> None:
    import torch

    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"{len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"


@pytest.fixture(scope="module")
def uninterrupted(workload, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """Per framework, the same job under a daemon with nothing in its way (run once, on demand);
    while it runs, `orch status --json` must show its step, total and ETA."""
    done: dict[str, Any] = {}

    def run(framework: str) -> dict[str, Any]:
        if framework in done:
            return done[framework]
        h = make_home(tmp_path_factory.mktemp(f"a-{framework}") / "a")
        try:
            h.start_daemon()
            job_id = h.submit(job_toml(h.jobs_dir, workload, framework, "a"))

            def running_row() -> Any:
                row = next((r for r in h.cli_json("status") if r["id"] == job_id), None)
                if row is None or row["state"] != "running":
                    assert h.state(job_id) in (JobState.QUEUED, JobState.RUNNING), attempt_log(h, job_id)
                    return None
                return row if row["step"] and row["eta_s"] is not None else None

            row = wait_for(running_row, 90, interval=0.1, what="orch status to show step and ETA")
            assert row["total_steps"] == TOTAL_STEPS and 0 < row["step"] < TOTAL_STEPS and row["eta_s"] > 0, row
            data = wait_succeeded(h, job_id)
            assert [a["outcome"] for a in data["attempts"]] == ["succeeded"], data["attempts"]
            assert data["result"]["steps"] == TOTAL_STEPS, data["result"]
            done[framework] = {"weights": final_weights(h.run_dir(job_id))}
        finally:
            h.cleanup()
        return done[framework]

    yield run


@pytest.fixture
def home(tmp_path) -> Iterator[OrchHome]:
    h = make_home(tmp_path / "b")
    yield h
    h.cleanup()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_notice_at_a_random_step_costs_nothing_and_a_sigkill_resumes_from_the_newest_periodic_checkpoint(
    framework, workload, uninterrupted, home
):
    """One job, three attempts: a notice at a random step (exit 75, 0 steps lost), then a SIGKILL
    at a random step after a periodic checkpoint (steps lost reported), then the end — with the
    weights of the uninterrupted run."""
    expected = uninterrupted(framework)["weights"]
    h = home
    rng = random.Random()
    # The SIGKILL lands a few steps after the test sees kill_at (it polls progress.json), so kill_at
    # stays clear of the steps just before a periodic save: a kill at the save itself loses nothing.
    kill_steps = [
        s for s in range(SAVE_EVERY + 2, 2 * SAVE_EVERY + 10) if not 2 * SAVE_EVERY - 8 <= s <= 2 * SAVE_EVERY
    ]
    notice_at, kill_at = rng.randrange(2, SAVE_EVERY - 3), rng.choice(kill_steps)
    where = f"notice at step {notice_at}, SIGKILL at step {kill_at}"
    sentinel = h.root / "preempt-notice"
    h.start_daemon()
    job_id = h.submit(job_toml(h.jobs_dir, workload, framework, "b"))
    ckpts = h.run_dir(job_id) / "checkpoints"

    # attempt 1: the notice
    wait_for(lambda: progress_step(h, job_id) >= notice_at, 90, interval=0.02, what=f"step {notice_at} of attempt 1")
    sentinel.touch()
    wait_for(
        lambda: h.state(job_id) is JobState.QUEUED,
        40,
        interval=0.05,
        what=f"the notice to requeue the job: {attempt_log(h, job_id)}",
    )
    sentinel.unlink()
    h.wait_state(job_id, JobState.RUNNING)
    data = h.cli_json("show", str(job_id))
    first = data["attempts"][0]
    resumed = next(e for e in data["events"] if e["kind"] == "resumed")
    found = re.search(r"notice-step-(\d{8})\.ckpt", resumed["detail"])
    assert found, (where, resumed)
    notice_step = int(found.group(1))
    assert first["outcome"] == "preempted" and first["exit_code"] == 75, (where, first)
    assert first["step_reached"] == notice_step >= notice_at, (where, data["attempts"])
    assert data["attempts"][1]["resumed_from_step"] == notice_step, (where, data["attempts"])
    assert data["steps_lost"] == 0, (where, data)

    # attempt 2: a SIGKILL, no chance to save
    wait_for(
        lambda: progress_step(h, job_id) >= kill_at and (newest_checkpoint(ckpts)[1] or 0) >= SAVE_EVERY,
        90,
        interval=0.02,
        what=f"step {kill_at} and a periodic checkpoint",
    )
    os.killpg(h.attempt_pids(job_id, 2)["job_pid"], signal.SIGKILL)
    wait_for(lambda: h.exit_record(job_id, 2), 30, what="attempt 2's exit record")
    newest_path, newest = newest_checkpoint(ckpts)
    data = wait_succeeded(h, job_id)

    _, second, third = data["attempts"]
    assert second["signal"] == signal.SIGKILL and second["outcome"] == "failed", (where, second)
    assert newest_path is not None and newest_path.name.startswith("step-") and newest % SAVE_EVERY == 0, (
        where,
        newest,
    )
    assert third["resumed_from_step"] == newest and third["outcome"] == "succeeded", (where, data["attempts"])
    assert second["step_reached"] >= kill_at and second["step_reached"] > newest, (where, data["attempts"])
    assert data["steps_lost"] == second["step_reached"] - newest > 0, (where, data)
    assert data["result"]["steps"] == TOTAL_STEPS
    assert_same_weights(expected, final_weights(h.run_dir(job_id)))
    if framework == "hf-trainer":  # the Trainer's report_to="wandb": one run, paused at the notice
        from tracker_files import wandb_attempts

        runs = wandb_attempts(h.jobs_dir / "b" / "wandb")
        # the SIGKILLed attempt's file may end before its run record: no id read from it
        assert len(runs) == 3 and len({r["run_id"] for r in runs} - {None}) == 1, (where, runs)
        assert runs[0]["preempting"] and runs[0]["exit"] == 75, (where, runs[0])
        assert runs[2]["exit"] == 0, (where, runs[2])
        tracking = json.loads((h.run_dir(job_id) / "tracking.json").read_text())
        assert tracking["backends"]["wandb"]["run_id"] == runs[0]["run_id"] == tracking["uid"]
