"""A plain PyTorch fine-tuning loop (the tutorial kind: DataLoader, AdamW, a warm-up schedule, AMP on
a GPU) made preemptible and exactly resumable by orch's OrchLoop. Offline, on the tiny BERT that
prepare.py makes:

    python examples/plain-pytorch/prepare.py
    orch submit examples/plain-pytorch/job.toml     # or by hand: python examples/plain-pytorch/train.py

The lines marked `orch` are all it takes; the one other rule for an exact resume is that an
epoch's order depends only on (seed, epoch): the DataLoader gets a generator seeded per epoch."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout as well as from an installed orch

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding  # noqa: E402

from training.torch_loop import OrchLoop  # noqa: E402  <- orch


def load_rows(path: Path, tokenizer, max_length: int) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=max_length)
    return [
        {"input_ids": ids, "attention_mask": mask, "labels": r["label"]}
        for ids, mask, r in zip(enc["input_ids"], enc["attention_mask"], rows)
    ]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(HERE / "tiny-bert"))
    p.add_argument("--data", default=str(HERE / "data"))
    p.add_argument("--output-dir", default=os.environ.get("ORCH_RUN_DIR") or str(HERE / "out"))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--save-every", type=int, default=25)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model).to(device)  # dropout 0.1
    train = load_rows(Path(args.data) / "train.jsonl", tokenizer, args.max_length)
    order = torch.Generator()
    loader = DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        generator=order,
        num_workers=args.workers,
        collate_fn=DataCollatorWithPadding(tokenizer),
    )
    total = args.epochs * len(loader)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = 5
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (total - s) / total)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")

    orch = OrchLoop(
        model,
        optimizer,
        scheduler,
        scaler,
        total_steps=total,
        save_every=args.save_every,
        samples_per_step=args.batch_size,
    )  # <- orch
    pos = orch.resume() or {"epoch": 0, "batch": 0}  # <- orch
    model.train()
    for epoch in range(pos["epoch"], args.epochs):
        order.manual_seed(args.seed * 1000 + epoch)
        skip = pos["batch"] if epoch == pos["epoch"] else 0
        for i, batch in enumerate(orch.skip(loader, skip), start=skip):  # <- orch
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=torch.float16, enabled=scaler.is_enabled()):
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            # where to continue from: the next batch of this epoch, or the start of the next one
            nxt = {"epoch": epoch, "batch": i + 1} if i + 1 < len(loader) else {"epoch": epoch + 1, "batch": 0}
            orch.step_done(data=nxt, epoch=epoch, metrics={"loss": loss.item()})  # <- orch
    orch.finish()  # <- orch
    model.save_pretrained(str(Path(args.output_dir) / "model"))
    print(f"saved the model to {Path(args.output_dir) / 'model'}", flush=True)


if __name__ == "__main__":
    main()
