"""(a) the built-in runner in 16-mixed and bf16-mixed, and (b) its throughput against a plain
Lightning script on the same model, data, sizes and steps, timed by the same clock."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from .assets import loss_curve
from .common import finite_weights, lightning_precision, on_device, precision_ran_as, train_data
from .plain import main as plain_script
from .frame import Ctx, Section, free_run, read_json, run_here, tail


def precision_runs(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model, data = ctx.model(s.model), train_data(ctx)
    runs: dict[str, Any] = {}
    head = []
    folders = {p: ctx.work / f"a-{p}" for p in s.precisions}
    for precision, run in folders.items():
        ctx.write_job(
            run, model=model, train=data, seq=s.seq, batch=s.batch, precision=precision, lr=s.lr, steps=s.steps
        )
    # On the GPU one run at a time (each one's samples/s is the GPU's alone); on the CPU side by
    # side, one thread each (the rehearsal's rates are reported, not judged).
    done = ctx.run_jobs(
        {p: (run, ["--clock", str(run / "clock.json")]) for p, run in folders.items()},
        timeout=240 if ctx.gpu else 150,
        side_by_side=not ctx.gpu,
    )
    for precision, run in folders.items():
        code, proc = done[precision]
        log = proc.output()
        if not sec.check(f"{precision}: the runner exits 0", code == 0, f"exit {code}: {proc.tail()}"):
            continue
        on_device(ctx, sec, precision, proc)
        result = read_json(run / "result.json") or {}
        clock = read_json(run / "clock.json") or {}
        curve = loss_curve(run / "metrics.csv")
        losses = [v for _, v in curve]
        sec.check(f"{precision}: {s.steps} optimizer steps", result.get("steps") == s.steps, f"{result.get('steps')}")
        finite = bool(losses) and all(math.isfinite(v) for v in losses)
        sec.check(f"{precision}: no NaN/inf in the logged loss", finite, f"{len(losses)} values: {losses[:6]}")
        ok, detail = finite_weights(run)
        sec.check(f"{precision}: no NaN/inf in the trained weights", ok, detail)
        q = max(1, len(losses) // 4)
        first, last = (statistics.fmean(losses[:q]), statistics.fmean(losses[-q:])) if finite else (math.nan, math.nan)
        sec.check(
            f"{precision}: the loss falls (last quarter < 0.9 x first quarter)",
            finite and last < 0.9 * first,
            f"{first:.4f} -> {last:.4f}",
        )
        ran_as = precision_ran_as(precision, log)
        amp = next(
            (
                line.strip()
                for line in log.splitlines()
                if "Automatic Mixed Precision" in line or "bfloat16 Automatic" in line
            ),
            None,
        )
        runs[precision] = {"run": str(run), "ran_as": ran_as, "samples_per_s": clock.get("samples_per_s")}
        sec.figures[precision] = {
            "ran_as": ran_as,
            "lightning_says": amp,
            "samples_per_s": clock.get("samples_per_s"),
            "steps_per_s": clock.get("steps_per_s"),
            "loss_first_quarter": first,
            "loss_last_quarter": last,
            "loss_curve": curve,
            "job_seconds": result.get("seconds"),
            "batch": s.batch,
            "seq": s.seq,
            "steps": s.steps,
        }
        if clock.get("samples_per_s"):
            head.append(
                f"{precision}{' (ran as 32)' if ran_as != precision else ''}: "
                f"{clock['samples_per_s']:.0f} samples/s, loss {first:.2f} -> {last:.2f}"
            )
        if precision != s.throughput_precision:
            free_run(run)
    ctx.shared["a_runs"] = runs
    sec.figures["model"] = f"BERT {s.model} (random init), {s.batch} x {s.seq} tokens, lr {s.lr}"
    sec.headline = "; ".join(head)


def throughput(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model, data = ctx.model(s.model), train_data(ctx)
    prior = (ctx.shared.get("a_runs") or {}).get(s.throughput_precision)
    ran_as = (
        prior["ran_as"]
        if prior
        else ("32" if not ctx.gpu and s.throughput_precision == "16-mixed" else s.throughput_precision)
    )
    runner: list[float] = []
    plain: list[float] = []
    order: list[str] = []
    if prior and prior.get("samples_per_s"):
        runner.append(prior["samples_per_s"])
        order.append("runner (section a's run)")
        free_run(Path(prior["run"]))
    arms = []
    for i in range(max(s.plain_runs, s.extra_runner_runs)):
        if i < s.plain_runs:
            arms.append("plain")
        if i < s.extra_runner_runs:
            arms.append("runner")
    if not runner:
        arms = ["runner"] + arms
    for n, arm in enumerate(arms):
        folder = ctx.work / f"b-{n}-{arm}"
        folder.mkdir(parents=True, exist_ok=True)
        clock = folder / "clock.json"
        if arm == "plain":
            args = {
                "model": str(model),
                "train": str(data),
                "steps": s.steps,
                "batch_size": s.batch,
                "max_length": s.seq,
                "learning_rate": s.lr,
                "seed": 7,
                "num_workers": s.workers,
                "precision": lightning_precision(ran_as),
                "accelerator": "gpu" if ctx.gpu else "cpu",
                "clock": str(clock),
            }
            (folder / "args.json").write_text(json.dumps(args))
            if ctx.gpu:
                proc = ctx.start(
                    [sys.executable, "-m", "tools.gpucheck.plain", str(folder / "args.json")],
                    ctx.env(),
                    folder / "plain.log",
                )
                code = proc.wait(ctx.timeout(240))
                said = proc.tail()
            else:
                # the baseline, not what is checked: in this process, which has its imports
                # already (deps.py), at one thread like the runner's processes
                code = run_here(lambda: plain_script(str(folder / "args.json")), folder / "plain.log", threads=1)
                said = tail(folder / "plain.log")
        else:
            ctx.write_job(
                folder,
                model=model,
                train=data,
                seq=s.seq,
                batch=s.batch,
                precision=s.throughput_precision,
                lr=s.lr,
                steps=s.steps,
            )
            code, proc = ctx.run_job(folder, timeout=240 if ctx.gpu else 150, wrap=["--clock", str(clock)])
            said = proc.tail()
        sec.require(f"{arm} run {n + 1}: exits 0", code == 0, f"exit {code}: {said}")
        rate = (read_json(clock) or {}).get("samples_per_s")
        sec.require(f"{arm} run {n + 1}: timed", bool(rate), "" if rate else "no clock.json")
        (plain if arm == "plain" else runner).append(rate)
        order.append(arm)
        free_run(folder)
    ratio = statistics.median(runner) / statistics.median(plain)
    sec.figures.update(
        {
            "precision": ran_as,
            "order": order,
            "runner_samples_per_s": runner,
            "plain_samples_per_s": plain,
            "ratio_runner_over_plain": ratio,
            "goal": s.goal_throughput,
            "steps": s.steps,
            "batch": s.batch,
            "seq": s.seq,
        }
    )
    sec.headline = (
        f"runner/plain = {ratio:.3f} (goal >= {s.goal_throughput}; medians of {len(runner)} and {len(plain)})"
    )
    if ctx.gpu:
        sec.check(f"runner/plain samples/s >= {s.goal_throughput}", ratio >= s.goal_throughput, f"{ratio:.3f}")
    else:
        sec.check("both arms trained and were timed", True)
        beside = "the runner's run went beside a's other precision, " if prior and prior.get("samples_per_s") else ""
        sec.notes.append(
            "CPU rehearsal: the ratio is reported, not judged (a tiny model on shared cores; "
            f"{beside}the plain baseline ran in the check's own process)."
        )
