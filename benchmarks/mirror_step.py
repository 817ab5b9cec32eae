"""benchmarks/mirror.py's two arms on the training step itself: how long a periodic save holds
the step (the background snapshot vs a synchronous save) and a job's steps/s with the mirror on
vs off. Run through `python -m benchmarks.mirror --blocking | --throughput`."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.contract import periodic_name


def blocking(ckpt: Path, reps: int) -> None:
    import torch

    from training.resume.checkpoints import AtomicCheckpointIO
    from training.resume.snapshot import BackgroundCheckpointIO

    state = torch.load(ckpt, map_location="cpu", weights_only=True)  # the live state of a training job
    out = Path(tempfile.mkdtemp(prefix="orch-bench-blocking-"))
    sync_io, bg_io = AtomicCheckpointIO(keep=1), BackgroundCheckpointIO(keep=1)
    sync_s, bg_s, bg_write_s = [], [], []
    for rep in range(reps + 1):  # the first of each is a warm-up
        for arm in ("sync", "bg") if rep % 2 == 0 else ("bg", "sync"):
            path = out / arm / periodic_name(rep + 1)
            t = time.perf_counter()
            if arm == "sync":
                sync_io.save_checkpoint(state, path)
                took = time.perf_counter() - t
            else:
                bg_io.save_checkpoint(state, path)
                took = time.perf_counter() - t
                t2 = time.perf_counter()
                bg_io.wait()  # not blocking in training: the next interval; waited here so arms do not overlap
                took_write = time.perf_counter() - t2
            if rep:
                (sync_s if arm == "sync" else bg_s).append(took)
                if arm == "bg":
                    bg_write_s.append(took_write)
            print(f"rep {rep} {arm}: blocked {took:.2f} s", flush=True)
    ratio = statistics.median(bg_s) / statistics.median(sync_s)
    print(
        json.dumps(
            {
                "checkpoint_gb": round(ckpt.stat().st_size / 1e9, 3),
                "sync_save_s": [round(x, 2) for x in sync_s],
                "background_blocked_s": [round(x, 3) for x in bg_s],
                "background_write_after_s": [round(x, 2) for x in bg_write_s],
                "blocking_ratio_background_over_sync": round(ratio, 3),
            },
            indent=1,
        )
    )


def throughput(reps: int, steps: int) -> None:
    import tomli_w

    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    root = Path(tempfile.mkdtemp(prefix="orch-bench-throughput-"))
    texts = [r["text"] for r in sentiment_rows(2000, seed=1)]
    model = build_tiny_bert(root / "model", texts, hidden=256, layers=4, heads=4, vocab_size=400, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(steps * 16, seed=11))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def run(arm: str, i: int) -> float:
        home = root / f"{arm}-{i}"
        home.mkdir()
        cfg = "[daemon]\ngpus = []\ntick_seconds = 0.5\n"
        if arm == "mirror":
            cfg += f'[storage]\nurl = "file://{root}/store-{i}"\n'
        (home / "config.toml").write_text(cfg)
        spec = {
            "name": "tp",
            "gpus": 0,
            "model": {"name_or_path": str(model), "num_labels": 2},
            "data": {"train": str(train), "max_length": 32, "num_workers": 0},
            "train": {"max_epochs": 1, "batch_size": 16, "precision": "32", "seed": 7},
            "checkpoint": {"every_n_steps": 20, "keep": 3},
            "env": {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(root / "hf"), "OMP_NUM_THREADS": "1"},
        }
        job = home / "job.toml"
        job.write_bytes(tomli_w.dumps(spec).encode())
        orch = [sys.executable, "-m", "orchestrator.cli", "--home", str(home)]
        daemon = subprocess.Popen(
            orch + ["daemon", "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(2)
            subprocess.run(orch + ["submit", str(job)], env=env, check=True, capture_output=True)
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                shown = subprocess.run(orch + ["show", "1", "--json"], env=env, capture_output=True, text=True)
                state = json.loads(shown.stdout)["state"] if shown.returncode == 0 else ""
                if state in ("succeeded", "failed"):
                    break
                time.sleep(2)
            assert state == "succeeded", state
            progress = json.loads((home / "runs" / "1" / "progress.json").read_text())
            rate = progress["step"] / (progress["updated_at"] - progress["first_step_at"])
            return rate
        finally:
            daemon.terminate()
            daemon.wait(60)

    off, on = [], []
    for rep in range(reps):
        for arm in ("off", "mirror") if rep % 2 == 0 else ("mirror", "off"):
            rate = run(arm, rep)
            (off if arm == "off" else on).append(rate)
            print(f"rep {rep} {arm}: {rate:.2f} steps/s", flush=True)
    print(
        json.dumps(
            {
                "steps": steps,
                "off_steps_per_s": [round(x, 3) for x in off],
                "mirror_steps_per_s": [round(x, 3) for x in on],
                "throughput_ratio_on_over_off": round(statistics.median(on) / statistics.median(off), 3),
            },
            indent=1,
        )
    )
