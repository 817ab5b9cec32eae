"""No checkpoint load runs pickled code. A checkpoint whose pickle would run a command (planted in
a job's checkpoint folder by whoever can write there) is refused with a message naming it; the
command never runs; the built-in runner resumes from the previous valid checkpoint. Lightning's
own restore goes through torch.load(weights_only=True) too, whatever torch's default."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)
from orchestrator.model.states import JobState


class RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path: Path, marker: Path) -> None:
    torch.save(
        {"state_dict": RunsCode(marker), "global_step": 99999999, "epoch": 0, "loops": {}, "optimizer_states": []}, path
    )


def test_lightning_restores_never_unpickle_code(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.io import TorchCheckpointIO

    from training.scripts.lightning import safe_loads
    from training.resume.checkpoints import AtomicCheckpointIO, checkpoint_problem

    evil, marker = tmp_path / "step-00000005.ckpt", tmp_path / "ran"
    plant(evil, marker)
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        AtomicCheckpointIO().load_checkpoint(evil)
    assert "does not load" in checkpoint_problem(evil)
    # A user's Trainer with Lightning's own CheckpointIO, once OrchCallback's setup has run:
    trainer = pl.Trainer(plugins=[TorchCheckpointIO()], logger=False, enable_checkpointing=False)
    safe_loads(trainer)
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        trainer.strategy.checkpoint_io.load_checkpoint(evil, weights_only=False)  # even when asked
    assert not marker.exists()


@pytest.mark.slow
def test_a_planted_pickle_checkpoint_is_refused_and_the_job_resumes_from_the_previous_one(orch_home, tmp_path):
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    h = orch_home(cpu_slots=1)
    data = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(2000, seed=3))
    model = build_tiny_bert(
        tmp_path / "bert",
        [r["text"] for r in sentiment_rows(500, seed=1)],
        hidden=32,
        layers=1,
        heads=2,
        vocab_size=200,
        max_positions=64,
    )
    job = tmp_path / "ft.toml"
    job.write_text(
        "\n".join(
            [
                'name = "ft"',
                "gpus = 0",
                "retries = 0",
                "[model]",
                f"name_or_path = {json.dumps(str(model))}",
                "[data]",
                f"train = {json.dumps(str(data))}",
                "max_length = 32",
                "num_workers = 0",
                "[train]",
                "max_steps = 300",
                "batch_size = 8",
                'precision = "32"',
                "learning_rate = 1e-3",
                "[checkpoint]",
                "every_n_steps = 5",
                "keep = 2",
            ]
        )
        + "\n"
    )
    job_id = h.submit(job)
    marker = tmp_path / "pickle-ran"
    daemon = h.start_daemon()
    ckpts = h.run_dir(job_id) / "checkpoints"
    wait_for(lambda: (ckpts / "step-00000005.ckpt").exists(), 240, what="a first checkpoint")
    plant(ckpts / "step-99999999.ckpt", marker)  # newest by its name: what ORCH_RESUME_FROM will name
    h.stop_daemon(daemon, timeout=120)  # SIGTERM to the daemon: preempt, notice checkpoint, exit 75
    assert h.state(job_id) is JobState.QUEUED
    daemon = h.start_daemon()
    done = h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=400)
    h.stop_daemon(daemon)
    log = (h.run_dir(job_id) / "attempt-2.log").read_text()
    assert done.state is JobState.SUCCEEDED, log[-3000:]
    assert not marker.exists(), "the planted pickle ran"
    assert "skipping checkpoint" in log and "step-99999999.ckpt" in log, log[-3000:]
    result = json.loads((h.run_dir(job_id) / "result.json").read_text())
    assert result["steps"] == 300
