"""A plain `transformers.Trainer` fine-tune (the shape of run_glue.py) made preemptible by orch with
two lines: the callback, and `resume_from_checkpoint=resume_from()`. Offline, on the tiny BERT
that prepare.py makes:

    python examples/hf-trainer/prepare.py
    orch submit examples/hf-trainer/job.toml     # or run it by hand: python examples/hf-trainer/train.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout as well as from an installed orch

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

from training.hf_trainer import OrchTrainerCallback, resume_from  # noqa: E402  <- orch, line 1 of 3


class JsonlDataset(torch.utils.data.Dataset):
    def __init__(self, path: Path, tokenizer, max_length: int):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=max_length)
        self.items = [
            {"input_ids": ids, "attention_mask": mask, "labels": r["label"]}
            for ids, mask, r in zip(enc["input_ids"], enc["attention_mask"], rows)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(HERE / "tiny-bert"))
    p.add_argument("--data", default=str(HERE / "data"))
    p.add_argument("--output-dir", default=os.environ.get("ORCH_RUN_DIR") or str(HERE / "out"))
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--save-steps", type=int, default=25)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--seed", type=int, default=7)
    # "wandb", "swanlab", "mlflow": the Trainer's own integration; orch gives it the run id, so
    # every attempt of the job continues one run (docs/tracking.md)
    p.add_argument("--report-to", default="none")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    # FSDP2 through accelerate's plugin, each BERT layer a unit, checkpoints sharded (DCP); run it
    # under torchrun or `accelerate launch` with one process per GPU (job-fsdp.toml). On GPUs only:
    # on the CPU accelerate runs the ranks as DDP (see docs/large-models.md, bring your own)
    p.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 over the ranks")
    args = p.parse_args()
    sharding = (
        {
            "fsdp": True,
            "fsdp_config": {
                "version": 2,
                "transformer_layer_cls_to_wrap": ["BertLayer"],
                "state_dict_type": "SHARDED_STATE_DICT",
            },
        }
        if args.fsdp
        else {}
    )

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model)  # dropout 0.1: RNG matters
    data = Path(args.data)
    train = JsonlDataset(data / "train.jsonl", tokenizer, args.max_length)
    dev = JsonlDataset(data / "dev.jsonl", tokenizer, args.max_length)
    out = Path(args.output_dir)
    training_args = TrainingArguments(
        output_dir=str(out / "trainer"),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-3,
        warmup_steps=5,
        seed=args.seed,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=2,
        eval_strategy="epoch",
        logging_steps=5,
        report_to=args.report_to,
        disable_tqdm=True,
        dataloader_num_workers=args.workers,
        **sharding,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=dev,
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[OrchTrainerCallback()],
    )  # <- orch, line 2 of 3
    trainer.train(resume_from_checkpoint=resume_from())  # <- orch, line 3 of 3
    trainer.save_model(str(out / "model"))  # under FSDP: the whole model, gathered
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(out / "model"))
        print(f"saved the model to {out / 'model'}", flush=True)


if __name__ == "__main__":
    main()
