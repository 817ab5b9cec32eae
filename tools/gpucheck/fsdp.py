"""(g) strategy = "fsdp" on the GPU: a built-in job sharded with FSDP2 over the GPUs (up to two;
NCCL), bf16 parameters with fp32 gradient reduction, its periodic checkpoints in the background
(DCP's async save), SIGTERM at a random step -> a sharded notice checkpoint -> exit 75, the
resumed attempt finishing with weights compared to an uninterrupted run; then
benchmarks/fsdp.py's save, load and stall ratios on the same GPUs. The CPU rehearsal skips it:
tests/training/test_fsdp.py runs the same paths on two CPU ranks (gloo)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

from .assets import write_rows
from .common import rows, weights
from .frame import Ctx, Section, Skip, free_run, read_json, wait_for
from orchestrator.contract import EX_CHECKPOINTED

REPO = Path(__file__).resolve().parents[2]


def _fsdp_job(ctx: Ctx, run: Path, *, model: Path, data: Path, gpus: int, steps: int) -> None:
    import tomli_w
    import tomllib

    s = ctx.sizes
    ctx.write_job(
        run,
        model=model,
        train=data,
        seq=s.seq,
        batch=s.resume_batch,
        precision="bf16-mixed",
        lr=s.lr,
        steps=steps,
        deterministic=True,
        every_n_steps=max(2, steps // 4),
    )
    spec = tomllib.loads((run / "job.toml").read_text())
    spec["gpus"] = gpus
    spec["train"]["strategy"] = "fsdp"
    (run / "job.toml").write_text(tomli_w.dumps(spec))


def fsdp(ctx: Ctx, sec: Section) -> None:
    import torch

    if not ctx.gpu or not torch.cuda.is_available():
        raise Skip("needs a GPU: the CPU path (gloo, two ranks) is tests/training/test_fsdp.py")
    gpus = min(2, torch.cuda.device_count())
    s = ctx.sizes
    model = ctx.model(s.model)
    steps = s.resume_steps
    data = ctx.work / "data" / "fsdp.jsonl"
    write_rows(data, rows(ctx, steps * s.resume_batch * gpus, seed=9))
    full, inter = ctx.work / "g-full", ctx.work / "g-int"
    for run in (full, inter):
        _fsdp_job(ctx, run, model=model, data=data, gpus=gpus, steps=steps)
    straight = ctx.start_job(full)
    interrupted = ctx.start_job(inter, ORCH_PROGRESS_EVERY_S="0.000001", ORCH_FAULT_SLOW_STEP_S="0.02")
    target = random.Random().randint(max(2, steps // 4), steps * 3 // 4)
    wait_for(
        lambda: int((read_json(inter / "progress.json") or {}).get("step") or 0) >= target or not interrupted.alive(),
        ctx.timeout(240),
    )
    interrupted.signal(signal.SIGTERM)
    code = interrupted.wait(ctx.timeout(120))
    notices = sorted(p for p in (inter / "checkpoints").glob("notice-step-*.ckpt") if p.is_dir())
    sec.check(
        f"SIGTERM at step >= {target} -> exit 75 with a sharded notice folder",
        code == EX_CHECKPOINTED and bool(notices),
        f"exit {code}: {interrupted.tail(6)}",
    )
    sec.check("bf16 parameters under FSDP on NCCL", "fsdp: " in interrupted.output(), interrupted.tail(6))
    code = straight.wait(ctx.timeout(300))
    sec.check("the uninterrupted fsdp run exits 0", code == 0, f"exit {code}: {straight.tail()}")
    if notices:
        resumed = ctx.start_job(inter, attempt=2)
        code = resumed.wait(ctx.timeout(300))
        sec.check(
            "the resumed attempt exits 0 from the notice folder",
            code == 0 and f"resuming from {notices[-1].name}" in resumed.output(),
            f"exit {code}: {resumed.tail()}",
        )
    if (full / "model" / "model.safetensors").exists() and (inter / "model" / "model.safetensors").exists():
        a, b = weights(full), weights(inter)
        unequal = [k for k in a if not torch.equal(a[k], b[k])]
        worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
        sec.figures.update({"gpus": gpus, "tensors": len(a), "unequal_tensors": len(unequal), "max_abs_diff": worst})
        sec.check(
            "deterministic = true: torch.equal after the notice",
            not unequal,
            f"{len(unequal)} of {len(a)} differ, largest {worst:.3g}",
        )
    bench = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.fsdp",
            "--device",
            "cuda",
            "--ranks",
            str(gpus),
            "--rounds",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=ctx.timeout(240),
        cwd=str(REPO),
    )
    sec.check("benchmarks/fsdp.py ran", bench.returncode == 0, bench.stderr[-1500:])
    sec.figures["benchmark"] = bench.stdout.strip().splitlines()
    sec.headline = f"{gpus} GPU(s): notice at step {notices[-1].name if notices else '?'}; " + "; ".join(
        line.split(" (goal")[0] for line in bench.stdout.strip().splitlines()[1:]
    )
    for run in (full, inter):
        free_run(run)
