"""(c) a real CUDA out-of-memory (a batch sized from a memory probe to need 1.4x the card): exit 76,
batch.json halves the micro-batch and doubles the accumulation, the next attempt resumes from the
last periodic checkpoint and finishes, and a trace shows every sample trained exactly once. On the
CPU the out-of-memory comes from the runner's fault seam, and the report says so."""

from __future__ import annotations

import collections
import json
import math
import sys
import time
from pathlib import Path

from .assets import long_rows, short_rows, write_rows
from .common import on_device
from .frame import Ctx, Section, free_run, read_json
from orchestrator.contract import EX_OOM


def _trace(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def oom(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model = ctx.model(s.model)
    run = ctx.work / "c-oom"
    run.mkdir(parents=True, exist_ok=True)
    fault: dict[str, str] = {}
    if ctx.gpu:
        probe = run / "probe.json"
        proc = ctx.start(
            [sys.executable, "-m", "tools.gpucheck.probe", str(model), str(s.oom_seq), str(probe)],
            ctx.env(),
            run / "probe.log",
        )
        code = proc.wait(ctx.timeout(120))
        sec.require("memory probe ran", code == 0 and probe.exists(), f"exit {code}: {proc.tail()}")
        p = read_json(probe) or {}
        per_sample, base, total = p["per_sample_bytes"], p["base_bytes"], p["total_bytes"]
        sec.require("memory probe: a sample costs memory", per_sample > 0, str(p))
        # 1.4x the card at the full batch, 0.7x at half: the first overflows, the second fits.
        batch = int(math.ceil(1.4 * (total - base) / per_sample))
        batch += batch % 2
        sec.figures.update(
            {
                "per_sample_mib": per_sample / 2**20,
                "card_gib": total / 2**30,
                "predicted_use_full_batch": (base + batch * per_sample) / total,
                "predicted_use_half_batch": (base + batch // 2 * per_sample) / total,
            }
        )
        precision = "bf16-mixed"
    else:
        batch = s.oom_cpu_batch
        fault = {"ORCH_FAULT_OOM_ABOVE_BATCH": str(batch // 2), "ORCH_FAULT_OOM_AT_STEP": "2"}
        precision = "32"
        sec.notes.append(
            "SIMULATED: no GPU, so the out-of-memory is raised by the runner's fault seam "
            f"(ORCH_FAULT_OOM_ABOVE_BATCH={batch // 2}, a real torch.cuda.OutOfMemoryError raised "
            "in training_step); the exit code, batch.json, resume and sample accounting are real."
        )
    sec.figures["simulated"] = not ctx.gpu
    # 2 steps of short rows (checkpoint at step 2), then 2 steps' worth of long rows that overflow.
    data = write_rows(
        run / "oom.jsonl",
        short_rows(2 * batch, seed=21)
        + long_rows(2 * batch, min_words=s.oom_seq + 8, seed=22, start=2 * batch, unique=True),
    )
    ctx.write_job(
        run,
        model=model,
        train=data,
        seq=s.oom_seq,
        batch=batch,
        precision=precision,
        lr=s.lr,
        epochs=1,
        every_n_steps=2,
        keep=2,
        shuffle=False,
    )
    trace1, trace2 = run / "trace-1.jsonl", run / "trace-2.jsonl"
    t0 = time.monotonic()
    code, proc = ctx.run_job(run, attempt=1, timeout=240, ORCH_TRACE_SAMPLES=str(trace1), **fault)
    oom_line = next((line.strip() for line in proc.output().splitlines() if "out of GPU memory at step" in line), "")
    sec.require("attempt 1 exits 76 (out of GPU memory)", code == EX_OOM, f"exit {code}: {proc.tail()}")
    sizes = read_json(run / "batch.json") or {}
    history = sizes.get("history") or [{}]
    error = str(history[-1].get("error") or "")
    sec.figures.update(
        {
            "batch": batch,
            "seq": s.oom_seq,
            "attempt_1_s": time.monotonic() - t0,
            "runner_says": oom_line,
            "error": error,
        }
    )
    if ctx.gpu:
        sec.check(
            "the out-of-memory is real (raised by CUDA, not the fault seam)",
            "injected by" not in error and "out of memory" in error.lower(),
            error,
        )
    else:
        sec.check("the simulated out-of-memory was raised by the fault seam", "injected by" in error, error)
    half = batch // 2
    sec.check(
        f"batch.json: the next attempt runs batch {half} x accumulate 2",
        (sizes.get("batch_size"), sizes.get("accumulate_grad_batches")) == (half, 2),
        str(sizes)[:300],
    )
    sec.check(
        "batch.json: the OOM was at step 2 (after the step-2 checkpoint)",
        history[-1].get("step") == 2,
        str(history[-1])[:300],
    )
    sec.check("no result.json after the OOM", not (run / "result.json").exists())
    t1 = time.monotonic()
    code, proc = ctx.run_job(run, attempt=2, timeout=300, ORCH_TRACE_SAMPLES=str(trace2), **fault)
    sec.figures["attempt_2_s"] = time.monotonic() - t1
    sec.require("attempt 2 finishes (exit 0)", code == 0, f"exit {code}: {proc.tail()}")
    on_device(ctx, sec, "attempt 2", proc)
    sec.check("attempt 2 resumed from the step-2 checkpoint", "resuming from step-00000002.ckpt" in proc.output())
    result = read_json(run / "result.json") or {}
    sec.check(
        "same optimizer steps as planned (4: the effective batch did not change)",
        result.get("steps") == 4,
        str(result.get("steps")),
    )
    sec.check(
        f"result.json: batch {half} x accumulate 2",
        (result.get("batch_size"), result.get("accumulate_grad_batches")) == (half, 2),
    )
    first, second = _trace(trace1), _trace(trace2)
    sec.check(
        f"attempt 2's micro-batches hold {half} rows", bool(second) and max(len(x["rows"]) for x in second) == half
    )
    # what counts: attempt 1 up to the checkpoint attempt 2 resumed from, then all of attempt 2
    kept = [r for line in first if line["step"] < 2 for r in line["rows"]]
    kept += [r for line in second for r in line["rows"]]
    counts = collections.Counter(kept)
    repeated = sum(1 for c in counts.values() if c > 1)
    sec.check(
        f"every sample trained exactly once ({4 * batch} rows)",
        len(kept) == 4 * batch and len(counts) == 4 * batch,
        f"{len(kept)} trained, {len(counts)} distinct, {repeated} repeated",
    )
    sec.figures["samples_trained"] = len(kept)
    kind = "simulated" if not ctx.gpu else "real CUDA"
    sec.headline = (
        f"{kind} OOM at batch {batch} -> exit 76 -> batch {half} x 2 finished, {len(counts)}/{4 * batch} samples once"
    )
    free_run(run)
