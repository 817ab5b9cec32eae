"""Programs written as their users write them, with no orch import, for the instrument tests: a
`transformers.Trainer` fine-tune with its own output_dir and save_steps and no resume argument, and a
plain Lightning script. Each writes its final weights to <output_dir>/final.pt on the main process."""

from __future__ import annotations

from pathlib import Path

HF_TRAINER = r"""
import os, sys, torch
from transformers import Trainer, TrainingArguments

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

class Rows(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(320, 8, generator=g), torch.randn(320, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}

out = sys.argv[1]
args = TrainingArguments(output_dir=out, num_train_epochs=2, per_device_train_batch_size=8, learning_rate=1e-2,
                         save_strategy="steps", save_steps=int(sys.argv[2]), save_total_limit=2, logging_steps=5,
                         report_to="none", disable_tqdm=True, seed=3, use_cpu=True)
torch.manual_seed(0)
trainer = Trainer(model=Net(), args=args, train_dataset=Rows())
trainer.train()
if trainer.is_world_process_zero():
    torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))
print("trained", flush=True)
"""

LIGHTNING = r"""
import os, sys, time, torch, pytorch_lightning as pl
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))

    def training_step(self, batch, idx):
        time.sleep(float(os.environ.get("SLOW", "0")))  # the test's window to send a notice in
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

out = sys.argv[1]
pl.seed_everything(0)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(400, 8, generator=g), torch.randn(400, generator=g))
# its own generator: a resume rebuilds the iterator, which draws from it (OrchCallback puts it back)
loader = StatefulDataLoader(data, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(1))
checkpoints = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "ckpts"), every_n_train_steps=15, save_top_k=-1)
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=out, callbacks=[checkpoints])
trainer.fit(Model(), loader)
torch.save(trainer.lightning_module.state_dict(), os.path.join(out, "final.pt"))
print("trained", flush=True)
"""

NEITHER = r"""
import json, sys
names = sorted(n for n in sys.modules if n.split(".")[0] in ("training", "orchestrator", "transformers", "torch"))
print(json.dumps({"argv": sys.argv[1:], "modules": names}), flush=True)
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path
