"""OrchCallback in a user's own Lightning script (an orch command job): progress.json, SIGTERM ->
notice checkpoint -> exit 75, and an exact resume from ORCH_RESUME_FROM — also when the script's
configure_optimizers reads trainer.estimated_stepping_batches (which makes Lightning 2.6 forget
the restored loader position unless OrchCallback re-applies it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from training.resume.checkpoints import list_checkpoints

from conftest import REPO, read_progress, wait_for

pytestmark = pytest.mark.slow

SCRIPT = r"""
import os, time, torch, pytorch_lightning as pl
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from training.callbacks import OrchCallback

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    def training_step(self, batch, idx):
        time.sleep(float(os.environ.get("SLOW", "0")))
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        total = int(self.trainer.estimated_stepping_batches)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

pl.seed_everything(0)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(400, 8, generator=g), torch.randn(400, generator=g))
loader = StatefulDataLoader(data, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(1))
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False, callbacks=[OrchCallback()])
trainer.fit(Model(), loader, ckpt_path=os.environ.get("ORCH_RESUME_FROM") or None)
torch.save(trainer.lightning_module.state_dict(), os.path.join(os.environ["ORCH_RUN_DIR"], "final.pt"))
"""


def start(run_dir, **env):
    script = run_dir / "train.py"
    script.write_text(SCRIPT)
    full_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ORCH_RUN_DIR": str(run_dir),
        "ORCH_CKPT_DIR": str(run_dir / "checkpoints"),
        "ORCH_PROGRESS_EVERY_S": "0.05",
        **env,
    }
    log = open(run_dir / "log.txt", "ab")
    return subprocess.Popen(
        [sys.executable, str(script)],
        cwd=str(run_dir),
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_user_script_with_orch_callback_is_preemptible_and_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    straight.mkdir()
    assert start(straight).wait(timeout=120) == 0, (straight / "log.txt").read_text()

    run = tmp_path / "interrupted"
    run.mkdir()
    proc = start(run, SLOW="0.03")
    wait_for(lambda: (read_progress(run) or {}).get("step", 0) >= 55, 120, "step 55")  # mid epoch 2 (40/epoch)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=25) == 75, (run / "log.txt").read_text()
    notice = list_checkpoints(run / "checkpoints")[0]
    assert notice.name.startswith("notice-step-")
    assert read_progress(run)["total_steps"] == 80

    resumed = start(run, ORCH_RESUME_FROM=str(notice))
    assert resumed.wait(timeout=120) == 0, (run / "log.txt").read_text()
    a = torch.load(straight / "final.pt", weights_only=True)
    b = torch.load(run / "final.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
