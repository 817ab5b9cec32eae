"""What the built-in runner costs over a hand-written Lightning script.

Same tiny BERT, same data, same number of steps, CPU: (a) a plain Lightning script, (b) the runner
(`python -m training.run`), interleaved a/b several times. Reports the training throughput ratio
b/a (steps per second between the first and the last step; goal >= 0.97), time to first step from
process start, and the tokenization time of 100k rows, first run vs cached second run.

    python benchmarks/overhead.py [--runs 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PLAIN = r'''
import json, sys, time
T0 = time.time()
import pytorch_lightning as pl, torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

model_dir, train_file, steps, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(model_dir)
ds = load_dataset("json", data_files=train_file, split="train")
ds = ds.map(lambda b: tok(b["text"], truncation=True, max_length=64), batched=True, remove_columns=["text"])

def collate(rows):
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long); mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"]); mask[i, :len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["label"] for r in rows])}

class Plain(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
        self.model.train()
    def training_step(self, batch, idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.01)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": get_linear_schedule_with_warmup(opt, 10, steps), "interval": "step"}}

class Clock(pl.Callback):
    first = last = None
    def on_train_batch_end(self, trainer, *a):
        if trainer.global_step == 1: Clock.first = time.time()
        Clock.last = time.time()

pl.seed_everything(42)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock()], gradient_clip_val=1.0)
trainer.fit(Plain(), DataLoader(ds, batch_size=batch, shuffle=True, collate_fn=collate))
print(json.dumps({"start": T0, "first": Clock.first, "last": Clock.last, "steps": trainer.global_step}))
'''


def setup(folder: Path, rows: int) -> tuple[Path, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    data = write_jsonl(folder / "train.jsonl", sentiment_rows(rows, seed=5))
    model = build_tiny_bert(folder / "tiny-bert", [r["text"] for r in sentiment_rows(2000, seed=1)])
    return model, data


def env_for(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache), "PYTHONPATH": str(REPO),
            "TOKENIZERS_PARALLELISM": "false"}


def run_plain(model: Path, data: Path, steps: int, batch: int, cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PLAIN, str(model), str(data), str(steps), str(batch)],
                         capture_output=True, text=True, env=env_for(cache), check=True)
    t = json.loads(out.stdout.strip().splitlines()[-1])
    return {"first_step_s": t["first"] - t["start"], "steps_per_s": (t["steps"] - 1) / (t["last"] - t["first"])}


def run_runner(model: Path, data: Path, steps: int, batch: int, cache: Path, workdir: Path) -> dict:
    import tomli_w

    run = Path(tempfile.mkdtemp(dir=workdir, prefix="run-"))
    spec = {"name": "bench", "gpus": 0, "model": {"name_or_path": str(model), "num_labels": 2},
            "data": {"train": str(data), "max_length": 64, "num_workers": 0},
            "train": {"max_steps": steps, "max_epochs": 1000, "batch_size": batch, "precision": "32",
                      "learning_rate": 1e-3},
            "checkpoint": {"every_minutes": 10.0, "keep": 1}}
    (run / "job.toml").write_bytes(tomli_w.dumps(spec).encode())
    env = {**env_for(cache), "ORCH_RUN_DIR": str(run)}
    start = time.time()
    subprocess.run([sys.executable, "-m", "training.run", str(run)], cwd=str(REPO), env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # progress.json is rewritten when training ends: first_step_at and updated_at bracket the steps
    p = json.loads((run / "progress.json").read_text())
    return {"first_step_s": p["first_step_at"] - start,
            "steps_per_s": (p["step"] - 1) / (p["updated_at"] - p["first_step_at"])}


def tokenization(rows: int, workdir: Path) -> dict:
    from training.toy import sentiment_rows, write_jsonl

    data = write_jsonl(workdir / "big.jsonl", sentiment_rows(rows, seed=9))
    model = workdir / "tiny-bert"
    cache = workdir / "tok-cache"
    code = ("import sys, json; from transformers import AutoTokenizer; from training.data import TextClassificationData as D;"
            f"d = D(tokenizer=AutoTokenizer.from_pretrained({str(model)!r}), train={str(data)!r}, validation=None);"
            "d.prepare(); print(json.dumps(d.tokenize_seconds))")
    times = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_for(cache),
                             cwd=str(REPO), check=True)
        times.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"rows": rows, "first_s": times[0], "cached_s": times[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokenize-rows", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        work = Path(tmp)
        model, data = setup(work, rows=args.steps * args.batch)
        cache = work / "cache"
        run_plain(model, data, 5, args.batch, cache)  # warm the tokenization cache and the page cache
        results = {"plain": [], "runner": []}
        for i in range(args.runs):
            results["plain"].append(run_plain(model, data, args.steps, args.batch, cache))
            results["runner"].append(run_runner(model, data, args.steps, args.batch, cache, work))
            print(f"run {i + 1}: plain {results['plain'][-1]}  runner {results['runner'][-1]}", flush=True)
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("steps_per_s", "first_step_s")}
               for k, v in results.items()}
        ratio = med["runner"]["steps_per_s"] / med["plain"]["steps_per_s"]
        tok = tokenization(args.tokenize_rows, work)
        summary = {"steps": args.steps, "batch": args.batch, "runs": args.runs, "median": med,
                   "throughput_ratio_runner_over_plain": round(ratio, 3), "tokenization": tok}
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
