"""(d) exact resume: SIGTERM at a random step, resume from the notice checkpoint, and compare the
final weights with an uninterrupted run, with `deterministic = true` (torch.equal) and without
(the largest difference). The four runs go side by side, and an interrupted one resumes as soon
as it has exited. The CPU rehearsal runs the deterministic
pair only: a job on one CPU thread is deterministic either way, so the second pair would cost three
more runner processes to show a difference of 0."""

from __future__ import annotations

import math
import random
import signal
from pathlib import Path
from typing import Any

from .common import on_device, rows, weights
from .assets import write_rows
from .frame import Ctx, Section, free_run, read_json, wait_for
from orchestrator.contract import EX_CHECKPOINTED, notice_name


def _progress_step(run: Path) -> int:
    p = read_json(run / "progress.json") or {}
    return int(p.get("step") or 0)


def resume(ctx: Ctx, sec: Section) -> None:
    import torch

    s = ctx.sizes
    model = ctx.model(s.model)
    data = ctx.work / "data" / "resume.jsonl"
    write_rows(data, rows(ctx, s.resume_steps * s.resume_batch, seed=5))
    steps = s.resume_steps
    rng = random.Random()
    plans = {}
    tags = ["det" if det else "nondet" for det in s.resume_arms]
    for det in s.resume_arms:
        tag = "det" if det else "nondet"
        for kind in ("full", "int"):
            run = ctx.work / f"d-{tag}-{kind}"
            ctx.write_job(
                run,
                model=model,
                train=data,
                seq=s.seq,
                batch=s.resume_batch,
                precision=s.resume_precision,
                lr=s.lr,
                steps=steps,
                deterministic=det,
                workers=min(2, s.workers),
            )
            plans[(tag, kind)] = run
    target = {tag: rng.randint(max(2, steps // 4), steps * 3 // 4) for tag in tags}
    # the four runs side by side (exactness does not depend on speed); the interrupted ones write
    # progress.json every step and sleep 20 ms a step so the SIGTERM lands mid-run
    procs = {}
    for (tag, kind), run in plans.items():
        extra = {}
        if kind == "int":
            extra.update(ORCH_PROGRESS_EVERY_S="0.000001", ORCH_FAULT_SLOW_STEP_S="0.02")
        procs[(tag, kind)] = ctx.start_job(run, attempt=1, **extra)
    notice_steps = {}
    pending = set(tags)

    def signal_due() -> bool:  # both interrupted runs at once: each gets SIGTERM when it reaches its step
        for tag in list(pending):
            run, proc = plans[(tag, "int")], procs[(tag, "int")]
            if not proc.alive():
                pending.discard(tag)
            elif _progress_step(run) >= target[tag]:
                proc.signal(signal.SIGTERM)
                pending.discard(tag)
        return not pending

    wait_for(signal_due, ctx.timeout(240))
    resumed = {}
    for tag in tags:
        run, proc = plans[(tag, "int")], procs[(tag, "int")]
        code = proc.wait(ctx.timeout(120))
        notices = sorted((run / "checkpoints").glob("notice-step-*.ckpt"))
        notice = int(notices[-1].stem.rsplit("-", 1)[1]) if notices else None
        notice_steps[tag] = notice
        sec.check(
            f"{tag}: SIGTERM at step >= {target[tag]} -> exit 75 with a notice checkpoint",
            code == EX_CHECKPOINTED and notice is not None and 0 < notice < steps,
            f"exit {code}, notice step {notice}: " + proc.tail(6),
        )
        if notice is not None:  # resumed at once, beside the uninterrupted runs still going
            resumed[tag] = ctx.start_job(run, attempt=2)
    for (tag, kind), proc in procs.items():
        if kind == "full":
            code = proc.wait(ctx.timeout(300))
            sec.check(f"{tag}: the uninterrupted run exits 0", code == 0, f"exit {code}: {proc.tail()}")
    for tag, proc in resumed.items():
        code = proc.wait(ctx.timeout(300))
        ok = sec.check(f"{tag}: the resumed attempt exits 0", code == 0, f"exit {code}: {proc.tail()}")
        if ok:
            sec.check(
                f"{tag}: resumed from the notice checkpoint",
                f"resuming from {notice_name(notice_steps[tag])}" in proc.output(),
            )
            on_device(ctx, sec, f"{tag} resumed", proc)
    figures: dict[str, Any] = {
        "steps": steps,
        "batch": s.resume_batch,
        "precision": s.resume_precision,
        "sigterm_after_step": target,
        "notice_step": notice_steps,
    }
    for tag in tags:
        full, inter = plans[(tag, "full")], plans[(tag, "int")]
        if not ((full / "model" / "model.safetensors").exists() and (inter / "model" / "model.safetensors").exists()):
            continue
        steps_done = [(read_json(r / "result.json") or {}).get("steps") for r in (full, inter)]
        sec.check(f"{tag}: both runs did {steps} steps", steps_done == [steps, steps], str(steps_done))
        a, b = weights(full), weights(inter)
        sec.require(f"{tag}: same tensors", a.keys() == b.keys())
        diffs = {
            k: (a[k].double() - b[k].double()).abs().max().item()
            if a[k].is_floating_point()
            else float(not torch.equal(a[k], b[k]))
            for k in a
        }
        unequal = [k for k in a if not torch.equal(a[k], b[k])]
        worst = max(diffs, key=diffs.get)
        figures[tag] = {
            "tensors": len(a),
            "unequal_tensors": len(unequal),
            "max_abs_diff": diffs[worst],
            "worst_tensor": worst if diffs[worst] else None,
        }
        if tag == "det":
            sec.check(
                "deterministic = true: torch.equal on every weight, interrupted vs uninterrupted",
                not unequal,
                f"{len(unequal)} of {len(a)} differ, largest {diffs[worst]:.3g} in {worst}",
            )
        else:
            sec.check("deterministic = false: the difference is finite", math.isfinite(diffs[worst]), f"{diffs[worst]}")
    sec.figures.update(figures)
    det, nondet = figures.get("det") or {}, figures.get("nondet") or {}
    if det:
        without = (
            f"without: max abs diff {nondet.get('max_abs_diff', math.nan):.3g}"
            if "nondet" in tags
            else "without: not run on the CPU"
        )
        sec.headline = (
            f"deterministic: {'bit-exact' if not det['unequal_tensors'] else 'DIFFERS'} after SIGTERM at "
            f"step {notice_steps.get('det')}; {without}"
        )
    if "nondet" not in tags:
        sec.notes.append(
            "CPU rehearsal: the deterministic pair only (on one CPU thread a job is deterministic either way)."
        )
    for run in plans.values():
        free_run(run)
