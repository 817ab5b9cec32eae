"""Bring your own FSDP2 script: examples/plain-pytorch/train_fsdp.py (torchrun, `fully_shard`, DCP,
OrchShardedLoop) on a tiny BERT with dropout, 2 CPU ranks over gloo, as a command job under a real
daemon. A preemption notice (the sentinel file) at a random step: both ranks save one sharded folder
at the same step and the job resumes from it; then a SIGKILL of the job's whole process group after
a periodic save: the next attempt resumes from the newest complete folder (a kill mid-save leaves
only a temp folder, removed at start). The job ends with weights torch.equal to an uninterrupted run
of the same script without orch."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from daemon_harness import OrchHome, wait_for

from orchestrator.contract import read_json, step_checkpoints
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "plain-pytorch" / "train_fsdp.py"
ROWS, BATCH, RANKS, SAVE_EVERY = 320, 8, 2, 5
TOTAL_STEPS = ROWS // (BATCH * RANKS)  # 20, one epoch
QUIET = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def argv(workload: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
        "--model", str(workload / "tiny-bert"), "--data", str(workload / "data"), "--output-dir", str(out),
        "--epochs", "1", "--batch-size", str(BATCH), "--save-every", str(SAVE_EVERY),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    sys.path.insert(0, str(REPO / "examples" / "hf-trainer"))
    try:
        from prepare import prepare
    finally:
        sys.path.pop(0)
    return prepare(tmp_path_factory.mktemp("fsdp-workload"), train_rows=ROWS)


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


def logs(h: OrchHome, job_id: int) -> str:
    found = sorted(h.run_dir(job_id).glob("attempt-*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in found)


def step_folders(ckpts: Path) -> list[tuple[Path, int]]:
    """The complete periodic folders, newest first (what the daemon chooses among)."""
    return [(p, n.step) for p, n in step_checkpoints(ckpts) if not n.notice and p.is_dir()] if ckpts.is_dir() else []


def weights(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)


def test_an_fsdp2_script_resumes_to_identical_weights_after_a_notice(tmp_path, home, workload):
    import torch

    plain = tmp_path / "plain"  # the reference: the script alone, no orch in its environment
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    ran = subprocess.run(
        argv(workload, plain), cwd=tmp_path, env={**env, **QUIET}, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]

    h = home
    h.start_daemon()
    out = tmp_path / "out"
    spec = {
        "name": "fsdp2",
        "gpus": 0,
        "retries": 1,  # the SIGKILLed attempt is a charged failure
        "grace_seconds": 30,
        "command": argv(workload, out),
        "env": {**QUIET, "ORCH_PROGRESS_EVERY_S": "0.05", "ORCH_FAULT_SLOW_STEP_S": "0.2"},
    }
    path = h.jobs_dir / "fsdp2.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job_id = h.submit(path)
    at = random.Random().randrange(2, 8)
    step = lambda: (read_json(h.run_dir(job_id) / "progress.json") or {}).get("step") or 0  # noqa: E731
    wait_for(lambda: step() >= at, 180, interval=0.02, what=lambda: f"step {at}: {logs(h, job_id)}")
    sentinel = h.root / "preempt-notice"
    sentinel.touch()
    wait_for(lambda: h.state(job_id) is JobState.QUEUED, 60, interval=0.05, what=lambda: logs(h, job_id))
    notices = sorted((h.run_dir(job_id) / "checkpoints").glob("notice-step-*.ckpt"))
    assert len(notices) == 1 and notices[0].is_dir(), logs(h, job_id)
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt"} <= {p.name for p in notices[0].iterdir()}
    sentinel.unlink()

    def done() -> bool:
        state = h.state(job_id)
        assert state not in (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED), logs(h, job_id)
        return state is JobState.SUCCEEDED

    # attempt 2: a SIGKILL of torchrun and its ranks after a periodic folder past the notice's
    ckpts = h.run_dir(job_id) / "checkpoints"
    notice_step = int(re.search(r"notice-step-(\d{8})", notices[0].name).group(1))  # type: ignore[union-attr]
    periodic = lambda: [n for _, n in step_folders(ckpts) if n > notice_step]  # noqa: E731
    wait_for(lambda: periodic() and step() >= periodic()[0] + 2, 180, interval=0.02, what=lambda: logs(h, job_id))
    os.killpg(h.attempt_pids(job_id, 2)["job_pid"], signal.SIGKILL)
    wait_for(lambda: h.exit_record(job_id, 2), 30, what="attempt 2's exit record")
    newest = periodic()[0]

    wait_for(done, 300, interval=0.2, what=lambda: f"success: {logs(h, job_id)}")
    data = h.cli_json("show", str(job_id))
    first, second, third = data["attempts"]
    assert first["outcome"] == "preempted" and second["resumed_from_step"] == notice_step >= at, data["attempts"]
    assert second["signal"] == signal.SIGKILL and third["resumed_from_step"] == newest, data["attempts"]
    assert data["result"]["steps"] == TOTAL_STEPS, data
    assert f"resumed from {notices[0]} at step {notice_step}" in logs(h, job_id)
    expected, got = weights(plain / "final.pt"), weights(out / "final.pt")
    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"notice at {at}: {len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"
