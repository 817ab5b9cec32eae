"""Programs nobody edited for orch, run as command jobs with `instrument` under a real daemon: a
`transformers.Trainer` script (alone and under `accelerate launch` with 2 CPU processes), `trl sft`
on a tiny causal LM, and a plain Lightning script. A preemption notice (the sentinel file) at a
random step must end with the weights of an uninterrupted run of the same program without orch; a
SIGKILL must resume from the program's newest `checkpoint-N`."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from daemon_harness import OrchHome, wait_for
from instrument_programs import HF_TRAINER, LIGHTNING, write

from orchestrator.contract import newest_checkpoint, read_json
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow

SAVE_EVERY = 15  # the HF program: 40 steps an epoch, 80 in all; its own saves at 15, 30, 45, ...
QUIET = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}
TRL = shutil.which("trl") or str(Path(sys.executable).with_name("trl"))
ACCELERATE = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plain(argv: list[str], cwd: Path) -> None:
    """The uninterrupted reference: the program alone, no orch anywhere in its environment."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") and k != "PYTHONPATH"}
    ran = subprocess.run(argv, cwd=cwd, env={**env, **QUIET}, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]


def weights(path: Path) -> dict[str, Any]:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, weights_only=True)


def assert_same_weights(expected: dict[str, Any], got: dict[str, Any], where: str) -> None:
    import torch

    assert expected.keys() == got.keys(), where
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"{where}: {len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"


@pytest.fixture
def home(tmp_path) -> Iterator[OrchHome]:
    (tmp_path / "h").mkdir()
    h = OrchHome(
        tmp_path / "h",
        {"preemption": {"sources": ["file"], "poll_seconds": 0.2, "on_notice": "wait"}},
        cpu_slots=1,
        grace_seconds=30,
    )
    yield h
    h.cleanup()


def submit(h: OrchHome, command: list[str], workdir: Path, instrument: str, **env: str) -> int:
    spec = {
        "name": "unedited",
        "gpus": 0,
        "retries": 2,
        "grace_seconds": 30,
        "instrument": instrument,
        "command": command,
        "workdir": str(workdir),
        "env": {**QUIET, "ORCH_PROGRESS_EVERY_S": "0.05", **env},
    }
    path = h.jobs_dir / "unedited.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return h.submit(path)


def logs(h: OrchHome, job_id: int) -> str:
    found = sorted(h.run_dir(job_id).glob("attempt-*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in found)


def step_of(h: OrchHome, job_id: int) -> int:
    return (read_json(h.run_dir(job_id) / "progress.json") or {}).get("step") or 0


def notice_at(h: OrchHome, job_id: int, step: int) -> int:
    """Touch the notice sentinel once the job passed `step`; wait for the requeue; lift the notice.
    Returns the step of the notice checkpoint the next attempt resumes from."""
    wait_for(lambda: step_of(h, job_id) >= step, 180, interval=0.02, what=f"step {step}: {logs(h, job_id)}")
    sentinel = h.root / "preempt-notice"
    sentinel.touch()
    wait_for(lambda: h.state(job_id) is JobState.QUEUED, 60, interval=0.05, what=f"the requeue: {logs(h, job_id)}")
    sentinel.unlink()
    h.wait_state(job_id, JobState.RUNNING, timeout=60)
    data = h.cli_json("show", str(job_id))
    resumed = next(e for e in data["events"] if e["kind"] == "resumed")
    found = re.search(r"notice-step-(\d{8})\.ckpt", resumed["detail"])
    assert found, (resumed, logs(h, job_id))
    return int(found.group(1))


def wait_succeeded(h: OrchHome, job_id: int) -> dict[str, Any]:
    def done() -> bool:
        state = h.state(job_id)
        assert state not in (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED), logs(h, job_id)
        return state is JobState.SUCCEEDED

    wait_for(done, 300, interval=0.2, what=f"success: {logs(h, job_id)}")
    return h.cli_json("show", str(job_id))


def test_a_trainer_script_resumes_exactly_after_a_notice_and_from_its_own_checkpoint_after_a_sigkill(tmp_path, home):
    h = home
    program = write(tmp_path, "train.py", HF_TRAINER)
    run_plain([sys.executable, str(program), str(tmp_path / "plain"), str(SAVE_EVERY)], tmp_path)
    rng = random.Random()
    first, kill_at = rng.randrange(3, SAVE_EVERY - 3), rng.randrange(2 * SAVE_EVERY + 3, 3 * SAVE_EVERY - 5)
    where = f"notice at step {first}, SIGKILL at step {kill_at}"
    h.start_daemon()
    out = tmp_path / "out"
    job_id = submit(
        h,
        [sys.executable, str(program), str(out), str(SAVE_EVERY)],
        tmp_path,
        "transformers",
        ORCH_FAULT_SLOW_STEP_S="0.05",
    )
    notice_step = notice_at(h, job_id, first)
    assert notice_step >= first and (out / f"checkpoint-{notice_step}").is_dir(), where

    ckpts = h.run_dir(job_id) / "checkpoints"
    wait_for(lambda: step_of(h, job_id) >= kill_at, 180, interval=0.02, what=f"step {kill_at}")
    os.killpg(h.attempt_pids(job_id, 2)["job_pid"], signal.SIGKILL)
    wait_for(lambda: h.exit_record(job_id, 2), 30, what="attempt 2's exit record")
    newest_path, newest = newest_checkpoint(ckpts)
    target = os.readlink(newest_path) if newest_path is not None else ""  # (later rotated away by the program)
    data = wait_succeeded(h, job_id)

    first_attempt, second, third = data["attempts"]
    assert first_attempt["outcome"] == "preempted" and first_attempt["exit_code"] == 75, (where, first_attempt)
    assert second["signal"] == signal.SIGKILL, (where, second)
    assert newest_path is not None and newest_path.name.startswith("step-") and newest % SAVE_EVERY == 0, where
    assert target.endswith(f"checkpoint-{newest}"), (where, target)  # the program's own folder
    assert third["resumed_from_step"] == newest and newest >= 2 * SAVE_EVERY, (where, data["attempts"])
    said = re.search(
        r"instrument: resuming from (\S+) \(step (\d+)\)", (h.run_dir(job_id) / "attempt-3.log").read_text()
    )
    assert said and said.group(1).endswith(newest_path.name) and int(said.group(2)) == newest, where
    assert data["result"]["steps"] == 80, data["result"]
    assert_same_weights(weights(tmp_path / "plain" / "final.pt"), weights(out / "final.pt"), where)


def accelerate_argv(port: int, program: Path, out: Path) -> list[str]:
    return [
        ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        str(program), str(out), str(SAVE_EVERY),
    ]  # fmt: skip


@pytest.mark.skipif(not os.path.exists(ACCELERATE), reason="accelerate is not installed (the test extra has it)")
def test_a_trainer_script_under_accelerate_launch_with_two_processes_resumes_exactly_after_a_notice(tmp_path, home):
    """Both ranks save at the same step (they agree on the notice); the launcher exits of the
    SIGTERM after its workers (not 75), which orch, having sent the notice, still reads as one."""
    h = home
    program = write(tmp_path, "train.py", HF_TRAINER)
    run_plain(accelerate_argv(free_port(), program, tmp_path / "plain"), tmp_path)
    at = random.Random().randrange(3, 36)  # 40 steps with two ranks
    h.start_daemon()
    out = tmp_path / "out"
    job_id = submit(h, accelerate_argv(free_port(), program, out), tmp_path, "auto", ORCH_FAULT_SLOW_STEP_S="0.1")
    notice_step = notice_at(h, job_id, at)
    data = wait_succeeded(h, job_id)
    first, second = data["attempts"]
    assert first["outcome"] == "preempted" and second["resumed_from_step"] == notice_step >= at, data["attempts"]
    assert data["result"]["steps"] == 40, data["result"]
    assert_same_weights(weights(tmp_path / "plain" / "final.pt"), weights(out / "final.pt"), f"notice at {at}")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    from training.toy import write_jsonl
    from training.toys.lm_and_ner import build_tiny_llama, instruction_rows

    folder = tmp_path_factory.mktemp("tiny-lm")
    rows = instruction_rows(160)
    build_tiny_llama(folder / "model", [r["text"] for r in rows])
    write_jsonl(folder / "data" / "train.jsonl", [{"text": r["text"]} for r in rows])
    return folder


def trl_argv(lm: Path, out: Path) -> list[str]:
    return [
        TRL, "sft", "--model_name_or_path", str(lm / "model"), "--dataset_name", str(lm / "data"),
        "--output_dir", str(out), "--per_device_train_batch_size", "8", "--num_train_epochs", "1",
        "--save_steps", "8", "--logging_steps", "5", "--report_to", "none", "--seed", "3", "--use_cpu",
        "--max_length", "64", "--disable_tqdm", "true",
    ]  # fmt: skip


@pytest.mark.skipif(not os.path.exists(TRL), reason="trl is not installed (the test extra has it)")
def test_trl_sft_on_a_tiny_causal_lm_resumes_exactly_after_a_notice(tmp_path, home, tiny_lm):
    """`trl sft` runs its trainer under accelerate's launcher, which dies of the SIGTERM at once:
    the supervisor leaves the trainer its grace to finish the notice checkpoint."""
    h = home
    run_plain(trl_argv(tiny_lm, tmp_path / "plain"), tmp_path)
    at = random.Random().randrange(2, 17)  # 20 steps
    h.start_daemon()
    out = tmp_path / "out"
    job_id = submit(h, trl_argv(tiny_lm, out), tmp_path, "transformers", ORCH_FAULT_SLOW_STEP_S="0.2")
    notice_step = notice_at(h, job_id, at)
    data = wait_succeeded(h, job_id)
    assert data["attempts"][1]["resumed_from_step"] == notice_step >= at, data["attempts"]
    assert_same_weights(
        weights(tmp_path / "plain" / "model.safetensors"), weights(out / "model.safetensors"), f"notice at {at}"
    )


def test_a_plain_lightning_script_resumes_exactly_after_a_notice(tmp_path, home):
    h = home
    program = write(tmp_path, "fit.py", LIGHTNING)
    run_plain([sys.executable, str(program), str(tmp_path / "plain")], tmp_path)
    at = random.Random().randrange(5, 75)  # 40 steps an epoch, 80 in all
    h.start_daemon()
    out = tmp_path / "out"
    job_id = submit(h, [sys.executable, str(program), str(out)], tmp_path, "lightning", SLOW="0.05")
    notice_step = notice_at(h, job_id, at)
    data = wait_succeeded(h, job_id)
    assert data["attempts"][1]["resumed_from_step"] == notice_step >= at, data["attempts"]
    assert_same_weights(weights(tmp_path / "plain" / "final.pt"), weights(out / "final.pt"), f"notice at {at}")
