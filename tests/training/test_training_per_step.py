"""The runner's per-step path kept cheap without losing a guarantee: a loss check deferred to
every N steps (as on a GPU or under DDP) still stops a diverged run within N steps, names the
exact step the loss went bad, and never lets a checkpoint of a bad step be written;
progress.json written by a thread never goes back in time; lr and samples/s still reach the
loggers on every logging step though logged only then. Real Lightning fits on the CPU."""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from orchestrator.contract import HEALTH, parse_checkpoint_name, read_json
from training.heartbeat.health import Diverged, HealthCallback
from training.heartbeat.progress import ProgressWriter
from training.logs.run_logs import RateAndLR, run_loggers


class GoesNaN(pl.LightningModule):
    """A one-weight regression whose loss is NaN from the batch of step `bad_step` (1-based) on."""

    def __init__(self, bad_step: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.bad_step = bad_step

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = ((self.w * batch - 1.0) ** 2).mean()
        if self.global_step + 1 >= self.bad_step:
            loss = loss * float("nan")
        self.log("train_loss", loss, on_step=True, prog_bar=False, batch_size=len(batch))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path: Path, *, bad_step: int, check_every: int, checkpoint_every: int = 0) -> tuple[pl.Trainer, Path]:
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    callbacks: list = [HealthCallback(tmp_path, ckpt_dir, attempt="1", check_every=check_every, defer_loss_check=True)]
    if checkpoint_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=str(ckpt_dir),
                filename="step-{step:08d}",
                auto_insert_metric_name=False,
                every_n_train_steps=checkpoint_every,
                save_top_k=-1,
            )
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=40,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(checkpoint_every),
        callbacks=callbacks,
    )
    with pytest.raises(Diverged) as caught:
        trainer.fit(GoesNaN(bad_step), DataLoader(torch.arange(200, dtype=torch.float32), batch_size=4))
    assert caught.value.step == bad_step
    return trainer, ckpt_dir


def test_a_deferred_loss_check_stops_within_n_steps_and_names_the_first_bad_step(tmp_path):
    trainer, _ = _fit(tmp_path, bad_step=6, check_every=4)
    assert trainer.global_step == 8  # the first check after step 6: within 4 steps, not at 40
    diverged = (read_json(tmp_path / HEALTH) or {})["diverged"]
    assert diverged["step"] == 6 and "nan" in diverged["what"], diverged


def test_a_deferred_loss_check_runs_before_any_checkpoint_of_a_bad_step(tmp_path):
    trainer, ckpt_dir = _fit(tmp_path, bad_step=6, check_every=10, checkpoint_every=1)
    steps = sorted(parse_checkpoint_name(p.name).step for p in ckpt_dir.iterdir() if parse_checkpoint_name(p.name))
    assert steps == [1, 2, 3, 4, 5], steps  # the save after step 6 read the flag and stopped
    assert trainer.global_step == 6
    assert (read_json(tmp_path / HEALTH) or {})["diverged"]["checkpoint"] == "step-00000005.ckpt"


def test_the_progress_thread_never_writes_an_older_snapshot_over_a_newer_one(tmp_path):
    writer = ProgressWriter(tmp_path / "progress.json")
    stop = threading.Event()

    def heartbeat() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            writer.submit({"step": n, "metrics": {"loss": torch.tensor(0.5)}})

    thread = threading.Thread(target=heartbeat)
    thread.start()
    time.sleep(0.2)
    stop.set()
    thread.join()
    writer.write_now({"step": 10**9, "metrics": {"loss": torch.tensor(0.25), "note": "x"}})
    deadline = time.monotonic() + 10
    while writer._pending is not None and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.01)
    time.sleep(0.1)
    final = read_json(tmp_path / "progress.json")
    assert final == {"step": 10**9, "metrics": {"loss": 0.25}}  # tensors read as numbers; non-numbers left out
    assert writer.writes >= 2


def test_lr_and_samples_per_s_reach_the_loggers_on_every_logging_step(tmp_path):
    class Fine(GoesNaN):
        def __init__(self):
            super().__init__(bad_step=10**9)

    loggers = run_loggers(tmp_path, resume_step=None, job_name="t")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=35,
        logger=loggers,
        log_every_n_steps=10,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[RateAndLR()],
    )
    trainer.fit(Fine(), DataLoader(torch.arange(200, dtype=torch.float32), batch_size=4))
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == [9, 19, 29]
    assert all(
        float(r["lr"]) == pytest.approx(0.01) and float(r["samples_per_s"]) > 0 and r["train_loss"] for r in rows
    )
