"""A resume changes no metric (issue 31), in one process with a toy model so that each case is
cheap and lands on the exact step it needs: a notice at a step whose end runs a validation, and a
crash after a periodic checkpoint taken just before one (Lightning restores both as "validation
already run"). The resumed run must log metrics.csv row for row as the uninterrupted one and end
with the same weights, early-stopping state and best score. Plus the loggers' side: a validation
run again replaces the row an earlier attempt wrote, in metrics.csv and in TensorBoard."""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import tb_reader as tb
from training.callbacks import OrchCallback, Preempted
from training.logs.run_logs import ContinuingCSVLogger
from training.logs.tensorboard_log import TensorBoardEvents
from training.resume.sampler import ResumableSampler

ROWS, BATCH, EPOCHS, VAL_EVERY, LOG_EVERY = 200, 10, 2, 5, 3  # 20 steps per epoch, 40 in all


class Toy(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))

    def training_step(self, batch, idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class _At(pl.Callback):
    """SIGTERM to this process before step `notice` trains (OrchCallback's own handler takes it),
    or an exception before step `crash` trains (a crash: no checkpoint of its own)."""

    def __init__(self, notice: Optional[int] = None, crash: Optional[int] = None):
        self.notice, self.crash = notice, crash

    def on_train_batch_start(self, trainer, *args: Any) -> None:
        if trainer.global_step + 1 == self.notice:
            os.kill(os.getpid(), signal.SIGTERM)
        if trainer.global_step == self.crash:
            raise RuntimeError("crash")


def fit(folder: Path, *, resume: Optional[str] = None, patience: int = 100, **at: int) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, generator=g))
    val = TensorDataset(torch.randn(40, 8, generator=g), torch.randn(40, generator=g))
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    ckpt = folder / "checkpoints"
    early = EarlyStopping(monitor="val_loss", patience=patience)
    best = ModelCheckpoint(dirpath=str(ckpt), filename="best", monitor="val_loss", enable_version_counter=False)
    periodic = ModelCheckpoint(
        dirpath=str(ckpt), filename="step-{step:08d}", every_n_train_steps=VAL_EVERY, save_top_k=-1,
        auto_insert_metric_name=False, enable_version_counter=False, save_on_train_epoch_end=False,
    )  # fmt: skip
    step = int(Path(resume).stem.rsplit("-", 1)[1]) if resume else 0
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        logger=ContinuingCSVLogger(folder, purge_step=step),
        callbacks=[_At(**at), OrchCallback(run_dir=folder, ckpt_dir=ckpt), early, best, periodic],
        val_check_interval=VAL_EVERY,
        check_val_every_n_epoch=None,
        log_every_n_steps=LOG_EVERY,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Toy()
    loader = StatefulDataLoader(
        train, batch_size=BATCH, sampler=ResumableSampler(ROWS, seed=3), generator=torch.Generator().manual_seed(1)
    )
    try:
        trainer.fit(model, loader, DataLoader(val, batch_size=10), ckpt_path=resume)
    except Preempted as stop:
        return {"checkpoint": stop.checkpoint}
    except RuntimeError as exc:
        assert str(exc) == "crash"
        return {"checkpoint": str(sorted(ckpt.glob("step-*.ckpt"))[-1])}
    with open(folder / "metrics.csv", newline="") as fh:
        rows = [{k: v for k, v in r.items() if v} for r in csv.DictReader(fh)]
    return {
        "rows": rows,
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "early": {k: str(v) for k, v in early.state_dict().items()},
        "best": str(best.best_model_score),
        "steps": trainer.global_step,
    }


def assert_same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    val = [r["step"] for r in a["rows"] if "val_loss" in r]
    assert [r["step"] for r in b["rows"] if "val_loss" in r] == val
    assert b["rows"] == a["rows"]
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    assert (b["early"], b["best"], b["steps"]) == (a["early"], a["best"], a["steps"])


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Any]:
    return fit(tmp_path_factory.mktemp("straight"))


@pytest.mark.parametrize("notice", [15, 20, 27])  # 15, 20: a validation due (20 also ends epoch 0); 27: a train row
def test_a_notice_at_any_step_resumes_to_the_same_rows_weights_and_early_stopping(straight, tmp_path, notice):
    first = fit(tmp_path, notice=notice)
    assert Path(first["checkpoint"]).name == f"notice-step-{notice:08d}.ckpt"
    assert_same_run(straight, fit(tmp_path, resume=first["checkpoint"]))


def test_a_crash_after_a_checkpoint_taken_just_before_a_validation_resumes_with_that_validation(tmp_path_factory):
    # Patience 6 with a validation every 5 steps: one validation more or less moves the step
    # early stopping ends the run at (Lightning alone skipped it on resume and trained on longer).
    straight = fit(tmp_path_factory.mktemp("straight-es"), patience=6)
    run = tmp_path_factory.mktemp("crashed")
    first = fit(run, patience=6, crash=12)  # after step-00000010.ckpt, taken before step 9's validation
    assert Path(first["checkpoint"]).name == "step-00000010.ckpt"
    assert_same_run(straight, fit(run, resume=first["checkpoint"], patience=6))


def test_a_validation_run_again_replaces_the_earlier_attempts_row_in_metrics_csv_and_tensorboard(tmp_path):
    csv_1, tb_1 = (
        ContinuingCSVLogger(tmp_path, purge_step=0),
        TensorBoardEvents(tmp_path / "tb", purge_step=0, attempt="1"),
    )
    for logger in (csv_1, tb_1):
        logger.log_metrics({"train_loss": 0.9, "epoch": 0}, step=8)
        logger.log_metrics({"train_loss": 0.8, "epoch": 0}, step=9)
        logger.log_metrics({"val_loss": 0.7, "epoch": 0}, step=9)  # after the checkpoint of step 10
        logger.log_metrics({"train_loss": 0.6, "epoch": 0}, step=10)
        logger.finalize("failed")
    time.sleep(1.01)  # the events file name carries the second it was made in
    csv_2, tb_2 = (
        ContinuingCSVLogger(tmp_path, purge_step=10),
        TensorBoardEvents(tmp_path / "tb", purge_step=10, attempt="2"),
    )
    for logger in (csv_2, tb_2):
        logger.drop_validation_at(9)
        logger.log_metrics({"val_loss": 0.75, "epoch": 0}, step=9)  # the rerun, from the checkpoint's state
        logger.log_metrics({"train_loss": 0.5, "epoch": 0}, step=10)
        logger.finalize("success")
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = [(r["step"], r["train_loss"], r["val_loss"]) for r in csv.DictReader(fh)]
    assert rows == [("8", "0.9", ""), ("9", "0.8", ""), ("9", "", "0.75"), ("10", "0.5", "")]
    series = tb.read_scalars(tmp_path / "tb")
    assert [s for s, _ in series["train_loss"]] == [8, 9, 10] and series["train_loss"][1][1] == pytest.approx(0.8)
    assert series["val_loss"] == [(9, pytest.approx(0.75))]
