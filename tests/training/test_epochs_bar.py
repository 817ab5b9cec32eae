"""The foreground progress bar names the last epoch the job runs, also when only max_steps bounds it
(Lightning's own bar showed "Epoch 1/-2" for max_epochs = -1)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from training.builtin.job_trainer import last_epoch, progress_bar


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.seen: list[str] = []

    def training_step(self, batch, idx):
        self.seen.append(self.trainer.progress_bar_callback._get_train_description(self.current_epoch).strip())
        return self.net(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_job_bounded_by_max_steps_shows_its_real_last_epoch(tmp_path):
    # 10 batches per epoch, max_steps 25, no max_epochs: epochs 0, 1 and 2 (of which the last is partial)
    loader = DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=4)
    model = _Tiny()
    trainer = pl.Trainer(
        max_epochs=-1,
        max_steps=25,
        callbacks=[progress_bar()],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, loader)
    assert sorted(set(model.seen)) == ["Epoch 0/2", "Epoch 1/2", "Epoch 2/2"]
    assert last_epoch(trainer) == 2


def test_the_last_epoch_is_whichever_bound_ends_first():
    class T:  # the four Trainer attributes last_epoch reads
        def __init__(self, max_epochs, max_steps, batches=10, accumulate=1):
            self.max_epochs, self.max_steps = max_epochs, max_steps
            self.num_training_batches, self.accumulate_grad_batches = batches, accumulate

    assert last_epoch(T(3, -1)) == 2
    assert last_epoch(T(-1, 25)) == 2
    assert last_epoch(T(-1, 25, accumulate=2)) == 4  # 5 steps per epoch
    assert last_epoch(T(5, 12)) == 1
    assert last_epoch(T(-1, -1)) is None
    assert last_epoch(T(-1, 25, batches=float("inf"))) is None
