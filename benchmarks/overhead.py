"""What the built-in runner costs over a hand-written Lightning script.

Same BERT classifier, same data, same number of steps, CPU: (a) a plain Lightning script, (b) the
runner (`python -m training.run`), in pairs with the arms alternated (plain first in even pairs,
runner first in odd ones) after one warm-up run of each. Per pair: the training throughput ratio
runner/plain (steps per second between the end of the first and of the last step, timed by the
same clock callback in both arms; goal >= 0.98), the gap in milliseconds per step, and the same
ratio in process CPU time per step (steadier when other work shares the machine). Two model sizes (tiny: 2 layers x 64; small: 4 layers x 256,
a step several times longer) show how the runner's fixed per-step cost scales with the step time.
Also: time to first step from process start, and the tokenization time of `--tokenize-rows` rows,
first run vs cached second run. The load average is reported: on a shared machine, compare pairs.

    python -m benchmarks.overhead [--runs 5] [--steps 600] [--sizes tiny,small] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import REPO

# The same clock in both arms (one more callback in each): wall and process CPU time at the end of
# every step, written to $BENCH_CLOCK when training ends. CPU seconds per step count every thread
# of the process (orch's writer threads too) and hold up better than wall time on a busy machine.
CLOCK = r"""
import json as _json, os as _os, time as _time
import pytorch_lightning as _pl

class Clock(_pl.Callback):
    def __init__(self):
        self.marks = []
    def on_train_batch_end(self, trainer, *args):
        self.marks.append((trainer.global_step, _time.time(), _time.perf_counter(), _time.process_time()))
    def on_train_end(self, trainer, *args):
        marks = [m for m in self.marks if m[0] >= 1]
        first, last = marks[0], marks[-1]
        with open(_os.environ["BENCH_CLOCK"], "w") as fh:
            _json.dump({"first_step_at": first[1], "steps": last[0] - first[0], "wall_s": last[2] - first[2],
                        "cpu_s": last[3] - first[3]}, fh)
"""

PLAIN = (
    CLOCK
    + r"""
import json, sys, time
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

pl.seed_everything(42)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock()], gradient_clip_val=1.0)
trainer.fit(Plain(), DataLoader(ds, batch_size=batch, shuffle=True, collate_fn=collate))
"""
)

# `python -m training.run RUN_DIR` with the clock added to the runner's own callbacks
RUNNER = (
    CLOCK
    + r"""
import sys
import training.builtin.job as job

_build = job.build_callbacks

def build_callbacks(*args, **kwargs):
    orch, early, best, callbacks = _build(*args, **kwargs)
    return orch, early, best, callbacks + [Clock()]

job.build_callbacks = build_callbacks
from training.run import cli

sys.exit(cli())
"""
)


SIZES = {  # name -> (hidden, layers, heads, steps as a share of --steps)
    "tiny": (64, 2, 2, 1.0),
    "small": (256, 4, 4, 0.4),
}
GOAL_RATIO = 0.98


def setup(folder: Path, rows: int, sizes: list[str]) -> tuple[dict[str, Path], Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    data = write_jsonl(folder / "train.jsonl", sentiment_rows(rows, seed=5))
    texts = [r["text"] for r in sentiment_rows(2000, seed=1)]
    models = {}
    for name in sizes:
        hidden, layers, heads, _ = SIZES[name]
        models[name] = build_tiny_bert(folder / f"bert-{name}", texts, hidden=hidden, layers=layers, heads=heads)
    return models, data


def env_for(cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(cache),
        "PYTHONPATH": str(REPO),
        "TOKENIZERS_PARALLELISM": "false",
    }


def _timed(cmd: list[str], env: dict[str, str], clock: Path) -> dict:
    start = time.time()
    subprocess.run(
        cmd,
        cwd=str(REPO),
        env={**env, "BENCH_CLOCK": str(clock)},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    t = json.loads(clock.read_text())
    return {
        "first_step_s": t["first_step_at"] - start,
        "steps_per_s": t["steps"] / t["wall_s"],
        "cpu_ms_per_step": t["cpu_s"] / t["steps"] * 1000,
    }


def run_plain(model: Path, data: Path, steps: int, batch: int, cache: Path, workdir: Path) -> dict:
    clock = Path(tempfile.mktemp(dir=workdir, prefix="clock-"))
    return _timed([sys.executable, "-c", PLAIN, str(model), str(data), str(steps), str(batch)], env_for(cache), clock)


def run_runner(model: Path, data: Path, steps: int, batch: int, cache: Path, workdir: Path) -> dict:
    import tomli_w

    run = Path(tempfile.mkdtemp(dir=workdir, prefix="run-"))
    spec = {
        "name": "bench",
        "gpus": 0,
        "model": {"name_or_path": str(model), "num_labels": 2},
        "data": {"train": str(data), "max_length": 64, "num_workers": 0},
        "train": {
            "max_steps": steps,
            "max_epochs": 1000,
            "batch_size": batch,
            "precision": "32",
            "learning_rate": 1e-3,
        },
        "checkpoint": {"every_minutes": 10.0, "keep": 1},
    }
    (run / "job.toml").write_bytes(tomli_w.dumps(spec).encode())
    try:
        return _timed(
            [sys.executable, "-c", RUNNER, str(run)], {**env_for(cache), "ORCH_RUN_DIR": str(run)}, run / "clock.json"
        )
    finally:
        shutil.rmtree(run, ignore_errors=True)


def tokenization(rows: int, workdir: Path, model: Path) -> dict:
    from training.toy import sentiment_rows, write_jsonl

    data = write_jsonl(workdir / "big.jsonl", sentiment_rows(rows, seed=9))
    cache = workdir / "tok-cache"
    code = (
        "import sys, json; from transformers import AutoTokenizer; from training.builtin.data import TextClassificationData as D;"
        f"d = D(tokenizer=AutoTokenizer.from_pretrained({str(model)!r}), train={str(data)!r}, validation=None);"
        "d.prepare(); print(json.dumps(d.tokenize_seconds))"
    )
    times = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env_for(cache), cwd=str(REPO), check=True
        )
        times.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"rows": rows, "first_s": times[0], "cached_s": times[1]}


def spread(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": values[0], "max": values[-1], "q1": q[0], "q3": q[2]}


def measure_size(name: str, model: Path, data: Path, args: argparse.Namespace, cache: Path, work: Path, log) -> dict:
    steps = max(20, round(args.steps * SIZES[name][3]))
    run_plain(model, data, 5, args.batch, cache, work)  # warm-up: tokenization cache, page cache, imports
    run_runner(model, data, 5, args.batch, cache, work)
    pairs = []
    for i in range(args.runs):
        order = ("plain", "runner") if i % 2 == 0 else ("runner", "plain")
        got = {}
        for arm in order:
            got[arm] = (
                run_plain(model, data, steps, args.batch, cache, work)
                if arm == "plain"
                else run_runner(model, data, steps, args.batch, cache, work)
            )
        p, r = got["plain"]["steps_per_s"], got["runner"]["steps_per_s"]
        pair = {
            "order": "/".join(order),
            "plain": got["plain"],
            "runner": got["runner"],
            "ratio": r / p,
            "cpu_ratio": got["plain"]["cpu_ms_per_step"] / got["runner"]["cpu_ms_per_step"],
            "gap_ms_per_step": (1 / r - 1 / p) * 1000,
            "load_avg_1m": os.getloadavg()[0],
        }
        pairs.append(pair)
        log(
            f"{name} pair {i + 1} ({pair['order']}): plain {p:.1f} steps/s, runner {r:.1f} steps/s, "
            f"ratio {pair['ratio']:.3f} (CPU time {pair['cpu_ratio']:.3f}), gap {pair['gap_ms_per_step']:+.2f} ms/step, load {pair['load_avg_1m']:.1f}"
        )
    hidden, layers, heads, _ = SIZES[name]
    return {
        "model": f"BERT {layers} layers x {hidden} hidden, {heads} heads",
        "steps": steps,
        "batch": args.batch,
        "pairs_n": len(pairs),
        "ratio": spread([x["ratio"] for x in pairs]),
        "cpu_ratio": spread([x["cpu_ratio"] for x in pairs]),
        "plain_cpu_ms_per_step": spread([x["plain"]["cpu_ms_per_step"] for x in pairs]),
        "runner_cpu_ms_per_step": spread([x["runner"]["cpu_ms_per_step"] for x in pairs]),
        "gap_ms_per_step": spread([x["gap_ms_per_step"] for x in pairs]),
        "plain_step_ms": spread([1000 / x["plain"]["steps_per_s"] for x in pairs]),
        "runner_step_ms": spread([1000 / x["runner"]["steps_per_s"] for x in pairs]),
        "plain_first_step_s": spread([x["plain"]["first_step_s"] for x in pairs]),
        "runner_first_step_s": spread([x["runner"]["first_step_s"] for x in pairs]),
        "pairs": pairs,
    }


def render(rep: dict) -> None:
    def fmt(s: dict, digits: int = 3) -> str:
        return (
            f"median {s['median']:.{digits}f} (quartiles {s['q1']:.{digits}f}-{s['q3']:.{digits}f}, "
            f"range {s['min']:.{digits}f}-{s['max']:.{digits}f})"
        )

    c = rep["conditions"]
    print(
        f"CPU, {c['cpus']} cores, OMP_NUM_THREADS={c['omp_num_threads']}, load average {c['load_before']:.1f} before / "
        f"{c['load_after']:.1f} after; arms alternated, one warm-up run of each per size"
    )
    for name, s in rep["sizes"].items():
        print(f"{name}: {s['model']}, {s['steps']} steps x batch {s['batch']}, {s['pairs_n']} pairs")
        print(
            "  | pair | order | plain steps/s | runner steps/s | runner / plain | gap ms/step | CPU ms/step plain / runner | CPU ratio | load |"
        )
        print("  |---|---|---|---|---|---|---|---|---|")
        for i, x in enumerate(s["pairs"], 1):
            print(
                f"  | {i} | {x['order']} | {x['plain']['steps_per_s']:.1f} | {x['runner']['steps_per_s']:.1f} | "
                f"{x['ratio']:.3f} | {x['gap_ms_per_step']:+.2f} | {x['plain']['cpu_ms_per_step']:.2f} / "
                f"{x['runner']['cpu_ms_per_step']:.2f} | {x['cpu_ratio']:.3f} | {x['load_avg_1m']:.1f} |"
            )
        print(f"  ratio runner/plain per pair: {fmt(s['ratio'])}  (goal >= {GOAL_RATIO})")
        print(f"  CPU-time ratio plain/runner per pair: {fmt(s['cpu_ratio'])}")
        print(f"  step ms: plain {fmt(s['plain_step_ms'], 2)}; runner {fmt(s['runner_step_ms'], 2)}")
        print(f"  gap ms per step: {fmt(s['gap_ms_per_step'], 2)}")
        print(f"  first step s: plain {fmt(s['plain_first_step_s'], 1)}; runner {fmt(s['runner_first_step_s'], 1)}")
    if rep.get("tokenization"):
        t = rep["tokenization"]
        print(f"tokenization of {t['rows']} rows: first {t['first_s']:.2f} s, cached {t['cached_s']:.3f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="pairs per model size (at least 5)")
    parser.add_argument(
        "--steps",
        type=int,
        default=600,
        help="steps of the tiny model (the small one runs 40%%); 150 steps (2 s) are too short to resolve 2 %% on a 2-core VM",
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sizes", default="tiny,small", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--tokenize-rows", type=int, default=100_000, help="0 skips the tokenization figure")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (progress goes to stderr)")
    args = parser.parse_args()
    sizes = [x.strip() for x in args.sizes.split(",") if x.strip()]
    unknown = [x for x in sizes if x not in SIZES]
    if unknown or not sizes:
        parser.error(f"--sizes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SIZES)}")
    if args.runs < 5:
        parser.error("--runs must be at least 5 (pairs per size)")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    conditions = {
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        work = Path(tmp)
        models, data = setup(work, rows=args.steps * args.batch, sizes=sizes)
        cache = work / "cache"
        report = {
            "conditions": conditions,
            "goal_ratio": GOAL_RATIO,
            "sizes": {name: measure_size(name, models[name], data, args, cache, work, log) for name in sizes},
        }
        conditions["load_after"] = os.getloadavg()[0]
        if args.tokenize_rows:
            report["tokenization"] = tokenization(args.tokenize_rows, work, models[sizes[0]])
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    first = report["sizes"][sizes[0]]
    return 0 if first["ratio"]["median"] >= GOAL_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
