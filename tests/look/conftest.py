"""One real daemon run shared by the tests of issue 14 ("look instead of read"): a tiny-BERT
fine-tune preempted by the daemon's file notice and resumed to success, a job whose learning
rate sends its loss to NaN, one whose loss stays flat, and a command job held in the queue; an
aiosmtpd server receives the e-mails; [logging] tensorboard_dir points at a folder of links."""

from __future__ import annotations

import json
import time
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from daemon_harness import OrchHome, wait_for

from orchestrator.jobs.notify import load_config_checked
from orchestrator.contract import read_json
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.wake import poke

ROWS, BATCH, EPOCHS = 320, 16, 2
TOTAL_STEPS = ROWS // BATCH * EPOCHS  # 40
PREEMPT_AFTER = 12  # the notice comes once progress.json shows this step (rows are logged at 9, 19, ...)


class Inbox:
    def __init__(self) -> None:
        self.mails: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        self.mails.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 accepted"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _job_toml(
    folder: Path,
    workload: dict[str, Path],
    name: str,
    *,
    train: dict[str, Any],
    checkpoint: dict[str, Any],
    slow_step_s: float = 0.0,
    retries: int = 2,
) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "retries": retries,
        "grace_seconds": 30,
        "model": {"name_or_path": str(workload["model"]), "num_labels": 2},
        "data": {
            "train": str(workload["train"]),
            "validation": str(workload["dev"]),
            "max_length": 32,
            "num_workers": 0,
        },
        "train": {"max_epochs": EPOCHS, "batch_size": BATCH, "precision": "32", "seed": 7, **train},
        "checkpoint": checkpoint,
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(workload["root"] / "hf-cache"),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.2",
            "ORCH_FAULT_SLOW_STEP_S": str(slow_step_s),
        },
    }
    path = folder / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return path


def _attempt_log(h: OrchHome, job_id: int) -> str:
    job = h.job(job_id)
    try:
        return (h.run_dir(job_id) / f"attempt-{job.attempt}.log").read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def _wait_state(h: OrchHome, job_id: int, state: JobState, timeout: float = 240) -> None:
    def done() -> bool:
        now = h.state(job_id)
        if now is not state and now.is_terminal:
            raise AssertionError(f"job {job_id} ended {now.value}: {h.job(job_id).reason}\n{_attempt_log(h, job_id)}")
        return now is state

    wait_for(done, timeout, interval=0.2, what=f"job {job_id} to become {state.value} ({h.log_tail()})")


@pytest.fixture(scope="session")
def scenario(tmp_path_factory) -> Iterator[dict[str, Any]]:
    from aiosmtpd.controller import Controller

    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    root = tmp_path_factory.mktemp("look")
    workload = {
        "root": root,
        "train": write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11)),
        "dev": write_jsonl(root / "dev.jsonl", sentiment_rows(64, seed=12)),
        "model": build_tiny_bert(
            root / "tiny-bert",
            [r["text"] for r in sentiment_rows(1000, seed=1)],
            hidden=32,
            layers=2,
            heads=2,
            vocab_size=300,
            max_positions=64,
        ),
    }
    inbox = Inbox()
    smtp = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    smtp.start()
    (root / "h").mkdir()
    h = OrchHome(root / "h", cpu_slots=1, grace_seconds=30)
    tf_logs = root / "tf-logs"
    config = h.root / "config.toml"
    config.write_text(
        config.read_text()
        + "\n".join(
            [
                "[pricing]",
                'currency = "USD"',
                "instance_hour = 3.6",
                "[budget]",
                "total = 50.0",
                "[preemption]",
                'sources = ["file"]',
                "poll_seconds = 0.2",
                "[logging]",
                f"tensorboard_dir = {json.dumps(str(tf_logs))}",
                "[notify]",
                "retry_base_seconds = 0.5",
                "retry_max_seconds = 2.0",
                "[[notifiers]]",
                'type = "email"',
                'name = "mail"',
                'host = "127.0.0.1"',
                f"port = {smtp.port}",
                'tls = "none"',
                'sender = "orch@example.com"',
                'to = ["me@example.com"]',
                'events = ["succeeded", "failed", "diverged", "loss_flat", "preempted"]',
                "",
            ]
        )
    )
    h.config = load_config_checked(config, required=True)
    try:
        h.start_daemon()

        def submit(path: Path) -> int:
            job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
            poke(h.home.wake_socket)
            return job.id

        # A: val every half epoch, checkpoints every 10 steps, preempted mid-epoch, resumed.
        a = submit(
            _job_toml(
                h.jobs_dir,
                workload,
                "sst-tiny",
                slow_step_s=0.05,
                train={"learning_rate": 1e-3, "val_check_interval": 0.5},
                checkpoint={"every_n_steps": 10, "keep": 2},
            )
        )
        sentinel = h.root / "preempt-notice"
        wait_for(
            lambda: ((read_json(h.run_dir(a) / "progress.json") or {}).get("step") or 0) >= PREEMPT_AFTER,
            180,
            interval=0.02,
            what=f"step {PREEMPT_AFTER} of job {a}",
        )
        sentinel.touch()
        wait_for(lambda: h.state(a) is JobState.QUEUED, 60, interval=0.05, what=f"job {a} to be preempted")
        sentinel.unlink()
        # B: a learning rate that sends the loss to NaN within a few steps; checkpoints every 2.
        b = submit(
            _job_toml(
                h.jobs_dir,
                workload,
                "diverge",
                train={"learning_rate": 1e4, "gradient_clip_val": 0},
                checkpoint={"every_n_steps": 2, "keep": 5},
            )
        )
        # D: a learning rate too small to learn: the loss stays flat; the job goes on and succeeds.
        d = submit(
            _job_toml(
                h.jobs_dir,
                workload,
                "flat",
                train={"learning_rate": 1e-9, "max_steps": 16, "flat_after_steps": 10, "flat_min_improvement": 0.5},
                checkpoint={"every_n_steps": 100},
            )
        )
        c = h.submit("held", not_before=time.time() + 7200)  # a command job waiting for its --at
        for job_id, state in ((a, JobState.SUCCEEDED), (b, JobState.FAILED), (d, JobState.SUCCEEDED)):
            _wait_state(h, job_id, state)
        wait_for(lambda: h.store.pending_outbox() == 0, 60, interval=0.2, what="the outbox to drain")
        yield {"h": h, "a": a, "b": b, "c": c, "d": d, "inbox": inbox, "tf_logs": tf_logs, "workload": workload}
    finally:
        h.cleanup()
        smtp.stop()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots go: $ORCH_TEST_ARTIFACTS, else test-artifacts/look in the checkout."""
    import os

    folder = (
        Path(os.environ.get("ORCH_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts") / "look"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder
