"""Helpers the sections share: the training rows, the runner's own words about precision and
device, and the weights a run exported."""

from __future__ import annotations

from pathlib import Path

from training.toy import sentiment_rows

from .assets import long_rows, write_rows
from .frame import Ctx, Proc, Section


def precision_ran_as(precision: str, log: str) -> str:
    return "32" if f'precision "{precision}" needs CUDA; running in "32"' in log else precision


def lightning_precision(p: str) -> str:
    return "32-true" if p == "32" else p


def on_device(ctx: Ctx, sec: Section, label: str, proc: Proc) -> None:
    if ctx.gpu:
        sec.check(
            f"{label}: trained on the GPU",
            "no CUDA GPU visible" not in proc.output(),
            "the runner said it ran on the CPU",
        )


def weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def finite_weights(run_dir: Path) -> tuple[bool, str]:
    import torch

    bad = [k for k, v in weights(run_dir).items() if v.is_floating_point() and not torch.isfinite(v).all()]
    return not bad, (f"{len(bad)} tensors hold NaN/inf, e.g. {bad[:3]}" if bad else "")


def rows(ctx: Ctx, n: int, seed: int) -> list[dict]:
    """Training rows: several toy sentences of one label, truncated to the full max_length (GPU), or
    one sentence each (CPU: a tiny model learns those within a few dozen steps)."""
    if ctx.sizes.row_words:
        return long_rows(n, min_words=ctx.sizes.row_words, seed=seed)
    return sentiment_rows(n, seed=seed)


def train_data(ctx: Ctx) -> Path:
    path = ctx.work / "data" / "train.jsonl"
    if not path.exists():
        write_rows(path, rows(ctx, ctx.sizes.steps * ctx.sizes.batch, seed=3))
    return path
