"""`python -m tools.gpucheck.plain ARGS.json`: the throughput baseline, a plain Lightning script
as a user would write it (datasets map -> DataLoader -> AutoModelForSequenceClassification with
AdamW and a linear warmup, Trainer with no logger and no checkpoints), on the same model, data,
sizes, precision, loader workers and steps as the runner, timed by the same Clock."""

from __future__ import annotations

import json
import sys


def main(args_file: str) -> int:
    a = json.loads(open(args_file).read())
    import pytorch_lightning as pl
    import torch
    from datasets import load_dataset
    from torch.utils.data import DataLoader
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

    from tools.gpucheck.clock import Clock

    tok = AutoTokenizer.from_pretrained(a["model"])
    ds = load_dataset("json", data_files=a["train"], split="train")
    ds = ds.map(
        lambda b: tok(b["text"], truncation=True, max_length=a["max_length"]), batched=True, remove_columns=["text"]
    )

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["label"] for r in rows])}

    steps = a["steps"]

    class Plain(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = AutoModelForSequenceClassification.from_pretrained(a["model"], num_labels=2)
            self.model.train()

        def training_step(self, batch, idx):
            loss = self.model(**batch).loss
            self.log("train_loss", loss, batch_size=batch["labels"].shape[0])
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=a["learning_rate"], weight_decay=0.01)
            sched = get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    pl.seed_everything(a["seed"], verbose=False)
    workers = a["num_workers"]
    loader = DataLoader(
        ds,
        batch_size=a["batch_size"],
        shuffle=True,
        collate_fn=collate,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
    )
    trainer = pl.Trainer(
        accelerator=a["accelerator"],
        devices=1,
        precision=a["precision"],
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Clock(a["clock"])],
        gradient_clip_val=1.0,
        num_sanity_val_steps=0,
    )
    trainer.fit(Plain(), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
