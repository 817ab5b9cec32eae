"""The six sections of the GPU check. Each gets the context and its Section record, runs real
processes (the built-in runner as orch starts it, a plain Lightning script, a real daemon), and
records checks (pass/fail) and figures. Sizes come from check.GPU or check.CPU."""

from __future__ import annotations

import collections
import json
import math
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

from training.toy import sentiment_rows

from .assets import long_rows, loss_curve, short_rows, write_rows
from .check import Ctx, Proc, Section, Skip, free_run, read_json, wait_for


def _ran_as(precision: str, log: str) -> str:
    return "32" if f'precision "{precision}" needs CUDA; running in "32"' in log else precision


def _lightning_precision(p: str) -> str:
    return "32-true" if p == "32" else p


def _on_device(ctx: Ctx, sec: Section, label: str, proc: Proc) -> None:
    if ctx.gpu:
        sec.check(f"{label}: trained on the GPU", "no CUDA GPU visible" not in proc.output(),
                  "the runner said it ran on the CPU")


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def _finite_weights(run_dir: Path) -> tuple[bool, str]:
    import torch

    bad = [k for k, v in _weights(run_dir).items() if v.is_floating_point() and not torch.isfinite(v).all()]
    return not bad, (f"{len(bad)} tensors hold NaN/inf, e.g. {bad[:3]}" if bad else "")


# -- (a) the built-in runner in 16-mixed and bf16-mixed ----------------------------------------------


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


def precision_runs(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model, data = ctx.model(s.model), train_data(ctx)
    runs: dict[str, Any] = {}
    head = []
    for precision in s.precisions:
        run = ctx.work / f"a-{precision}"
        ctx.write_job(run, model=model, train=data, seq=s.seq, batch=s.batch, precision=precision, lr=s.lr,
                      steps=s.steps)
        code, proc = ctx.run_job(run, timeout=240 if ctx.gpu else 150, wrap=["--clock", str(run / "clock.json")])
        log = proc.output()
        if not sec.check(f"{precision}: the runner exits 0", code == 0, f"exit {code}: {proc.tail()}"):
            continue
        _on_device(ctx, sec, precision, proc)
        result = read_json(run / "result.json") or {}
        clock = read_json(run / "clock.json") or {}
        curve = loss_curve(run / "metrics.csv")
        losses = [v for _, v in curve]
        sec.check(f"{precision}: {s.steps} optimizer steps", result.get("steps") == s.steps, f"{result.get('steps')}")
        finite = bool(losses) and all(math.isfinite(v) for v in losses)
        sec.check(f"{precision}: no NaN/inf in the logged loss", finite, f"{len(losses)} values: {losses[:6]}")
        ok, detail = _finite_weights(run)
        sec.check(f"{precision}: no NaN/inf in the trained weights", ok, detail)
        q = max(1, len(losses) // 4)
        first, last = (statistics.fmean(losses[:q]), statistics.fmean(losses[-q:])) if finite else (math.nan, math.nan)
        sec.check(f"{precision}: the loss falls (last quarter < 0.9 x first quarter)", finite and last < 0.9 * first,
                  f"{first:.4f} -> {last:.4f}")
        ran_as = _ran_as(precision, log)
        amp = next((line.strip() for line in log.splitlines() if "Automatic Mixed Precision" in line
                    or "bfloat16 Automatic" in line), None)
        runs[precision] = {"run": str(run), "ran_as": ran_as, "samples_per_s": clock.get("samples_per_s")}
        sec.figures[precision] = {
            "ran_as": ran_as, "lightning_says": amp, "samples_per_s": clock.get("samples_per_s"),
            "steps_per_s": clock.get("steps_per_s"), "loss_first_quarter": first, "loss_last_quarter": last,
            "loss_curve": curve, "job_seconds": result.get("seconds"), "batch": s.batch, "seq": s.seq,
            "steps": s.steps}
        if clock.get("samples_per_s"):
            head.append(f"{precision}{' (ran as 32)' if ran_as != precision else ''}: "
                        f"{clock['samples_per_s']:.0f} samples/s, loss {first:.2f} -> {last:.2f}")
        if precision != s.throughput_precision:
            free_run(run)
    ctx.shared["a_runs"] = runs
    sec.figures["model"] = f"BERT {s.model} (random init), {s.batch} x {s.seq} tokens, lr {s.lr}"
    sec.headline = "; ".join(head)


# -- (b) runner vs plain Lightning ----------------------------------------------------------------


def throughput(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model, data = ctx.model(s.model), train_data(ctx)
    prior = (ctx.shared.get("a_runs") or {}).get(s.throughput_precision)
    ran_as = prior["ran_as"] if prior else ("32" if not ctx.gpu and s.throughput_precision == "16-mixed"
                                            else s.throughput_precision)
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
            args = {"model": str(model), "train": str(data), "steps": s.steps, "batch_size": s.batch,
                    "max_length": s.seq, "learning_rate": s.lr, "seed": 7, "num_workers": s.workers,
                    "precision": _lightning_precision(ran_as), "accelerator": "gpu" if ctx.gpu else "cpu",
                    "clock": str(clock)}
            (folder / "args.json").write_text(json.dumps(args))
            proc = ctx.start([sys.executable, "-m", "training.gpucheck.plain", str(folder / "args.json")],
                             ctx.env(), folder / "plain.log")
            code = proc.wait(ctx.timeout(240 if ctx.gpu else 150))
        else:
            ctx.write_job(folder, model=model, train=data, seq=s.seq, batch=s.batch, precision=s.throughput_precision,
                          lr=s.lr, steps=s.steps)
            code, proc = ctx.run_job(folder, timeout=240 if ctx.gpu else 150, wrap=["--clock", str(clock)])
        sec.require(f"{arm} run {n + 1}: exits 0", code == 0, f"exit {code}: {proc.tail()}")
        rate = (read_json(clock) or {}).get("samples_per_s")
        sec.require(f"{arm} run {n + 1}: timed", bool(rate), "no clock.json")
        (plain if arm == "plain" else runner).append(rate)
        order.append(arm)
        free_run(folder)
    ratio = statistics.median(runner) / statistics.median(plain)
    sec.figures.update({"precision": ran_as, "order": order, "runner_samples_per_s": runner,
                        "plain_samples_per_s": plain, "ratio_runner_over_plain": ratio, "goal": s.goal_throughput,
                        "steps": s.steps, "batch": s.batch, "seq": s.seq})
    sec.headline = f"runner/plain = {ratio:.3f} (goal >= {s.goal_throughput}; medians of {len(runner)} and {len(plain)})"
    if ctx.gpu:
        sec.check(f"runner/plain samples/s >= {s.goal_throughput}", ratio >= s.goal_throughput, f"{ratio:.3f}")
    else:
        sec.check("both arms trained and were timed", True)
        sec.notes.append("CPU rehearsal: the ratio is reported, not judged (a tiny model on shared cores).")


# -- (c) out of GPU memory --------------------------------------------------------------------------


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
        proc = ctx.start([sys.executable, "-m", "training.gpucheck.probe", str(model), str(s.oom_seq), str(probe)],
                         ctx.env(), run / "probe.log")
        code = proc.wait(ctx.timeout(120))
        sec.require("memory probe ran", code == 0 and probe.exists(), f"exit {code}: {proc.tail()}")
        p = read_json(probe) or {}
        per_sample, base, total = p["per_sample_bytes"], p["base_bytes"], p["total_bytes"]
        sec.require("memory probe: a sample costs memory", per_sample > 0, str(p))
        # 1.4x the card at the full batch, 0.7x at half: the first overflows, the second fits.
        batch = int(math.ceil(1.4 * (total - base) / per_sample))
        batch += batch % 2
        sec.figures.update({"per_sample_mib": per_sample / 2**20, "card_gib": total / 2**30,
                            "predicted_use_full_batch": (base + batch * per_sample) / total,
                            "predicted_use_half_batch": (base + batch // 2 * per_sample) / total})
        precision = "bf16-mixed"
    else:
        batch = s.oom_cpu_batch
        fault = {"ORCH_FAULT_OOM_ABOVE_BATCH": str(batch // 2), "ORCH_FAULT_OOM_AT_STEP": "2"}
        precision = "32"
        sec.notes.append("SIMULATED: no GPU, so the out-of-memory is raised by the runner's fault seam "
                         f"(ORCH_FAULT_OOM_ABOVE_BATCH={batch // 2}, a real torch.cuda.OutOfMemoryError raised "
                         "in training_step); the exit code, batch.json, resume and sample accounting are real.")
    sec.figures["simulated"] = not ctx.gpu
    # 2 steps of short rows (checkpoint at step 2), then 2 steps' worth of long rows that overflow.
    data = write_rows(run / "oom.jsonl", short_rows(2 * batch, seed=21) + long_rows(
        2 * batch, min_words=s.oom_seq + 8, seed=22, start=2 * batch, unique=True))
    ctx.write_job(run, model=model, train=data, seq=s.oom_seq, batch=batch, precision=precision, lr=s.lr,
                  epochs=1, every_n_steps=2, keep=2, shuffle=False)
    trace1, trace2 = run / "trace-1.jsonl", run / "trace-2.jsonl"
    t0 = time.monotonic()
    code, proc = ctx.run_job(run, attempt=1, timeout=240, ORCH_TRACE_SAMPLES=str(trace1), **fault)
    oom_line = next((line.strip() for line in proc.output().splitlines() if "out of GPU memory at step" in line), "")
    sec.require("attempt 1 exits 76 (out of GPU memory)", code == 76, f"exit {code}: {proc.tail()}")
    sizes = read_json(run / "batch.json") or {}
    history = sizes.get("history") or [{}]
    error = str(history[-1].get("error") or "")
    sec.figures.update({"batch": batch, "seq": s.oom_seq, "attempt_1_s": time.monotonic() - t0,
                        "runner_says": oom_line, "error": error})
    if ctx.gpu:
        sec.check("the out-of-memory is real (raised by CUDA, not the fault seam)",
                  "injected by" not in error and "out of memory" in error.lower(), error)
    else:
        sec.check("the simulated out-of-memory was raised by the fault seam", "injected by" in error, error)
    half = batch // 2
    sec.check(f"batch.json: the next attempt runs batch {half} x accumulate 2",
              (sizes.get("batch_size"), sizes.get("accumulate_grad_batches")) == (half, 2), str(sizes)[:300])
    sec.check("batch.json: the OOM was at step 2 (after the step-2 checkpoint)", history[-1].get("step") == 2,
              str(history[-1])[:300])
    sec.check("no result.json after the OOM", not (run / "result.json").exists())
    t1 = time.monotonic()
    code, proc = ctx.run_job(run, attempt=2, timeout=300, ORCH_TRACE_SAMPLES=str(trace2), **fault)
    sec.figures["attempt_2_s"] = time.monotonic() - t1
    sec.require("attempt 2 finishes (exit 0)", code == 0, f"exit {code}: {proc.tail()}")
    _on_device(ctx, sec, "attempt 2", proc)
    sec.check("attempt 2 resumed from the step-2 checkpoint", "resuming from step-00000002.ckpt" in proc.output())
    result = read_json(run / "result.json") or {}
    sec.check("same optimizer steps as planned (4: the effective batch did not change)", result.get("steps") == 4,
              str(result.get("steps")))
    sec.check(f"result.json: batch {half} x accumulate 2",
              (result.get("batch_size"), result.get("accumulate_grad_batches")) == (half, 2))
    first, second = _trace(trace1), _trace(trace2)
    sec.check(f"attempt 2's micro-batches hold {half} rows", bool(second) and max(len(x["rows"]) for x in second) == half)
    kept = [r for line in first if line["step"] < 2 for r in line["rows"]] + [r for line in second for r in line["rows"]]
    counts = collections.Counter(kept)
    repeated = sum(1 for c in counts.values() if c > 1)
    sec.check(f"every sample trained exactly once ({4 * batch} rows)",
              len(kept) == 4 * batch and len(counts) == 4 * batch,
              f"{len(kept)} trained, {len(counts)} distinct, {repeated} repeated")
    sec.figures["samples_trained"] = len(kept)
    kind = "simulated" if not ctx.gpu else "real CUDA"
    sec.headline = (f"{kind} OOM at batch {batch} -> exit 76 -> batch {half} x 2 finished, "
                    f"{len(counts)}/{4 * batch} samples once")
    free_run(run)


# -- (d) exact resume ---------------------------------------------------------------------------------


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
    threads = {} if ctx.gpu else {"OMP_NUM_THREADS": "1"}
    for det in (True, False):
        tag = "det" if det else "nondet"
        for kind in ("full", "int"):
            run = ctx.work / f"d-{tag}-{kind}"
            ctx.write_job(run, model=model, train=data, seq=s.seq, batch=s.resume_batch, precision=s.resume_precision,
                          lr=s.lr, steps=steps, deterministic=det, workers=min(2, s.workers))
            plans[(tag, kind)] = run
    target = {tag: rng.randint(max(2, steps // 4), steps * 3 // 4) for tag in ("det", "nondet")}
    # the four runs side by side (exactness does not depend on speed); the interrupted ones write
    # progress.json every step and sleep 20 ms a step so the SIGTERM lands mid-run
    procs = {}
    for (tag, kind), run in plans.items():
        extra = dict(threads)
        if kind == "int":
            extra.update(ORCH_PROGRESS_EVERY_S="0.000001", ORCH_FAULT_SLOW_STEP_S="0.02")
        procs[(tag, kind)] = ctx.start_job(run, attempt=1, **extra)
    notice_steps = {}
    pending = {"det", "nondet"}

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
    for tag in ("det", "nondet"):
        run, proc = plans[(tag, "int")], procs[(tag, "int")]
        code = proc.wait(ctx.timeout(120))
        notices = sorted((run / "checkpoints").glob("notice-step-*.ckpt"))
        notice = int(notices[-1].stem.rsplit("-", 1)[1]) if notices else None
        notice_steps[tag] = notice
        sec.check(f"{tag}: SIGTERM at step >= {target[tag]} -> exit 75 with a notice checkpoint",
                  code == 75 and notice is not None and 0 < notice < steps, f"exit {code}, notice step {notice}: "
                  + proc.tail(6))
    for (tag, kind), proc in procs.items():
        if kind == "full":
            code = proc.wait(ctx.timeout(300))
            sec.check(f"{tag}: the uninterrupted run exits 0", code == 0, f"exit {code}: {proc.tail()}")
    resumed = {}
    for tag in ("det", "nondet"):
        if notice_steps.get(tag) is not None:
            resumed[tag] = ctx.start_job(plans[(tag, "int")], attempt=2, **threads)
    for tag, proc in resumed.items():
        code = proc.wait(ctx.timeout(300))
        ok = sec.check(f"{tag}: the resumed attempt exits 0", code == 0, f"exit {code}: {proc.tail()}")
        if ok:
            sec.check(f"{tag}: resumed from the notice checkpoint",
                      f"resuming from notice-step-{notice_steps[tag]:08d}.ckpt" in proc.output())
            _on_device(ctx, sec, f"{tag} resumed", proc)
    figures: dict[str, Any] = {"steps": steps, "batch": s.resume_batch, "precision": s.resume_precision,
                               "sigterm_after_step": target, "notice_step": notice_steps}
    for tag in ("det", "nondet"):
        full, inter = plans[(tag, "full")], plans[(tag, "int")]
        if not ((full / "model" / "model.safetensors").exists() and (inter / "model" / "model.safetensors").exists()):
            continue
        steps_done = [(read_json(r / "result.json") or {}).get("steps") for r in (full, inter)]
        sec.check(f"{tag}: both runs did {steps} steps", steps_done == [steps, steps], str(steps_done))
        a, b = _weights(full), _weights(inter)
        sec.require(f"{tag}: same tensors", a.keys() == b.keys())
        diffs = {k: (a[k].double() - b[k].double()).abs().max().item() if a[k].is_floating_point()
                 else float(not torch.equal(a[k], b[k])) for k in a}
        unequal = [k for k in a if not torch.equal(a[k], b[k])]
        worst = max(diffs, key=diffs.get)
        figures[tag] = {"tensors": len(a), "unequal_tensors": len(unequal), "max_abs_diff": diffs[worst],
                        "worst_tensor": worst if diffs[worst] else None}
        if tag == "det":
            sec.check("deterministic = true: torch.equal on every weight, interrupted vs uninterrupted", not unequal,
                      f"{len(unequal)} of {len(a)} differ, largest {diffs[worst]:.3g} in {worst}")
        else:
            sec.check("deterministic = false: the difference is finite", math.isfinite(diffs[worst]),
                      f"{diffs[worst]}")
    sec.figures.update(figures)
    det, nondet = figures.get("det") or {}, figures.get("nondet") or {}
    if det:
        sec.headline = (f"deterministic: {'bit-exact' if not det['unequal_tensors'] else 'DIFFERS'} after SIGTERM at "
                        f"step {notice_steps.get('det')}; without: max abs diff {nondet.get('max_abs_diff', math.nan):.3g}")
    for run in plans.values():
        free_run(run)


# -- (e) the notice checkpoint of BERT-large + AdamW ------------------------------------------------


def notice(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model = ctx.model(s.large)
    run = ctx.work / "e-notice"
    data = write_rows(ctx.work / "data" / "notice.jsonl", rows(ctx, 400, seed=9))
    ctx.write_job(run, model=model, train=data, seq=s.notice_seq, batch=s.notice_batch, precision=s.notice_precision,
                  lr=2e-5, steps=100_000, epochs=1000, keep=1)
    times = run / "notice-times.jsonl"
    wrap = ["--notice-times", str(times)]
    env = {"ORCH_PROGRESS_EVERY_S": "0.000001"}
    attempts: list[dict[str, Any]] = []
    resume_from = 0
    for attempt, order in ((1, "orch-first"), (2, "bare-first")):
        proc = ctx.start_job(run, attempt=attempt, wrap=wrap, GPUCHECK_NOTICE_ORDER=order, **env)
        at = resume_from + 3

        def reached() -> Optional[dict]:
            p = read_json(run / "progress.json") or {}
            fresh = (p.get("updated_at") or 0) >= proc.launched
            return p if (fresh and (p.get("step") or 0) >= at) or not proc.alive() else None

        first = wait_for(lambda: (lambda p: p if (p.get("first_step_at") or 0) >= proc.launched or not proc.alive()
                                  else None)(read_json(run / "progress.json") or {}), ctx.timeout(300))
        progress = wait_for(reached, ctx.timeout(300))
        sent = time.time()
        proc.signal(signal.SIGTERM)
        code = proc.wait(ctx.timeout(300))
        exited = time.time()
        sec.require(f"attempt {attempt}: SIGTERM -> exit 75", code == 75, f"exit {code}: {proc.tail()}")
        if attempt == 2:
            sec.check("attempt 2 resumed from the notice checkpoint",
                      f"resuming from notice-step-{resume_from:08d}.ckpt" in proc.output())
        _on_device(ctx, sec, f"attempt {attempt}", proc)
        lines = [json.loads(x) for x in times.read_text().splitlines()] if times.exists() else []
        sec.require(f"attempt {attempt}: the notice save was timed", len(lines) == attempt, f"{len(lines)} lines")
        line = lines[-1]
        last = read_json(run / "progress.json") or {}
        attempts.append({"order": order, "notice_step": line["step"], "orch_s": line["orch_s"],
                         "bare_s": line["bare"]["s"], "orch_bytes": line["orch_bytes"],
                         "bare_bytes": line["bare"]["bytes"], "steps_lost": int(last.get("step") or 0) - line["step"],
                         "sigterm_to_exit_s": exited - sent,
                         "launch_to_first_step_s": (first.get("first_step_at") or math.nan) - proc.launched
                         if first else None})
        sec.check(f"attempt {attempt}: no step lost (notice at the last finished step)", attempts[-1]["steps_lost"] == 0,
                  f"progress at {last.get('step')}, notice at {line['step']}")
        resume_from = line["step"]
        del progress
    orch = [a["orch_s"] for a in attempts]
    bare = [a["bare_s"] for a in attempts]
    ratio = statistics.median(orch) / statistics.median(bare)
    sec.figures.update({"model": f"BERT {s.large} + AdamW ({s.notice_precision})", "attempts": attempts,
                        "orch_s": orch, "bare_s": bare, "ratio_orch_over_bare": ratio, "goal": s.goal_notice_ratio,
                        "checkpoint_mb": attempts[0]["orch_bytes"] / 1e6, "bare_mb": attempts[0]["bare_bytes"] / 1e6})
    sec.headline = (f"end of step -> durable: orch {statistics.median(orch):.2f} s vs bare torch.save "
                    f"{statistics.median(bare):.2f} s = {ratio:.2f}x (goal <= {s.goal_notice_ratio}); "
                    f"{attempts[0]['orch_bytes'] / 1e6:.0f} MB")
    if ctx.gpu:
        sec.check(f"notice save within {s.goal_notice_ratio}x a bare torch.save", ratio <= s.goal_notice_ratio,
                  f"{ratio:.2f}")
    else:
        sec.notes.append("CPU rehearsal: a tiny model stands in for BERT-large; the ratio is reported, not judged.")
    free_run(run)


# -- (f) GPU idle time between two queued jobs under the daemon --------------------------------------


def daemon_idle(ctx: Ctx, sec: Section) -> None:
    from orchestrator.paths import Home
    from orchestrator.store import Store

    s = ctx.sizes
    model = ctx.model(s.model)
    root = ctx.work / "f-daemon"
    home = Home(root / "home").ensure()
    gpus = "[0]" if ctx.gpu else "[]"
    (home.root / "config.toml").write_text(f"[daemon]\ngpus = {gpus}\ncpu_slots = 1\n")
    env = ctx.env(ORCH_HOME=str(home.root))
    daemon = ctx.start([sys.executable, "-m", "orchestrator.cli.app", "daemon", "run"], env, root / "daemon.out")
    started = wait_for(lambda: (home.log_file.exists() and "daemon started" in home.log_file.read_text())
                       or not daemon.alive(), ctx.timeout(60), interval=0.05)
    sec.require("the daemon starts", bool(started) and daemon.alive(), daemon.tail())
    data = write_rows(ctx.work / "data" / "daemon.jsonl", rows(ctx, s.daemon_steps * s.batch, seed=13))
    ids = []
    for n in (1, 2):
        folder = root / f"job{n}"
        ctx.write_job(folder, model=model, train=data, seq=s.seq, batch=s.batch, precision=s.throughput_precision,
                      lr=s.lr, steps=s.daemon_steps, name=f"gpucheck-{n}")
        out = ctx.start([sys.executable, "-m", "orchestrator.cli.app", "submit", str(folder / "job.toml"), "--json"],
                        env, root / f"submit-{n}.out")
        code = out.wait(ctx.timeout(60))
        sec.require(f"orch submit job {n}", code == 0, out.tail())
        ids.append(json.loads(out.output().strip().splitlines()[-1])["id"])
    store = Store(home.db)
    done = wait_for(lambda: all(store.get(i).state.is_terminal for i in ids) or not daemon.alive(),
                    ctx.timeout(300 if ctx.gpu else 200), interval=0.2)
    states = {i: store.get(i).state.value for i in ids}
    daemon.signal(signal.SIGTERM)
    daemon.wait(30)
    sec.require("both jobs succeeded under the daemon", bool(done) and all(v == "succeeded" for v in states.values()),
                f"states {states}; daemon log: {_tail(home.log_file)}")
    run1, run2 = home.run_dir(ids[0]), home.run_dir(ids[1])
    exit1, exit2 = read_json(run1 / "attempt-1.exit") or {}, read_json(run2 / "attempt-1.exit") or {}
    prog1, prog2 = read_json(run1 / "progress.json") or {}, read_json(run2 / "progress.json") or {}
    if ctx.gpu:
        for n, run in ((1, run1), (2, run2)):
            log = (run / "attempt-1.log").read_text(errors="replace") if (run / "attempt-1.log").exists() else ""
            sec.check(f"job {n} trained on the GPU", "no CUDA GPU visible" not in log)
    try:
        gpu_done = float(prog1["updated_at"])  # job 1's last write: on_train_end, after its last step
        parts = {
            "job1_last_step_to_exit_s": float(exit1["ended_at"]) - gpu_done,
            "job1_exit_to_job2_spawn_s": float(exit2["started_at"]) - float(exit1["ended_at"]),
            "job2_spawn_to_train_start_s": float(prog2["train_started_at"]) - float(exit2["started_at"]),
            "job2_train_start_to_first_step_end_s": float(prog2["first_step_at"]) - float(prog2["train_started_at"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        sec.require("the run folders hold the timestamps", False, f"{type(exc).__name__}: {exc}")
        return
    idle = float(prog2["first_step_at"]) - gpu_done
    sec.check("job 2 started only after job 1 ended (one GPU slot)", parts["job1_exit_to_job2_spawn_s"] >= 0,
              f"{parts['job1_exit_to_job2_spawn_s']:.3f}")
    sec.check(f"the daemon starts the queued job within {s.goal_daemon_gap_s} s of the exit",
              parts["job1_exit_to_job2_spawn_s"] <= s.goal_daemon_gap_s, f"{parts['job1_exit_to_job2_spawn_s']:.3f} s")
    sec.figures.update({"gpu_idle_s": idle, **parts, "jobs": ids, "steps_per_job": s.daemon_steps})
    sec.headline = (f"GPU idle {idle:.1f} s between the jobs (daemon's share {parts['job1_exit_to_job2_spawn_s']:.2f} s;"
                    f" job 1 wind-down {parts['job1_last_step_to_exit_s']:.1f} s, job 2 start-up "
                    f"{parts['job2_spawn_to_train_start_s']:.1f} s)")


def _tail(path: Path, n: int = 8) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


# key, letter, title, function, the least time (s) worth starting it with
SECTIONS = [
    ("precision", "a", "built-in runner in 16-mixed and bf16-mixed", precision_runs, 40),
    ("throughput", "b", "runner vs plain Lightning throughput", throughput, 40),
    ("oom", "c", "out of GPU memory: exit 76, half the batch, finish", oom, 40),
    ("resume", "d", "exact resume after SIGTERM (deterministic, and not)", resume, 40),
    ("notice", "e", "notice checkpoint of BERT-large + AdamW on the GPU vs bare torch.save", notice, 40),
    ("daemon_idle", "f", "GPU idle between two queued jobs under a real daemon", daemon_idle, 30),
]

_ = (Skip,)  # sections raise check.Skip to skip themselves with a reason
