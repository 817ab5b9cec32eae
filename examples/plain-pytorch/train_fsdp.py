"""A plain PyTorch FSDP2 fine-tune (torchrun, `fully_shard`, torch.distributed.checkpoint) made
preemptible and exactly resumable by orch's OrchShardedLoop. Each rank holds 1/N of the model, its
gradients and its optimizer state; a checkpoint is one folder, each rank writing its own shards.
Offline, on the tiny BERT that prepare.py makes:

    python examples/plain-pytorch/prepare.py
    orch submit examples/plain-pytorch/job-fsdp.toml   # or: torchrun --nproc-per-node 2 train_fsdp.py

The lines marked `orch` are all it takes. For an exact resume an epoch's order depends only on
(seed, epoch) (DistributedSampler.set_epoch), and the data position saved is this rank's next
batch, the same number on every rank."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout as well as from an installed orch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding  # noqa: E402

from training.torch_loop import OrchShardedLoop  # noqa: E402  <- orch


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
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model).to(device)  # dropout 0.1
    for layer in model.bert.encoder.layer:  # each transformer block a unit, gathered only while it runs
        fully_shard(layer)
    fully_shard(model)
    torch.manual_seed(args.seed + rank)  # each rank its own dropout stream (orch restores every rank's)

    train = load_rows(Path(args.data) / "train.jsonl", tokenizer, args.max_length)
    sampler = DistributedSampler(train, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(
        train, batch_size=args.batch_size, sampler=sampler, collate_fn=DataCollatorWithPadding(tokenizer)
    )
    total = args.epochs * len(loader)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = 5
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (total - s) / total)

    orch = OrchShardedLoop(
        model,
        optimizer,
        scheduler,
        total_steps=total,
        save_every=args.save_every,
        samples_per_step=args.batch_size * dist.get_world_size(),
    )  # <- orch
    pos = orch.resume() or {"epoch": 0, "batch": 0}  # <- orch
    model.train()
    for epoch in range(pos["epoch"], args.epochs):
        sampler.set_epoch(epoch)
        skip = pos["batch"] if epoch == pos["epoch"] else 0
        for i, batch in enumerate(orch.skip(loader, skip), start=skip):  # <- orch
            loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            nxt = {"epoch": epoch, "batch": i + 1} if i + 1 < len(loader) else {"epoch": epoch + 1, "batch": 0}
            orch.step_done(data=nxt, epoch=epoch, metrics={"loss": loss.item()})  # <- orch
    orch.finish()  # <- orch

    # the whole model gathered once, onto rank 0's CPU, for save_pretrained
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        out = Path(args.output_dir)
        model.save_pretrained(str(out / "model"), state_dict=full)
        torch.save(full, out / "final.pt")
        print(f"saved the model to {out / 'model'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
